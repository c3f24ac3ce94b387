/* SPDX-License-Identifier: Apache-2.0 */
/* The CUDA device backend: spw__backend_cuda_ops on the CUDA Runtime API (contract in
 * backend.h). Compiled only with SPW_HAVE_CUDA.
 *
 * What it owns: the device's default memory pool settings (release threshold raised to keep
 * freed memory cached, put back at destroy; with two backends on one device, destroy them
 * in reverse order or the survivor's pool stops caching), the streams it created (kept in a
 * list so that destroy can wait for and destroy them without cudaDeviceSynchronize), and
 * the capabilities probed once at create. Events are cudaEvent_t values cast to
 * spw_bevent_t; their owner destroys them.
 *
 * Invariants:
 *  - every CUDA call is checked; a failure reaches on_error with the CUDA error name and
 *    text, and the thread's last CUDA error is cleared so that it poisons neither our next
 *    call nor the application's cudaGetLastError (sticky errors stay: CUDA keeps them);
 *  - every op first makes the backend's device current on the calling thread (the current
 *    device is per thread and ops run on engine and application threads alike); the device
 *    is left current afterwards, as cudaSetDevice would;
 *  - nothing is allocated and nothing synchronizes in the per-copy paths; no op calls
 *    cudaDeviceSynchronize.
 */
#ifdef SPW_HAVE_CUDA

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "copy_kernels.h"
#include "grow.h"

/* Device staging of one stream (stream_stage). `mu` is held while a batch enqueues its
 * transfers through `buf`: the stream's order then keeps each batch's use of it after the
 * one before, whichever thread enqueued that. */
#define SPW_CUDA_MAX_STAGES 32 /* each engine lane: its stream and its slices' (engine.h) */
typedef struct stage {
  cudaStream_t stream; /* NULL: a free entry */
  void *buf;
  size_t bytes;
  pthread_mutex_t mu;
} stage_t;

typedef struct spw_cuda_backend {
  spw_error_sink_fn on_error; /* may be NULL */
  void *err_ctx;
  int device;
  int has_pool;               /* cudaDevAttrMemoryPoolsSupported */
  int use_kernel;             /* registered host pointers usable by kernels, kernel loads */
  cudaMemPool_t pool;         /* the device's default pool, when has_pool */
  uint64_t saved_threshold;   /* the pool's release threshold before create */
  pthread_mutex_t streams_mu; /* guards streams, nstreams, cap, stages; a leaf lock */
  cudaStream_t *streams;      /* streams made by stream_create, not yet destroyed */
  size_t nstreams, cap;
  stage_t stages[SPW_CUDA_MAX_STAGES]; /* staging of streams given some (stream_stage) */
  /* Virtual memory management, through driver entry points that the CUDA runtime hands out
   * (cudaGetDriverEntryPointByVersion): the library then needs no link to libcuda, which
   * the static cudart already loads at run time. vm_status is SPW_OK when every entry
   * point was found and the device supports VMM, else why not (SPW_ERR_UNSUPPORTED). */
  int vm_status;
  size_t vm_gran;
  CUcontext ctx; /* the device's primary context, which the runtime API uses */
  PFN_cuMemAddressReserve_v10020 mem_address_reserve;
  PFN_cuMemAddressFree_v10020 mem_address_free;
  PFN_cuMemCreate_v10020 mem_create;
  PFN_cuMemRelease_v10020 mem_release;
  PFN_cuMemMap_v10020 mem_map;
  PFN_cuMemUnmap_v10020 mem_unmap;
  PFN_cuMemSetAccess_v10020 mem_set_access;
  PFN_cuMemExportToShareableHandle_v10020 mem_export;   /* NULL: no chunk_export */
  PFN_cuMemImportFromShareableHandle_v10020 mem_import; /* NULL: no chunk_import */
  int vm_shareable; /* chunks are created exportable as POSIX file descriptors */
  PFN_cuCtxGetCurrent_v4000 ctx_get_current;
  PFN_cuCtxSetCurrent_v4000 ctx_set_current;
  PFN_cuGetErrorName_v6000 get_error_name;
  PFN_cuGetErrorString_v6000 get_error_string;
  /* Events are recorded through the driver where it can (NULL: never): an acquire of a
   * spilled buffer and each launch record one, and the runtime API's call cost its caller
   * about 0.3 µs more than the driver's on an H100 (bench/enqueue_cost). */
  PFN_cuEventRecord_v2000 event_record;
} spw_cuda_backend_t;

static spw_cuda_backend_t *cb_of(spw_backend_t *b) { return (spw_cuda_backend_t *)b; }

/* Reports `e` and maps it to a status: `oom` for cudaErrorMemoryAllocation, else
 * SPW_ERR_CUDA. Clears the thread's last error, which a non-sticky failure leaves set. */
static int fail_as(const spw_cuda_backend_t *cb, cudaError_t e, int oom) {
  (void)cudaGetLastError();
  if (cb->on_error) cb->on_error(cb->err_ctx, cudaGetErrorName(e), cudaGetErrorString(e));
  return e == cudaErrorMemoryAllocation ? oom : SPW_ERR_CUDA;
}

static int fail(const spw_cuda_backend_t *cb, cudaError_t e) {
  return fail_as(cb, e, SPW_ERR_OUT_OF_MEMORY);
}

static int check(const spw_cuda_backend_t *cb, cudaError_t e) {
  return e == cudaSuccess ? SPW_OK : fail(cb, e);
}

/* cudaGetDevice is a thread-local read; cudaSetDevice only when the thread is elsewhere. */
static int use_device(const spw_cuda_backend_t *cb) {
  int cur = -1;
  if (cudaGetDevice(&cur) == cudaSuccess && cur == cb->device) return SPW_OK;
  return check(cb, cudaSetDevice(cb->device));
}

/* ---- virtual memory management (driver API) ---- */

