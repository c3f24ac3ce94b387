/* SPDX-License-Identifier: Apache-2.0 */
/* The lender thread of --peer on: a second runtime (st->lender, same backend, its own
 * device limit, the borrower's budget) lends part of its device memory to the workers'
 * runtime as that one's peer tier, and takes it back, over and over, while the workers,
 * the meddler and the controller go on. The workers' contents checks then catch any byte
 * lost in a move into, out of or away from lent memory.
 *
 * One round: lend a random amount (budget/8 .. budget/2, at least 1 MiB) to the borrower;
 * sleep 0.5-20 ms; then either spw_peer_reclaim, or make the lender take its memory back
 * by itself: allocate and lock (acquire on the lender's stream) a buffer that fits in the
 * lender's budget only if the lent memory comes back, check that it did, write a small
 * pattern into the buffer and read it back, synchronize, free.
 *
 * The model: only this thread lends, so it knows whether memory is lent now. Lending while
 * it is must give SPW_ERR_BUSY, and must succeed otherwise (the lender has nothing else
 * in its budget). spw_peer_reclaim may give the borrower's SPW_ERR_HOST_OUT_OF_MEMORY /
 * SPW_ERR_DISK_FULL (the memory then stays lent: the next round tries again); nothing else
 * but SPW_OK is accepted anywhere. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "stress.h"
#include "stress_pattern.h"

/* Bytes of the pattern written into, and read back from, the buffer of a pressure round. */
#define PRESSURE_CHECK_BYTES (64 * KiB)

static void lender_expect(stress_t *st, const char *call, int rc, unsigned acc) {
  if (rc <= 0 && rc > -32 && (acc & (1u << (unsigned)(-rc)))) return;
  stress_fail(st, NULL,
              "lender: %s returned %s (%s); last error text: lender \"%s\", borrower \"%s\"", call,
              spw_err_name(rc), spw_strerror(rc), spw_last_error(st->lender),
              spw_last_error(st->rt));
}

static spw_stats_t stats_of(stress_t *st, spw_runtime_t *rt) {
  spw_stats_t s;
  memset(&s, 0, sizeof s);
  s.struct_size = sizeof s;
  int rc = spw_get_stats(rt, &s);
  lender_expect(st, "spw_get_stats", rc, ACC(OK));
  return s;
}

/* The lender's budget is free, save what it lends: allocate and lock more than what is
 * left, so that its reservation must take the lent memory back. */
