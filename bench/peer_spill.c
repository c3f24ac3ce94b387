/* SPDX-License-Identifier: Apache-2.0 */
/* peer_spill: spill into memory another GPU lends (the peer tier, spw_peer_lend) and
 * unspill from it, by buffer size, next to raw copies between the two GPUs measured in the
 * same run (issue 23's goal: >= 90% of the raw peer copies from 16 MiB up).
 *
 * A borrower runtime on device 0 (SPILLWAY_DEVICE) and a lender on device 1 (--lender;
 * the same device when there is one GPU, or on the host backend, where both are emulated
 * in host memory). The lender lends the whole working set plus a margin, so every spill
 * lands there. Per size, `count` buffers are filled, warmed up (one spill + prefetch,
 * untimed), then each of `reps` rounds times:
 *  - spill: spw_spill_n(all, HOST) + spw_wait_idle; every buffer must then be in PEER;
 *  - unspill: spw_prefetch_n(all) + spw_wait_idle; every buffer must then be RESIDENT.
 * Raw: one cudaMemcpyPeerAsync per buffer, device 0 -> 1 and 1 -> 0, of the same pieces
 * (host backend: memcpy). Then the lender takes its memory back (spw_peer_reclaim), timed:
 * the buffers move on to host memory. A sample of buffers is read back and compared word
 * for word at the end of each size. Nothing here asserts on time.
 *
 * Options (--NAME=VALUE or SPW_BENCH_NAME): sizes (list), total (bytes per size; count is
 * total/size, at least 2), reps, lender (device ordinal). Defaults on cuda: 64KiB, 1MiB,
 * 16MiB, 256MiB, total 1 GiB, reps 3; on host: 64KiB, 1MiB, total 16 MiB. */
#include <stdio.h>
#include <stdlib.h>

#include "bench_common.h"

typedef struct row {
  uint64_t size, count;
  double spill, unspill, raw_down, raw_up, reclaim_s;
  uint64_t bad;
} row_t;

typedef struct ctx {
  bench_env_t env;
  int lender_dev;
  spw_runtime_t *borrower, *lender;
  spw_stream_t s;
  unsigned reps;
} ctx_t;

/* ---- Spillway ------------------------------------------------------------------------ */

/* One spill (or prefetch) pass of all buffers, waited for and checked; its seconds. */
static int pass(ctx_t *c, const spw_buf_t *b, size_t n, int spill, double *secs) {
  double t0 = bench_now();
  int st = spill ? spw_spill_n(c->borrower, b, n, SPW_TIER_HOST)
                 : spw_prefetch_n(c->borrower, b, n, c->s);
  if (st == SPW_OK) st = spw_wait_idle(c->borrower);
  *secs = bench_now() - t0;
  if (st != SPW_OK) return bench_fail(c->borrower, spill ? "spill" : "prefetch", st);
  spw_state_t want = spill ? SPW_STATE_PEER : SPW_STATE_RESIDENT;
  size_t off = bench_count_not_in(c->borrower, b, n, want);
  if (off) {
    fprintf(stderr, "peer_spill: %zu of %zu buffers not in state %d after the pass\n", off, n,
            (int)want);
    return SPW_ERR_INTERNAL;
  }
  return SPW_OK;
}

static int run_size(ctx_t *c, row_t *r) {
  size_t n = (size_t)r->count;
  spw_buf_t *b = calloc(n, sizeof *b);
  double *ts = calloc(2 * (c->reps + 1), sizeof *ts);
  if (!b || !ts) return SPW_ERR_SYSTEM;
  int st = SPW_OK;
  size_t made = 0;
  for (; made < n && st == SPW_OK; made++)
    st = bench_alloc_filled(&c->env, c->borrower, (size_t)r->size, (uint32_t)made, c->s, &b[made]);
  if (st == SPW_OK) st = spw_stream_synchronize(c->borrower, c->s);
  double warm;
  if (st == SPW_OK) st = pass(c, b, n, 1, &warm);
  if (st == SPW_OK) st = pass(c, b, n, 0, &warm);
  for (unsigned k = 0; k < c->reps && st == SPW_OK; k++) {
    st = pass(c, b, n, 1, &ts[k]);
    if (st == SPW_OK) st = pass(c, b, n, 0, &ts[c->reps + 1 + k]);
  }
  if (st == SPW_OK) {
    uint64_t bytes = r->size * r->count;
    r->spill = bench_gbs(bytes, bench_median(ts, c->reps));
    r->unspill = bench_gbs(bytes, bench_median(ts + c->reps + 1, c->reps));
    /* Once more into the peer, then the lender takes its memory back. */
    st = pass(c, b, n, 1, &warm);
  }
  if (st == SPW_OK) {
    double t0 = bench_now();
    st = spw_peer_reclaim(c->lender, c->borrower);
    r->reclaim_s = bench_now() - t0;
    if (st != SPW_OK) bench_fail(c->lender, "spw_peer_reclaim", st);
    else if (bench_count_not_in(c->borrower, b, n, SPW_STATE_HOST)) st = SPW_ERR_INTERNAL;
  }
  for (size_t i = 0; i < n && st == SPW_OK; i += n / 8 + 1) {
    uint64_t bad = 0;
    st = bench_verify(c->borrower, b[i], (size_t)r->size, (uint32_t)i, 0, c->s, &bad);
    r->bad += bad;
  }
  for (size_t i = 0; i < made; i++) spw_free(c->borrower, b[i]);
  free(b);
  free(ts);
  if (st == SPW_OK) st = spw_peer_lend(c->lender, c->borrower, (r->size * r->count) + 64 * BENCH_MIB);
  return st;
}