static void *driver_entry(const char *name) {
  void *fn = NULL;
  enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
  /* 12000: the ABI of these functions as CUDA 12.0 defined them, whatever the driver. */
  if (cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &q) != cudaSuccess ||
      q != cudaDriverEntryPointSuccess) {
    (void)cudaGetLastError();
    return NULL;
  }
  return fn;
}

/* ISO C has no cast from void * to a function pointer; POSIX gives both one layout. */
#define LOAD_ENTRY(field, name)                                                              \
  do {                                                                                       \
    void *p_ = driver_entry(name);                                                           \
    _Static_assert(sizeof p_ == sizeof(field), "function and data pointers differ in size"); \
    memcpy(&(field), &p_, sizeof p_);                                                        \
  } while (0)

/* Finds the entry points and the granularity once, at create; an old driver or a device
 * without VMM leaves vm_status SPW_ERR_UNSUPPORTED, and only stable buffers notice. */
static void vm_probe(spw_cuda_backend_t *cb, int want_shareable) {
  cb->vm_status = SPW_ERR_UNSUPPORTED;
  LOAD_ENTRY(cb->mem_address_reserve, "cuMemAddressReserve");
  LOAD_ENTRY(cb->mem_address_free, "cuMemAddressFree");
  LOAD_ENTRY(cb->mem_create, "cuMemCreate");
  LOAD_ENTRY(cb->mem_release, "cuMemRelease");
  LOAD_ENTRY(cb->mem_map, "cuMemMap");
  LOAD_ENTRY(cb->mem_unmap, "cuMemUnmap");
  LOAD_ENTRY(cb->mem_set_access, "cuMemSetAccess");
  LOAD_ENTRY(cb->mem_export, "cuMemExportToShareableHandle");
  LOAD_ENTRY(cb->mem_import, "cuMemImportFromShareableHandle");
  LOAD_ENTRY(cb->ctx_get_current, "cuCtxGetCurrent");
  LOAD_ENTRY(cb->ctx_set_current, "cuCtxSetCurrent");
  PFN_cuMemGetAllocationGranularity_v10020 gran;
  PFN_cuDeviceGetAttribute_v2000 attr;
  LOAD_ENTRY(gran, "cuMemGetAllocationGranularity");
  LOAD_ENTRY(attr, "cuDeviceGetAttribute");
  if (!cb->mem_address_reserve || !cb->mem_address_free || !cb->mem_create || !cb->mem_release ||
      !cb->mem_map || !cb->mem_unmap || !cb->mem_set_access || !cb->ctx_get_current ||
      !cb->ctx_set_current || !gran || !attr)
    return;
  int vmm = 0;
  if (attr(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, cb->device) !=
          CUDA_SUCCESS || !vmm)
    return;
  CUmemAllocationProp prop = {0};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = cb->device;
  /* The minimum, not the recommended one: a chunk is the unit of spilling, and a smaller
   * chunk wastes less of a buffer's last one (bench/vmm_chunks prints both). */
  if (gran(&cb->vm_gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) != CUDA_SUCCESS || !cb->vm_gran)
    return;
  /* cudaSetDevice made the primary context current on this thread. */
  if (cb->ctx_get_current(&cb->ctx) != CUDA_SUCCESS || !cb->ctx) return;
  cb->vm_status = SPW_OK;
  /* Exportable chunks only where they are asked for (config.ipc) and the device can make
   * them: a chunk asked for with a handle type the device lacks is refused outright. */
  int fd_ok = 0;
  if (want_shareable && cb->mem_export &&
      attr(&fd_ok, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, cb->device) ==
          CUDA_SUCCESS)
    cb->vm_shareable = fd_ok != 0;
}

static int drv_fail(const spw_cuda_backend_t *cb, const char *call, CUresult r) {
  const char *name = NULL, *text = NULL;
  if (cb->get_error_name) (void)cb->get_error_name(r, &name);
  if (cb->get_error_string) (void)cb->get_error_string(r, &text);
  char buf[256];
  snprintf(buf, sizeof buf, "%s: %s", call, text ? text : "driver error");
  if (cb->on_error) cb->on_error(cb->err_ctx, name ? name : "CUresult", buf);
  return r == CUDA_ERROR_OUT_OF_MEMORY ? SPW_ERR_OUT_OF_MEMORY : SPW_ERR_CUDA;
}

/* The driver API works on the thread's current context, which a thread that has made no
 * runtime call yet may lack: the primary context is made current here when it is not. */
static int vm_enter(spw_cuda_backend_t *cb) {
  if (cb->vm_status != SPW_OK) return cb->vm_status;
  CUcontext cur = NULL;
  if (cb->ctx_get_current(&cur) == CUDA_SUCCESS && cur == cb->ctx) return SPW_OK;
  CUresult r = cb->ctx_set_current(cb->ctx);
  return r == CUDA_SUCCESS ? SPW_OK : drv_fail(cb, "cuCtxSetCurrent", r);
}

/* ---- the peer tier ------------------------------------------------------------------------ */

static int cuda_peer_access(spw_backend_t *b, int peer_device) {
  spw_cuda_backend_t *cb = cb_of(b);
  if (peer_device == cb->device) return SPW_OK;
  int s = use_device(cb);
  if (s != SPW_OK) return s;
  int can = 0;
  s = check(cb, cudaDeviceCanAccessPeer(&can, cb->device, peer_device));
  if (s != SPW_OK) return s;
  if (!can) return SPW_ERR_UNSUPPORTED;
  cudaError_t e = cudaDeviceEnablePeerAccess(peer_device, 0);
  if (e == cudaErrorPeerAccessAlreadyEnabled) {
    (void)cudaGetLastError(); /* not an error here: another runtime of this device did it */
    return SPW_OK;
  }
  return check(cb, e);
}

static int cuda_peer_alloc(spw_backend_t *b, size_t bytes, void **out) {
  spw_cuda_backend_t *cb = cb_of(b);
  int s = use_device(cb);
  if (s != SPW_OK) return s;
  void *p = NULL;
  cudaError_t e = cudaMalloc(&p, bytes);
  if (e != cudaSuccess) return fail(cb, e);
  *out = p;
  return SPW_OK;
}

