/* SPDX-License-Identifier: Apache-2.0 */
/* Unit test of the CUDA backend (src/backend/backend_cuda.c, src/backend/copy_kernels.cu)
 * through its ops table, on device 0. Skipped without a GPU or in a build without CUDA.
 * Where a result cannot be seen through the ops (the thread's last CUDA error, device-side
 * gaps between buffers) the test asks the CUDA runtime directly. */
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "test_main.h"
#include "test_util.h"

#ifndef SPW_HAVE_CUDA
int main(void) {
  printf("SKIP: this build has no CUDA backend\n");
  return TEST_SKIP;
}
#else

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)
#define SENTINEL 0xEEu

static const spw_backend_ops_t *const ops = &spw__backend_cuda_ops;

/* ---- support ------------------------------------------------------------------------- */

/* The error sink: remembers the last CUDA error name it was given. */
typedef struct sink {
  pthread_mutex_t mu;
  int calls;
  char name[96];
} sink_t;

static void sink_fn(void *ctx, const char *name, const char *text) {
  sink_t *k = ctx;
  (void)text;
  pthread_mutex_lock(&k->mu);
  k->calls++;
  snprintf(k->name, sizeof k->name, "%s", name ? name : "(null)");
  pthread_mutex_unlock(&k->mu);
}

static sink_t sink;
static spw_backend_t *be;

