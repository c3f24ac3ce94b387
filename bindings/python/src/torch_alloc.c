/* SPDX-License-Identifier: Apache-2.0 */
/* torch_alloc.c: libspillway_torch.so, the allocator that PyTorch's CUDAPluggableAllocator
 * loads (spillway/torch.py). PyTorch calls
 *
 *   void *spw_torch_alloc(ssize_t size, int device, cudaStream_t stream);
 *   void  spw_torch_free(void *ptr, ssize_t size, int device, cudaStream_t stream);
 *
 * (four arguments for free: what PyTorch calls, whatever its docstring says).
 * spw_torch_alloc returns NULL on failure, which is right for a torch.cuda.MemPool: the
 * caching allocator over it raises torch.OutOfMemoryError. PyTorch's allocator swap
 * (change_current_allocator) does not check for NULL and would hand out a tensor at
 * address 0, so install() uses spw_torch_alloc_or_throw (torch_throw.cpp), which throws a
 * C++ exception that PyTorch turns into a Python RuntimeError. Each device's
 * runtime is the process's shared one, registered from Python by spw_torch_set_runtime
 * together with the extension's table of Spillway calls (capi.h says why a table). This
 * library links no Spillway code and no Python: PyTorch calls it from any thread, usually
 * with the GIL released, and it never takes the GIL.
 *
 * Memory: every allocation is a Spillway buffer, allocated stream-ordered on PyTorch's
 * stream (so it counts against the budget, and deferrable buffers are spilled to make room)
 * as owner SPWPY_OWNER_TORCH (named "torch" when the runtime is registered, so the trace and
 * the stats summary say it is PyTorch's), and locked on the runtime's exposure stream, which only the Python package's allocators
 * use, so it stays resident and in place while PyTorch holds the pointer. A free moves the
 * lock to PyTorch's stream and releases it once that stream passes the free, so kernels
 * PyTorch queued before it still run on valid memory; nothing blocks.
 *
 * Invariants: the pointer map holds exactly the live allocations; a pointer this library did
 * not hand out, or hands back twice, is counted (`unknown_frees`) and ignored. Nothing here
 * aborts: a failed allocation returns NULL, and PyTorch raises its out-of-memory error.
 *
 * Locks: `g_rt_lock` (a reader-writer lock) guards the registrations: allocations and frees
 * hold it for reading across their Spillway calls, spw_torch_set_runtime for writing, so a
 * runtime is never unregistered while a call is using it. `g_map_lock` (a mutex) guards the
 * pointer map and is taken inside `g_rt_lock`, never around a Spillway call. */
#define _POSIX_C_SOURCE 200809L /* pthread_rwlock_t, ssize_t under -std=c11 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include "capi.h"

#define EXPORT __attribute__((visibility("default")))
#define MAX_DEVICES 64

typedef struct device_slot {
  spw_runtime_t *rt; /* NULL: not registered */
  spw_stream_t expose;
  /* Counters, read by spw_torch_usage while calls run. */
  _Atomic uint64_t live, live_bytes, allocs, alloc_bytes, failures, unknown_frees;
  _Atomic int last_status; /* the status of the last failed allocation */
} device_slot_t;

static pthread_rwlock_t g_rt_lock = PTHREAD_RWLOCK_INITIALIZER;
static const spwpy_capi_t *g_api; /* the same table for every device */
static device_slot_t g_slots[MAX_DEVICES];
static atomic_int g_stopped; /* set at interpreter exit: nothing is called any more */

/* ---- the pointer map: open hashing with chains, grown at load 1 ------------------------ */
typedef struct entry {
  struct entry *next;
  uintptr_t ptr;
  spw_buf_t h;
  size_t size;
  int device;
} entry_t;

static pthread_mutex_t g_map_lock = PTHREAD_MUTEX_INITIALIZER;
static entry_t **g_buckets;
static size_t g_nbuckets, g_count;

static size_t bucket_of(uintptr_t p, size_t n) {
  uint64_t x = (uint64_t)p;
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL; /* splitmix's finalizer: device pointers share low bits */
  x ^= x >> 33;
  return (size_t)(x & (n - 1));
}

/* Doubles the table; on failure the old one stays (chains just get longer). */
static void map_grow(void) {
  size_t n = g_nbuckets ? g_nbuckets * 2 : 1024;
  entry_t **b = calloc(n, sizeof *b);
  if (!b) return;
  for (size_t i = 0; i < g_nbuckets; i++) {
    entry_t *e = g_buckets[i];
    while (e) {
      entry_t *next = e->next;
      size_t k = bucket_of(e->ptr, n);
      e->next = b[k];
      b[k] = e;
      e = next;
    }
  }
  free(g_buckets);
  g_buckets = b;
  g_nbuckets = n;
}

