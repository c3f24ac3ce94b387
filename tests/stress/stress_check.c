/* SPDX-License-Identifier: Apache-2.0 */
/* What every thread of spw_stress shares to judge a run: the clock and the random streams,
 * the per-thread operation histories, the failure report, and the locked-bytes model with
 * its peak trackers (see stress.h).
 *
 * A failure report is printed once: the first thread to fail prints the seed and the
 * replay command, what it called, the status and spw_last_error's text (read on the failing
 * thread, right after the call), its last 50 operations, then ends the process with
 * status 1. Other threads that fail meanwhile wait for that exit. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "stress.h"

double stress_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

uint64_t stress_rand(uint64_t *state) { /* SplitMix64 */
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

const char *stress_op_name(int op) {
  static const char *const names[OP_COUNT] = {
#define STRESS_OP_NAME_W(name, text, w, ws) text,
#define STRESS_OP_NAME_S(name, text) text,
      STRESS_WEIGHTED_OPS(STRESS_OP_NAME_W) "?", STRESS_STEP_OPS(STRESS_OP_NAME_S)
#undef STRESS_OP_NAME_W
#undef STRESS_OP_NAME_S
  };
  return op >= 0 && op < OP_COUNT ? names[op] : "?";
}

/* ---- histories ---------------------------------------------------------------------
 * Entries are atomics so that the watchdog may print another thread's history while it
 * runs. Word 0: op (8 bits), -status (8), stream + 1 (8), flags (8), n (8); word 1: the
 * handle; word 2: id << 24 | version; word 3: size. */

void stress_note(history_t *h, int op, int status, int stream, unsigned flags, spw_buf_t buf,
                 uint64_t id, uint32_t version, uint64_t size, unsigned n) {
  uint64_t seq = atomic_load_explicit(&h->seq, memory_order_relaxed);
  hist_entry_t *e = &h->e[seq % STRESS_HIST];
  uint64_t w0 = (uint64_t)(op & 0xff) | (uint64_t)((-status) & 0xff) << 8 |
                (uint64_t)((stream + 1) & 0xff) << 16 | (uint64_t)(flags & 0xff) << 24 |
                (uint64_t)(n & 0xff) << 32;
  atomic_store_explicit(&e->w[0], w0, memory_order_relaxed);
  atomic_store_explicit(&e->w[1], buf, memory_order_relaxed);
  atomic_store_explicit(&e->w[2], id << 24 | (version & 0xffffff), memory_order_relaxed);
  atomic_store_explicit(&e->w[3], size, memory_order_relaxed);
  atomic_store_explicit(&h->seq, seq + 1, memory_order_release);
}

void stress_print_history(const history_t *h, const char *who, int last) {
  uint64_t seq = atomic_load_explicit(&((history_t *)h)->seq, memory_order_acquire);
  uint64_t from = seq > (uint64_t)last ? seq - (uint64_t)last : 0;
  if (seq - from > STRESS_HIST) from = seq - STRESS_HIST;
  fprintf(stderr, "last %llu operations of %s (oldest first; status of the call):\n",
          (unsigned long long)(seq - from), who);
  for (uint64_t i = from; i < seq; i++) {
    hist_entry_t *e = (hist_entry_t *)&h->e[i % STRESS_HIST];
    uint64_t w0 = atomic_load_explicit(&e->w[0], memory_order_relaxed);
    uint64_t buf = atomic_load_explicit(&e->w[1], memory_order_relaxed);
    uint64_t idv = atomic_load_explicit(&e->w[2], memory_order_relaxed);
    uint64_t size = atomic_load_explicit(&e->w[3], memory_order_relaxed);
    int op = (int)(w0 & 0xff), status = -(int)((w0 >> 8) & 0xff);
    int stream = (int)((w0 >> 16) & 0xff) - 1;
    fprintf(stderr,
            "  #%-7llu %-15s %-22s stream %-2d flags %#x buf %#018llx id %llu v%llu "
            "size %llu n %u\n",
            (unsigned long long)i, stress_op_name(op), spw_err_name(status), stream,
            (unsigned)((w0 >> 24) & 0xff), (unsigned long long)buf, (unsigned long long)(idv >> 24),
            (unsigned long long)(idv & 0xffffff), (unsigned long long)size,
            (unsigned)((w0 >> 32) & 0xff));
  }
}

/* ---- failure ----------------------------------------------------------------------- */

/* The thread's own history and name, if it has one: a callback that fails on a worker's
 * thread (a spill on demand) or on the meddler's reports that thread's operations. */
static _Thread_local history_t *this_hist;
static _Thread_local char this_name[32];

void stress_set_thread(history_t *h, const char *name) {
  this_hist = h;
  snprintf(this_name, sizeof this_name, "%s", name);
}