static void pressure(stress_t *st, uint64_t lent) {
  spw_runtime_t *rt = st->lender;
  uint64_t size = st->o.budget - lent / 2; /* > budget - lent, <= budget */
  spw_buf_t b = SPW_BUF_NULL;
  int rc = spw_alloc(rt, (size_t)size, st->lender_stream, &b);
  stress_note(&st->lender_hist, OP_PRESSURE, rc, -1, 0, b, 0, 0, size, 0);
  lender_expect(st, "spw_alloc (a buffer that fits only once the lent memory is back)", rc,
                ACC(OK));
  void *dptr = NULL;
  rc = spw_acquire(rt, b, st->lender_stream, 0, &dptr);
  stress_note(&st->lender_hist, OP_ACQUIRE, rc, -1, 0, b, 0, 0, size, 0);
  lender_expect(st, "spw_acquire (of a buffer that fits only once the lent memory is back)", rc,
                ACC(OK));
  spw_stats_t ls = stats_of(st, rt), bs = stats_of(st, st->rt);
  if (ls.lent_bytes != 0 || bs.peer_limit != 0)
    stress_fail(st, NULL,
                "lender: a buffer of %llu bytes is locked within a budget of %llu while %llu "
                "bytes were lent, yet the lender still lends %llu bytes and the borrower's "
                "peer_limit is %llu",
                (unsigned long long)size, (unsigned long long)st->o.budget,
                (unsigned long long)lent, (unsigned long long)ls.lent_bytes,
                (unsigned long long)bs.peer_limit);
  /* A small pattern through the buffer and back, on the lender's stream. */
  size_t n = size < PRESSURE_CHECK_BYTES ? (size_t)size : (size_t)PRESSURE_CHECK_BYTES;
  uint64_t *out = malloc(n), *in = calloc(1, n);
  if (!out || !in) stress_fail(st, NULL, "lender: out of host memory");
  uint64_t key = stress_key(st->lender_rounds + 1, 1);
  for (size_t i = 0; i < n / 8; i++) out[i] = stress_word(key, i);
  rc = spw_memcpy_async(rt, dptr, out, n, st->lender_stream);
  lender_expect(st, "spw_memcpy_async (host to lender device)", rc, ACC(OK));
  rc = spw_memcpy_async(rt, in, dptr, n, st->lender_stream);
  lender_expect(st, "spw_memcpy_async (lender device to host)", rc, ACC(OK));
  rc = spw_stream_synchronize(rt, st->lender_stream); /* also releases the lock */
  stress_note(&st->lender_hist, OP_SYNC, rc, -1, 0, b, 0, 0, size, 0);
  lender_expect(st, "spw_stream_synchronize (lender)", rc, ACC(OK));
  if (memcmp(in, out, n) != 0)
    stress_fail(st, NULL, "lender: the %zu bytes written into buf %#llx read back different", n,
                (unsigned long long)b);
  free(out);
  free(in);
  rc = spw_free(rt, b);
  stress_note(&st->lender_hist, OP_FREE, rc, -1, 0, b, 0, 0, size, 0);
  lender_expect(st, "spw_free (lender)", rc, ACC(OK));
}

static void sleep_us(uint64_t us) {
  struct timespec ts = {(time_t)(us / 1000000), (long)(us % 1000000) * 1000};
  nanosleep(&ts, NULL);
}

void *stress_lender_main(void *arg) {
  stress_t *st = arg;
  uint64_t *rng = &st->lender_rng;
  uint64_t budget = st->o.budget, lo = budget / 8, hi = budget / 2;
  if (lo < MiB) lo = MiB;
  if (hi < lo) hi = lo;
  stress_set_thread(&st->lender_hist, "the lender");
  while (!atomic_load_explicit(&st->lender_stop, memory_order_relaxed)) {
    st->lender_rounds++;
    uint64_t bytes = lo + stress_below(rng, hi - lo + 1);
    int rc = spw_peer_lend(st->lender, st->rt, bytes);
    stress_note(&st->lender_hist, OP_LEND, rc, -1, 0, 0, 0, 0, bytes, 0);
    lender_expect(st, st->lent ? "spw_peer_lend (memory lent already)" : "spw_peer_lend", rc,
                  st->lent ? ACC(ERR_BUSY) : ACC(OK));
    if (rc == SPW_OK) {
      st->lent = bytes;
      st->lends++;
    } else {
      st->lend_busy++;
    }
    sleep_us(500 + stress_below(rng, 19501));
    atomic_fetch_add_explicit(&st->lender_heartbeat, 1, memory_order_relaxed);
    if (stress_below(rng, 2)) {
      rc = spw_peer_reclaim(st->lender, st->rt);
      stress_note(&st->lender_hist, OP_RECLAIM, rc, -1, 0, 0, 0, 0, st->lent, 0);
      lender_expect(st, "spw_peer_reclaim", rc,
                    ACC(OK) | ACC(ERR_HOST_OUT_OF_MEMORY) | ACC(ERR_DISK_FULL));
      if (rc == SPW_OK) {
        st->lent = 0;
        st->reclaims++;
      } else {
        st->reclaims_refused++; /* still lent, buffers intact: the next round tries again */
      }
    } else {
      pressure(st, st->lent);
      st->lent = 0;
      st->pressure_takebacks++;
    }
    atomic_fetch_add_explicit(&st->lender_heartbeat, 1, memory_order_relaxed);
  }
  atomic_store(&st->lender_phase, 2);
  return NULL;
}