static int cuda_peer_free(spw_backend_t *b, void *ptr) {
  spw_cuda_backend_t *cb = cb_of(b);
  int s = use_device(cb);
  return s == SPW_OK ? check(cb, cudaFree(ptr)) : s;
}

/* ---- memory other processes can map (legacy CUDA IPC: cudaMalloc'd memory only) ---- */

static int cuda_ipc_alloc(spw_backend_t *b, size_t bytes, void **out) {
  return cuda_peer_alloc(b, bytes, out); /* the same cudaMalloc'd memory */
}

static int cuda_ipc_free(spw_backend_t *b, void *base) { return cuda_peer_free(b, base); }

static int cuda_ipc_export(spw_backend_t *b, void *base,
                           unsigned char handle[SPW_IPC_HANDLE_BYTES]) {
  spw_cuda_backend_t *cb = cb_of(b);
  int s = use_device(cb);
  if (s != SPW_OK) return s;
  cudaIpcMemHandle_t h;
  _Static_assert(sizeof h == SPW_IPC_HANDLE_BYTES, "cudaIpcMemHandle_t is 64 bytes");
  cudaError_t e = cudaIpcGetMemHandle(&h, base);
  if (e != cudaSuccess) return fail_as(cb, e, SPW_ERR_CUDA);
  memcpy(handle, &h, sizeof h);
  return SPW_OK;
}

static int cuda_ipc_open(spw_backend_t *b, const unsigned char handle[SPW_IPC_HANDLE_BYTES],
                         void **base) {
  spw_cuda_backend_t *cb = cb_of(b);
  int s = use_device(cb);
  if (s != SPW_OK) return s;
  cudaIpcMemHandle_t h;
  memcpy(&h, handle, sizeof h);
  /* Lazy peer access: the exporter's device may be another one of this machine. */
  cudaError_t e = cudaIpcOpenMemHandle(base, h, cudaIpcMemLazyEnablePeerAccess);
  return e == cudaSuccess ? SPW_OK : fail_as(cb, e, SPW_ERR_CUDA);
}

static int cuda_ipc_close(spw_backend_t *b, void *base) {
  spw_cuda_backend_t *cb = cb_of(b);
  int s = use_device(cb);
  if (s != SPW_OK) return s;
  cudaError_t e = cudaIpcCloseMemHandle(base);
  return e == cudaSuccess ? SPW_OK : fail_as(cb, e, SPW_ERR_CUDA);
}

static int cuda_vm_granularity(spw_backend_t *b, size_t *out) {
  spw_cuda_backend_t *cb = cb_of(b);
  if (cb->vm_status != SPW_OK) return cb->vm_status;
  *out = cb->vm_gran;
  return SPW_OK;
}

static int cuda_vm_reserve(spw_backend_t *b, size_t bytes, void **out) {
  spw_cuda_backend_t *cb = cb_of(b);
  int s = vm_enter(cb);
  if (s != SPW_OK) return s;
  CUdeviceptr va = 0;
  CUresult r = cb->mem_address_reserve(&va, bytes, cb->vm_gran, 0, 0);
  if (r != CUDA_SUCCESS) return drv_fail(cb, "cuMemAddressReserve", r);
  *out = (void *)(uintptr_t)va;
  return SPW_OK;
}

static int cuda_vm_free(spw_backend_t *b, void *va, size_t bytes) {
  spw_cuda_backend_t *cb = cb_of(b);
  int s = vm_enter(cb);
  if (s != SPW_OK) return s;
  CUresult r = cb->mem_address_free((CUdeviceptr)(uintptr_t)va, bytes);
  return r == CUDA_SUCCESS ? SPW_OK : drv_fail(cb, "cuMemAddressFree", r);
}

static int cuda_chunk_create(spw_backend_t *b, size_t bytes, uint64_t *out) {
  spw_cuda_backend_t *cb = cb_of(b);
  int s = vm_enter(cb);
  if (s != SPW_OK) return s;
  CUmemAllocationProp prop = {0};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = cb->device;
  if (cb->vm_shareable) prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  CUmemGenericAllocationHandle h = 0;
  CUresult r = cb->mem_create(&h, bytes, &prop, 0);
  if (r != CUDA_SUCCESS) return drv_fail(cb, "cuMemCreate", r);
  *out = (uint64_t)h;
  return SPW_OK;
}

static void cuda_chunk_release(spw_backend_t *b, uint64_t chunk, size_t bytes) {
  (void)bytes;
  spw_cuda_backend_t *cb = cb_of(b);
  if (vm_enter(cb) != SPW_OK) return;
  CUresult r = cb->mem_release((CUmemGenericAllocationHandle)chunk);
  if (r != CUDA_SUCCESS) (void)drv_fail(cb, "cuMemRelease", r);
}

static int cuda_chunk_map(spw_backend_t *b, void *va, size_t bytes, uint64_t chunk) {
  spw_cuda_backend_t *cb = cb_of(b);
  int s = vm_enter(cb);
  if (s != SPW_OK) return s;
  CUdeviceptr p = (CUdeviceptr)(uintptr_t)va;
  CUresult r = cb->mem_map(p, bytes, 0, (CUmemGenericAllocationHandle)chunk, 0);
  if (r != CUDA_SUCCESS) return drv_fail(cb, "cuMemMap", r);
  CUmemAccessDesc acc = {0};
  acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  acc.location.id = cb->device;
  acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  /* Every new mapping starts with no access at all. */
  r = cb->mem_set_access(p, bytes, &acc, 1);
  if (r != CUDA_SUCCESS) {
    s = drv_fail(cb, "cuMemSetAccess", r);
    (void)cb->mem_unmap(p, bytes);
    return s;
  }
  return SPW_OK;
}