static uint64_t rng_next(uint64_t *state) { /* splitmix64 */
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

/* Sizes spread evenly over powers of two from 1 B to max (log-uniform, so most are small and
 * some are past the 1 MiB copy-engine threshold), after a head of edge cases. */
static size_t *random_sizes(size_t n, size_t max, uint64_t *rng) {
  static const size_t edges[] = {1,       15,       16,          17,      4095,
                                 4096,    4097,     64 * KiB - 1, 64 * KiB, 64 * KiB + 1,
                                 MiB - 1, MiB,      MiB + 1,     2 * MiB};
  size_t *sz = malloc(n * sizeof *sz);
  ASSERT_TRUE(sz != NULL);
  unsigned bits = 0;
  while (((size_t)1 << (bits + 1)) <= max) bits++;
  for (size_t i = 0; i < n; i++) {
    if (i < sizeof edges / sizeof edges[0] && edges[i] <= max) {
      sz[i] = edges[i];
      continue;
    }
    unsigned k = (unsigned)(rng_next(rng) % (bits + 1));
    size_t lo = (size_t)1 << k;
    sz[i] = lo + (size_t)(rng_next(rng) % lo);
    if (sz[i] > max) sz[i] = max;
  }
  return sz;
}

/* Where n buffers sit in one region: offsets aligned to `align`, plus a misalignment below
 * `mis_max` (0: none), and at least `gap` sentinel bytes between buffers. */
typedef struct extents {
  size_t n;
  const size_t *size;
  size_t *off;
  size_t span;
} extents_t;

static extents_t place(const size_t *size, size_t n, size_t align, size_t gap, size_t mis_max,
                       uint64_t *rng) {
  extents_t e = {n, size, malloc(n * sizeof(size_t)), 0};
  ASSERT_TRUE(e.off != NULL);
  size_t at = 0;
  for (size_t i = 0; i < n; i++) {
    at = round_up(at, align);
    if (mis_max) at += (size_t)(rng_next(rng) % mis_max);
    e.off[i] = at;
    at += size[i] + gap;
  }
  e.span = round_up(at, 4096);
  return e;
}

static uint64_t buf_seed(uint64_t seed, size_t i) { return seed * 1000003u + i; }

/* Sentinel everywhere, each buffer's own pattern inside its extent. */
static void fill_extents(uint8_t *base, const extents_t *e, uint64_t seed) {
  memset(base, SENTINEL, e->span);
  for (size_t i = 0; i < e->n; i++) test_fill(base + e->off[i], e->size[i], buf_seed(seed, i));
}

/* Each buffer holds its pattern and every byte between buffers is still the sentinel. */
static void check_extents(const uint8_t *base, const extents_t *e, uint64_t seed,
                          const char *what) {
  size_t at = 0;
  for (size_t i = 0; i < e->n; i++) {
    for (; at < e->off[i]; at++) {
      if (base[at] != SENTINEL) {
        fprintf(stderr, "%s: byte %zu before buffer %zu overwritten: 0x%02x\n", what, at, i,
                base[at]);
        abort();
      }
    }
    size_t bad = test_first_mismatch(base + e->off[i], e->size[i], buf_seed(seed, i));
    if (bad != (size_t)-1) {
      fprintf(stderr, "%s: buffer %zu (%zu bytes at %zu) differs at byte %zu\n", what, i,
              e->size[i], e->off[i], bad);
      abort();
    }
    at = e->off[i] + e->size[i];
  }
  for (; at < e->span; at++) ASSERT_EQ(base[at], SENTINEL);
}

/* Page-aligned host memory, touched and registered as the spill engine's arena does. */
static uint8_t *registered_slab(spw_backend_t *b, size_t bytes) {
  void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_TRUE(p != MAP_FAILED);
  memset(p, 0, bytes);
  ASSERT_OK(ops->host_register(b, p, bytes));
  return p;
}

static void free_slab(spw_backend_t *b, uint8_t *p, size_t bytes) {
  ASSERT_OK(ops->host_unregister(b, p));
  ASSERT_EQ(munmap(p, bytes), 0);
}

static spw_copy_desc_t *descs_for(const extents_t *dst_e, uint8_t *dst, const extents_t *src_e,
                                  const uint8_t *src) {
  spw_copy_desc_t *d = malloc(dst_e->n * sizeof *d);
  ASSERT_TRUE(d != NULL);
  for (size_t i = 0; i < dst_e->n; i++)
    d[i] = (spw_copy_desc_t){dst + dst_e->off[i], src + src_e->off[i], dst_e->size[i]};
  return d;
}

static size_t total_bytes(const size_t *size, size_t n) {
  size_t t = 0;
  for (size_t i = 0; i < n; i++) t += size[i];
  return t;
}

/* A host function that blocks its stream until the test opens the gate. */
typedef struct gate {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool open;
  bool left; /* the host function returned from its wait */
} gate_t;

static void gate_init(gate_t *g) {
  ASSERT_EQ(pthread_mutex_init(&g->mu, NULL), 0);
  ASSERT_EQ(pthread_cond_init(&g->cv, NULL), 0);
  g->open = false;
  g->left = false;
}

static void gate_wait_fn(void *arg) {
  gate_t *g = arg;
  pthread_mutex_lock(&g->mu);
  while (!g->open) pthread_cond_wait(&g->cv, &g->mu);
  g->left = true;
  pthread_cond_broadcast(&g->cv);
  pthread_mutex_unlock(&g->mu);
}

static void gate_open(gate_t *g) {
  pthread_mutex_lock(&g->mu);
  g->open = true;
  pthread_cond_broadcast(&g->cv);
  pthread_mutex_unlock(&g->mu);
}

/* Waits for the host function to leave the gate through the gate's own mutex, which CUDA's
 * completion already implies, but which ThreadSanitizer can see (libcuda is not
 * instrumented). */
static void gate_fini(gate_t *g) {
  pthread_mutex_lock(&g->mu);
  while (!g->left) pthread_cond_wait(&g->cv, &g->mu);
  pthread_mutex_unlock(&g->mu);
  pthread_cond_destroy(&g->cv);
  pthread_mutex_destroy(&g->mu);
}

static void sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* ---- tests --------------------------------------------------------------------------- */

static void test_alloc_free_round_trip(void) {
  spw_backend_t *b = be;
  spw_stream_t s;
  ASSERT_OK(ops->stream_create(b, &s));
  void *p = NULL, *q = NULL;
  ASSERT_OK(ops->alloc_async(b, MiB + 3, s, &p));
  ASSERT_OK(ops->alloc_async(b, 1000, ops->default_stream(b), &q));
  ASSERT_TRUE(p != NULL);
  ASSERT_TRUE(q != NULL);
  ASSERT_EQ((uintptr_t)p % 256, 0);
  ASSERT_EQ((uintptr_t)q % 256, 0);
  ASSERT_OK(ops->free_async(b, p, s));
  ASSERT_OK(ops->free_async(b, q, ops->default_stream(b)));
  ASSERT_OK(ops->free_async(b, NULL, s));
  ASSERT_OK(ops->stream_sync(b, s));
  ASSERT_OK(ops->stream_sync(b, ops->default_stream(b)));
  ASSERT_OK(ops->stream_destroy(b, s));
}

static void test_freed_memory_stays_cached_until_trim(void) {
  spw_backend_t *b = be;
  const size_t big = 1024 * MiB;
  size_t free0, free1, free2, total;
  ASSERT_OK(ops->trim(b));
  ASSERT_OK(ops->mem_info(b, &free0, &total));
  ASSERT_LE(free0, total);
  TEST_SKIP_IF(free0 < 2 * big, "too little free device memory");
  spw_stream_t s;
  ASSERT_OK(ops->stream_create(b, &s));
  void *p = NULL;
  ASSERT_OK(ops->alloc_async(b, big, s, &p));
  ASSERT_OK(ops->free_async(b, p, s));
  ASSERT_OK(ops->stream_sync(b, s));
  ASSERT_OK(ops->mem_info(b, &free1, NULL));
  ASSERT_OK(ops->trim(b));
  ASSERT_OK(ops->mem_info(b, &free2, NULL));
  /* Synchronizing did not give the pool's memory back (release threshold); trim did. */
  ASSERT_LE(free1 + big / 2, free0);
  ASSERT_GE(free2, free1 + big / 2);
  ASSERT_OK(ops->stream_destroy(b, s));
}

static void test_memcpy_async_round_trip(void) {
  spw_backend_t *b = be;
  const size_t n = MiB + 3;
  uint8_t *src = malloc(n), *back = malloc(n);
  ASSERT_TRUE(src && back);
  test_fill(src, n, 11);
  memset(back, 0, n);
  spw_stream_t s;
  ASSERT_OK(ops->stream_create(b, &s));
  void *d = NULL;
  ASSERT_OK(ops->alloc_async(b, n, s, &d));
  ASSERT_OK(ops->memcpy_async(b, d, src, n, s));
  ASSERT_OK(ops->memcpy_async(b, back, d, n, s));
  ASSERT_OK(ops->free_async(b, d, s));
  ASSERT_OK(ops->stream_sync(b, s));
  ASSERT_UEQ(test_first_mismatch(back, n, 11), (size_t)-1);
  ASSERT_OK(ops->stream_destroy(b, s));
  free(src);
  free(back);
}

/* 3000 buffers of 1 B .. 2 MiB between device buffers (256-aligned, in one allocation so the
 * gaps can be checked) and 4096-aligned extents of one registered slab. */
enum { BATCH_N = 3000 };

typedef struct batch_layout {
  size_t *size;
  extents_t dev_e, host_e;
} batch_layout_t;

static batch_layout_t batch_layout(uint64_t seed) {
  batch_layout_t l;
  uint64_t rng = seed;
  l.size = random_sizes(BATCH_N, 2 * MiB, &rng);
  l.dev_e = place(l.size, BATCH_N, 256, 256, 0, &rng);
  l.host_e = place(l.size, BATCH_N, 4096, 4096, 0, &rng);
  return l;
}

static void batch_layout_free(batch_layout_t *l) {
  free(l->dev_e.off);
  free(l->host_e.off);
  free(l->size);
}

/* One batch copy of the whole layout on s, synchronized, and its rate printed (a first call:
 * it includes loading the copy kernel). */
static void timed_batch_copy(spw_backend_t *b, const batch_layout_t *l,
                             const spw_copy_desc_t *d, spw_copy_dir_t dir, spw_stream_t s) {
  double t0 = now_s();
  ASSERT_OK(ops->copy_batch_async(b, d, BATCH_N, dir, s));
  ASSERT_OK(ops->stream_sync(b, s));
  double dt = now_s() - t0;
  size_t bytes = total_bytes(l->size, BATCH_N);
  printf("  info: %s %d buffers, %.1f MB in %.2f ms (%.1f GB/s, first call)\n",
         dir == SPW_COPY_D2H ? "D2H" : "H2D", BATCH_N, (double)bytes / 1e6, dt * 1e3,
         (double)bytes / dt / 1e9);
}

static void test_copy_batch_d2h_3000_buffers(void) {
  spw_backend_t *b = be;
  batch_layout_t l = batch_layout(0xD2D2);
  spw_stream_t s;
  ASSERT_OK(ops->stream_create(b, &s));
  uint8_t *stage = malloc(l.dev_e.span);
  ASSERT_TRUE(stage != NULL);
  fill_extents(stage, &l.dev_e, 21);
  uint8_t *dev = NULL;
  ASSERT_OK(ops->alloc_async(b, l.dev_e.span, s, (void **)&dev));
  ASSERT_OK(ops->memcpy_async(b, dev, stage, l.dev_e.span, s));
  uint8_t *slab = registered_slab(b, l.host_e.span);
  memset(slab, SENTINEL, l.host_e.span);
  spw_copy_desc_t *d = descs_for(&l.host_e, slab, &l.dev_e, dev);
  ASSERT_OK(ops->stream_sync(b, s));
  timed_batch_copy(b, &l, d, SPW_COPY_D2H, s);
  check_extents(slab, &l.host_e, 21, "D2H slab");

  ASSERT_OK(ops->free_async(b, dev, s));
  ASSERT_OK(ops->stream_destroy(b, s));
  free_slab(b, slab, l.host_e.span);
  free(d);
  free(stage);
  batch_layout_free(&l);
}

static void test_copy_batch_h2d_3000_buffers(void) {
  spw_backend_t *b = be;
  batch_layout_t l = batch_layout(0x4242);
  spw_stream_t s;
  ASSERT_OK(ops->stream_create(b, &s));
  uint8_t *slab = registered_slab(b, l.host_e.span);
  fill_extents(slab, &l.host_e, 31);
  uint8_t *dev = NULL;
  ASSERT_OK(ops->alloc_async(b, l.dev_e.span, s, (void **)&dev));
  ASSERT_EQ(cudaMemsetAsync(dev, SENTINEL, l.dev_e.span, s), cudaSuccess);
  spw_copy_desc_t *d = descs_for(&l.dev_e, dev, &l.host_e, slab);
  ASSERT_OK(ops->stream_sync(b, s));
  timed_batch_copy(b, &l, d, SPW_COPY_H2D, s);

  uint8_t *back = malloc(l.dev_e.span);
  ASSERT_TRUE(back != NULL);
  ASSERT_OK(ops->memcpy_async(b, back, dev, l.dev_e.span, s));
  ASSERT_OK(ops->free_async(b, dev, s));
  ASSERT_OK(ops->stream_sync(b, s));
  check_extents(back, &l.dev_e, 31, "H2D device");

  ASSERT_OK(ops->stream_destroy(b, s));
  free_slab(b, slab, l.host_e.span);
  free(back);
  free(d);
  batch_layout_free(&l);
}

/* Sends n buffers laid out as src_e (host) to dev_e (device) in one H2D batch, then to
 * dst_e (host) in one D2H batch, on a new stream (given a stage of `stage` bytes unless 0),
 * and checks both copies: each buffer's pattern, and the sentinel between buffers. */
static void round_trip(spw_backend_t *b, const extents_t *src_e, const extents_t *dev_e,
                       const extents_t *dst_e, size_t n, uint64_t seed, size_t stage) {
  spw_stream_t s;
  ASSERT_OK(ops->stream_create(b, &s));
  if (stage) ASSERT_OK(ops->stream_stage(b, s, stage));
  uint8_t *src = registered_slab(b, src_e->span), *dst = registered_slab(b, dst_e->span);
  fill_extents(src, src_e, seed);
  memset(dst, SENTINEL, dst_e->span);
  uint8_t *dev = NULL;
  ASSERT_OK(ops->alloc_async(b, dev_e->span, s, (void **)&dev));
  ASSERT_EQ(cudaMemsetAsync(dev, SENTINEL, dev_e->span, s), cudaSuccess);
  spw_copy_desc_t *in = descs_for(dev_e, dev, src_e, src);
  spw_copy_desc_t *out = descs_for(dst_e, dst, dev_e, dev);
  ASSERT_OK(ops->copy_batch_async(b, in, n, SPW_COPY_H2D, s));
  ASSERT_OK(ops->copy_batch_async(b, out, n, SPW_COPY_D2H, s));
  uint8_t *back = malloc(dev_e->span);
  ASSERT_TRUE(back != NULL);
  ASSERT_OK(ops->memcpy_async(b, back, dev, dev_e->span, s));
  ASSERT_OK(ops->free_async(b, dev, s));
  ASSERT_OK(ops->stream_sync(b, s));
  check_extents(back, dev_e, seed, "device");
  check_extents(dst, dst_e, seed, "host");
  ASSERT_OK(ops->stream_destroy(b, s));
  free_slab(b, src, src_e->span);
  free_slab(b, dst, dst_e->span);
  free(back);
  free(in);
  free(out);
}

/* Buffers at any byte offset on both sides (shared alignment mod 16, 8, 4, or none) arrive
 * intact through H2D then D2H, and nothing around them is touched. */
static void test_copy_batch_any_alignment_round_trip(void) {
  spw_backend_t *b = be;
  enum { N = 600 };
  uint64_t rng = 0xA11A;
  size_t *size = random_sizes(N, 300 * KiB, &rng);
  extents_t src_e = place(size, N, 4096, 64, 64, &rng);
  extents_t dev_e = place(size, N, 256, 64, 64, &rng);
  extents_t dst_e = place(size, N, 4096, 64, 64, &rng);
  round_trip(b, &src_e, &dev_e, &dst_e, N, 41, 0);
  free(src_e.off);
  free(dev_e.off);
  free(dst_e.off);
  free(size);
}

/* On a stream with a stage, runs of small buffers whose host sides lie back to back cross
 * in one transfer each (several when a run is larger than the stage), the others as
 * without one: buffers of 1 B .. 2 MiB, host extents back to back (align 1, no gap), then
 * apart, arrive intact through H2D then D2H, and nothing around them is touched. */
static void test_copy_batch_through_a_stage_round_trip(void) {
  spw_backend_t *b = be;
  enum { N = 900 };
  for (int apart = 0; apart <= 1; apart++) {
    uint64_t rng = 0x57A6 + (uint64_t)apart;
    size_t *size = random_sizes(N, apart ? 300 * KiB : 2 * MiB, &rng);
    extents_t src_e = place(size, N, apart ? 4096 : 1, apart ? 64 : 0, 0, &rng);
    extents_t dev_e = place(size, N, 256, 64, 0, &rng);
    extents_t dst_e = place(size, N, apart ? 4096 : 1, apart ? 64 : 0, 0, &rng);
    round_trip(b, &src_e, &dev_e, &dst_e, N, 51, 64 * KiB);
    free(src_e.off);
    free(dev_e.off);
    free(dst_e.off);
    free(size);
  }
}

/* A stage is given only to a stream the backend made, and once. */
static void test_a_stage_is_for_a_stream_the_backend_made(void) {
  spw_backend_t *b = be;
  spw_stream_t s;
  ASSERT_OK(ops->stream_create(b, &s));
  ASSERT_STATUS(ops->stream_stage(b, NULL, 4096), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(ops->stream_stage(b, s, 0), SPW_ERR_INVALID_ARG);
  cudaStream_t other;
  ASSERT_EQ(cudaStreamCreate(&other), cudaSuccess);
  ASSERT_STATUS(ops->stream_stage(b, other, 4096), SPW_ERR_INVALID_STREAM);
  ASSERT_OK(ops->stream_stage(b, s, 4096));
  ASSERT_STATUS(ops->stream_stage(b, s, 4096), SPW_ERR_BUSY);
  ASSERT_OK(ops->stream_destroy(b, s));
  ASSERT_EQ(cudaStreamDestroy(other), cudaSuccess);
}

static void test_event_never_recorded_is_complete(void) {
  spw_backend_t *b = be;
  spw_bevent_t *e = NULL;
  ASSERT_OK(ops->event_create(b, &e));
  ASSERT_OK(ops->event_query(b, e));
  ASSERT_OK(ops->event_sync(b, e));
  ops->event_destroy(b, e);
}

static void test_event_query_not_ready_until_host_func_returns(void) {
  spw_backend_t *b = be;
  gate_t g;
  gate_init(&g);
  spw_stream_t s;
  ASSERT_OK(ops->stream_create(b, &s));
  spw_bevent_t *e = NULL;
  ASSERT_OK(ops->event_create(b, &e));
  ASSERT_OK(ops->launch_host_func(b, s, gate_wait_fn, &g));
  ASSERT_OK(ops->event_record(b, e, s));
  sleep_ms(20);
  ASSERT_STATUS(ops->event_query(b, e), SPW_ERR_NOT_READY);
  gate_open(&g);
  ASSERT_OK(ops->event_sync(b, e));
  ASSERT_OK(ops->event_query(b, e));
  ops->event_destroy(b, e);
  ASSERT_OK(ops->stream_destroy(b, s));
  gate_fini(&g);
}

typedef struct record_on_thread {
  spw_bevent_t *e;
  spw_stream_t s;
  PFN_cuCtxGetCurrent_v4000 ctx_get_current; /* looked up on the main thread */
  int had_context;                           /* before the record, after cudaGetDevice */
  int status;
} record_on_thread_t;

static void *record_fn(void *arg) {
  record_on_thread_t *r = arg;
  /* What the backend's record does first (use_device), then whether that left a context
   * current: where it did not, the driver's cuEventRecord alone would fail here. */
  int dev = -1;
  CUcontext ctx = NULL;
  (void)cudaGetDevice(&dev);
  r->had_context = r->ctx_get_current(&ctx) == CUDA_SUCCESS && ctx != NULL;
  r->status = ops->event_record(be, r->e, r->s);
  return NULL;
}

/* Events are recorded through the driver API, which needs a current context: a thread whose
 * first CUDA call is the record (an application thread that acquires before anything else)
 * must still record it, behind the work already on the stream, and no error is reported. */
static void test_an_event_records_on_a_thread_that_made_no_cuda_call(void) {
  spw_backend_t *b = be;
  gate_t g;
  gate_init(&g);
  spw_stream_t s;
  ASSERT_OK(ops->stream_create(b, &s));
  record_on_thread_t r = {.s = s, .status = -1};
  void *fn = NULL;
  enum cudaDriverEntryPointQueryResult q;
  ASSERT_TRUE(cudaGetDriverEntryPointByVersion("cuCtxGetCurrent", &fn, 12000, cudaEnableDefault,
                                               &q) == cudaSuccess && fn != NULL);
  memcpy(&r.ctx_get_current, &fn, sizeof fn);
  ASSERT_OK(ops->event_create(b, &r.e));
  ASSERT_OK(ops->launch_host_func(b, s, gate_wait_fn, &g));
  const int reports = sink.calls;
  pthread_t t;
  ASSERT_EQ(pthread_create(&t, NULL, record_fn, &r), 0);
  ASSERT_EQ(pthread_join(t, NULL), 0);
  ASSERT_OK(r.status);
  ASSERT_EQ(sink.calls, reports);
  printf("  the thread had %s\n", r.had_context ? "a current context (the driver recorded it)"
                                                : "no current context (the runtime recorded it)");
  sleep_ms(20);
  ASSERT_STATUS(ops->event_query(b, r.e), SPW_ERR_NOT_READY);
  gate_open(&g);
  ASSERT_OK(ops->event_sync(b, r.e));
  ops->event_destroy(b, r.e);
  ASSERT_OK(ops->stream_destroy(b, s));
  gate_fini(&g);
}

/* Stream b waits on an event of stream a, which a host function holds back: b's copy must
 * not land before the gate opens. (A copy, not a host function, on b: CUDA may run all host
 * functions on one thread, which would order them without any wait.) */
static void test_stream_wait_event_orders_streams(void) {
  spw_backend_t *b = be;
  gate_t g;
  gate_init(&g);
  spw_stream_t sa, sb;
  ASSERT_OK(ops->stream_create(b, &sa));
  ASSERT_OK(ops->stream_create(b, &sb));
  const size_t n = 4096;
  uint8_t *host = registered_slab(b, n);
  uint8_t *pattern = malloc(n);
  ASSERT_TRUE(pattern != NULL);
  test_fill(pattern, n, 51);
  void *dev = NULL;
  ASSERT_OK(ops->alloc_async(b, n, sb, &dev));
  ASSERT_OK(ops->memcpy_async(b, dev, pattern, n, sb));
  ASSERT_OK(ops->stream_sync(b, sb));

  spw_bevent_t *ea = NULL, *eb = NULL;
  ASSERT_OK(ops->event_create(b, &ea));
  ASSERT_OK(ops->event_create(b, &eb));
  ASSERT_OK(ops->launch_host_func(b, sa, gate_wait_fn, &g));
  ASSERT_OK(ops->event_record(b, ea, sa));
  ASSERT_OK(ops->stream_wait_event(b, sb, ea));
  ASSERT_OK(ops->memcpy_async(b, host, dev, n, sb));
  ASSERT_OK(ops->event_record(b, eb, sb));
  sleep_ms(50);
  ASSERT_STATUS(ops->event_query(b, eb), SPW_ERR_NOT_READY);
  ASSERT_EQ(((volatile uint8_t *)host)[0], 0);
  gate_open(&g);
  ASSERT_OK(ops->stream_sync(b, sb));
  ASSERT_OK(ops->event_query(b, ea));
  ASSERT_UEQ(test_first_mismatch(host, n, 51), (size_t)-1);

  ASSERT_OK(ops->free_async(b, dev, sb));
  ops->event_destroy(b, ea);
  ops->event_destroy(b, eb);
  ASSERT_OK(ops->stream_destroy(b, sa));
  ASSERT_OK(ops->stream_destroy(b, sb));
  free_slab(b, host, n);
  free(pattern);
  gate_fini(&g);
}

static void test_alloc_beyond_device_is_out_of_memory(void) {
  spw_backend_t *b = be;
  sink_t *k = &sink;
  size_t total = 0;
  ASSERT_OK(ops->mem_info(b, NULL, &total));
  spw_stream_t s;
  ASSERT_OK(ops->stream_create(b, &s));
  int calls = k->calls;
  void *p = NULL;
  ASSERT_STATUS(ops->alloc_async(b, 2 * total, s, &p), SPW_ERR_OUT_OF_MEMORY);
  ASSERT_TRUE(p == NULL);
  ASSERT_EQ(k->calls, calls + 1);
  ASSERT_EQ(strcmp(k->name, "cudaErrorMemoryAllocation"), 0);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess); /* cleared: later calls are not poisoned */
  ASSERT_OK(ops->alloc_async(b, MiB, s, &p));
  ASSERT_TRUE(p != NULL);
  ASSERT_OK(ops->free_async(b, p, s));
  ASSERT_OK(ops->stream_sync(b, s));
  ASSERT_OK(ops->stream_destroy(b, s));
  ASSERT_EQ(k->calls, calls + 1);
}

static void test_create_with_missing_device_is_cuda_error(void) {
  int count = 0;
  ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  sink_t k = {.calls = 0};
  ASSERT_EQ(pthread_mutex_init(&k.mu, NULL), 0);
  spw_backend_params_t p = {.device = count, .on_error = sink_fn, .err_ctx = &k};
  spw_backend_t *b = NULL;
  ASSERT_STATUS(ops->create(&p, &b), SPW_ERR_CUDA);
  ASSERT_TRUE(b == NULL);
  ASSERT_EQ(k.calls, 1);
  ASSERT_EQ(strcmp(k.name, "cudaErrorInvalidDevice"), 0);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  pthread_mutex_destroy(&k.mu);
}

/* One backend for every test, as an application would have: the error sink counts what
 * reaches it, and only the one refused allocation may. */
static void open_backend(void) {
  ASSERT_EQ(pthread_mutex_init(&sink.mu, NULL), 0);
  spw_backend_params_t p = {.device = 0, .on_error = sink_fn, .err_ctx = &sink};
  int s = ops->create(&p, &be);
  TEST_SKIP_IF(s == SPW_ERR_NO_DEVICE, "no CUDA device on this machine");
  ASSERT_OK(s);
  ASSERT_EQ(sink.calls, 0);
}

static void close_backend(void) {
  ASSERT_LE(sink.calls, 1); /* the refused allocation, nothing else */
  ops->destroy(be);
  pthread_mutex_destroy(&sink.mu);
}

static const spw_test_t tests[] = {
    TEST(test_alloc_free_round_trip),
    TEST(test_memcpy_async_round_trip),
    TEST(test_copy_batch_d2h_3000_buffers),
    TEST(test_copy_batch_h2d_3000_buffers),
    TEST(test_copy_batch_any_alignment_round_trip),
    TEST(test_copy_batch_through_a_stage_round_trip),
    TEST(test_a_stage_is_for_a_stream_the_backend_made),
    TEST(test_event_never_recorded_is_complete),
    TEST(test_event_query_not_ready_until_host_func_returns),
    TEST(test_an_event_records_on_a_thread_that_made_no_cuda_call),
    TEST(test_stream_wait_event_orders_streams),
    TEST(test_alloc_beyond_device_is_out_of_memory),
    TEST(test_freed_memory_stays_cached_until_trim),
    TEST(test_create_with_missing_device_is_cuda_error),
};
TEST_MAIN_WITH(tests, open_backend, close_backend)

#endif /* SPW_HAVE_CUDA */
