/* SPDX-License-Identifier: Apache-2.0 */
/* Several devices in one process (issue 23): one runtime per device, each keeping its own
 * buffers and streams, and neither using the other's. On the host backend every ordinal
 * is an emulated device of its own; on the CUDA backend the tests that need a second device
 * skip themselves where there is one GPU, and those that put two runtimes on device 0 run.
 * A seam test only for the CUDA runtime it shares with the library: the GPU tests make a
 * stream with cudaStreamCreate on another device, as an application would. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include "test_main.h"
#include "test_util.h"

#ifdef SPW_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#define BUF_BYTES ((size_t)64 << 10)
#define NBUFS 8
#define THREAD_ROUNDS 40

/* How many devices the test's backend has: host emulates any ordinal, so two. */
static int device_count(void) {
  if (test_backend() == SPW_BACKEND_HOST) return 2;
#ifdef SPW_HAVE_CUDA
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
#else
  return 0;
#endif
}

/* A runtime on `device` with a device limit small enough that NBUFS buffers spill. */
static spw_runtime_t *runtime_on(int device) {
  spw_config_t cfg = SPW_CONFIG_INIT;
  cfg.device = device;
  cfg.device_limit = (uint64_t)BUF_BYTES * NBUFS / 2;
  return test_runtime(&cfg);
}

/* The second device: 1, or the test skips where there is one device only. */
static int second_device(void) {
  TEST_SKIP_IF(device_count() < 2, "fewer than 2 CUDA devices");
  return 1;
}

/* Fills NBUFS buffers on rt (seeds from `seed`), written through its own stream `s`. */
static void fill_all(spw_runtime_t *rt, spw_stream_t s, spw_buf_t *bufs, uint64_t seed) {
  for (int i = 0; i < NBUFS; i++) bufs[i] = test_filled(rt, s, BUF_BYTES, seed + (uint64_t)i);
}

/* Spills every buffer to host, then to disk, reading all back in between: the data
 * survives every tier of its own runtime. */
static void spill_and_check(spw_runtime_t *rt, spw_stream_t s, const spw_buf_t *bufs,
                            uint64_t seed) {
  (void)test_spill_counted(rt, bufs, NBUFS, SPW_TIER_HOST);
  for (int i = 0; i < NBUFS; i++) test_expect_fill(rt, bufs[i], s, BUF_BYTES, seed + (uint64_t)i);
  (void)test_spill_counted(rt, bufs, NBUFS, SPW_TIER_DISK);
  for (int i = 0; i < NBUFS; i++) test_expect_fill(rt, bufs[i], s, BUF_BYTES, seed + (uint64_t)i);
}

static void free_all(spw_runtime_t *rt, const spw_buf_t *bufs) {
  for (int i = 0; i < NBUFS; i++) ASSERT_OK(spw_free(rt, bufs[i]));
}

/* Two runtimes, interleaved: each fills, spills and reads back its buffers on its own
 * stream while the other's are alive. */
static void two_runtimes_keep_their_data(int dev_a, int dev_b) {
  spw_runtime_t *a = runtime_on(dev_a), *b = runtime_on(dev_b);
  spw_stream_t sa, sb;
  ASSERT_OK(spw_stream_create(a, &sa));
  ASSERT_OK(spw_stream_create(b, &sb));
  spw_buf_t ba[NBUFS], bb[NBUFS];
  fill_all(a, sa, ba, 100);
  fill_all(b, sb, bb, 200);
  spill_and_check(a, sa, ba, 100);
  spill_and_check(b, sb, bb, 200);
  for (int i = 0; i < NBUFS; i++) test_expect_fill(a, ba[i], sa, BUF_BYTES, 100 + (uint64_t)i);
  free_all(a, ba);
  free_all(b, bb);
  ASSERT_OK(spw_runtime_destroy(a));
  ASSERT_OK(spw_runtime_destroy(b));
}

static void runtimes_on_two_devices_each_keep_their_data(void) {
  two_runtimes_keep_their_data(0, second_device());
}

/* backend_cuda.c's pool settings are per device: two backends on one device share them. */
static void two_runtimes_on_one_device_each_keep_their_data(void) {
  two_runtimes_keep_their_data(0, 0);
}

/* A's handle means nothing to B, whatever their devices: the handle's runtime tag refuses
 * it, and A's buffer is untouched. */