/* 0, or -1 if no memory for the entry. */
static int map_insert(entry_t *e) {
  pthread_mutex_lock(&g_map_lock);
  if (g_count >= g_nbuckets) map_grow();
  if (!g_nbuckets) {
    pthread_mutex_unlock(&g_map_lock);
    return -1;
  }
  size_t k = bucket_of(e->ptr, g_nbuckets);
  e->next = g_buckets[k];
  g_buckets[k] = e;
  g_count++;
  pthread_mutex_unlock(&g_map_lock);
  return 0;
}

/* Removes and returns the entry of `ptr`, or NULL if the map does not hold it. */
static entry_t *map_remove(uintptr_t ptr) {
  entry_t *found = NULL;
  pthread_mutex_lock(&g_map_lock);
  if (g_nbuckets) {
    entry_t **pp = &g_buckets[bucket_of(ptr, g_nbuckets)];
    while (*pp && (*pp)->ptr != ptr) pp = &(*pp)->next;
    if (*pp) {
      found = *pp;
      *pp = found->next;
      g_count--;
    }
  }
  pthread_mutex_unlock(&g_map_lock);
  return found;
}

static size_t map_count_device(int device) {
  size_t n = 0;
  pthread_mutex_lock(&g_map_lock);
  for (size_t i = 0; i < g_nbuckets; i++)
    for (entry_t *e = g_buckets[i]; e; e = e->next) n += e->device == device;
  pthread_mutex_unlock(&g_map_lock);
  return n;
}

/* ---- Spillway calls on PyTorch's streams ------------------------------------------------ */

/* PyTorch's streams are the application's: on the first use of one, the runtime is told of
 * it (spw_stream_register) and the call made again, as the extension does for Python calls. */
static int adopt(device_slot_t *d, spw_stream_t s, int st) {
  return st == SPW_ERR_INVALID_STREAM && s != NULL && g_api->stream_register(d->rt, s) == SPW_OK;
}

static int alloc_on(device_slot_t *d, size_t n, spw_stream_t s, spw_buf_t *h) {
  const unsigned flags = SPW_ALLOC_ARENA | SPW_ALLOC_OWNER(SPWPY_OWNER_TORCH);
  int st = g_api->alloc_ex(d->rt, n, s, flags, h);
  if (adopt(d, s, st)) st = g_api->alloc_ex(d->rt, n, s, flags, h);
  return st;
}

static int try_lock_on(device_slot_t *d, spw_buf_t h, spw_stream_t s) {
  void *p;
  int st = g_api->acquire(d->rt, h, s, SPW_ACQUIRE_TRY, &p);
  if (adopt(d, s, st)) st = g_api->acquire(d->rt, h, s, SPW_ACQUIRE_TRY, &p);
  return st;
}

static void fail(device_slot_t *d, int st) {
  atomic_fetch_add(&d->failures, 1);
  atomic_store(&d->last_status, st);
}

/* The allocation, with its status in *status and, if `why` is not NULL, the reason in words
 * (for spw_torch_alloc_or_throw, torch_throw.cpp). Not exported from the library. */
void *spw__torch_alloc_status(ssize_t size, int device, spw_stream_t stream, int *status,
                              char *why, size_t whylen) {
  *status = SPW_OK;
  if (why && whylen) why[0] = 0;
  if (size <= 0) return NULL; /* no memory, and no failure: PyTorch's empty tensors */
  if (device < 0 || device >= MAX_DEVICES || atomic_load(&g_stopped)) {
    *status = SPW_ERR_INVALID_ARG;
    if (why) snprintf(why, whylen, "device %d is not served (0 to %d), or the process is exiting",
                      device, MAX_DEVICES - 1);
    return NULL;
  }
  device_slot_t *d = &g_slots[device];
  entry_t *e = malloc(sizeof *e);
  if (!e) {
    *status = SPW_ERR_SYSTEM;
    if (why) snprintf(why, whylen, "no host memory for the pointer map");
    return NULL;
  }
  void *p = NULL;
  int st = SPW_OK;
  pthread_rwlock_rdlock(&g_rt_lock);
  if (!d->rt) {
    st = SPW_ERR_INVALID_ARG;
    if (why) snprintf(why, whylen, "no Spillway runtime is registered for device %d "
                      "(spillway.torch.install(devices=[...]))", device);
    goto out;
  }
  spw_buf_t h = SPW_BUF_NULL;
  st = alloc_on(d, (size_t)size, stream, &h);
  if (st == SPW_OK) {
    st = g_api->acquire(d->rt, h, d->expose, 0, &p);
    if (st != SPW_OK) (void)g_api->free(d->rt, h);
  }
  if (st != SPW_OK) {
    p = NULL;
    /* Read on this thread, right after the failing call: the runtime keeps it per thread. */
    if (why) snprintf(why, whylen, "%s: %s", g_api->err_name(st), g_api->last_error(d->rt));
    goto out;
  }
  *e = (entry_t){NULL, (uintptr_t)p, h, (size_t)size, device};
  if (map_insert(e) < 0) {
    /* Nothing has used the memory yet: releasing at once is safe. */
    (void)g_api->release(d->rt, h, d->expose);
    (void)g_api->free(d->rt, h);
    p = NULL;
    st = SPW_ERR_SYSTEM;
    if (why) snprintf(why, whylen, "no host memory for the pointer map");
    goto out;
  }
  e = NULL;
  atomic_fetch_add(&d->live, 1);
  atomic_fetch_add(&d->live_bytes, (uint64_t)size);
  atomic_fetch_add(&d->allocs, 1);
  atomic_fetch_add(&d->alloc_bytes, (uint64_t)size);
out:
  if (st != SPW_OK) fail(d, st);
  pthread_rwlock_unlock(&g_rt_lock);
  free(e);
  *status = st;
  return p;
}

