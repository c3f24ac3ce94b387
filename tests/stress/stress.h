/* SPDX-License-Identifier: Apache-2.0 */
/* Private header of spw_stress, the randomized model-based stress test (tests/stress/, never
 * installed). What the program does and how to run it: stress_main.c's first comment.
 *
 * The model. Each worker thread OWNS its buffers: only the owner acquires, writes, reads,
 * releases and frees them, so for each one it knows exactly the size, the version of the
 * contents (stress_pattern.h) and the locks it holds, per stream, split into "held" (in the
 * stream's lock map) and "pending" (handed to spw_stream_release_async or
 * spw_release_n_async, released by the runtime once the stream passes that point, at a
 * moment the owner does not know). The meddler thread and the controller callbacks only
 * move buffers (spill, prefetch), and the lender thread (--peer on) lends memory to the
 * runtime and takes it back, which must never change what an owner reads back.
 *
 * What is shared between threads, all through atomics: the handles each worker publishes
 * for the meddler (pub), a ring of freed handles (dead), the locked-bytes model and its
 * peak trackers, counters, the op history (read by the watchdog on a hang) and the stop
 * flag. A buffer counts in `locked` from just before the acquire that takes its first lock
 * until its owner knows the last lock is gone, so `locked` is never below what the runtime
 * really holds locked; each thread's tracker records the highest value seen during a call,
 * and SPW_ERR_OUT_OF_MEMORY is accepted only when that peak (its own request included)
 * exceeds the device budget.
 */
#ifndef SPILLWAY_TESTS_STRESS_H
#define SPILLWAY_TESTS_STRESS_H

#include <pthread.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "spillway/spillway.h"

#define STRESS_MAX_THREADS 64
#define STRESS_STREAMS 2   /* streams per worker, at most */
#define STRESS_MAX_N 8     /* handles per acquire_n / release_n_async / spill_n of a worker */
#define STRESS_MEDDLE_N 16 /* handles per spill_n / prefetch_n of the meddler */
#define STRESS_PUB 512     /* handles a worker publishes for the meddler and the controller */
#define STRESS_DEAD 256    /* freed handles remembered for them */
#define STRESS_LOCAL_DEAD 32
#define STRESS_HIST 64 /* operations remembered per thread; the last 50 are printed */
#define STRESS_TRACKERS (2 * STRESS_MAX_THREADS + 4)
#define STRESS_NSTATES (SPW_STATE_PEER + 1) /* controller events: from and to, by state */

#define KiB ((uint64_t)1 << 10)
#define MiB ((uint64_t)1 << 20)
#define GiB ((uint64_t)1 << 30)

/* The operations a worker draws (name, weight by default, weight in --soak), then the
 * steps that only appear in histories. */
#define STRESS_WEIGHTED_OPS(X)                \
  X(ALLOC, "alloc", 10, 3)                    \
  X(FREE, "free", 5, 2)                       \
  X(FREE_LOCKED, "free_locked", 2, 1)         \
  X(FREE_PENDING, "free_pending", 2, 1)       \
  X(FREE_SPILLING, "free_spilling", 2, 1)     \
  X(ACQUIRE, "acquire", 16, 10)               \
  X(ACQUIRE_READ, "acquire_read", 10, 6)      \
  X(ACQUIRE_TRY, "acquire_try", 3, 1)         \
  X(ACQUIRE_N, "acquire_n", 8, 12)            \
  X(RELEASE, "release", 5, 3)                 \
  X(SYNC, "sync", 6, 4)                       \
  X(RELEASE_ASYNC, "release_async", 6, 5)     \
  X(RELEASE_N_ASYNC, "release_n_async", 6, 6) \
  X(SPILL_HOST, "spill_host", 3, 1)           \
  X(SPILL_DISK, "spill_disk", 3, 1)           \
  X(SPILL_N, "spill_n", 2, 1)                 \
  X(PREFETCH, "prefetch", 3, 1)               \
  X(PREFETCH_N, "prefetch_n", 2, 1)           \
  X(WAIT_IDLE, "wait_idle", 1, 1)             \
  X(ASYNC_ERROR, "async_error", 1, 1)         \
  X(QUERY, "query", 5, 2)                     \
  X(STATS, "stats", 2, 1)                     \
  X(CONTROLLER, "controller", 1, 1)           \
  X(DEAD_HANDLE, "dead_handle", 2, 1)         \
  X(BAD_INPUT, "bad_input", 2, 1)             \
  X(STREAM_RECYCLE, "stream_recycle", 1, 1)   \
  X(HOST_RESERVE, "host_reserve", 1, 1)

#define STRESS_STEP_OPS(X)          \
  X(FENCE, "fence")                 \
  X(VERIFY, "verify")               \
  X(WRITE, "write")                 \
  X(RETIRE, "lock_count")           \
  X(STREAM_CREATE, "stream_create") \
  X(FINISH, "finish")               \
  X(MEDDLE, "meddle")               \
  X(CALLBACK, "callback")           \
  X(LEND, "peer_lend")              \
  X(RECLAIM, "peer_reclaim")        \
  X(PRESSURE, "lender_pressure")