static void handle_of_another_runtime_is_invalid_handle(void) {
  int other = device_count() >= 2 ? 1 : 0;
  spw_runtime_t *a = runtime_on(0), *b = runtime_on(other);
  spw_stream_t sa, sb;
  ASSERT_OK(spw_stream_create(a, &sa));
  ASSERT_OK(spw_stream_create(b, &sb));
  spw_buf_t buf = test_filled(a, sa, BUF_BYTES, 7);
  void *d = NULL;
  ASSERT_STATUS(spw_acquire(b, buf, sb, 0, &d), SPW_ERR_INVALID_HANDLE);
  ASSERT_STATUS(spw_prefetch(b, buf, sb), SPW_ERR_INVALID_HANDLE);
  ASSERT_STATUS(spw_spill_n(b, &buf, 1, SPW_TIER_HOST), SPW_ERR_INVALID_HANDLE);
  ASSERT_STATUS(spw_free(b, buf), SPW_ERR_INVALID_HANDLE);
  ASSERT_PTR_EQ(d, NULL);
  test_expect_fill(a, buf, sa, BUF_BYTES, 7);
  ASSERT_OK(spw_free(a, buf));
  ASSERT_OK(spw_runtime_destroy(a));
  ASSERT_OK(spw_runtime_destroy(b));
}

static int noop_launch(void *user, void *const *dptrs, spw_stream_t stream) {
  (void)user;
  (void)dptrs;
  (void)stream;
  return 0;
}
static void noop_host_fn(void *arg) { (void)arg; }

/* Every call that takes a stream refuses `foreign` with `expected`, and leaves rt's buffer
 * unlocked and intact. */
static void every_stream_call_refuses(spw_runtime_t *rt, spw_stream_t own, spw_stream_t foreign,
                                      int expected) {
  spw_buf_t buf = test_filled(rt, own, BUF_BYTES, 11), nb = 0;
  void *d = NULL, *dn[1] = {NULL};
  char host[16];
  spw_buf_arg_t arg = spw_buf_arg(buf, 0, 0);
  ASSERT_STATUS(spw_acquire(rt, buf, foreign, 0, &d), expected);
  ASSERT_STATUS(spw_acquire_n(rt, &buf, 1, foreign, 0, dn), expected);
  ASSERT_STATUS(spw_acquire_args(rt, &arg, 1, foreign, dn), expected);
  ASSERT_STATUS(spw_alloc(rt, BUF_BYTES, foreign, &nb), expected);
  ASSERT_STATUS(spw_release(rt, buf, foreign), expected);
  ASSERT_STATUS(spw_release_n_async(rt, &buf, 1, foreign), expected);
  ASSERT_STATUS(spw_prefetch(rt, buf, foreign), expected);
  ASSERT_STATUS(spw_prefetch_n(rt, &buf, 1, foreign), expected);
  ASSERT_STATUS(spw_stream_synchronize(rt, foreign), expected);
  ASSERT_STATUS(spw_stream_release_async(rt, foreign), expected);
  ASSERT_STATUS(spw_stream_wait(rt, foreign), expected);
  ASSERT_STATUS(spw_stream_destroy(rt, foreign), expected);
  ASSERT_STATUS(spw_stream_unregister(rt, foreign), expected);
  ASSERT_STATUS(spw_launch_host_func(rt, foreign, noop_host_fn, NULL), expected);
  ASSERT_STATUS(spw_memcpy_async(rt, host, host + 8, 8, foreign), expected);
  ASSERT_STATUS(spw_lock_and_launch(rt, &arg, 1, foreign, 0, noop_launch, NULL), expected);
  ASSERT_STATUS(spw_lock_and_launch_async(rt, &arg, 1, foreign, noop_launch, NULL), expected);
  ASSERT_PTR_EQ(d, NULL);
  ASSERT_PTR_EQ(dn[0], NULL);
  ASSERT_UEQ(nb, 0);
  ASSERT_EQ(test_locks_of(rt, buf), 0);
  test_expect_fill(rt, buf, own, BUF_BYTES, 11);
  ASSERT_OK(spw_free(rt, buf));
}

