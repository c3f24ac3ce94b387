/* SPDX-License-Identifier: Apache-2.0 */
/* Private header, never installed: the runtime object and the helpers every core file uses.
 *
 * The runtime owns everything: settings, the backend (always behind the fault shim, the
 * seam tests use to make copies, allocations and registrations fail), the handle table, the
 * stream table, the budget, the host arena, the disk tier, the spill engine and the
 * completion poller. Nothing in Spillway lives outside it.
 *
 * Lock order (outer to inner): a slot's mu -> a stream's lock-map spin lock -> budget_mu,
 * arena mutex, disk mutex, completion mutex, engine mutex, tls_mu, ctl_mu. A thread never
 * holds two slot mutexes at once, and no user or controller callback runs while any of these
 * is held (callbacks are collected and delivered afterwards).
 */
#ifndef SPILLWAY_SRC_RUNTIME_H
#define SPILLWAY_SRC_RUNTIME_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "../spill/disk_io.h"
#include "../spill/host_arena.h"
#include "../spill/spill_file.h"
#include "backend.h"
#include "config.h"
#include "device_pool.h"
#include "handle_table.h"
#include "log.h"
#include "stream_table.h"

typedef struct spw_engine spw_engine_t;
typedef struct spw_completions spw_completions_t;

/* Per-thread state of one runtime (pthread key): last error text, callback depth. */
typedef struct spw_tls {
  char last_error[512];
  int callback_depth; /* > 0 while this thread runs a controller callback */
  struct spw_tls *next;
} spw_tls_t;

/* Counters behind spw_stats_t; relaxed atomics, read together without a lock. */
typedef struct spw_counters {
  _Atomic uint64_t spills, spill_bytes, unspills, unspill_bytes;
  _Atomic uint64_t demotions, demote_bytes, disk_reads, disk_read_bytes;
  _Atomic uint64_t disk_writes, disk_write_bytes;
  _Atomic uint64_t spills_on_demand, spills_background, spills_abandoned, clean_respills;
  _Atomic uint64_t failures;
  _Atomic uint64_t spill_ns, unspill_ns, demote_ns, disk_read_ns;
  _Atomic uint64_t host_bytes, disk_bytes;
  _Atomic uint64_t host_deferred; /* host extent bytes waiting for a stream to be returned */
} spw_counters_t;

/* Operations the fault shim can make fail (tests). */
typedef enum spw_fault {
  SPW_FAULT_ALLOC = 0,         /* alloc_async -> SPW_ERR_OUT_OF_MEMORY */
  SPW_FAULT_COPY = 1,          /* memcpy_async / copy_batch_async -> SPW_ERR_CUDA */
  SPW_FAULT_HOST_REGISTER = 2, /* host_register -> SPW_ERR_CUDA */
  SPW_FAULT_LAUNCH = 3,        /* launch_kernel -> SPW_ERR_CUDA */
  SPW_FAULT_COUNT_
} spw_fault_t;

struct spw_runtime {
  spw_settings_t settings;
  spw_log_t log;
  spw_backend_kind_t kind;
  const spw_backend_ops_t *ops; /* the fault shim's ops */
  spw_backend_t *be;            /* the fault shim, wrapping the real backend */
  spw_stream_t null_bstream;    /* what the backend is given for the NULL stream */

  spw_handle_table_t handles;
  spw_stream_table_t streams;

  /* Budget: device bytes held by buffers, against the limit and its watermarks. */
  uint64_t device_limit, high_bytes, low_bytes;
  _Atomic uint64_t device_used;
  _Atomic uint64_t spilling_bytes; /* part of device_used on its way out */
  _Atomic uint64_t background_wanted; /* the engine has been told to spill down to low */
  pthread_mutex_t budget_mu;
  pthread_cond_t budget_cv; /* broadcast whenever device bytes are given back */

  /* Tiers. The disk tier (spill/disk_tier.c) is opened the first time it is needed;
   * disk_mu guards opening it. */
  spw_host_arena_t *arena;
  pthread_mutex_t disk_mu;
  struct spw_disk *disk;
  int disk_status; /* why opening the disk tier failed, once it has (then not retried) */

  struct spw_dpool *dpool;
  spw_engine_t *engine;
  spw_completions_t *completions;

  /* Pool of backend events for one-shot uses (release_async, deferred frees). */
  pthread_mutex_t event_mu;
  spw_bevent_t **event_pool;
  size_t event_pool_n, event_pool_cap;