/* For torch.cuda.MemPool (spillway.torch.mem_pool): PyTorch's caching allocator treats NULL
 * as out of memory (it frees cached blocks, retries, then raises torch.OutOfMemoryError). */
EXPORT void *spw_torch_alloc(ssize_t size, int device, spw_stream_t stream) {
  int st;
  return spw__torch_alloc_status(size, device, stream, &st, NULL, 0);
}

EXPORT void spw_torch_free(void *ptr, ssize_t size, int device, spw_stream_t stream) {
  (void)size; /* the map has the size that was allocated */
  (void)device;
  if (!ptr || atomic_load(&g_stopped)) return; /* at exit the runtimes go to the OS */
  pthread_rwlock_rdlock(&g_rt_lock);
  entry_t *e = map_remove((uintptr_t)ptr);
  if (!e) {
    if (device >= 0 && device < MAX_DEVICES) atomic_fetch_add(&g_slots[device].unknown_frees, 1);
    pthread_rwlock_unlock(&g_rt_lock);
    return;
  }
  device_slot_t *d = &g_slots[e->device];
  if (d->rt) {
    /* Work PyTorch queued on `stream` may still use the memory: hold it with a lock of that
     * stream and release that lock once the stream gets there. */
    int st = try_lock_on(d, e->h, stream);
    (void)g_api->release(d->rt, e->h, d->expose);
    (void)g_api->free(d->rt, e->h);
    if (st == SPW_OK) (void)g_api->release_n_async(d->rt, &e->h, 1, stream);
  }
  atomic_fetch_sub(&d->live, 1);
  atomic_fetch_sub(&d->live_bytes, (uint64_t)e->size);
  pthread_rwlock_unlock(&g_rt_lock);
  free(e);
}

/* Registers the runtime of `device` and the exposure stream its allocations are locked on
 * (rt NULL unregisters it), and names this library's owner in it ("torch"). Returns 0;
 * SPW_ERR_INVALID_ARG for a device outside [0, 64) or a table older than this library's;
 * SPW_ERR_BUSY if the device has live allocations (the registration is kept: their memory
 * belongs to that runtime). Waits for running allocations and frees; call it with the GIL
 * released (ctypes does). */
EXPORT int spw_torch_set_runtime(int device, const spwpy_capi_t *api, spw_runtime_t *rt,
                                 spw_stream_t expose) {
  if (device < 0 || device >= MAX_DEVICES) return SPW_ERR_INVALID_ARG;
  if (rt && (!api || api->struct_size < sizeof *api)) return SPW_ERR_INVALID_ARG;
  int st = SPW_OK;
  pthread_rwlock_wrlock(&g_rt_lock);
  device_slot_t *d = &g_slots[device];
  if (d->rt && d->rt != rt && map_count_device(device) != 0) {
    st = SPW_ERR_BUSY;
  } else {
    if (rt) g_api = api;
    d->rt = rt;
    d->expose = rt ? expose : NULL;
    if (rt) st = api->owner_name(rt, SPWPY_OWNER_TORCH, "torch");
  }
  pthread_rwlock_unlock(&g_rt_lock);
  return st;
}

/* Interpreter exit: from now on allocations fail and frees do nothing (the runtimes are
 * left to the operating system, as the extension leaves them). */
EXPORT void spw_torch_stop(void) { atomic_store(&g_stopped, 1); }

/* out[0..7): live allocations, live bytes, allocations, bytes allocated, failed
 * allocations, frees of unknown pointers, the status of the last failure, 1 if a runtime is
 * registered. Returns 0, or SPW_ERR_INVALID_ARG. */
EXPORT int spw_torch_usage(int device, int64_t out[7 + 1]) {
  if (device < 0 || device >= MAX_DEVICES || !out) return SPW_ERR_INVALID_ARG;
  device_slot_t *d = &g_slots[device];
  out[0] = (int64_t)atomic_load(&d->live);
  out[1] = (int64_t)atomic_load(&d->live_bytes);
  out[2] = (int64_t)atomic_load(&d->allocs);
  out[3] = (int64_t)atomic_load(&d->alloc_bytes);
  out[4] = (int64_t)atomic_load(&d->failures);
  out[5] = (int64_t)atomic_load(&d->unknown_frees);
  out[6] = atomic_load(&d->last_status);
  pthread_rwlock_rdlock(&g_rt_lock);
  out[7] = d->rt != NULL;
  pthread_rwlock_unlock(&g_rt_lock);
  return SPW_OK;
}
