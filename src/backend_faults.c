/* SPDX-License-Identifier: Apache-2.0 */
/* The fault shim: a backend that forwards every operation to the real one and makes chosen
 * operations fail on demand. The runtime always talks to the device through it, so the
 * tests that inject a failed copy, a refused allocation or a failed host registration run
 * exactly the error paths a real failure would, on both backends. A counter at zero (the
 * normal case) costs one relaxed load per forwarded call. */
#include <stdlib.h>

#include "runtime.h"

typedef struct shim {
  const spw_backend_ops_t *ops;
  spw_backend_t *b;
  spw_runtime_t *rt;
} shim_t;

#define SHIM(b) ((shim_t *)(void *)(b))

/* Takes one pending failure of kind f, if any. */
static int take(shim_t *s, spw_fault_t f) {
  _Atomic uint32_t *c = &s->rt->faults[f];
  uint32_t n = atomic_load_explicit(c, memory_order_relaxed);
  while (n > 0)
    if (atomic_compare_exchange_weak(c, &n, n - 1)) return 1;
  return 0;
}

static int injected(shim_t *s, int status) {
  spw__error_sink(s->rt, "injected", "fault injected through the backend seam");
  return status;
}

static int sh_create(const spw_backend_params_t *p, spw_backend_t **out) { return SPW_ERR_INTERNAL; }
static void sh_destroy(spw_backend_t *b) {
  shim_t *s = SHIM(b);
  s->ops->destroy(s->b);
  free(s);
}
static int sh_mem_info(spw_backend_t *b, size_t *f, size_t *t) {
  return SHIM(b)->ops->mem_info(SHIM(b)->b, f, t);
}
static int sh_alloc(spw_backend_t *b, size_t n, spw_stream_t st, void **out) {
  if (take(SHIM(b), SPW_FAULT_ALLOC)) return injected(SHIM(b), SPW_ERR_OUT_OF_MEMORY);
  return SHIM(b)->ops->alloc_async(SHIM(b)->b, n, st, out);
}
static int sh_free(spw_backend_t *b, void *p, spw_stream_t st) {
  return SHIM(b)->ops->free_async(SHIM(b)->b, p, st);
}
static int sh_trim(spw_backend_t *b) { return SHIM(b)->ops->trim(SHIM(b)->b); }
static spw_stream_t sh_default_stream(spw_backend_t *b) {
  return SHIM(b)->ops->default_stream(SHIM(b)->b);
}
static int sh_stream_create(spw_backend_t *b, spw_stream_t *out) {
  return SHIM(b)->ops->stream_create(SHIM(b)->b, out);
}
static int sh_stream_destroy(spw_backend_t *b, spw_stream_t st) {
  return SHIM(b)->ops->stream_destroy(SHIM(b)->b, st);
}
static int sh_stream_sync(spw_backend_t *b, spw_stream_t st) {
  return SHIM(b)->ops->stream_sync(SHIM(b)->b, st);
}
static int sh_event_create(spw_backend_t *b, spw_bevent_t **out) {
  return SHIM(b)->ops->event_create(SHIM(b)->b, out);
}
static void sh_event_destroy(spw_backend_t *b, spw_bevent_t *e) {
  SHIM(b)->ops->event_destroy(SHIM(b)->b, e);
}
static int sh_event_record(spw_backend_t *b, spw_bevent_t *e, spw_stream_t st) {
  return SHIM(b)->ops->event_record(SHIM(b)->b, e, st);
}
static int sh_event_query(spw_backend_t *b, spw_bevent_t *e) {
  return SHIM(b)->ops->event_query(SHIM(b)->b, e);
}
static int sh_event_sync(spw_backend_t *b, spw_bevent_t *e) {
  return SHIM(b)->ops->event_sync(SHIM(b)->b, e);
}
static int sh_stream_wait_event(spw_backend_t *b, spw_stream_t st, spw_bevent_t *e) {
  return SHIM(b)->ops->stream_wait_event(SHIM(b)->b, st, e);
}
static int sh_memcpy(spw_backend_t *b, void *d, const void *s, size_t n, spw_stream_t st) {
  if (take(SHIM(b), SPW_FAULT_COPY)) return injected(SHIM(b), SPW_ERR_CUDA);
  return SHIM(b)->ops->memcpy_async(SHIM(b)->b, d, s, n, st);
}
static int sh_copy_batch(spw_backend_t *b, const spw_copy_desc_t *d, size_t n, spw_copy_dir_t dir,
                         spw_stream_t st) {
  if (take(SHIM(b), SPW_FAULT_COPY)) return injected(SHIM(b), SPW_ERR_CUDA);
  return SHIM(b)->ops->copy_batch_async(SHIM(b)->b, d, n, dir, st);
}
static int sh_host_register(spw_backend_t *b, void *p, size_t n) {
  if (take(SHIM(b), SPW_FAULT_HOST_REGISTER)) return injected(SHIM(b), SPW_ERR_CUDA);
  return SHIM(b)->ops->host_register(SHIM(b)->b, p, n);
}
static int sh_host_unregister(spw_backend_t *b, void *p) {
  return SHIM(b)->ops->host_unregister(SHIM(b)->b, p);
}
static int sh_launch_host_func(spw_backend_t *b, spw_stream_t st, spw_host_fn fn, void *arg) {
  return SHIM(b)->ops->launch_host_func(SHIM(b)->b, st, fn, arg);
}

static int sh_launch_kernel(spw_backend_t *b, spw_stream_t st, const void *func, spw_dim3_t grid,
                            spw_dim3_t block, size_t shared, void **args, const size_t *sizes,
                            size_t nargs) {
  if (take(SHIM(b), SPW_FAULT_LAUNCH)) return injected(SHIM(b), SPW_ERR_CUDA);
  return SHIM(b)->ops->launch_kernel(SHIM(b)->b, st, func, grid, block, shared, args, sizes,
                                     nargs);
}

static const spw_backend_ops_t shim_ops = {
    .name = "faults",
    .create = sh_create,
    .destroy = sh_destroy,
    .mem_info = sh_mem_info,
    .alloc_async = sh_alloc,
    .free_async = sh_free,
    .trim = sh_trim,
    .default_stream = sh_default_stream,
    .stream_create = sh_stream_create,
    .stream_destroy = sh_stream_destroy,
    .stream_sync = sh_stream_sync,
    .event_create = sh_event_create,
    .event_destroy = sh_event_destroy,
    .event_record = sh_event_record,
    .event_query = sh_event_query,
    .event_sync = sh_event_sync,
    .stream_wait_event = sh_stream_wait_event,
    .memcpy_async = sh_memcpy,
    .copy_batch_async = sh_copy_batch,
    .host_register = sh_host_register,
    .host_unregister = sh_host_unregister,
    .launch_host_func = sh_launch_host_func,
    .launch_kernel = sh_launch_kernel,
};

int spw__faults_wrap(spw_runtime_t *rt, const spw_backend_ops_t *inner, spw_backend_t *inner_b,
                     const spw_backend_ops_t **ops_out, spw_backend_t **b_out) {
  shim_t *s = malloc(sizeof *s);
  if (!s) return SPW_ERR_SYSTEM;
  s->ops = inner;
  s->b = inner_b;
  s->rt = rt;
  *ops_out = &shim_ops;
  *b_out = (spw_backend_t *)(void *)s;
  return SPW_OK;
}

void spw__inject_fault(spw_runtime_t *rt, spw_fault_t f, uint32_t count) {
  if ((unsigned)f < SPW_FAULT_COUNT_) atomic_store(&rt->faults[f], count);
}