typedef enum stress_op {
#define STRESS_OP_ENUM_W(name, text, w, ws) OP_##name,
#define STRESS_OP_ENUM_S(name, text) OP_##name,
  STRESS_WEIGHTED_OPS(STRESS_OP_ENUM_W) OP_NWEIGHTED,
  STRESS_STEP_OPS(STRESS_OP_ENUM_S) OP_COUNT
#undef STRESS_OP_ENUM_W
#undef STRESS_OP_ENUM_S
} stress_op_t;

const char *stress_op_name(int op);

/* Acceptable statuses of a call, as a bit mask. */
#define ACC(name) (1u << (unsigned)(-(SPW_##name)))

typedef struct stress_options {
  uint64_t seed;
  double seconds;
  int threads;
  uint64_t budget, host_limit;
  uint64_t min_buf, max_buf; /* allocation sizes */
  uint64_t live;             /* live data each worker aims at */
  uint64_t lock_cap;         /* bytes a worker may hold locked (pending included) */
  int controller, meddler;
  int sanity, soak;
  int peer;        /* --peer on: a lender thread lends a second runtime's memory (stress_lender.c) */
  int peer_device; /* the lender's device; -1: the borrower's */
  spw_backend_kind_t backend;
  const char *spill_dir;
  unsigned meddle_us;      /* the meddler's period */
  double hang_seconds;     /* no progress for this long: a hang */
  double idle_seconds;     /* bound on spw_wait_idle once the workers and meddler stopped */
  double progress_seconds; /* progress line period (0: none) */
  unsigned weights[OP_NWEIGHTED];
  unsigned tolerate_async; /* triage only: background errors to count rather than fail on */
} stress_options_t;

/* A buffer in its owner's model. */
typedef struct mbuf {
  spw_buf_t h;
  uint64_t id;
  size_t size;
  uint32_t version; /* of the contents; 0 = never written */
  uint16_t held[STRESS_STREAMS], pending[STRESS_STREAMS];
  int work;     /* stream with work on the buffer not known to be complete, or -1 */
  bool counted; /* its bytes are in the shared locked model */
  int pub;      /* its slot in the owner's published table, or -1 */
  void *dptr;   /* while held */
} mbuf_t;

typedef struct hist_entry {
  _Atomic uint64_t w[4];
} hist_entry_t;

typedef struct history {
  hist_entry_t e[STRESS_HIST];
  _Atomic uint64_t seq;
} history_t;

typedef struct stress stress_t;

typedef struct worker {
  stress_t *st;
  int index;
  uint64_t rng;
  spw_stream_t streams[STRESS_STREAMS];
  int nstreams;
  int null_stream;        /* index of the NULL stream in streams, or -1 */
  mbuf_t *live, *zombies; /* zombies: freed, some locks still outstanding */
  size_t nlive, live_cap, nzombies, zombie_cap;
  spw_buf_t dead[STRESS_LOCAL_DEAD];
  size_t ndead;
  uint64_t live_bytes, mine_locked;
  _Atomic spw_buf_t pub[STRESS_PUB];
  int pub_free[STRESS_PUB];
  int npub_free;
  _Atomic int pub_high;
  history_t hist;
  _Atomic uint64_t heartbeat;
  atomic_int phase; /* 0 running, 1 finishing, 2 checked (waits for may_free), 3 done */
  int tracker_call, tracker_async;
  uint64_t ops_since_retire;
  /* counts */
  uint64_t counts[OP_COUNT];
  uint64_t oom_accepted, not_ready, locked_refused, checks;
  uint64_t peer_seen; /* queries that found a buffer in SPW_STATE_PEER */
  _Atomic uint64_t groups, bytes_checked, bytes_written; /* read by the progress line */
  /* the data plane (stress_data.c) */
  sem_t fence;
  _Atomic uint64_t staging; /* host staging bytes not yet handed back */
  _Atomic uint64_t host_checks, host_bytes_checked;
  atomic_int bad; /* 2 once bad_msg holds a contents mismatch */
  char bad_msg[512];
  void *cuda_check;
} worker_t;