static int cuda_chunk_unmap(spw_backend_t *b, void *va, size_t bytes) {
  spw_cuda_backend_t *cb = cb_of(b);
  int s = vm_enter(cb);
  if (s != SPW_OK) return s;
  CUresult r = cb->mem_unmap((CUdeviceptr)(uintptr_t)va, bytes);
  return r == CUDA_SUCCESS ? SPW_OK : drv_fail(cb, "cuMemUnmap", r);
}

static int cuda_chunk_export(spw_backend_t *b, uint64_t chunk, int *fd, uint64_t *fd_offset) {
  spw_cuda_backend_t *cb = cb_of(b);
  if (!fd || !fd_offset) return SPW_ERR_INVALID_ARG;
  int s = vm_enter(cb);
  if (s != SPW_OK) return s;
  if (!cb->vm_shareable) return SPW_ERR_UNSUPPORTED;
  int out = -1;
  CUresult r = cb->mem_export(&out, (CUmemGenericAllocationHandle)chunk,
                              CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
  if (r != CUDA_SUCCESS) return drv_fail(cb, "cuMemExportToShareableHandle", r);
  *fd = out;
  *fd_offset = 0; /* a descriptor names its whole chunk */
  return SPW_OK;
}

static int cuda_chunk_import(spw_backend_t *b, int fd, uint64_t fd_offset, size_t bytes,
                             uint64_t *chunk) {
  (void)bytes; /* the descriptor carries its chunk's size */
  spw_cuda_backend_t *cb = cb_of(b);
  if (fd < 0 || fd_offset != 0 || !chunk) return SPW_ERR_INVALID_ARG;
  int s = vm_enter(cb);
  if (s != SPW_OK) return s;
  if (!cb->mem_import) return SPW_ERR_UNSUPPORTED;
  CUmemGenericAllocationHandle h = 0;
  CUresult r = cb->mem_import(&h, (void *)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  if (r != CUDA_SUCCESS) return drv_fail(cb, "cuMemImportFromShareableHandle", r);
  *chunk = (uint64_t)h;
  return SPW_OK;
}

static int cuda_create(const spw_backend_params_t *p, spw_backend_t **out) {
  if (!p || !out) return SPW_ERR_INVALID_ARG;
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver ||
      (e == cudaSuccess && count == 0)) {
    (void)cudaGetLastError(); /* expected on GPU-less machines: no report, no residue */
    return SPW_ERR_NO_DEVICE;
  }

  spw_cuda_backend_t *cb = calloc(1, sizeof *cb);
  if (!cb) return SPW_ERR_SYSTEM;
  cb->on_error = p->on_error;
  cb->err_ctx = p->err_ctx;
  cb->device = p->device;
  if (pthread_mutex_init(&cb->streams_mu, NULL) != 0) {
    free(cb);
    return SPW_ERR_SYSTEM;
  }

  int s = SPW_OK;
  int pools = 0, host_ptr = 0;
  if (e != cudaSuccess) {
    s = fail(cb, e);
  } else {
    /* An ordinal past the last device fails here with cudaErrorInvalidDevice: an error the
     * user must see, not "no device" (which would quietly fall back to emulation). */
    s = check(cb, cudaSetDevice(p->device));
  }
  if (s == SPW_OK) {
    LOAD_ENTRY(cb->event_record, "cuEventRecord");
    LOAD_ENTRY(cb->get_error_name, "cuGetErrorName");
    LOAD_ENTRY(cb->get_error_string, "cuGetErrorString");
  }
  if (s == SPW_OK)
    s = check(cb, cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, p->device));
  if (s == SPW_OK)
    s = check(cb, cudaDeviceGetAttribute(&host_ptr, cudaDevAttrCanUseHostPointerForRegisteredMem,
                                         p->device));
  if (s == SPW_OK && pools) {
    s = check(cb, cudaDeviceGetDefaultMemPool(&cb->pool, p->device));
    if (s == SPW_OK)
      s = check(cb, cudaMemPoolGetAttribute(cb->pool, cudaMemPoolAttrReleaseThreshold,
                                            &cb->saved_threshold));
    /* Keep freed memory cached in the pool: cudaMallocAsync then costs ~1 us instead of a
     * trip to the driver; trim() gives it back when the runtime asks. */
    uint64_t keep = UINT64_MAX;
    if (s == SPW_OK)
      s = check(cb, cudaMemPoolSetAttribute(cb->pool, cudaMemPoolAttrReleaseThreshold, &keep));
    cb->has_pool = s == SPW_OK;
  }
  if (s != SPW_OK) {
    pthread_mutex_destroy(&cb->streams_mu);
    free(cb);
    return s;
  }
  /* Without direct access to registered host memory, or without kernel code for this
   * device, copy_batch_async falls back to one cudaMemcpyAsync per buffer: correct, slower.
   * The probe also loads the kernel now, off the spill path. */
  int probe_err = 0;
  cb->use_kernel = host_ptr && spw__copy_kernel_probe(&probe_err) == SPW_OK;
  vm_probe(cb, p->vm_shareable);
  *out = (spw_backend_t *)cb;
  return SPW_OK;
}

/* Frees the stage of `st` if it has one. Caller holds streams_mu; the stream's work is
 * done. */
static void stage_drop(spw_cuda_backend_t *cb, cudaStream_t st) {
  for (int i = 0; i < SPW_CUDA_MAX_STAGES; i++) {
    stage_t *g = &cb->stages[i];
    if (g->stream != st || !st) continue;
    (void)check(cb, cudaFree(g->buf));
    pthread_mutex_destroy(&g->mu);
    g->stream = NULL;
    g->buf = NULL;
    g->bytes = 0;
  }
}

