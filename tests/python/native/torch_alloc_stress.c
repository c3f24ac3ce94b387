/* SPDX-License-Identifier: Apache-2.0 */
/* torch_alloc_stress.c: the PyTorch allocator library's own logic (bindings/python/src/
 * torch_alloc.c: the pointer map, the registration lock, the counters) under threads, built
 * together with it under ThreadSanitizer or AddressSanitizer by test_process_host.py. The
 * Spillway calls are a fake table (capi.h): what is checked here is the library's
 * bookkeeping, not Spillway's (the Python tests run it against a real runtime).
 *
 * 8 threads allocate and free 20000 times each, sizes and streams varying, while another
 * thread re-registers the runtime and reads the counters; frees of unknown pointers and
 * twice-freed pointers are mixed in. At the end: every allocation freed, every fake buffer
 * freed exactly once, every allocation tagged with the library's owner and asking for the
 * arenas, every naming of it "torch", the counters consistent. Exit 0 on success. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>

#include "capi.h"

void *spw_torch_alloc(ssize_t size, int device, spw_stream_t stream);
void spw_torch_free(void *ptr, ssize_t size, int device, spw_stream_t stream);
int spw_torch_set_runtime(int device, const spwpy_capi_t *api, spw_runtime_t *rt,
                          spw_stream_t expose);
int spw_torch_usage(int device, int64_t out[8]);

#define THREADS 8
#define ROUNDS 20000

static atomic_ullong next_handle = 1, live_buffers, frees;

static int f_alloc(spw_runtime_t *rt, size_t n, spw_stream_t s, spw_buf_t *out) {
  (void)rt, (void)n, (void)s;
  *out = atomic_fetch_add(&next_handle, 1);
  atomic_fetch_add(&live_buffers, 1);
  return SPW_OK;
}
static int f_free(spw_runtime_t *rt, spw_buf_t b) {
  (void)rt, (void)b;
  atomic_fetch_sub(&live_buffers, 1);
  atomic_fetch_add(&frees, 1);
  return SPW_OK;
}
static int f_acquire(spw_runtime_t *rt, spw_buf_t b, spw_stream_t s, unsigned f, void **p) {
  (void)rt, (void)s, (void)f;
  *p = (void *)(uintptr_t)(b << 12);
  return SPW_OK;
}
static int f_release(spw_runtime_t *rt, spw_buf_t b, spw_stream_t s) {
  (void)rt, (void)b, (void)s;
  return SPW_OK;
}
static int f_release_n(spw_runtime_t *rt, const spw_buf_t *b, size_t n, spw_stream_t s) {
  (void)rt, (void)b, (void)n, (void)s;
  return SPW_OK;
}
static int f_register(spw_runtime_t *rt, spw_stream_t s) {
  (void)rt, (void)s;
  return SPW_OK;
}
/* The library allocates as its owner and names it at each registration. */
static atomic_ullong bad_flags, bad_names, namings;
static int f_alloc_ex(spw_runtime_t *rt, size_t n, spw_stream_t s, unsigned flags,
                      spw_buf_t *out) {
  if (flags != (SPW_ALLOC_ARENA | SPW_ALLOC_OWNER(SPWPY_OWNER_TORCH)))
    atomic_fetch_add(&bad_flags, 1);
  return f_alloc(rt, n, s, out);
}
static int f_owner_name(spw_runtime_t *rt, unsigned id, const char *name) {
  (void)rt;
  if (id != SPWPY_OWNER_TORCH || strcmp(name, "torch") != 0) atomic_fetch_add(&bad_names, 1);
  atomic_fetch_add(&namings, 1);
  return SPW_OK;
}
static const char *f_name(int st) { return st ? "SPW_ERR_x" : "SPW_OK"; }
static const char *f_last(const spw_runtime_t *rt) {
  (void)rt;
  return "";
}

static const spwpy_capi_t api = {sizeof api,  f_alloc,    f_free,  f_acquire,  f_release,
                                 f_release_n, f_register, f_name,  f_last,     f_alloc_ex,
                                 f_owner_name};
static int fake_runtime; /* any address: the fake calls never read it */
static atomic_int done;

static void *worker(void *arg) {
  uintptr_t id = (uintptr_t)arg;
  for (int i = 0; i < ROUNDS; i++) {
    ssize_t size = (ssize_t)((i % 7) + 1) * 256;
    spw_stream_t s = (spw_stream_t)(uintptr_t)(id + 16);
    void *p = spw_torch_alloc(size, 0, s);
    if (!p) return (void *)1;
    spw_torch_free(p, size, 0, s);
    if (i % 1000 == 0) {
      spw_torch_free(p, size, 0, s);                    /* twice: ignored */
      spw_torch_free((void *)(uintptr_t)0x10, 1, 0, s); /* never allocated: ignored */
    }
  }
  return NULL;
}

static void *meddler(void *arg) {
  (void)arg;
  int64_t u[8];
  while (!atomic_load(&done)) {
    if (spw_torch_set_runtime(0, &api, (spw_runtime_t *)&fake_runtime, NULL) != SPW_OK)
      return (void *)1;
    if (spw_torch_usage(0, u) != SPW_OK || u[0] < 0) return (void *)1;
  }
  return NULL;
}

int main(void) {
  if (spw_torch_set_runtime(0, &api, (spw_runtime_t *)&fake_runtime, NULL) != SPW_OK) return 2;
  pthread_t t[THREADS], m;
  pthread_create(&m, NULL, meddler, NULL);
  for (uintptr_t i = 0; i < THREADS; i++) pthread_create(&t[i], NULL, worker, (void *)i);
  int bad = 0;
  for (int i = 0; i < THREADS; i++) {
    void *r;
    pthread_join(t[i], &r);
    bad |= r != NULL;
  }
  atomic_store(&done, 1);
  void *r;
  pthread_join(m, &r);
  bad |= r != NULL;
  int64_t u[8];
  spw_torch_usage(0, u);
  long long n = (long long)THREADS * ROUNDS;
  printf("live %lld, allocs %lld, unknown frees %lld, fake buffers live %llu, freed %llu\n",
         (long long)u[0], (long long)u[2], (long long)u[5],
         (unsigned long long)live_buffers, (unsigned long long)frees);
  printf("allocations not tagged torch's %llu, namings %s\n", (unsigned long long)bad_flags,
         namings > 0 && bad_names == 0 ? "all torch" : "wrong");
  if (bad || u[0] != 0 || u[1] != 0 || u[2] != n || u[5] != 2 * THREADS * (ROUNDS / 1000) ||
      live_buffers != 0 || frees != (unsigned long long)n || bad_flags != 0 || namings == 0 ||
      bad_names != 0)
    return 1;
  /* Unregistering with nothing live succeeds; the map is empty (ASan's leak check sees the
   * table itself as reachable through a static, which is what it is). */
  return spw_torch_set_runtime(0, NULL, NULL, NULL) == SPW_OK ? 0 : 3;
}