static void print_table(const ctx_t *c, const row_t *r, size_t n) {
  printf("\n| size | count | spill to peer GB/s | raw %d -> %d GB/s | ratio | unspill from peer GB/s "
         "| raw %d -> %d GB/s | ratio | reclaim (to host) s |\n",
         c->env.device, c->lender_dev, c->lender_dev, c->env.device);
  printf("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  int met = 1, judged = 0;
  for (size_t i = 0; i < n; i++) {
    char sz[32];
    bench_fmt_size(r[i].size, sz, sizeof sz);
    double a = r[i].raw_down > 0 ? r[i].spill / r[i].raw_down : 0;
    double b = r[i].raw_up > 0 ? r[i].unspill / r[i].raw_up : 0;
    printf("| %s | %llu | %.1f | %.1f | %.2f | %.1f | %.1f | %.2f | %.3f |\n", sz,
           (unsigned long long)r[i].count, r[i].spill, r[i].raw_down, a, r[i].unspill,
           r[i].raw_up, b, r[i].reclaim_s);
    if (r[i].size >= 16 * BENCH_MIB) {
      judged = 1;
      met = met && a >= 0.9 && b >= 0.9;
    }
  }
  printf("\ngoal: spill to and unspill from the peer >= 90%% of raw peer copies from 16 MiB up: %s\n",
         !judged ? "not judged (no size >= 16 MiB)" : met ? "met" : "NOT met");
}

int main(int argc, char **argv) {
  static const char *const known[] = {"sizes", "total", "reps", "lender", NULL};
  ctx_t c = {0};
  if (bench_opt_check(argc, argv, known) != SPW_OK || bench_env_init(&c.env) != SPW_OK) return 2;
  int cuda = c.env.kind == SPW_BACKEND_CUDA;
  static const uint64_t cuda_sizes[] = {64 * BENCH_KIB, BENCH_MIB, 16 * BENCH_MIB, 256 * BENCH_MIB};
  static const uint64_t host_sizes[] = {64 * BENCH_KIB, BENCH_MIB};
  uint64_t sizes[BENCH_MAX_LIST], total, reps, lender_dev = (uint64_t)bench_other_device(&c.env);
  size_t nsizes;
  if (bench_opt_size_list(argc, argv, "sizes", cuda ? cuda_sizes : host_sizes, cuda ? 4 : 2,
                          sizes, &nsizes) != SPW_OK ||
      bench_opt_size(argc, argv, "total", cuda ? BENCH_GIB : 16 * BENCH_MIB, &total) != SPW_OK ||
      bench_opt_uint(argc, argv, "reps", 3, &reps) != SPW_OK ||
      bench_opt_uint(argc, argv, "lender", lender_dev, &lender_dev) != SPW_OK)
    return 2;
  c.reps = reps == 0 ? 1 : reps > 15 ? 15 : (unsigned)reps;
  c.lender_dev = (int)lender_dev;

  uint64_t lend = total + 64 * BENCH_MIB;
  int st = bench_runtime_create(&c.env, 2 * total + 256 * BENCH_MIB, 2 * total + 256 * BENCH_MIB,
                                NULL, &c.borrower);
  spw_config_t cfg = SPW_CONFIG_INIT;
  cfg.backend = c.env.kind;
  cfg.device = c.lender_dev;
  cfg.device_limit = lend + 256 * BENCH_MIB;
  cfg.host_device_bytes = cfg.device_limit;
  cfg.log_level = SPW_LOG_WARN;
  if (st == SPW_OK) st = spw_runtime_create(&cfg, &c.lender);
  if (st == SPW_OK) st = spw_stream_create(c.borrower, &c.s);
  if (st == SPW_OK) st = spw_peer_lend(c.lender, c.borrower, lend);
  if (st != SPW_OK) {
    fprintf(stderr, "peer_spill: set-up failed: %s (%s)\n", spw_err_name(st),
            c.borrower ? spw_last_error(c.borrower) : "");
    return 1;
  }
  printf("peer_spill: backend %s, borrower device %d (%s), lender device %d%s; %.0f MiB per "
         "size, median of %u\n",
         cuda ? "cuda" : "host", c.env.device, c.env.device_name, c.lender_dev,
         c.lender_dev == c.env.device ? " (the same device: one GPU)" : "",
         (double)total / BENCH_MIB, c.reps);
  row_t r[BENCH_MAX_LIST] = {{0}};
  uint64_t bad = 0;
  for (size_t i = 0; i < nsizes && st == SPW_OK; i++) {
    r[i].size = sizes[i];
    r[i].count = total / sizes[i] < 2 ? 2 : total / sizes[i];
    st = bench_raw_peer_gbs(&c.env, c.env.device, c.lender_dev, (size_t)r[i].size,
                            (size_t)r[i].count, c.reps, &r[i].raw_down, &r[i].raw_up);
    if (st == SPW_OK) st = run_size(&c, &r[i]);
    bad += r[i].bad;
  }
  if (st == SPW_OK) print_table(&c, r, nsizes);
  printf("\ndata check: %s (%llu wrong words in the sampled buffers)\n",
         st == SPW_OK && bad == 0 ? "ok" : "FAILED", (unsigned long long)bad);
  spw_stream_destroy(c.borrower, c.s);
  spw_runtime_destroy(c.borrower);
  spw_runtime_destroy(c.lender);
  return st == SPW_OK && bad == 0 ? 0 : 1;
}
