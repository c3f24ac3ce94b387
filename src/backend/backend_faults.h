/* SPDX-License-Identifier: Apache-2.0 */
/* Private header, never installed: the fault shim, a backend that forwards every operation
 * to a real one and makes chosen operations fail, or pause, on demand.
 *
 * The runtime always talks to the device through it, so tests that make a copy, an
 * allocation, an event or a stream operation fail run exactly the error paths a real
 * failure would, on both backends, and tests that must force an interleaving (an acquire
 * while a spill's copy is being enqueued) can hold an operation in a hook. Idle, it costs
 * one relaxed load per forwarded call. */
#ifndef SPILLWAY_BACKEND_FAULTS_H
#define SPILLWAY_BACKEND_FAULTS_H

#include <stdint.h>

#include "backend.h"

/* The operations that can be made to fail; each names the ops it covers. */
typedef enum spw_fault {
  SPW_FAULT_ALLOC = 0,     /* alloc_async, chunk_create -> SPW_ERR_OUT_OF_MEMORY */
  SPW_FAULT_COPY,          /* memcpy_async, copy_batch_async -> SPW_ERR_CUDA */
  SPW_FAULT_HOST_REGISTER, /* host_register -> SPW_ERR_CUDA */
  SPW_FAULT_EVENT_CREATE,  /* event_create -> SPW_ERR_CUDA */
  SPW_FAULT_EVENT_RECORD,  /* event_record -> SPW_ERR_CUDA */
  SPW_FAULT_EVENT_QUERY,   /* event_query -> SPW_ERR_CUDA */
  SPW_FAULT_EVENT_SYNC,    /* event_sync -> SPW_ERR_CUDA */
  SPW_FAULT_STREAM_WAIT,   /* stream_wait_event -> SPW_ERR_CUDA */
  SPW_FAULT_STREAM_SYNC,   /* stream_sync -> SPW_ERR_CUDA */
  SPW_FAULT_STREAM_CREATE, /* stream_create -> SPW_ERR_CUDA */
  SPW_FAULT_HOST_FUNC,     /* launch_host_func -> SPW_ERR_CUDA */
  SPW_FAULT_MEM_INFO,      /* mem_info -> SPW_ERR_CUDA */
  SPW_FAULT_LAUNCH,        /* launch_kernel, graph_launch -> SPW_ERR_CUDA */
  SPW_FAULT_COUNT_
} spw_fault_t;

/* Called before an operation of kind `op` is forwarded (or failed), on the calling thread. */
typedef void (*spw_fault_hook_fn)(void *arg, spw_fault_t op, spw_stream_t stream);

/* Wraps (inner_ops, inner) into a shim; `sink` receives "injected" errors like real ones.
 * Destroying the shim destroys the inner backend. */
int spw__faults_wrap(const spw_backend_ops_t *inner_ops, spw_backend_t *inner,
                     spw_error_sink_fn sink, void *sink_ctx, const spw_backend_ops_t **ops_out,
                     spw_backend_t **shim_out);
/* The next `count` operations of kind `f` after `skip` more of them fail. Replaces what was
 * armed before; count 0 disarms. */
void spw__faults_arm(spw_backend_t *shim, spw_fault_t f, uint32_t skip, uint32_t count);
/* Operations of kind `f` call `fn` first (NULL removes the hook). Set it while no such
 * operation runs. */
void spw__faults_hook(spw_backend_t *shim, spw_fault_t f, spw_fault_hook_fn fn, void *arg);

#endif /* SPILLWAY_BACKEND_FAULTS_H */
