/* SPDX-License-Identifier: Apache-2.0 */
/* Private header, never installed: the runtime object, and the per-thread error text and
 * callback depth every core file uses.
 *
 * The runtime owns everything: settings, the backend (always behind the fault shim), the
 * handle table, the stream table, the budget, the host arena, the disk tier, the device
 * pool, the spill engine, the completion poller and the event pool. Nothing in Spillway
 * lives outside it.
 *
 * Lock order (outer to inner): a slot's mu -> a stream's lock-map spin lock -> d2h_gate ->
 * budget mu, arena mutex, disk_mu, completion mutex, hints_mu -> engine mutex, event pool
 * mutex, tls_mu, ctl_mu, the stable pool's mutex (a leaf, taken with none of these held in
 * practice: maps and unmaps happen outside slot mutexes), the owners' name mutex (a leaf,
 * taken with none of these held). (hints_mu is held while a hint's job is queued on the engine.) A thread never holds two slot mutexes at once except through a trylock,
 * and no user or controller callback runs while any of these is held (callbacks are
 * collected and delivered afterwards).
 * Across runtimes (the peer tier, peer.c): a lender's lend_mu -> the borrower's peer_rw ->
 * the borrower's own locks above; a borrower never takes a lock of its lender's except
 * lend_mu, with none of its own held (at lend and at destroy).
 */
#ifndef SPILLWAY_CORE_RUNTIME_H
#define SPILLWAY_CORE_RUNTIME_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "backend.h"
#include "backend_faults.h"
#include "budget.h"
#include "completions.h"
#include "config.h"
#include "device_pool.h"
#include "disk_tier.h"
#include "engine.h"
#include "event_pool.h"
#include "handle_table.h"
#include "hint_set.h"
#include "host_arena.h"
#include "log.h"
#include "owners.h"
#include "stable_pool.h"
#include "stream_table.h"
#include "trace.h"
#include "workers.h"

typedef struct spw_peer_link spw_peer_link_t; /* peer.h */

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
  _Atomic uint64_t disk_requests; /* counted by the disk tier itself */
  _Atomic uint64_t host_bytes, disk_bytes; /* authoritative bytes per tier (buffer_state.c) */
  _Atomic uint64_t host_deferred; /* host extent bytes waiting for a stream to be returned */
  _Atomic uint64_t hints_merged, hints_replaced, prefetch_dropped; /* jobs.c, budget.c */
  _Atomic uint64_t peer_bytes; /* authoritative bytes in lent peer memory (buffer_state.c) */
  _Atomic uint64_t peer_spills, peer_spill_bytes, peer_unspills, peer_unspill_bytes;
  _Atomic uint64_t peer_returns, peer_return_bytes;
} spw_counters_t;

typedef struct spw_ipc_opened {
  void *dptr; /* what spw_ipc_open returned */
  void *base; /* the region the backend mapped, or the range the chunk is mapped in */
  uint64_t chunk;     /* an imported chunk (a stable buffer's handle) ... */
  size_t chunk_bytes; /* ... of these bytes; 0 for a region */
} spw_ipc_opened_t;

typedef struct spw_ipc_server spw_ipc_server_t; /* ipc_share.c */

struct spw_runtime {
  spw_settings_t settings;
  spw_log_t log;
  spw_backend_kind_t kind;
  const spw_backend_ops_t *ops; /* the fault shim's ops */
  spw_backend_t *be;            /* the fault shim, wrapping the real backend */
  spw_stream_t null_bstream;    /* what the backend is given for the NULL stream */

  spw_handle_table_t handles;
  spw_stream_table_t streams;
  spw_budget_t budget;

  /* Tiers. The disk tier is opened the first time it is needed; disk_mu guards opening
   * it, and `disk` never changes once set until destruction. */
  spw_host_arena_t *arena;
  pthread_mutex_t disk_mu;
  spw_disk_t *disk;
  int disk_status; /* why the disk tier cannot be opened, for good (then not retried) */
  int disk_logged; /* the last failure to open it that was logged (once per reason) */

  spw_dpool_t *dpool;
  spw_stable_t *stable; /* address ranges and chunks of address-stable buffers */
  spw_engine_t *engine;
  spw_workers_t *workers[2]; /* helpers of each lane's large requests (jobs.c) */
  size_t slice_min;          /* 0, or SPILLWAY_TEST_SLICE_MIN: requests of twice this many
                                buffers go in slices (tests force slices on small ones) */
  spw_completions_t *completions;
  spw_event_pool_t events;
  spw_trace_t *trace; /* NULL unless SPILLWAY_TRACE: every hook is `if (rt->trace)` */
  spw_owners_t *owners; /* owner tags' counters and names (owners.h); never NULL */

  /* The pending hints (jobs.c): at most one wish per buffer. Under hints_mu nothing is taken
   * but the engine mutex (to queue a job). */
  pthread_mutex_t hints_mu;
  spw_hint_set_t hints;

