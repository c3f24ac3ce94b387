/* SPDX-License-Identifier: Apache-2.0 */
/* The fault shim (see backend_faults.h). Each fault kind has one 64-bit word, operations
 * to skip in the high half and failures to give in the low half, consumed by CAS so that
 * concurrent callers agree on which call fails. */
#include "backend_faults.h"

#include <stdatomic.h>
#include <stdlib.h>

typedef struct hook {
  _Atomic(spw_fault_hook_fn) fn;
  void *_Atomic arg;
} hook_t;

typedef struct shim {
  const spw_backend_ops_t *ops;
  spw_backend_t *b;
  spw_error_sink_fn sink;
  void *sink_ctx;
  _Atomic uint64_t armed[SPW_FAULT_COUNT_];
  hook_t hooks[SPW_FAULT_COUNT_];
} shim_t;

#define SHIM(b) ((shim_t *)(void *)(b))
#define INNER(b) SHIM(b)->b

/* Runs the hook of `f`, then takes one armed failure of kind f, if any is due. */
static int fails(spw_backend_t *b, spw_fault_t f, spw_stream_t stream) {
  shim_t *s = SHIM(b);
  spw_fault_hook_fn fn = atomic_load_explicit(&s->hooks[f].fn, memory_order_acquire);
  if (fn) fn(atomic_load_explicit(&s->hooks[f].arg, memory_order_relaxed), f, stream);
  _Atomic uint64_t *w = &s->armed[f];
  uint64_t v = atomic_load_explicit(w, memory_order_relaxed);
  while (v != 0) {
    uint64_t skip = v >> 32, count = v & 0xFFFFFFFFu;
    uint64_t next = skip ? ((skip - 1) << 32) | count : count - 1;
    if (atomic_compare_exchange_weak(w, &v, next)) return skip == 0;
  }
  return 0;
}

static int injected(spw_backend_t *b, int status) {
  shim_t *s = SHIM(b);
  if (s->sink) s->sink(s->sink_ctx, "injected", "fault injected through the backend seam");
  return status;
}

#define FAIL_IF(f, stream, status)                                                           \
  do {                                                                                       \
    if (fails(b, (f), (stream))) return injected(b, (status));                              \
  } while (0)