/* CUDA backend: a stream of the device-1 runtime, handed to the device-0 runtime, is unknown
 * until registered, registering it is refused with SPW_ERR_WRONG_DEVICE, and spw_last_error
 * names both devices. Host backend: every stream of another runtime is unknown to this one
 * (each emulates its own memory; registering is a CUDA call), so every call refuses it
 * with SPW_ERR_INVALID_STREAM. */
static void stream_of_another_device_is_wrong_device(void) {
  int other = second_device();
  spw_runtime_t *a = runtime_on(0), *b = runtime_on(other);
  spw_stream_t sa, sb;
  ASSERT_OK(spw_stream_create(a, &sa));
  ASSERT_OK(spw_stream_create(b, &sb));
  if (test_backend() == SPW_BACKEND_HOST) {
    every_stream_call_refuses(a, sa, sb, SPW_ERR_INVALID_STREAM);
    ASSERT_STATUS(spw_stream_register(a, sb), SPW_ERR_UNSUPPORTED);
  } else {
    ASSERT_STATUS(spw_stream_register(a, sb), SPW_ERR_WRONG_DEVICE);
    const char *why = spw_last_error(a);
    ASSERT_TRUE(strstr(why, "belongs to device 1") != NULL);
    ASSERT_TRUE(strstr(why, "runs on device 0") != NULL);
    every_stream_call_refuses(a, sa, sb, SPW_ERR_INVALID_STREAM);
    ASSERT_STATUS(spw_stream_register(a, sb), SPW_ERR_WRONG_DEVICE);
  }
  ASSERT_EQ(spw_status_has_detail(SPW_ERR_WRONG_DEVICE), 1);
  /* The other runtime's own use of its stream is unaffected. */
  spw_buf_t buf = test_filled(b, sb, BUF_BYTES, 3);
  test_expect_fill(b, buf, sb, BUF_BYTES, 3);
  ASSERT_OK(spw_free(b, buf));
  ASSERT_OK(spw_runtime_destroy(a));
  ASSERT_OK(spw_runtime_destroy(b));
}

/* Host backend: two runtimes on one ordinal are still two emulated memories, so a stream of
 * one is unknown to the other (its frees would land in the other's memory). */
static void host_stream_of_another_runtime_on_the_same_device_is_unknown(void) {
  TEST_SKIP_IF(test_backend() != SPW_BACKEND_HOST, "host backend only");
  spw_runtime_t *a = runtime_on(0), *b = runtime_on(0);
  spw_stream_t sa, sb;
  ASSERT_OK(spw_stream_create(a, &sa));
  ASSERT_OK(spw_stream_create(b, &sb));
  every_stream_call_refuses(a, sa, sb, SPW_ERR_INVALID_STREAM);
  ASSERT_OK(spw_runtime_destroy(a));
  ASSERT_OK(spw_runtime_destroy(b));
}

/* Host backend: a stream that runtime B destroyed, or that no runtime made, is unknown to
 * runtime A: the check compares addresses and never reads what it is given. */
static void host_stream_no_runtime_owns_is_unknown(void) {
  TEST_SKIP_IF(test_backend() != SPW_BACKEND_HOST, "host backend only");
  spw_runtime_t *a = runtime_on(0), *b = runtime_on(1);
  spw_stream_t sa, sb;
  ASSERT_OK(spw_stream_create(a, &sa));
  ASSERT_OK(spw_stream_create(b, &sb));
  ASSERT_OK(spw_stream_destroy(b, sb));
  spw_buf_t buf = test_filled(a, sa, BUF_BYTES, 5);
  void *d = NULL;
  int st = spw_acquire(a, buf, sb, 0, &d);
  /* B may have handed the freed address to a new stream meanwhile: none was made here. */
  ASSERT_STATUS(st, SPW_ERR_INVALID_STREAM);
  uint64_t forged = 0x1000;
  ASSERT_STATUS(spw_acquire(a, buf, (spw_stream_t)(uintptr_t)forged, 0, &d), SPW_ERR_INVALID_STREAM);
  ASSERT_OK(spw_free(a, buf));
  ASSERT_OK(spw_runtime_destroy(a));
  ASSERT_OK(spw_runtime_destroy(b));
}

/* CUDA backend: a stream of device 0 made by another runtime, or by the application, can
 * be registered with every runtime of device 0 (one CUDA context serves them all). */