  /* Orders what is enqueued on the engine's download stream against acquires that abandon
   * a spill: a mover checks that its victims are still SPILLING and enqueues their copies
   * under it, and an abandoning acquirer records an event on that stream under it, so the
   * acquirer's stream waits for every copy that may still read the buffer. */
  pthread_mutex_t d2h_gate;

  pthread_mutex_t ctl_mu;
  spw_controller_t ctl;
  void *ctl_user;
  atomic_int has_ctl; /* read without ctl_mu first: no controller costs no lock per event */

  pthread_key_t tls_key;
  pthread_mutex_t tls_mu;
  spw_tls_t *tls_list;
  _Atomic int async_error;

  /* The peer tier (peer.c). `peer` is the memory another runtime lends this one: readers
   * hold peer_rw for reading; the link is set and cleared under it for writing. The links
   * this runtime lends from are in `lent`, under lend_mu. */
  pthread_rwlock_t peer_rw;
  spw_peer_link_t *peer;
  atomic_int peer_on; /* peer != NULL, read first so that no peer tier costs no lock */
  pthread_mutex_t lend_mu;
  spw_peer_link_t *lent;
  _Atomic uint64_t lent_bytes;

  /* Regions of other processes opened here (ipc.c), under ipc_mu (a leaf). */
  pthread_mutex_t ipc_mu;
  spw_ipc_opened_t *ipc_opened;
  size_t ipc_nopened, ipc_cap;
  spw_ipc_server_t *ipc_server; /* answers for exported stable buffers; set under ipc_mu */

  spw_counters_t c;
};

/* ---- per-thread errors and callback depth (errors.c) ---- */
spw_tls_t *spw__tls(spw_runtime_t *rt);
/* Records the text for spw_last_error and logs it at debug level; returns `status`. */
int spw__set_error(spw_runtime_t *rt, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The error sink handed to the backend, the fault shim and the disk tier. */
void spw__error_sink(void *rt, const char *name, const char *text);
/* The log sink handed to the disk tier. */
void spw__log_sink(void *rt, int level, const char *msg);
/* Remembers the first error of background work for spw_async_error / spw_wait_idle. A
 * status that would mean "the caller's mistake" (bad argument, handle, stream) cannot come
 * from background work: it is recorded as SPW_ERR_INTERNAL. */
void spw__set_async_error(spw_runtime_t *rt, int status);
static inline int spw__in_callback(spw_runtime_t *rt) {
  spw_tls_t *t = spw__tls(rt);
  return t && t->callback_depth > 0;
}

/* How many slices a request of n buffers on `lane` is cut into (runtime.c): one below
 * twice the slice minimum, else up to the lane's helpers and the caller. */
unsigned spw__slice_count(const spw_runtime_t *rt, spw_lane_t lane, size_t n);

/* ---- the engine's streams ---- */
static inline spw_stream_t spw__d2h(spw_runtime_t *rt) {
  return spw__engine_stream(rt->engine, SPW_LANE_DOWN);
}
static inline spw_stream_t spw__h2d(spw_runtime_t *rt) {
  return spw__engine_stream(rt->engine, SPW_LANE_UP);
}
/* Waits for every stream of `lane` (its own and its slices'): what the lane's batches have
 * enqueued so far has run. Returns the first failure, having waited for every stream. */
int spw__lane_sync(spw_runtime_t *rt, spw_lane_t lane);

/* ---- the disk tier (runtime.c) ---- */
/* The disk tier, opened now if it is not yet; NULL with *status the reason it cannot be
 * used. A lasting reason (no such directory, io_uring refused under SPW_IO_URING) is
 * remembered and later calls fail fast with it; a passing one is tried again next time. */
spw_disk_t *spw__disk(spw_runtime_t *rt, int *status);

/* ---- test seams (runtime.c) ---- */
/* The next `count` backend operations of kind `f` fail (see backend_faults.h). */
void spw__inject_fault(spw_runtime_t *rt, spw_fault_t f, uint32_t count);
/* Opens the disk tier if needed, then its next `count` transfers fail with `status`
 * (SPW_ERR_IO, SPW_ERR_DISK_FULL, or 1 for a short transfer). Nothing if it cannot open. */
void spw__inject_disk_fault(spw_runtime_t *rt, int status, unsigned count);

/* ---- lifecycle (runtime.c) ---- */
/* Builds a runtime from resolved settings. `armed` (tests; may be NULL) is called with the
 * fault shim as soon as it wraps the backend, before anything else is created, so that
 * creation itself can be made to fail at any backend call. */
int spw__runtime_open(const spw_settings_t *settings, void (*armed)(spw_backend_t *shim, void *arg),
                      void *arg, spw_runtime_t **out);
/* Frees every buffer and everything the runtime owns; no lock may be held, no call may run. */
void spw__runtime_close(spw_runtime_t *rt);

#endif /* SPILLWAY_CORE_RUNTIME_H */