static int sh_create(const spw_backend_params_t *p, spw_backend_t **out) {
  (void)p;
  (void)out;
  return SPW_ERR_INTERNAL; /* shims are made by spw__faults_wrap */
}
static void sh_destroy(spw_backend_t *b) {
  SHIM(b)->ops->destroy(INNER(b));
  free(SHIM(b));
}
static int sh_mem_info(spw_backend_t *b, size_t *f, size_t *t) {
  FAIL_IF(SPW_FAULT_MEM_INFO, NULL, SPW_ERR_CUDA);
  return SHIM(b)->ops->mem_info(INNER(b), f, t);
}
static int sh_alloc(spw_backend_t *b, size_t n, spw_stream_t st, void **out) {
  FAIL_IF(SPW_FAULT_ALLOC, st, SPW_ERR_OUT_OF_MEMORY);
  return SHIM(b)->ops->alloc_async(INNER(b), n, st, out);
}
static int sh_free(spw_backend_t *b, void *p, spw_stream_t st) {
  return SHIM(b)->ops->free_async(INNER(b), p, st);
}
static int sh_trim(spw_backend_t *b) { return SHIM(b)->ops->trim(INNER(b)); }
static spw_stream_t sh_default_stream(spw_backend_t *b) {
  return SHIM(b)->ops->default_stream(INNER(b));
}
static int sh_stream_create(spw_backend_t *b, spw_stream_t *out) {
  FAIL_IF(SPW_FAULT_STREAM_CREATE, NULL, SPW_ERR_CUDA);
  return SHIM(b)->ops->stream_create(INNER(b), out);
}
static int sh_stream_destroy(spw_backend_t *b, spw_stream_t st) {
  return SHIM(b)->ops->stream_destroy(INNER(b), st);
}
static int sh_stream_device(spw_backend_t *b, spw_stream_t st, int *device) {
  return SHIM(b)->ops->stream_device(INNER(b), st, device);
}
static int sh_stream_sync(spw_backend_t *b, spw_stream_t st) {
  FAIL_IF(SPW_FAULT_STREAM_SYNC, st, SPW_ERR_CUDA);
  return SHIM(b)->ops->stream_sync(INNER(b), st);
}
static int sh_event_create(spw_backend_t *b, spw_bevent_t **out) {
  FAIL_IF(SPW_FAULT_EVENT_CREATE, NULL, SPW_ERR_CUDA);
  return SHIM(b)->ops->event_create(INNER(b), out);
}
static void sh_event_destroy(spw_backend_t *b, spw_bevent_t *e) {
  SHIM(b)->ops->event_destroy(INNER(b), e);
}
static int sh_event_record(spw_backend_t *b, spw_bevent_t *e, spw_stream_t st) {
  FAIL_IF(SPW_FAULT_EVENT_RECORD, st, SPW_ERR_CUDA);
  return SHIM(b)->ops->event_record(INNER(b), e, st);
}
static int sh_event_query(spw_backend_t *b, spw_bevent_t *e) {
  FAIL_IF(SPW_FAULT_EVENT_QUERY, NULL, SPW_ERR_CUDA);
  return SHIM(b)->ops->event_query(INNER(b), e);
}
static int sh_event_sync(spw_backend_t *b, spw_bevent_t *e) {
  FAIL_IF(SPW_FAULT_EVENT_SYNC, NULL, SPW_ERR_CUDA);
  return SHIM(b)->ops->event_sync(INNER(b), e);
}
static int sh_stream_wait_event(spw_backend_t *b, spw_stream_t st, spw_bevent_t *e) {
  FAIL_IF(SPW_FAULT_STREAM_WAIT, st, SPW_ERR_CUDA);
  return SHIM(b)->ops->stream_wait_event(INNER(b), st, e);
}
static int sh_memcpy(spw_backend_t *b, void *d, const void *s, size_t n, spw_stream_t st) {
  FAIL_IF(SPW_FAULT_COPY, st, SPW_ERR_CUDA);
  return SHIM(b)->ops->memcpy_async(INNER(b), d, s, n, st);
}
static int sh_copy_batch(spw_backend_t *b, const spw_copy_desc_t *d, size_t n, spw_copy_dir_t dir,
                         spw_stream_t st) {
  FAIL_IF(SPW_FAULT_COPY, st, SPW_ERR_CUDA);
  return SHIM(b)->ops->copy_batch_async(INNER(b), d, n, dir, st);
}
static int sh_stream_stage(spw_backend_t *b, spw_stream_t st, size_t bytes) {
  const spw_backend_ops_t *in = SHIM(b)->ops;
  return in->stream_stage ? in->stream_stage(INNER(b), st, bytes) : SPW_ERR_UNSUPPORTED;
}
static int sh_host_register(spw_backend_t *b, void *p, size_t n) {
  FAIL_IF(SPW_FAULT_HOST_REGISTER, NULL, SPW_ERR_CUDA);
  return SHIM(b)->ops->host_register(INNER(b), p, n);
}
static int sh_host_unregister(spw_backend_t *b, void *p) {
  return SHIM(b)->ops->host_unregister(INNER(b), p);
}
static int sh_launch_host_func(spw_backend_t *b, spw_stream_t st, spw_host_fn fn, void *arg) {
  FAIL_IF(SPW_FAULT_HOST_FUNC, st, SPW_ERR_CUDA);
  return SHIM(b)->ops->launch_host_func(INNER(b), st, fn, arg);
}

static int sh_launch_kernel(spw_backend_t *b, spw_stream_t st, const void *func, spw_dim3_t grid,
                            spw_dim3_t block, size_t shared, void **args, const size_t *sizes,
                            size_t nargs) {
  FAIL_IF(SPW_FAULT_LAUNCH, st, SPW_ERR_CUDA);
  return SHIM(b)->ops->launch_kernel(INNER(b), st, func, grid, block, shared, args, sizes, nargs);
}

static int sh_graph_launch(spw_backend_t *b, spw_stream_t st, const void *graph_exec) {
  FAIL_IF(SPW_FAULT_LAUNCH, st, SPW_ERR_CUDA);
  return SHIM(b)->ops->graph_launch(INNER(b), st, graph_exec);
}

static int sh_vm_granularity(spw_backend_t *b, size_t *out) {
  if (!SHIM(b)->ops->vm_granularity) return SPW_ERR_UNSUPPORTED;
  return SHIM(b)->ops->vm_granularity(INNER(b), out);
}
static int sh_vm_reserve(spw_backend_t *b, size_t n, void **out) {
  return SHIM(b)->ops->vm_reserve(INNER(b), n, out);
}
static int sh_vm_free(spw_backend_t *b, void *va, size_t n) {
  return SHIM(b)->ops->vm_free(INNER(b), va, n);
}
static int sh_chunk_create(spw_backend_t *b, size_t n, uint64_t *out) {
  FAIL_IF(SPW_FAULT_ALLOC, NULL, SPW_ERR_OUT_OF_MEMORY);
  return SHIM(b)->ops->chunk_create(INNER(b), n, out);
}
static void sh_chunk_release(spw_backend_t *b, uint64_t c, size_t n) {
  SHIM(b)->ops->chunk_release(INNER(b), c, n);
}
static int sh_chunk_map(spw_backend_t *b, void *va, size_t n, uint64_t c) {
  return SHIM(b)->ops->chunk_map(INNER(b), va, n, c);
}
static int sh_chunk_unmap(spw_backend_t *b, void *va, size_t n) {
  return SHIM(b)->ops->chunk_unmap(INNER(b), va, n);
}
static int sh_chunk_export(spw_backend_t *b, uint64_t c, int *fd, uint64_t *off) {
  return SHIM(b)->ops->chunk_export(INNER(b), c, fd, off);
}
static int sh_chunk_import(spw_backend_t *b, int fd, uint64_t off, size_t n, uint64_t *c) {
  return SHIM(b)->ops->chunk_import(INNER(b), fd, off, n, c);
}