static void cuda_destroy(spw_backend_t *b) {
  if (!b) return;
  spw_cuda_backend_t *cb = cb_of(b);
  (void)use_device(cb);
  pthread_mutex_lock(&cb->streams_mu);
  for (size_t i = 0; i < cb->nstreams; i++) {
    (void)check(cb, cudaStreamSynchronize(cb->streams[i]));
    stage_drop(cb, cb->streams[i]);
    (void)check(cb, cudaStreamDestroy(cb->streams[i]));
  }
  cb->nstreams = 0;
  pthread_mutex_unlock(&cb->streams_mu);
  /* The legacy stream carries what the runtime enqueued on the application's NULL stream. */
  (void)check(cb, cudaStreamSynchronize(NULL));
  if (cb->has_pool)
    (void)check(cb, cudaMemPoolSetAttribute(cb->pool, cudaMemPoolAttrReleaseThreshold,
                                            &cb->saved_threshold));
  pthread_mutex_destroy(&cb->streams_mu);
  free(cb->streams);
  free(cb);
}

static int cuda_mem_info(spw_backend_t *b, size_t *free_bytes, size_t *total_bytes) {
  spw_cuda_backend_t *cb = cb_of(b);
  int s = use_device(cb);
  if (s != SPW_OK) return s;
  size_t f = 0, t = 0;
  s = check(cb, cudaMemGetInfo(&f, &t));
  if (s != SPW_OK) return s;
  if (free_bytes) *free_bytes = f;
  if (total_bytes) *total_bytes = t;
  return SPW_OK;
}

static int cuda_alloc_async(spw_backend_t *b, size_t bytes, spw_stream_t st, void **out) {
  spw_cuda_backend_t *cb = cb_of(b);
  if (!out) return SPW_ERR_INVALID_ARG;
  int s = use_device(cb);
  if (s != SPW_OK) return s;
  void *p = NULL;
  /* From our pool by name: cudaMallocAsync would use the device's *current* pool, which the
   * application may have replaced (cudaDeviceSetMemPool). */
  cudaError_t e = cb->has_pool ? cudaMallocFromPoolAsync(&p, bytes, cb->pool, st)
                               : cudaMalloc(&p, bytes); /* synchronous: trivially ordered */
  if (e != cudaSuccess) return fail(cb, e);
  *out = p;
  return SPW_OK;
}

static int cuda_free_async(spw_backend_t *b, void *ptr, spw_stream_t st) {
  spw_cuda_backend_t *cb = cb_of(b);
  if (!ptr) return SPW_OK;
  int s = use_device(cb);
  if (s != SPW_OK) return s;
  if (cb->has_pool) return check(cb, cudaFreeAsync(ptr, st));
  /* No stream-ordered free on this device: wait for the stream's earlier work, which may
   * still use the memory, then free. */
  s = check(cb, cudaStreamSynchronize(st));
  return s != SPW_OK ? s : check(cb, cudaFree(ptr));
}

static int cuda_trim(spw_backend_t *b) {
  spw_cuda_backend_t *cb = cb_of(b);
  if (!cb->has_pool) return SPW_OK;
  int s = use_device(cb);
  return s != SPW_OK ? s : check(cb, cudaMemPoolTrimTo(cb->pool, 0));
}

static spw_stream_t cuda_default_stream(spw_backend_t *b) {
  (void)b;
  return NULL; /* the legacy default stream, as the application's NULL means */
}