static void cuda_stream_of_the_same_device_registers_with_both_runtimes(void) {
  TEST_SKIP_IF(test_backend() != SPW_BACKEND_CUDA, "CUDA backend only");
  spw_runtime_t *a = runtime_on(0), *b = runtime_on(0);
  spw_stream_t sb;
  ASSERT_OK(spw_stream_create(b, &sb));
  ASSERT_OK(spw_stream_register(a, sb));
  spw_buf_t buf = test_filled(a, sb, BUF_BYTES, 9);
  test_expect_fill(a, buf, sb, BUF_BYTES, 9);
  ASSERT_OK(spw_free(a, buf));
  ASSERT_OK(spw_stream_unregister(a, sb));
  ASSERT_OK(spw_runtime_destroy(a));
  ASSERT_OK(spw_runtime_destroy(b));
}

#ifdef SPW_HAVE_CUDA
typedef struct registrar {
  spw_runtime_t *rt;
  cudaStream_t s0, s1;
  atomic_int *go;
} registrar_t;

static void *register_both(void *arg) {
  registrar_t *r = arg;
  while (!atomic_load(r->go)) {
  }
  ASSERT_STATUS(spw_stream_register(r->rt, r->s1), SPW_ERR_WRONG_DEVICE);
  ASSERT_OK(spw_stream_register(r->rt, r->s0));
  return NULL;
}
#endif

/* CUDA backend, two GPUs: a stream the application made with cudaStreamCreate on device 1
 * is refused by the device-0 runtime, by every caller of a concurrent first registration;
 * a stream of device 0 made the same way is accepted by all of them at once. */
static void cuda_stream_created_on_device_1_is_refused_by_device_0(void) {
  TEST_SKIP_IF(test_backend() != SPW_BACKEND_CUDA, "CUDA backend only");
  (void)second_device();
#ifdef SPW_HAVE_CUDA
  spw_runtime_t *a = runtime_on(0);
  int prev = 0;
  ASSERT_EQ(cudaGetDevice(&prev), cudaSuccess);
  cudaStream_t s1, s0;
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&s0, cudaStreamNonBlocking), cudaSuccess);
  atomic_int go = 0;
  registrar_t r = {a, s0, s1, &go};
  pthread_t t[4];
  for (int i = 0; i < 4; i++) ASSERT_EQ(pthread_create(&t[i], NULL, register_both, &r), 0);
  atomic_store(&go, 1);
  for (int i = 0; i < 4; i++) ASSERT_EQ(pthread_join(t[i], NULL), 0);
  ASSERT_STATUS(spw_stream_register(a, s1), SPW_ERR_WRONG_DEVICE);
  ASSERT_OK(spw_stream_register(a, s0));
  spw_buf_t buf = test_filled(a, s0, BUF_BYTES, 13);
  void *d = NULL;
  ASSERT_STATUS(spw_acquire(a, buf, s1, 0, &d), SPW_ERR_INVALID_STREAM);
  test_expect_fill(a, buf, s0, BUF_BYTES, 13);
  ASSERT_OK(spw_free(a, buf));
  ASSERT_OK(spw_stream_unregister(a, s0));
  ASSERT_OK(spw_runtime_destroy(a));
  ASSERT_EQ(cudaStreamDestroy(s0), cudaSuccess);
  ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
  ASSERT_EQ(cudaStreamDestroy(s1), cudaSuccess);
  ASSERT_EQ(cudaSetDevice(prev), cudaSuccess);
#endif
}

/* ---- two runtimes at once, from two threads ---- */

typedef struct worker {
  spw_runtime_t *rt;
  uint64_t seed;
  spw_stream_t foreign; /* the other runtime's stream, refused here now and then */
  int foreign_status;   /* what this runtime answers for it */
  atomic_int *go;
} worker_t;

static void *worker_main(void *arg) {
  worker_t *w = arg;
  while (!atomic_load(w->go)) {
  }
  spw_stream_t s;
  ASSERT_OK(spw_stream_create(w->rt, &s));
  for (int round = 0; round < THREAD_ROUNDS; round++) {
    spw_buf_t bufs[NBUFS];
    uint64_t seed = w->seed + (uint64_t)round * NBUFS;
    fill_all(w->rt, s, bufs, seed);
    (void)test_spill_counted(w->rt, bufs, NBUFS, SPW_TIER_HOST);
    void *d = NULL;
    ASSERT_STATUS(spw_acquire(w->rt, bufs[0], w->foreign, 0, &d), w->foreign_status);
    for (int i = 0; i < NBUFS; i++) test_expect_fill(w->rt, bufs[i], s, BUF_BYTES, seed + (uint64_t)i);
    free_all(w->rt, bufs);
  }
  ASSERT_OK(spw_stream_destroy(w->rt, s));
  return NULL;
}