static int sh_peer_access(spw_backend_t *b, int dev) {
  return SHIM(b)->ops->peer_access(INNER(b), dev);
}
static int sh_peer_alloc(spw_backend_t *b, size_t n, void **out) {
  FAIL_IF(SPW_FAULT_ALLOC, NULL, SPW_ERR_OUT_OF_MEMORY);
  return SHIM(b)->ops->peer_alloc(INNER(b), n, out);
}
static int sh_peer_free(spw_backend_t *b, void *p) { return SHIM(b)->ops->peer_free(INNER(b), p); }

static int sh_ipc_alloc(spw_backend_t *b, size_t n, void **out) {
  FAIL_IF(SPW_FAULT_ALLOC, NULL, SPW_ERR_OUT_OF_MEMORY);
  return SHIM(b)->ops->ipc_alloc(INNER(b), n, out);
}
static int sh_ipc_free(spw_backend_t *b, void *p) { return SHIM(b)->ops->ipc_free(INNER(b), p); }
static int sh_ipc_export(spw_backend_t *b, void *p, unsigned char h[SPW_IPC_HANDLE_BYTES]) {
  return SHIM(b)->ops->ipc_export(INNER(b), p, h);
}
static int sh_ipc_open(spw_backend_t *b, const unsigned char h[SPW_IPC_HANDLE_BYTES], void **out) {
  return SHIM(b)->ops->ipc_open(INNER(b), h, out);
}
static int sh_ipc_close(spw_backend_t *b, void *p) { return SHIM(b)->ops->ipc_close(INNER(b), p); }

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
    .stream_device = sh_stream_device,
    .stream_sync = sh_stream_sync,
    .event_create = sh_event_create,
    .event_destroy = sh_event_destroy,
    .event_record = sh_event_record,
    .event_query = sh_event_query,
    .event_sync = sh_event_sync,
    .stream_wait_event = sh_stream_wait_event,
    .memcpy_async = sh_memcpy,
    .copy_batch_async = sh_copy_batch,
    .stream_stage = sh_stream_stage,
    .host_register = sh_host_register,
    .host_unregister = sh_host_unregister,
    .launch_host_func = sh_launch_host_func,
    .launch_kernel = sh_launch_kernel,
    .graph_launch = sh_graph_launch,
    .vm_granularity = sh_vm_granularity,
    .vm_reserve = sh_vm_reserve,
    .vm_free = sh_vm_free,
    .chunk_create = sh_chunk_create,
    .chunk_release = sh_chunk_release,
    .chunk_map = sh_chunk_map,
    .chunk_unmap = sh_chunk_unmap,
    .chunk_export = sh_chunk_export,
    .chunk_import = sh_chunk_import,
    .peer_access = sh_peer_access,
    .peer_alloc = sh_peer_alloc,
    .peer_free = sh_peer_free,
    .ipc_alloc = sh_ipc_alloc,
    .ipc_free = sh_ipc_free,
    .ipc_export = sh_ipc_export,
    .ipc_open = sh_ipc_open,
    .ipc_close = sh_ipc_close,
};

int spw__faults_wrap(const spw_backend_ops_t *inner_ops, spw_backend_t *inner,
                     spw_error_sink_fn sink, void *sink_ctx, const spw_backend_ops_t **ops_out,
                     spw_backend_t **shim_out) {
  shim_t *s = calloc(1, sizeof *s);
  if (!s) return SPW_ERR_SYSTEM;
  s->ops = inner_ops;
  s->b = inner;
  s->sink = sink;
  s->sink_ctx = sink_ctx;
  *ops_out = &shim_ops;
  *shim_out = (spw_backend_t *)(void *)s;
  return SPW_OK;
}

void spw__faults_arm(spw_backend_t *b, spw_fault_t f, uint32_t skip, uint32_t count) {
  if ((unsigned)f >= SPW_FAULT_COUNT_) return;
  atomic_store(&SHIM(b)->armed[f], count ? ((uint64_t)skip << 32) | count : 0);
}

void spw__faults_hook(spw_backend_t *b, spw_fault_t f, spw_fault_hook_fn fn, void *arg) {
  if ((unsigned)f >= SPW_FAULT_COUNT_) return;
  atomic_store_explicit(&SHIM(b)->hooks[f].arg, arg, memory_order_relaxed);
  atomic_store_explicit(&SHIM(b)->hooks[f].fn, fn, memory_order_release);
}