struct stress {
  stress_options_t o;
  spw_runtime_t *rt;
  spw_backend_kind_t backend;
  const char *io;
  char replay[1024];
  worker_t *workers;
  int nworkers;
  /* locked model */
  _Atomic uint64_t locked;
  _Atomic uint64_t peak[STRESS_TRACKERS];
  /* handles for the meddler and the controller */
  _Atomic spw_buf_t dead[STRESS_DEAD];
  _Atomic uint64_t dead_next;
  _Atomic uint64_t next_id;
  atomic_int stop;
  /* the meddler */
  spw_stream_t meddler_stream;
  uint64_t meddler_rng;
  history_t meddler_hist;
  _Atomic uint64_t meddler_heartbeat;
  atomic_int meddler_phase;
  int meddler_tracker;
  int run_tracker; /* the whole run: for failed moves reported to the controller */
  uint64_t meddles, meddle_freed, meddle_locked, meddle_oom, meddle_peer_seen;
  /* the lender (--peer on): its runtime, and what only its thread writes until joined */
  spw_runtime_t *lender;
  spw_stream_t lender_stream;
  uint64_t lender_rng;
  history_t lender_hist;
  _Atomic uint64_t lender_heartbeat;
  atomic_int lender_phase;
  atomic_int lender_stop; /* set, and the lender joined, before `stop` */
  uint64_t lent;          /* bytes lent now (0: none), as the lender thread knows it */
  uint64_t lender_rounds, lends, lend_busy, reclaims, reclaims_refused, pressure_takebacks;
  /* the controller */
  atomic_int controller_kind;
  _Atomic uint64_t tolerated; /* background errors let through by --tolerate-async */
  _Atomic uint64_t cb_seq, cb_allocated, cb_freed, cb_events, cb_locked_skips, cb_oom_events,
      cb_pressure, cb_victims, cb_calls, cb_deadlock_checks;
  _Atomic uint64_t cb_peer_stuck; /* PEER -> PEER failures: a buffer that could not move on */
  _Atomic uint64_t cb_transitions[STRESS_NSTATES][STRESS_NSTATES];
  /* the end of the run: workers free their buffers once the idle checks are done */
  atomic_int may_free;
  double idle_stop_s;            /* spw_wait_idle as soon as nothing sends hints any more */
  double idle_s;                 /* spw_wait_idle after the workers' final checks */
  /* the main thread, for the watchdog */
  _Atomic uint64_t main_heartbeat;
  _Atomic(const char *) main_phase;
  atomic_int failing;
  double t0;
};

/* stress_check.c: clock, histories, failure reports, the locked model. */
double stress_now(void);
uint64_t stress_rand(uint64_t *state);
static inline uint64_t stress_below(uint64_t *state, uint64_t n) {
  return n ? stress_rand(state) % n : 0;
}
void stress_note(history_t *h, int op, int status, int stream, unsigned flags, spw_buf_t buf,
                 uint64_t id, uint32_t version, uint64_t size, unsigned n);
void stress_print_history(const history_t *h, const char *who, int last);
void stress_set_thread(history_t *h, const char *name);
/* Prints the report and ends the process; w NULL: this thread's worker, if any. */
_Noreturn void stress_fail(stress_t *st, worker_t *w, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Fails the run unless status is in `accept`; reports the call, the status and its text. */
void stress_expect(stress_t *st, worker_t *w, const char *call, int status, unsigned accept,
                   const mbuf_t *b);
void stress_locked_add(stress_t *st, uint64_t bytes);
void stress_locked_sub(stress_t *st, uint64_t bytes);
void stress_tracker_begin(stress_t *st, int tracker);
uint64_t stress_tracker_peak(stress_t *st, int tracker);
/* The acceptable statuses of spw_wait_idle / spw_async_error for the tracker's window: OK,
 * and OUT_OF_MEMORY only if a prefetch may legitimately have found the device locked. */
unsigned stress_async_accept(stress_t *st, int tracker);
/* stress_expect for spw_wait_idle / spw_async_error over the tracker's window. */
void stress_expect_async(stress_t *st, worker_t *w, const char *call, int status, int tracker);

/* stress_data.c: writes and checks of contents, on the acquiring stream. */
int stress_data_init(worker_t *w);
void stress_data_fini(worker_t *w);
void stress_data_verify(worker_t *w, int s, const void *dptr, const mbuf_t *b);
void stress_data_write(worker_t *w, int s, void *dptr, const mbuf_t *b);
/* Blocks until the work enqueued on stream s so far has completed (locks untouched). */
void stress_data_fence(worker_t *w, int s);
/* Fails the run if a check found a wrong word. `device`: also read the GPU's record. */
void stress_data_check(worker_t *w, bool device);
/* End of run: no CUDA error anywhere, and the total of wrong words (0). */
void stress_data_finish(stress_t *st);

/* stress_worker.c */
void *stress_worker_main(void *arg);

/* stress_meddler.c: the meddler thread and the controller. */
void *stress_meddler_main(void *arg);
/* 0: none, 1: every callback, 2: state_changed and pressure only. */
void stress_controller_set(stress_t *st, worker_t *w, int kind);
/* A handle some worker published (maybe freed since), or, one time in dead_one_in (never
 * if 0), a freed one; 0 if none yet. */
spw_buf_t stress_any_handle(stress_t *st, uint64_t *rng, unsigned dead_one_in);

/* stress_lender.c: the lender thread (--peer on). */
void *stress_lender_main(void *arg);

#endif /* SPILLWAY_TESTS_STRESS_H */