/* Both runtimes allocate, spill, read back and are handed each other's streams at the same
 * time, each from its own thread: nothing of one shows in the other. */
static void two_runtimes_work_at_once_from_two_threads(void) {
  int other = device_count() >= 2 ? 1 : 0;
  spw_runtime_t *a = runtime_on(0), *b = runtime_on(other);
  spw_stream_t fa, fb; /* a stream of each, handed to the other */
  ASSERT_OK(spw_stream_create(a, &fa));
  ASSERT_OK(spw_stream_create(b, &fb));
  /* Host: another runtime's stream is unknown; CUDA: it was never registered. */
  int refused = SPW_ERR_INVALID_STREAM;
  atomic_int go = 0;
  worker_t wa = {a, 1000, fb, refused, &go}, wb = {b, 5000, fa, refused, &go};
  pthread_t ta, tb;
  ASSERT_EQ(pthread_create(&ta, NULL, worker_main, &wa), 0);
  ASSERT_EQ(pthread_create(&tb, NULL, worker_main, &wb), 0);
  atomic_store(&go, 1);
  ASSERT_EQ(pthread_join(ta, NULL), 0);
  ASSERT_EQ(pthread_join(tb, NULL), 0);
  ASSERT_OK(spw_runtime_destroy(a));
  ASSERT_OK(spw_runtime_destroy(b));
}

/* The device check of a stream not yet known races with its runtime creating and destroying
 * other streams: every answer is a refusal, none a crash (run it under TSan). */
typedef struct churn {
  spw_runtime_t *rt;
  atomic_int *stop;
} churn_t;

static void *churn_main(void *arg) {
  churn_t *c = arg;
  while (!atomic_load(c->stop)) {
    spw_stream_t s;
    ASSERT_OK(spw_stream_create(c->rt, &s));
    ASSERT_OK(spw_stream_destroy(c->rt, s));
  }
  return NULL;
}

static void host_device_check_is_safe_while_the_owner_churns_streams(void) {
  TEST_SKIP_IF(test_backend() != SPW_BACKEND_HOST, "host backend only");
  spw_runtime_t *a = runtime_on(0), *b = runtime_on(1);
  spw_stream_t sb;
  ASSERT_OK(spw_stream_create(b, &sb));
  spw_buf_t buf = test_filled(a, NULL, BUF_BYTES, 17);
  atomic_int stop = 0;
  churn_t c = {b, &stop};
  pthread_t t;
  ASSERT_EQ(pthread_create(&t, NULL, churn_main, &c), 0);
  for (int i = 0; i < 2000; i++) {
    void *d = NULL;
    ASSERT_STATUS(spw_acquire(a, buf, sb, 0, &d), SPW_ERR_INVALID_STREAM);
  }
  atomic_store(&stop, 1);
  ASSERT_EQ(pthread_join(t, NULL), 0);
  ASSERT_OK(spw_free(a, buf));
  ASSERT_OK(spw_runtime_destroy(a));
  ASSERT_OK(spw_runtime_destroy(b));
}

static const spw_test_t tests[] = {
    TEST(runtimes_on_two_devices_each_keep_their_data),
    TEST(two_runtimes_on_one_device_each_keep_their_data),
    TEST(handle_of_another_runtime_is_invalid_handle),
    TEST(stream_of_another_device_is_wrong_device),
    TEST(host_stream_of_another_runtime_on_the_same_device_is_unknown),
    TEST(host_stream_no_runtime_owns_is_unknown),
    TEST(cuda_stream_of_the_same_device_registers_with_both_runtimes),
    TEST(cuda_stream_created_on_device_1_is_refused_by_device_0),
    TEST(two_runtimes_work_at_once_from_two_threads),
    TEST(host_device_check_is_safe_while_the_owner_churns_streams),
};
TEST_MAIN(tests)