static int cuda_stream_create(spw_backend_t *b, spw_stream_t *out) {
  spw_cuda_backend_t *cb = cb_of(b);
  if (!out) return SPW_ERR_INVALID_ARG;
  int s = use_device(cb);
  if (s != SPW_OK) return s;
  cudaStream_t st = NULL;
  s = check(cb, cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  if (s != SPW_OK) return s;
  pthread_mutex_lock(&cb->streams_mu);
  cudaStream_t *grown = spw__grow(cb->streams, &cb->cap, cb->nstreams + 1, sizeof *grown, 8);
  if (!grown) {
    pthread_mutex_unlock(&cb->streams_mu);
    (void)cudaStreamDestroy(st);
    return SPW_ERR_SYSTEM;
  }
  cb->streams = grown;
  cb->streams[cb->nstreams++] = st;
  pthread_mutex_unlock(&cb->streams_mu);
  *out = st;
  return SPW_OK;
}

static int cuda_stream_destroy(spw_backend_t *b, spw_stream_t st) {
  spw_cuda_backend_t *cb = cb_of(b);
  if (!st) return SPW_ERR_INVALID_ARG; /* the legacy stream cannot be destroyed */
  int s = use_device(cb);
  if (s != SPW_OK) return s;
  pthread_mutex_lock(&cb->streams_mu);
  for (size_t i = 0; i < cb->nstreams; i++) {
    if (cb->streams[i] == st) {
      cb->streams[i] = cb->streams[--cb->nstreams];
      break;
    }
  }
  pthread_mutex_unlock(&cb->streams_mu);
  /* Destroy even when the wait fails (a sticky error): the stream is gone either way. */
  s = check(cb, cudaStreamSynchronize(st));
  pthread_mutex_lock(&cb->streams_mu);
  stage_drop(cb, st);
  pthread_mutex_unlock(&cb->streams_mu);
  int d = check(cb, cudaStreamDestroy(st));
  return s != SPW_OK ? s : d;
}

static int cuda_stream_sync(spw_backend_t *b, spw_stream_t st) {
  spw_cuda_backend_t *cb = cb_of(b);
  int s = use_device(cb);
  return s != SPW_OK ? s : check(cb, cudaStreamSynchronize(st));
}

static int cuda_stream_device(spw_backend_t *b, spw_stream_t st, int *device) {
  spw_cuda_backend_t *cb = cb_of(b);
  /* NULL, cudaStreamLegacy and cudaStreamPerThread name the current device's stream, and
   * every op makes this backend's device current first. */
  if (st == NULL || st == cudaStreamLegacy || st == cudaStreamPerThread) {
    *device = cb->device;
    return SPW_OK;
  }
#if CUDART_VERSION >= 12080
  cudaError_t e = cudaStreamGetDevice(st, device);
  if (e == cudaErrorInvalidResourceHandle || e == cudaErrorContextIsDestroyed) {
    (void)cudaGetLastError(); /* the application's mistake, not a device failure */
    return SPW_ERR_INVALID_STREAM;
  }
  return check(cb, e);
#else
  (void)device;
  return SPW_ERR_UNSUPPORTED;
#endif
}

static int cuda_event_create(spw_backend_t *b, spw_bevent_t **out) {
  spw_cuda_backend_t *cb = cb_of(b);
  if (!out) return SPW_ERR_INVALID_ARG;
  int s = use_device(cb);
  if (s != SPW_OK) return s;
  cudaEvent_t ev = NULL;
  s = check(cb, cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  if (s != SPW_OK) return s;
  *out = (spw_bevent_t *)ev;
  return SPW_OK;
}

static void cuda_event_destroy(spw_backend_t *b, spw_bevent_t *e) {
  spw_cuda_backend_t *cb = cb_of(b);
  if (!e || use_device(cb) != SPW_OK) return;
  (void)check(cb, cudaEventDestroy((cudaEvent_t)e));
}

/* The runtime's handles are the driver's (cudaEvent_t is CUevent, cudaStream_t CUstream,
 * NULL the legacy stream in both). A thread on which the runtime has not yet made the
 * context current gets CUDA_ERROR_INVALID_CONTEXT from the driver: the runtime's call, which
 * makes it current, takes over there. */
static int cuda_event_record(spw_backend_t *b, spw_bevent_t *e, spw_stream_t st) {
  spw_cuda_backend_t *cb = cb_of(b);
  int s = use_device(cb);
  if (s != SPW_OK) return s;
  if (cb->event_record) {
    CUresult r = cb->event_record((CUevent)e, (CUstream)st);
    if (r == CUDA_SUCCESS) return SPW_OK;
    if (r != CUDA_ERROR_INVALID_CONTEXT) return drv_fail(cb, "cuEventRecord", r);
  }
  return check(cb, cudaEventRecord((cudaEvent_t)e, st));
}

static int cuda_event_query(spw_backend_t *b, spw_bevent_t *e) {
  spw_cuda_backend_t *cb = cb_of(b);
  int s = use_device(cb);
  if (s != SPW_OK) return s;
  cudaError_t r = cudaEventQuery((cudaEvent_t)e);
  if (r == cudaErrorNotReady) return SPW_ERR_NOT_READY; /* a state, not an error */
  return check(cb, r);
}

static int cuda_event_sync(spw_backend_t *b, spw_bevent_t *e) {
  spw_cuda_backend_t *cb = cb_of(b);
  int s = use_device(cb);
  return s != SPW_OK ? s : check(cb, cudaEventSynchronize((cudaEvent_t)e));
}

static int cuda_stream_wait_event(spw_backend_t *b, spw_stream_t st, spw_bevent_t *e) {
  spw_cuda_backend_t *cb = cb_of(b);
  int s = use_device(cb);
  return s != SPW_OK ? s : check(cb, cudaStreamWaitEvent(st, (cudaEvent_t)e, 0));
}

static int cuda_memcpy_async(spw_backend_t *b, void *dst, const void *src, size_t bytes,
                             spw_stream_t st) {
  spw_cuda_backend_t *cb = cb_of(b);
  int s = use_device(cb);
  return s != SPW_OK ? s : check(cb, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, st));
}

/* Launches the kernel group `g` on `st` if it holds any copy, and empties it. */
static int group_flush(spw_cuda_backend_t *cb, spw_copy_group_t *g, cudaStream_t st) {
  int cuda_err = 0;
  if (g->n > 0 && spw__copy_kernel_launch(g, st, &cuda_err) != SPW_OK)
    return fail(cb, (cudaError_t)cuda_err);
  g->n = 0;
  g->chunks = 0;
  return SPW_OK;
}

/* Adds one small copy to the kernel group `g`, launching the group on `st` when it is full. */
static int group_add(spw_cuda_backend_t *cb, spw_copy_group_t *g, uintptr_t dst, uintptr_t src,
                     size_t bytes, cudaStream_t st) {
  spw_copy_item_t *it = &g->items[g->n++];
  it->dst = (uint64_t)dst;
  it->src = (uint64_t)src;
  it->bytes = (uint32_t)bytes;
  it->first_chunk = g->chunks;
  g->chunks += (uint32_t)((bytes + SPW_COPY_CHUNK_BYTES - 1) / SPW_COPY_CHUNK_BYTES);
  return g->n < SPW_COPY_GROUP_MAX ? SPW_OK : group_flush(cb, g, st);
}

/* The host side of a copy: what the link's transfer reads or writes. */
static uintptr_t host_side(const spw_copy_desc_t *d, spw_copy_dir_t dir) {
  return (uintptr_t)(dir == SPW_COPY_D2H ? d->dst : d->src);
}

/* Small copies d[0..n) whose host sides lie back to back (`span` bytes from the first)
 * through the stream's stage: gathered into it by the kernel, then one transfer to host
 * (D2H), or one transfer into it, then scattered by the kernel (H2D). A run that crosses
 * from one registered host range into another that happens to follow it is still copied
 * right; the driver may then move it as pageable memory. */
static int stage_run(spw_cuda_backend_t *cb, const stage_t *sg, const spw_copy_desc_t *d,
                     size_t n, size_t span, spw_copy_dir_t dir, spw_copy_group_t *g,
                     cudaStream_t st) {
  const uintptr_t base = host_side(&d[0], dir), buf = (uintptr_t)sg->buf;
  int s = SPW_OK;
  if (dir == SPW_COPY_H2D)
    s = check(cb, cudaMemcpyAsync(sg->buf, (const void *)base, span, cudaMemcpyHostToDevice, st));
  for (size_t i = 0; s == SPW_OK && i < n; i++) {
    uintptr_t staged = buf + (host_side(&d[i], dir) - base);
    s = dir == SPW_COPY_D2H ? group_add(cb, g, staged, (uintptr_t)d[i].src, d[i].bytes, st)
                            : group_add(cb, g, (uintptr_t)d[i].dst, staged, d[i].bytes, st);
  }
  if (s == SPW_OK) s = group_flush(cb, g, st);
  if (s == SPW_OK && dir == SPW_COPY_D2H)
    s = check(cb, cudaMemcpyAsync((void *)base, sg->buf, span, cudaMemcpyDeviceToHost, st));
  return s;
}

/* copy_batch_async on a stream with a stage, under its mutex: each run of two or more small
 * copies whose host sides lie back to back (as a batch's host extents usually do) crosses
 * the link as one copy-engine transfer (a gather kernel + one copy of 4 KiB x 65536: 53
 * GB/s on an H100, where the engine's batches written by the kernel into mapped host
 * memory ran at 47); the others go as without a stage. */
static int staged_batch(spw_cuda_backend_t *cb, const stage_t *sg, const spw_copy_desc_t *descs,
                        size_t n, spw_copy_dir_t dir, cudaStream_t st) {
  spw_copy_group_t g;    /* a run's, flushed before its transfer */
  spw_copy_group_t lone; /* copies in no run: the kernel on mapped host memory */
  g.n = g.chunks = lone.n = lone.chunks = 0;
  int s = SPW_OK;
  size_t first = 0, span = 0; /* the run so far: descs[first, i), span bytes */
  for (size_t i = 0; s == SPW_OK && i <= n; i++) {
    const spw_copy_desc_t *d = i < n ? &descs[i] : NULL;
    const int small = d && d->bytes > 0 && d->bytes < SPW_COPY_SMALL_MAX;
    if (small && i > first && host_side(d, dir) == host_side(&descs[first], dir) + span &&
        span + d->bytes <= sg->bytes) {
      span += d->bytes;
      continue;
    }
    /* The run ends before descs[i]. */
    if (i - first >= 2)
      s = stage_run(cb, sg, descs + first, i - first, span, dir, &g, st);
    else if (i - first == 1)
      s = group_add(cb, &lone, (uintptr_t)descs[first].dst, (uintptr_t)descs[first].src,
                    descs[first].bytes, st);
    first = i;
    span = 0;
    if (s != SPW_OK || !d) continue;
    if (small) {
      span = d->bytes; /* a new run starts here */
    } else {
      first = i + 1; /* empty, or large: the copy engines, alone */
      if (d->bytes > 0)
        s = check(cb, cudaMemcpyAsync(d->dst, d->src, d->bytes, cudaMemcpyDefault, st));
    }
  }
  if (s == SPW_OK) s = group_flush(cb, &lone, st);
  return s;
}

/* The stage of `st`, or NULL. An entry stays put until its stream is destroyed, which no
 * thread does while it copies on that stream. */
static const stage_t *stage_of(spw_cuda_backend_t *cb, cudaStream_t st) {
  const stage_t *found = NULL;
  if (!st) return NULL;
  pthread_mutex_lock(&cb->streams_mu);
  for (int i = 0; i < SPW_CUDA_MAX_STAGES && !found; i++)
    if (cb->stages[i].stream == st) found = &cb->stages[i];
  pthread_mutex_unlock(&cb->streams_mu);
  return found;
}

/* Large entries go to the copy engines one cudaMemcpyAsync each (they reach ~50 GB/s from
 * 1 MiB up); small ones are gathered into groups for the SM kernel, which reads or writes the
 * mapped host memory directly, or, on a stream with a stage, runs of them into one transfer
 * each (staged_batch). All work lands on `st`. The groups (30 KiB each) live on this
 * thread's stack: the call allocates nothing and may run on several threads at once. On an
 * error, copies enqueued before it still run; the caller treats the whole batch as failed. */
static int cuda_copy_batch_async(spw_backend_t *b, const spw_copy_desc_t *descs, size_t n,
                                 spw_copy_dir_t dir, spw_stream_t st) {
  spw_cuda_backend_t *cb = cb_of(b);
  if (n == 0) return SPW_OK;
  if (!descs || (dir != SPW_COPY_D2H && dir != SPW_COPY_H2D)) return SPW_ERR_INVALID_ARG;
  int s = use_device(cb);
  if (s != SPW_OK) return s;

  if (!cb->use_kernel) {
    for (size_t i = 0; i < n; i++) {
      if (descs[i].bytes == 0) continue;
      s = check(cb, cudaMemcpyAsync(descs[i].dst, descs[i].src, descs[i].bytes,
                                    cudaMemcpyDefault, st));
      if (s != SPW_OK) return s;
    }
    return SPW_OK;
  }
  stage_t *sg = n >= 2 ? (stage_t *)stage_of(cb, st) : NULL;
  if (sg) {
    pthread_mutex_lock(&sg->mu);
    s = staged_batch(cb, sg, descs, n, dir, st);
    pthread_mutex_unlock(&sg->mu);
    return s;
  }

  spw_copy_group_t g;
  g.n = 0;
  g.chunks = 0;
  for (size_t i = 0; i < n && s == SPW_OK; i++) {
    const spw_copy_desc_t *d = &descs[i];
    if (d->bytes == 0) continue;
    if (d->bytes >= SPW_COPY_SMALL_MAX)
      s = check(cb, cudaMemcpyAsync(d->dst, d->src, d->bytes, cudaMemcpyDefault, st));
    else
      s = group_add(cb, &g, (uintptr_t)d->dst, (uintptr_t)d->src, d->bytes, st);
  }
  if (s == SPW_OK) s = group_flush(cb, &g, st);
  return s;
}

static int cuda_stream_stage(spw_backend_t *b, spw_stream_t st, size_t bytes) {
  spw_cuda_backend_t *cb = cb_of(b);
  if (!st || bytes == 0) return SPW_ERR_INVALID_ARG;
  int s = use_device(cb);
  if (s != SPW_OK) return s;
  pthread_mutex_lock(&cb->streams_mu);
  int made = 0, has = 0, slot = -1;
  for (size_t i = 0; i < cb->nstreams; i++) made |= cb->streams[i] == st;
  for (int i = 0; i < SPW_CUDA_MAX_STAGES; i++) {
    has |= cb->stages[i].stream == st;
    if (!cb->stages[i].stream && slot < 0) slot = i;
  }
  /* One stage a stream (a second could not say which batches it orders); a few streams. */
  s = !made ? SPW_ERR_INVALID_STREAM : has || slot < 0 ? SPW_ERR_BUSY : SPW_OK;
  void *buf = NULL;
  if (s == SPW_OK) s = check(cb, cudaMalloc(&buf, bytes));
  if (s == SPW_OK && pthread_mutex_init(&cb->stages[slot].mu, NULL) != 0) {
    (void)cudaFree(buf);
    s = SPW_ERR_SYSTEM;
  }
  if (s == SPW_OK) {
    cb->stages[slot].buf = buf;
    cb->stages[slot].bytes = bytes;
    cb->stages[slot].stream = st;
  }
  pthread_mutex_unlock(&cb->streams_mu);
  return s;
}

static int cuda_host_register(spw_backend_t *b, void *ptr, size_t bytes) {
  spw_cuda_backend_t *cb = cb_of(b);
  int s = use_device(cb);
  if (s != SPW_OK) return s;
  /* Portable: any device's context may use it; mapped: kernels may address it directly,
   * which the batch copy kernel relies on. A refusal is host memory running out (memlock
   * limit, pinned memory exhausted), not device memory. */
  cudaError_t e = cudaHostRegister(ptr, bytes, cudaHostRegisterPortable | cudaHostRegisterMapped);
  return e == cudaSuccess ? SPW_OK : fail_as(cb, e, SPW_ERR_HOST_OUT_OF_MEMORY);
}

static int cuda_host_unregister(spw_backend_t *b, void *ptr) {
  spw_cuda_backend_t *cb = cb_of(b);
  int s = use_device(cb);
  return s != SPW_OK ? s : check(cb, cudaHostUnregister(ptr));
}

static int cuda_launch_host_func(spw_backend_t *b, spw_stream_t st, spw_host_fn fn, void *arg) {
  spw_cuda_backend_t *cb = cb_of(b);
  int s = use_device(cb);
  return s != SPW_OK ? s : check(cb, cudaLaunchHostFunc(st, fn, arg));
}

static int cuda_launch_kernel(spw_backend_t *b, spw_stream_t st, const void *func, spw_dim3_t grid,
                              spw_dim3_t block, size_t shared_bytes, void **args,
                              const size_t *sizes, size_t nargs) {
  (void)sizes;
  (void)nargs;
  spw_cuda_backend_t *cb = cb_of(b);
  int s = use_device(cb);
  if (s != SPW_OK) return s;
  dim3 g = {grid.x, grid.y, grid.z};
  dim3 k = {block.x, block.y, block.z};
  /* A refused launch is never out of memory: the buffers are already on the device. */
  cudaError_t e = cudaLaunchKernel(func, g, k, args, shared_bytes, st);
  return e == cudaSuccess ? SPW_OK : fail_as(cb, e, SPW_ERR_CUDA);
}

static int cuda_graph_launch(spw_backend_t *b, spw_stream_t st, const void *graph_exec) {
  spw_cuda_backend_t *cb = cb_of(b);
  int s = use_device(cb);
  if (s != SPW_OK) return s;
  /* As for a kernel, a refused launch is never out of memory: the buffers are on the device,
   * and a graph's own allocations (memory nodes) are CUDA's, not the budget's. */
  cudaError_t e = cudaGraphLaunch((cudaGraphExec_t)(uintptr_t)graph_exec, st);
  return e == cudaSuccess ? SPW_OK : fail_as(cb, e, SPW_ERR_CUDA);
}

const spw_backend_ops_t spw__backend_cuda_ops = {
    .name = "cuda",
    .kind = SPW_BACKEND_CUDA,
    .create = cuda_create,
    .destroy = cuda_destroy,
    .mem_info = cuda_mem_info,
    .alloc_async = cuda_alloc_async,
    .free_async = cuda_free_async,
    .trim = cuda_trim,
    .default_stream = cuda_default_stream,
    .stream_create = cuda_stream_create,
    .stream_destroy = cuda_stream_destroy,
    .stream_sync = cuda_stream_sync,
    .stream_device = cuda_stream_device,
    .event_create = cuda_event_create,
    .event_destroy = cuda_event_destroy,
    .event_record = cuda_event_record,
    .event_query = cuda_event_query,
    .event_sync = cuda_event_sync,
    .stream_wait_event = cuda_stream_wait_event,
    .memcpy_async = cuda_memcpy_async,
    .copy_batch_async = cuda_copy_batch_async,
    .stream_stage = cuda_stream_stage,
    .host_register = cuda_host_register,
    .host_unregister = cuda_host_unregister,
    .launch_host_func = cuda_launch_host_func,
    .launch_kernel = cuda_launch_kernel,
    .graph_launch = cuda_graph_launch,
    .peer_access = cuda_peer_access,
    .peer_alloc = cuda_peer_alloc,
    .peer_free = cuda_peer_free,
    .ipc_alloc = cuda_ipc_alloc,
    .ipc_free = cuda_ipc_free,
    .ipc_export = cuda_ipc_export,
    .ipc_open = cuda_ipc_open,
    .ipc_close = cuda_ipc_close,
    .vm_granularity = cuda_vm_granularity,
    .vm_reserve = cuda_vm_reserve,
    .vm_free = cuda_vm_free,
    .chunk_create = cuda_chunk_create,
    .chunk_release = cuda_chunk_release,
    .chunk_map = cuda_chunk_map,
    .chunk_export = cuda_chunk_export,
    .chunk_import = cuda_chunk_import,
    .chunk_unmap = cuda_chunk_unmap,
};

#else
/* ISO C forbids an empty translation unit. */
typedef int spw__backend_cuda_unused;
#endif /* SPW_HAVE_CUDA */