  pthread_mutex_t ctl_mu;
  spw_controller_t ctl;
  void *ctl_user;
  atomic_int has_ctl; /* read without ctl_mu first: no controller costs no lock per event */

  pthread_key_t tls_key;
  pthread_mutex_t tls_mu;
  spw_tls_t *tls_list;
  _Atomic int async_error;

  spw_counters_t c;
  _Atomic uint32_t faults[SPW_FAULT_COUNT_];
};

/* ---- per-thread errors and callback depth (runtime.c) ---- */
spw_tls_t *spw__tls(spw_runtime_t *rt);
/* Records the text for spw_last_error and logs it at debug level; returns `status`. */
int spw__set_error(spw_runtime_t *rt, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The error sink handed to the backend and the I/O layer. */
void spw__error_sink(void *rt, const char *name, const char *text);
/* Remembers the first error of background work for spw_async_error / spw_wait_idle. */
void spw__set_async_error(spw_runtime_t *rt, int status);
static inline int spw__in_callback(spw_runtime_t *rt) {
  spw_tls_t *t = spw__tls(rt);
  return t && t->callback_depth > 0;
}

/* ---- events (runtime.c) ---- */
int spw__event_get(spw_runtime_t *rt, spw_bevent_t **out);
void spw__event_put(spw_runtime_t *rt, spw_bevent_t *e);

/* ---- streams (stream_api.c) ---- */
/* Validates a user stream: its entry, or SPW_ERR_INVALID_STREAM. */
int spw__stream_lookup(spw_runtime_t *rt, spw_stream_t s, spw_stream_entry_t **out);

/* ---- locks (acquire.c) ---- */
/* Drops one lock of `h` without touching any lock map (the map entry is already gone).
 * Finishes a pending free when this was the last lock. */
void spw__unlock(spw_runtime_t *rt, spw_buf_t h);

/* ---- buffers (buffer.c) ---- */
/* Frees what a slot holds in every tier and returns the slot. Caller holds slot->mu and has
 * established that nobody else may touch the buffer (count 0, no move in flight). Unlocks
 * slot->mu. Returns the bytes that were on the device. */
void spw__buffer_finish_free(spw_runtime_t *rt, spw_slot_t *slot, spw_buf_t h);

/* ---- budget (budget.c) ---- */
/* Reserves `bytes` of the device limit, spilling unlocked buffers on demand (this thread
 * waits for them). SPW_ERR_OUT_OF_MEMORY when what remains is locked. */
int spw__budget_reserve(spw_runtime_t *rt, uint64_t bytes);
void spw__budget_unreserve(spw_runtime_t *rt, uint64_t bytes);
/* Device memory from the backend for `bytes` already reserved: retries after spilling when
 * the device itself refuses. */
int spw__device_alloc(spw_runtime_t *rt, size_t bytes, spw_stream_t bstream, void **out);
/* Spills least-recently-used unlocked buffers (the controller's choices first) until `bytes`
 * have left the device; waits for the copies and returns the bytes that left (0: nothing
 * could be spilled, or every spill failed or was abandoned). */
uint64_t spw__spill_lru(spw_runtime_t *rt, uint64_t bytes, int background);
/* Bytes of device memory held by locked buffers (for the out-of-memory message). */
uint64_t spw__locked_device_bytes(spw_runtime_t *rt);

/* ---- controller (controller.c) ---- */
void spw__notify_allocated(spw_runtime_t *rt, spw_buf_t h, size_t bytes);
void spw__notify_freed(spw_runtime_t *rt, spw_buf_t h, size_t bytes);
void spw__notify_state(spw_runtime_t *rt, const spw_state_event_t *ev);
/* Asks the controller for victims; returns how many it named (0 without a controller). */
size_t spw__ask_pressure(spw_runtime_t *rt, uint64_t bytes_needed, spw_buf_t *victims, size_t max);

/* ---- fault shim (backend_faults.c) ---- */
int spw__faults_wrap(spw_runtime_t *rt, const spw_backend_ops_t *inner, spw_backend_t *inner_b,
                     const spw_backend_ops_t **ops_out, spw_backend_t **b_out);
/* Test seam: the next `count` operations of kind `f` fail. */
void spw__inject_fault(spw_runtime_t *rt, spw_fault_t f, uint32_t count);

/* ---- time ---- */
uint64_t spw__now_ns(void);
uint64_t spw__coarse_now_ns(void);

#endif /* SPILLWAY_SRC_RUNTIME_H */