_Noreturn void stress_fail(stress_t *st, worker_t *w, const char *fmt, ...) {
  history_t *h = w ? &w->hist : this_hist;
  char who[32];
  if (w)
    snprintf(who, sizeof who, "worker %d", w->index);
  else
    snprintf(who, sizeof who, "%s", h ? this_name : "");
  int expected = 0;
  if (!atomic_compare_exchange_strong(&st->failing, &expected, 1)) {
    for (;;) pause(); /* the first failure's report ends the process */
  }
  fflush(stdout);
  char msg[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  fprintf(stderr, "\nspw_stress: FAIL after %.3f s (seed %llu): %s\n", stress_now() - st->t0,
          (unsigned long long)st->o.seed, msg);
  if (h) {
    fprintf(stderr, "thread: %s\n", who);
    stress_print_history(h, who, 50);
  } else {
    fprintf(stderr, "thread: a runtime thread or the main thread (no history)\n");
  }
  char stats[512];
  if (st->rt && spw_stats_summary(st->rt, stats, sizeof stats) == SPW_OK)
    fprintf(stderr, "stats: %s\n", stats);
  if (st->lender && spw_stats_summary(st->lender, stats, sizeof stats) == SPW_OK)
    fprintf(stderr, "the lender's stats: %s\n", stats);
  fprintf(stderr, "replay: %s\n", st->replay);
  fflush(stderr);
  _exit(1);
}

void stress_expect(stress_t *st, worker_t *w, const char *call, int status, unsigned accept,
                   const mbuf_t *b) {
  if (status <= 0 && status > -32 && (accept & (1u << (unsigned)(-status)))) {
    if (status != SPW_OK && (st->o.tolerate_async & (1u << (unsigned)(-status))))
      atomic_fetch_add(&st->tolerated, 1);
    return;
  }
  char allowed[256] = "";
  size_t len = 0;
  for (int k = 0; k < 32 && len < sizeof allowed - 32; k++)
    if (accept & (1u << k))
      len += (size_t)snprintf(allowed + len, sizeof allowed - len, "%s%s", len ? " " : "",
                              spw_err_name(-k));
  char bdesc[160] = "";
  if (b)
    snprintf(bdesc, sizeof bdesc,
             " on buf %#llx (id %llu, %zu bytes, v%u, held %u+%u, pending %u+%u)",
             (unsigned long long)b->h, (unsigned long long)b->id, b->size, b->version, b->held[0],
             b->held[1], b->pending[0], b->pending[1]);
  stress_fail(st, w, "%s%s returned %s (%s), expected %s; this thread's last error text: \"%s\"",
              call, bdesc, spw_err_name(status), spw_strerror(status), allowed,
              spw_last_error(st->rt));
}

/* ---- the locked model -------------------------------------------------------------- */

static void atomic_max(_Atomic uint64_t *p, uint64_t v) {
  uint64_t cur = atomic_load_explicit(p, memory_order_relaxed);
  while (cur < v && !atomic_compare_exchange_weak(p, &cur, v)) {
  }
}

void stress_locked_add(stress_t *st, uint64_t bytes) {
  uint64_t v = atomic_fetch_add(&st->locked, bytes) + bytes;
  for (int i = 0; i < STRESS_TRACKERS; i++) atomic_max(&st->peak[i], v);
}

void stress_locked_sub(stress_t *st, uint64_t bytes) { atomic_fetch_sub(&st->locked, bytes); }

/* After this, peak[tracker] >= locked at every instant: an add that the load below missed
 * raises the peak itself after its fetch_add, which comes after the store of 0. */
void stress_tracker_begin(stress_t *st, int tracker) {
  atomic_store(&st->peak[tracker], 0);
  atomic_max(&st->peak[tracker], atomic_load(&st->locked));
}

uint64_t stress_tracker_peak(stress_t *st, int tracker) { return atomic_load(&st->peak[tracker]); }

unsigned stress_async_accept(stress_t *st, int tracker) {
  /* A failed prefetch is the only background failure this configuration allows: the
   * device was locked to within less than the largest buffer. Its failure happened after
   * the previous reading of the async error by anyone, so after this tracker's begin. */
  unsigned acc = ACC(OK) | st->o.tolerate_async;
  if (stress_tracker_peak(st, tracker) + st->o.max_buf > st->o.budget)
    acc |= ACC(ERR_OUT_OF_MEMORY);
  return acc;
}

void stress_expect_async(stress_t *st, worker_t *w, const char *call, int status, int tracker) {
  unsigned acc = stress_async_accept(st, tracker);
  if (status == SPW_ERR_OUT_OF_MEMORY && !(acc & ACC(ERR_OUT_OF_MEMORY)))
    stress_fail(st, w,
                "%s returned SPW_ERR_OUT_OF_MEMORY: a prefetch failed for want of device room, "
                "yet since the previous reading of the async error at most %llu bytes were locked, "
                "and the largest buffer is %llu bytes, within the budget of %llu",
                call, (unsigned long long)stress_tracker_peak(st, tracker),
                (unsigned long long)st->o.max_buf, (unsigned long long)st->o.budget);
  stress_expect(st, w, call, status, acc, NULL);
}
