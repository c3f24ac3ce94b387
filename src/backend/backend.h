/* SPDX-License-Identifier: Apache-2.0 */
/* Private header, never installed: the device backend seam.
 *
 * Every call Spillway makes to the device goes through one spw_backend_ops table. Two
 * implementations: backend_cuda.c (CUDA Runtime API, device memory from the stream-ordered
 * pool) and backend_host.c (device memory emulated in host memory, each stream a FIFO
 * worker thread, so asynchronous order, events and synchronize behave as on a GPU).
 *
 * Contract, for every operation:
 *  - returns SPW_OK or a negative spw_status_t; on a device error it also calls
 *    b->on_error(b->err_ctx, name, text) with the CUDA error name and text, then returns
 *    SPW_ERR_CUDA (or SPW_ERR_OUT_OF_MEMORY for an allocation the device refuses);
 *  - every operation is thread-safe; streams and events may be used from any thread;
 *  - "async" operations are ordered on the given stream after the work enqueued before
 *    them, exactly as the CUDA call of the same name; the host backend obeys the same order;
 *  - the stream argument is never the caller's NULL when the backend is host: the runtime
 *    maps NULL to the host backend's default stream (ops->default_stream);
 *  - preconditions (valid pointers, live streams and events) are the caller's job: the
 *    runtime validates user input before it reaches this layer.
 */
#ifndef SPILLWAY_BACKEND_BACKEND_H
#define SPILLWAY_BACKEND_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "spillway/spillway.h"

typedef struct spw_backend spw_backend_t; /* implementation state, private to each .c */
typedef struct spw_bevent spw_bevent_t;   /* an event (cudaEvent_t or host emulation) */

typedef void (*spw_error_sink_fn)(void *ctx, const char *name, const char *text);

typedef struct spw_backend_params {
  int device;                 /* CUDA device ordinal */
  uint64_t host_device_bytes; /* host backend: emulated device capacity */
  spw_error_sink_fn on_error; /* receives device error name and text; may be NULL */
  void *err_ctx;
  int vm_shareable;           /* chunks are created exportable (chunk_export), for config.ipc */
} spw_backend_params_t;

/* One copy of a batch; all of one batch go in the same direction. */
typedef struct spw_copy_desc {
  void *dst;
  const void *src;
  size_t bytes;
} spw_copy_desc_t;

typedef enum spw_copy_dir {
  SPW_COPY_D2H = 0, /* device -> registered (pinned) host memory */
  SPW_COPY_H2D = 1, /* registered host memory -> device */
} spw_copy_dir_t;

typedef void (*spw_host_fn)(void *arg);

typedef struct spw_backend_ops {
  const char *name;           /* "cuda" or "host" */
  spw_backend_kind_t kind;

  /* Returns SPW_ERR_NO_DEVICE when this backend cannot run here (no GPU for cuda). */
  int (*create)(const spw_backend_params_t *p, spw_backend_t **out);
  /* Waits for all streams, destroys what the backend created. */
  void (*destroy)(spw_backend_t *b);

  /* Free and total device memory (host: the emulated capacity and what is not allocated). */
  int (*mem_info)(spw_backend_t *b, size_t *free_bytes, size_t *total_bytes);

  /* Stream-ordered allocation and free (cudaMallocAsync / cudaFreeAsync). Allocation returns
   * SPW_ERR_OUT_OF_MEMORY if the device (or the emulated capacity) refuses; memory is 256-byte
   * aligned. free_async of NULL is SPW_OK. */
  int (*alloc_async)(spw_backend_t *b, size_t bytes, spw_stream_t s, void **out);
  int (*free_async)(spw_backend_t *b, void *ptr, spw_stream_t s);
  /* Releases cached pool memory back to the device (cudaMemPoolTrimTo 0); host: no-op. */
  int (*trim)(spw_backend_t *b);

  /* The stream the runtime uses for the application's NULL stream: NULL on cuda, the
   * backend's own default stream on host. */
  spw_stream_t (*default_stream)(spw_backend_t *b);
  /* A new non-blocking stream. */
  int (*stream_create)(spw_backend_t *b, spw_stream_t *out);
  /* Waits for the stream's work, then destroys it. */
  int (*stream_destroy)(spw_backend_t *b, spw_stream_t s);
  int (*stream_sync)(spw_backend_t *b, spw_stream_t s);
  /* The device ordinal `s` belongs to, for refusing another device's stream. cuda:
   * cudaStreamGetDevice, so `s` must be a live stream or the handle is read after its
   * destruction (a handle CUDA rejects gives SPW_ERR_INVALID_STREAM, unreported; a build
   * against CUDA older than 12.8 gives SPW_ERR_UNSUPPORTED); the legacy and per-thread
   * streams are the backend's device, which every op makes current. host: any value may
   * be asked about, since only the addresses of live streams are compared: a stream of this
   * backend or of another host backend on another ordinal gives that ordinal; anything else
   * (another host backend's stream on this same ordinal included, as it emulates other
   * memory) is SPW_ERR_INVALID_STREAM. */
  int (*stream_device)(spw_backend_t *b, spw_stream_t s, int *device);

  /* Events: created without timing; record, query (SPW_OK when complete, SPW_ERR_NOT_READY
   * while pending), block until complete, make a stream wait. An event never recorded is
   * complete. */
  int (*event_create)(spw_backend_t *b, spw_bevent_t **out);
  void (*event_destroy)(spw_backend_t *b, spw_bevent_t *e);
  int (*event_record)(spw_backend_t *b, spw_bevent_t *e, spw_stream_t s);
  int (*event_query)(spw_backend_t *b, spw_bevent_t *e);
  int (*event_sync)(spw_backend_t *b, spw_bevent_t *e);
  int (*stream_wait_event)(spw_backend_t *b, spw_stream_t s, spw_bevent_t *e);

  /* cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s). */
  int (*memcpy_async)(spw_backend_t *b, void *dst, const void *src, size_t bytes,
                      spw_stream_t s);
  /* Copies a batch of buffers in one direction, host side in memory registered with
   * host_register. Fast for many small buffers: one kernel reading or writing mapped pinned
   * memory (cuda), or one stream operation (host). Large entries (>= 1 MiB) may be split
   * off to memcpy_async. `descs` may be reused by the caller as soon as this returns. */
  int (*copy_batch_async)(spw_backend_t *b, const spw_copy_desc_t *descs, size_t n,
                          spw_copy_dir_t dir, spw_stream_t s);
  /* Optional (NULL: none). Gives stream `s` (made by stream_create) `bytes` of device
   * staging for copy_batch_async: small buffers whose host sides lie back to back then
   * cross the link in one copy-engine transfer (gathered or scattered on the device),
   * instead of a kernel reading or writing mapped host memory. Freed with the stream. Errors:
   * SPW_ERR_INVALID_ARG, SPW_ERR_INVALID_STREAM (not made by stream_create), SPW_ERR_BUSY
   * (it has one, or 32 streams have), SPW_ERR_OUT_OF_MEMORY; then nothing changes and
   * the batches go as before. */
  int (*stream_stage)(spw_backend_t *b, spw_stream_t s, size_t bytes);

  /* Pins host memory for fast and mapped copies (cudaHostRegister, portable | mapped);
   * `ptr` page-aligned, `bytes` a multiple of the page size. Host backend: no-op. */
  int (*host_register)(spw_backend_t *b, void *ptr, size_t bytes);
  int (*host_unregister)(spw_backend_t *b, void *ptr);

  /* Enqueues fn(arg) on the stream (cudaLaunchHostFunc). fn must not call the backend. */
  int (*launch_host_func)(spw_backend_t *b, spw_stream_t s, spw_host_fn fn, void *arg);

  /* Launches a kernel on the stream (cudaLaunchKernel): args[i] points to argument i's
   * value, sizes[i] bytes, copied before the call returns. cuda: `func` is a host stub or a
   * cudaKernel_t, and sizes go unused (the kernel's signature gives them). host: `func` is
   * a spw_host_kernel_fn, run once on the stream's worker with pointers to its own copy of
   * the values; grid, block and shared_bytes go unused. The caller has checked the
   * dimensions, the count and the sizes. */
  int (*launch_kernel)(spw_backend_t *b, spw_stream_t s, const void *func, spw_dim3_t grid,
                       spw_dim3_t block, size_t shared_bytes, void **args, const size_t *sizes,
                       size_t nargs);

  /* Launches an instantiated graph on the stream (cudaGraphLaunch). cuda: `graph_exec` is a
   * cudaGraphExec_t. host: a spw_host_graph_t *, whose fn and user are read now and fn(user)
   * run once on the stream's worker (SPW_ERR_INVALID_ARG when fn is NULL). The caller has
   * checked that graph_exec is not NULL. */
  int (*graph_launch)(spw_backend_t *b, spw_stream_t s, const void *graph_exec);

  /* The peer tier (core/peer.h): memory of this device that another runtime's device
   * reads and writes through unified addresses.
   *  - peer_access: lets this backend's device reach `peer_device`'s memory (kernels and
   *    copies; cudaDeviceEnablePeerAccess, once); SPW_OK for its own device (and always on
   *    host), SPW_ERR_UNSUPPORTED when the two devices have no peer access;
   *  - peer_alloc / peer_free: memory of this device another device may reach once its
   *    peer access is on (cudaMalloc / cudaFree, synchronous: memory from a stream-ordered
   *    pool is reachable by a peer only with the pool's own access setting). */
  int (*peer_access)(spw_backend_t *b, int peer_device);
  int (*peer_alloc)(spw_backend_t *b, size_t bytes, void **out);
  int (*peer_free)(spw_backend_t *b, void *ptr);

  /* Memory another process can map (CUDA IPC; host: shared memory, see host_ipc.h).
   *  - ipc_alloc / ipc_free: a region that ipc_export can export, allocated synchronously
   *    and usable by every stream at once (cudaMalloc / cudaFree; free only once no work
   *    touches it);
   *  - ipc_export: the handle of the region that ipc_alloc returned at `base`;
   *  - ipc_open: maps a region of another process by its handle (*base: its start here);
   *  - ipc_close: unmaps what ipc_open mapped. */
  int (*ipc_alloc)(spw_backend_t *b, size_t bytes, void **out);
  int (*ipc_free)(spw_backend_t *b, void *base);
  int (*ipc_export)(spw_backend_t *b, void *base, unsigned char handle[SPW_IPC_HANDLE_BYTES]);
  int (*ipc_open)(spw_backend_t *b, const unsigned char handle[SPW_IPC_HANDLE_BYTES],
                  void **base);
  int (*ipc_close)(spw_backend_t *b, void *base);

  /* Address-stable memory (CUDA virtual memory management; host: an emulation of the same
   * contract). An address range is reserved with no memory behind it; physical chunks are
   * created apart and mapped into it, read-write for the device, and unmapped again, so
   * that the range keeps its address while its memory comes and goes.
   *  - vm_granularity: the chunk size; every size and offset below is a multiple of it.
   *    SPW_ERR_UNSUPPORTED when the device or driver has no virtual memory management;
   *  - vm_reserve / vm_free: a range, `bytes` long, aligned to the granularity; free only
   *    once nothing is mapped in it;
   *  - chunk_create: physical memory of `bytes` (one or more granules), counted against
   *    the device like an allocation (SPW_ERR_OUT_OF_MEMORY when refused); chunk_release
   *    gives it back and may be called only while it is not mapped;
   *  - chunk_map: maps the whole chunk at `va` (inside a reserved range, nothing mapped
   *    there) and makes it accessible; usable by every stream when the call returns;
   *  - chunk_unmap: unmaps [va, va + bytes), whole chunks only. Precondition: no work on any
   *    stream may still touch the range (the caller waits for it first); afterwards a
   *    device access there faults, and on the host backend a host access is SIGSEGV.
   *  - chunk_export: a new file descriptor (the caller closes it) and an offset in it that
   *    another process's chunk_import turns into the same physical chunk; only chunks of a
   *    backend created with vm_shareable (SPW_ERR_UNSUPPORTED otherwise);
   *  - chunk_import: a chunk of `bytes` from such a descriptor and offset (the caller may
   *    close the descriptor afterwards), mapped and released like any other chunk; it does
   *    not count against this device.
   * The chunk handle is opaque (a CUmemGenericAllocationHandle; host: an offset in one
   * memfd, or an entry of a table of descriptors). */
  int (*vm_granularity)(spw_backend_t *b, size_t *out);
  int (*vm_reserve)(spw_backend_t *b, size_t bytes, void **out);
  int (*vm_free)(spw_backend_t *b, void *va, size_t bytes);
  int (*chunk_create)(spw_backend_t *b, size_t bytes, uint64_t *out);
  void (*chunk_release)(spw_backend_t *b, uint64_t chunk, size_t bytes);
  int (*chunk_map)(spw_backend_t *b, void *va, size_t bytes, uint64_t chunk);
  int (*chunk_unmap)(spw_backend_t *b, void *va, size_t bytes);
  int (*chunk_export)(spw_backend_t *b, uint64_t chunk, int *fd, uint64_t *fd_offset);
  int (*chunk_import)(spw_backend_t *b, int fd, uint64_t fd_offset, size_t bytes,
                      uint64_t *chunk);
} spw_backend_ops_t;

/* The implementations; the CUDA one exists only in builds with CUDA (SPW_HAVE_CUDA). */
extern const spw_backend_ops_t spw__backend_host_ops;
#ifdef SPW_HAVE_CUDA
extern const spw_backend_ops_t spw__backend_cuda_ops;
#endif

#endif /* SPILLWAY_BACKEND_BACKEND_H */
