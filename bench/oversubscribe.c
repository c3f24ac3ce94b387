/* SPDX-License-Identifier: Apache-2.0 */
/* oversubscribe: a working set `factor` times the device budget (cuda: 8 GiB budget, 24 GiB
 * of 256 MiB buffers; host: 64 MiB, 192 MiB of 4 MiB buffers), swept in order `passes`
 * times. Each step acquires a buffer on the compute stream, runs a light kernel over it
 * (adds 1 to every u32; host: a host function) and releases it with
 * spw_stream_release_async; `depth` buffers ahead are prefetched (spw_prefetch on a stream
 * of their own, so the compute stream never waits for a buffer it is not about to use), so
 * transfers overlap compute. Depth 0 disables prefetching; a list (--depth=0,4) runs one
 * sweep per depth.
 *
 * Reported per depth: wall time of the sweep, the bytes that moved (spw_stats spill_bytes
 * and unspill_bytes, plus any demotions or disk reads), and the transfer floor those bytes
 * impose on the link measured in the same run (raw pinned cudaMemcpyAsync of buffer-sized
 * pieces each way, and both ways at once on two streams from two threads):
 *   serial floor = out / D2H + in / H2D;
 *   duplex floor = max(out / D2H, in / H2D, (out + in) / both-ways rate), or the serial
 *                  floor if that is lower (the last term only matters when the link does
 *                  not reach full rate both ways at once).
 * The floor on moved bytes hides any bytes Spillway moves needlessly, so a second floor is
 * shown on the bytes LRU must move in this sweep (every acquire misses: one buffer in and
 * one dirty buffer out per step), with "unspills per acquire" (1.0 when no buffer is brought
 * in twice). Goal printed: wall time <= 1.25x the duplex floor.
 *
 * The issuing thread stays at most `max-lag` steps ahead of the device (a host function
 * after each kernel counts completed steps; default: the buffers that fit in the budget
 * minus depth minus 2), so an unlocked resident buffer is always there to spill: Spillway
 * fails an acquire with SPW_ERR_OUT_OF_MEMORY when every resident buffer is locked, even if
 * release_async has already scheduled their release. Should that still happen, the compute
 * stream is synchronized and the call retried; the retries are counted in the table.
 *
 * Every buffer is filled with the check pattern at allocation; at the end a sample is read
 * back and must equal the pattern plus the number of passes run. Nothing asserts on time.
 *
 * With peer-lend (issue 23's peer tier), a second runtime on device `lender` (default: the
 * other GPU, else the same one) lends that many bytes of its device memory, and spills go
 * there first over the peer link. The raw peer copies of buffer-sized pieces each way are
 * measured too, and the table then also shows the time against the peer link's floor:
 * max(out / peer one way, in / peer the other way), the two directions of NVLink being
 * separate lanes.
 *
 * Options (--NAME=VALUE or SPW_BENCH_NAME): budget, buf-size, factor, passes, depth (list),
 * max-lag (0 = the default above), link-bytes (bytes of the raw link measurement), reps (of
 * the raw measurement), peer-lend (bytes; 0 = no peer tier), lender (device ordinal),
 * host-reserve (bytes of host memory pinned with spw_host_reserve after the setup, before
 * the sweeps, its time printed apart; 0 = none, the arena grows as the sweeps need it).
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_common.h"

typedef struct link {
  double d2h, h2d, duplex; /* GB/s; duplex is both directions together */
} link_t;

typedef struct sweep {
  uint64_t depth;
  double seconds;
  uint64_t out, in; /* bytes moved: to host or disk, and back */
  uint64_t peer_out, peer_in; /* the part of them that went to and came from peer memory */
  uint64_t unspills, on_demand, background, clean, disk;
  uint64_t oom_retries; /* acquires or prefetches retried after SPW_ERR_OUT_OF_MEMORY */
  /* Pinned host memory before and after: a slab pinned during the sweep costs about a
   * third of a second per GiB, which a slow run may owe to it. */
  uint64_t pinned_before, pinned_after;
} sweep_t;

static int measure_link(const bench_env_t *env, uint64_t link_bytes, uint64_t piece,
                        unsigned reps, link_t *out) {
  size_t count = (size_t)(link_bytes / piece);
  if (count < 2) count = 2;
  size_t bytes = count * piece;
  void *dev = NULL, *pinned = NULL;
  bench_rstream_t rs = {NULL};
  int st = bench_dev_alloc(env, bytes, &dev);
  if (st == SPW_OK) st = bench_pinned_alloc(env, bytes, &pinned);
  if (st == SPW_OK) st = bench_rstream_create(env, &rs);
  if (st == SPW_OK) st = bench_raw_copy_gbs(env, &rs, pinned, dev, piece, count, reps, &out->d2h);
  if (st == SPW_OK) st = bench_raw_copy_gbs(env, &rs, dev, pinned, piece, count, reps, &out->h2d);
  if (st == SPW_OK) st = bench_raw_duplex_gbs(env, dev, pinned, piece, count / 2, reps, &out->duplex);
  bench_rstream_destroy(env, &rs);
  bench_pinned_free(env, pinned, bytes);
  bench_dev_free(env, dev);
  return st;
}

/* Steps whose kernel has completed: a host function after each kernel counts it, so the
 * issuing thread can stay at most `max_lag` steps ahead of the device. Without that bound
 * the thread can lock every resident buffer with work the device has not reached, and an
 * acquire then fails with SPW_ERR_OUT_OF_MEMORY although release_async would free room. */
typedef struct progress {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  uint64_t done;
} progress_t;

static void step_done(void *arg) {
  progress_t *p = arg;
  pthread_mutex_lock(&p->mu);
  p->done++;
  pthread_cond_broadcast(&p->cv);
  pthread_mutex_unlock(&p->mu);
}

static void wait_lag(progress_t *p, uint64_t issued, uint64_t max_lag) {
  pthread_mutex_lock(&p->mu);
  while (issued > p->done + max_lag) pthread_cond_wait(&p->cv, &p->mu);
  pthread_mutex_unlock(&p->mu);
}

typedef struct sweep_args {
  const bench_env_t *env;
  spw_runtime_t *rt;
  const spw_buf_t *bufs;
  size_t n, size;
  uint64_t passes, depth, max_lag;
  spw_stream_t s, p; /* compute, prefetch */
} sweep_args_t;

/* An acquire or prefetch that found every resident buffer locked: wait for the compute
 * stream (which releases its locks) and try once more. Counted, and reported. */
static int retry_oom(const sweep_args_t *a, int st, uint64_t *retries) {
  if (st != SPW_ERR_OUT_OF_MEMORY) return st;
  (*retries)++;
  int sst = spw_stream_synchronize(a->rt, a->s);
  return sst != SPW_OK ? sst : SPW_ERR_NOT_READY; /* NOT_READY: the caller retries */
}

/* One timed sweep: `passes` passes over all n buffers with prefetch depth `depth`. */
static int sweep(const sweep_args_t *a, sweep_t *out) {
  spw_runtime_t *rt = a->rt;
  const size_t n = a->n;
  spw_stats_t s0, s1;
  progress_t prog = {.done = 0};
  pthread_mutex_init(&prog.mu, NULL);
  pthread_cond_init(&prog.cv, NULL);
  uint64_t retries = 0;
  int st = bench_get_stats(rt, &s0);
  const uint64_t steps = a->passes * n;
  double t0 = bench_now();
  for (uint64_t j = 0; j < a->depth && j < steps && st == SPW_OK; j++) {
    while ((st = retry_oom(a, spw_prefetch(rt, a->bufs[j % n], a->p), &retries)) ==
           SPW_ERR_NOT_READY) {
    }
    if (st != SPW_OK) bench_fail(rt, "spw_prefetch", st);
  }
  for (uint64_t g = 0; g < steps && st == SPW_OK; g++) {
    wait_lag(&prog, g, a->max_lag);
    if (a->depth > 0 && g + a->depth < steps) {
      while ((st = retry_oom(a, spw_prefetch(rt, a->bufs[(g + a->depth) % n], a->p),
                             &retries)) == SPW_ERR_NOT_READY) {
      }
      if (st != SPW_OK) {
        bench_fail(rt, "spw_prefetch", st);
        break;
      }
    }
    void *d = NULL;
    while ((st = retry_oom(a, spw_acquire(rt, a->bufs[g % n], a->s, 0, &d), &retries)) ==
           SPW_ERR_NOT_READY) {
    }
    if (st != SPW_OK) {
      bench_fail(rt, "spw_acquire", st);
      break;
    }
    st = bench_add(a->env, rt, d, a->size, 1, a->s);
    if (st == SPW_OK && (st = spw_launch_host_func(rt, a->s, step_done, &prog)) != SPW_OK)
      bench_fail(rt, "spw_launch_host_func", st);
    if (st == SPW_OK && (st = spw_stream_release_async(rt, a->s)) != SPW_OK)
      bench_fail(rt, "spw_stream_release_async", st);
  }
  int x = spw_stream_synchronize(rt, a->s);
  int y = spw_stream_synchronize(rt, a->p);
  out->seconds = bench_now() - t0;
  pthread_cond_destroy(&prog.cv);
  pthread_mutex_destroy(&prog.mu);
  if (st == SPW_OK && (x != SPW_OK || y != SPW_OK))
    st = bench_fail(rt, "spw_stream_synchronize", x != SPW_OK ? x : y);
  if (st == SPW_OK) st = bench_get_stats(rt, &s1);
  if (st != SPW_OK) return st;
  out->depth = a->depth;
  out->oom_retries = retries;
  out->out = (s1.spill_bytes - s0.spill_bytes) + (s1.demote_bytes - s0.demote_bytes);
  out->peer_out = s1.peer_spill_bytes - s0.peer_spill_bytes;
  out->peer_in = s1.peer_unspill_bytes - s0.peer_unspill_bytes;
  out->in = (s1.unspill_bytes - s0.unspill_bytes) + (s1.disk_read_bytes - s0.disk_read_bytes);
  out->unspills = (s1.unspills - s0.unspills) + (s1.disk_reads - s0.disk_reads);
  out->on_demand = s1.spills_on_demand - s0.spills_on_demand;
  out->background = s1.spills_background - s0.spills_background;
  out->clean = s1.clean_respills - s0.clean_respills;
  out->disk = (s1.disk_write_bytes - s0.disk_write_bytes) + (s1.disk_read_bytes - s0.disk_read_bytes);
  out->pinned_before = s0.host_pinned_bytes;
  out->pinned_after = s1.host_pinned_bytes;
  return SPW_OK;
}

static double dmax(double a, double b) { return a > b ? a : b; }

static double serial_floor(const link_t *l, uint64_t out, uint64_t in) {
  return (double)out / (l->d2h * 1e9) + (double)in / (l->h2d * 1e9);
}

/* Both directions at once, but never above the serial floor: where running them together
 * is slower (a link or host that does not overlap them), doing one after the other is the
 * better schedule, and the floor is the best schedule. */
static double duplex_floor(const link_t *l, uint64_t out, uint64_t in) {
  double f = dmax((double)out / (l->d2h * 1e9), (double)in / (l->h2d * 1e9));
  f = dmax(f, (double)(out + in) / (l->duplex * 1e9));
  double serial = serial_floor(l, out, in);
  return f < serial ? f : serial;
}

/* The floor of a sweep whose moves split between the peer link and the host link, which run
 * at once: the slower of the two parts. */
static double peer_floor(const link_t *l, const sweep_t *r, double down, double up) {
  double f = dmax((double)r->peer_out / (down * 1e9), (double)r->peer_in / (up * 1e9));
  return dmax(f, duplex_floor(l, r->out - r->peer_out, r->in - r->peer_in));
}

static void print_peer_table(const link_t *l, const sweep_t *r, size_t n, double down, double up) {
  printf("\npeer tier: moves split between the peer link and the host link\n\n");
  printf("| prefetch depth | to peer GiB | from peer GiB | to host GiB | from host GiB | floor s "
         "(both links) | time / floor | time / host duplex floor |\n");
  printf("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  for (size_t i = 0; i < n; i++) {
    double f = peer_floor(l, &r[i], down, up), h = duplex_floor(l, r[i].out, r[i].in);
    printf("| %" PRIu64 " | %.2f | %.2f | %.2f | %.2f | %.3f | %.2f | %.2f |\n", r[i].depth,
           (double)r[i].peer_out / BENCH_GIB, (double)r[i].peer_in / BENCH_GIB,
           (double)(r[i].out - r[i].peer_out) / BENCH_GIB,
           (double)(r[i].in - r[i].peer_in) / BENCH_GIB, f, f > 0 ? r[i].seconds / f : 0,
           h > 0 ? r[i].seconds / h : 0);
  }
}

int main(int argc, char **argv) {
  static const char *const known[] = {"budget", "buf-size", "factor", "passes", "depth",
                                      "max-lag", "link-bytes", "reps", "peer-lend", "lender",
                                      "host-reserve", NULL};
  bench_env_t env;
  if (bench_opt_check(argc, argv, known) != SPW_OK || bench_env_init(&env) != SPW_OK) return 2;
  const int cuda = env.kind == SPW_BACKEND_CUDA;
  static const uint64_t def_depth[] = {4};
  uint64_t budget, size, factor, passes, link_bytes, reps, max_lag, depths[BENCH_MAX_LIST];
  uint64_t peer_lend, lender_dev, host_reserve;
  size_t ndepths = 0;
  if (bench_opt_size(argc, argv, "budget", cuda ? 8 * BENCH_GIB : 64 * BENCH_MIB, &budget) ||
      bench_opt_size(argc, argv, "buf-size", cuda ? 256 * BENCH_MIB : 4 * BENCH_MIB, &size) ||
      bench_opt_uint(argc, argv, "factor", 3, &factor) ||
      bench_opt_uint(argc, argv, "passes", 3, &passes) ||
      bench_opt_size(argc, argv, "link-bytes", cuda ? BENCH_GIB : 64 * BENCH_MIB, &link_bytes) ||
      bench_opt_uint(argc, argv, "reps", 3, &reps) ||
      bench_opt_uint(argc, argv, "max-lag", 0, &max_lag) ||
      bench_opt_size_or_zero(argc, argv, "peer-lend", 0, &peer_lend) ||
      bench_opt_size_or_zero(argc, argv, "host-reserve", 0, &host_reserve) ||
      bench_opt_uint(argc, argv, "lender", (uint64_t)bench_other_device(&env), &lender_dev))
    return 2;
  if (bench_opt_uint_list(argc, argv, "depth", def_depth, 1, depths, &ndepths)) return 2;
  if (factor < 1 || passes < 1 || size % 4 != 0 || size > budget || reps < 1 || reps > 16) {
    fprintf(stderr, "oversubscribe: need factor >= 1, passes >= 1, buf-size a multiple of 4 and "
                    "<= budget, reps 1..16\n");
    return 2;
  }
  const size_t n = (size_t)(factor * budget / size);
  const uint64_t ws = (uint64_t)n * size;

  char bs[32], ss[32], ws_s[32];
  bench_fmt_size(budget, bs, sizeof bs);
  bench_fmt_size(size, ss, sizeof ss);
  bench_fmt_size(ws, ws_s, sizeof ws_s);
  printf("oversubscribe: backend %s, device %s: budget %s, %zu x %s = %s (%" PRIu64
         "x), %" PRIu64 " passes\n",
         cuda ? "cuda" : "host", env.device_name, bs, n, ss, ws_s, factor, passes);
  fflush(stdout);

  link_t link;
  if (measure_link(&env, link_bytes, size, (unsigned)reps, &link) != SPW_OK) return 1;
  printf("link (raw, pinned, %s copies): D2H %.2f GB/s, H2D %.2f GB/s, both at once %.2f GB/s\n\n",
         ss, link.d2h, link.h2d, link.duplex);
  fflush(stdout);

  double peer_down = 0, peer_up = 0;
  if (peer_lend) {
    if (bench_raw_peer_gbs(&env, env.device, (int)lender_dev, (size_t)size,
                           (size_t)(link_bytes / size), (unsigned)reps, &peer_down, &peer_up) != SPW_OK)
      return 1;
    printf("peer link (raw cudaMemcpyPeerAsync, %s copies): device %d -> %d %.2f GB/s, %d -> %d "
           "%.2f GB/s\n\n", ss, env.device, (int)lender_dev, peer_down, (int)lender_dev,
           env.device, peer_up);
  }

  spw_runtime_t *rt = NULL, *lender = NULL;
  if (bench_runtime_create(&env, budget, ws + ws / 4 + 256 * BENCH_MIB, NULL, &rt) != SPW_OK)
    return 1;
  if (peer_lend) {
    spw_config_t cfg = SPW_CONFIG_INIT;
    cfg.backend = env.kind;
    cfg.device = (int)lender_dev;
    cfg.device_limit = peer_lend + 256 * BENCH_MIB;
    cfg.host_device_bytes = cfg.device_limit;
    cfg.log_level = SPW_LOG_WARN;
    int lst = spw_runtime_create(&cfg, &lender);
    if (lst == SPW_OK) lst = spw_peer_lend(lender, rt, peer_lend);
    if (lst != SPW_OK) {
      bench_fail(rt, "lending peer memory", lst);
      return 1;
    }
  }
  spw_stream_t s = NULL, p = NULL;
  spw_buf_t *bufs = calloc(n, sizeof *bufs);
  int st = bufs ? SPW_OK : SPW_ERR_SYSTEM;
  if (st == SPW_OK) st = spw_stream_create(rt, &s);
  if (st == SPW_OK) st = spw_stream_create(rt, &p);
  if (st != SPW_OK) bench_fail(rt, "setup", st);

  /* Setup (untimed): every buffer allocated and filled; allocations past the budget spill
   * the oldest on demand, as they are released. */
  double t_setup = bench_now();
  size_t made = 0;
  for (; made < n && st == SPW_OK; made++) {
    st = bench_alloc_filled(&env, rt, size, (uint32_t)made * 7919u + 1, s, &bufs[made]);
    if (st != SPW_OK) break;
    /* Synchronize, not release_async: an allocation fails with SPW_ERR_OUT_OF_MEMORY when
     * all that is resident is locked, even by releases already scheduled. */
    if ((st = spw_stream_synchronize(rt, s)) != SPW_OK) bench_fail(rt, "spw_stream_synchronize", st);
  }
  int sst = spw_stream_synchronize(rt, s);
  if (st == SPW_OK && sst != SPW_OK) st = bench_fail(rt, "spw_stream_synchronize", sst);
  if (st == SPW_OK && (sst = spw_wait_idle(rt)) != SPW_OK) st = bench_fail(rt, "spw_wait_idle", sst);
  fprintf(stderr, "oversubscribe: setup (allocate and fill %zu buffers) %.2f s\n", made,
          bench_now() - t_setup);
  if (st == SPW_OK && host_reserve) {
    double t_pin = bench_now();
    if ((sst = spw_host_reserve(rt, host_reserve)) != SPW_OK)
      st = bench_fail(rt, "spw_host_reserve", sst);
    spw_stats_t ps;
    if (st == SPW_OK) st = bench_get_stats(rt, &ps);
    if (st == SPW_OK)
      fprintf(stderr, "oversubscribe: spw_host_reserve(%" PRIu64 " MiB) %.2f s, %" PRIu64
              " MiB pinned\n", host_reserve >> 20, bench_now() - t_pin, ps.host_pinned_bytes >> 20);
  }

  sweep_t res[BENCH_MAX_LIST];
  size_t done = 0;
  uint64_t added = 0;
  for (size_t i = 0; i < ndepths && st == SPW_OK; i++) {
    fprintf(stderr, "oversubscribe: depth %" PRIu64 " ...\n", depths[i]);
    sweep_args_t a = {&env, rt, bufs, n, size, passes, depths[i], max_lag, s, p};
    if (a.max_lag == 0) {
      /* Leave room for the prefetched buffers and one more: an unlocked victim always. */
      uint64_t fit = budget / size;
      a.max_lag = fit > depths[i] + 2 ? fit - depths[i] - 2 : 1;
    }
    st = sweep(&a, &res[i]);
    if (st == SPW_OK) {
      added += passes;
      done++;
    }
  }

  uint64_t bad = 0;
  for (size_t k = 0; k < 9 && st == SPW_OK && done > 0; k++) {
    size_t i = n <= 9 ? k % n : (n - 1) * k / 8;
    uint64_t b = 0;
    st = bench_verify(rt, bufs[i], size, (uint32_t)i * 7919u + 1, (uint32_t)added, s, &b);
    bad += b;
  }

  if (done > 0) {
    const double lru_bytes = (double)passes * (double)ws; /* each way */
    printf("| prefetch depth | wall s | s / pass | out GiB | in GiB | unspills / acquire | "
           "serial floor s | duplex floor s | time / serial floor | time / duplex floor | "
           "time / duplex floor at LRU bytes | OOM retries |\n");
    printf("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    for (size_t i = 0; i < done; i++) {
      const sweep_t *r = &res[i];
      double serial = serial_floor(&link, r->out, r->in);
      double duplex = duplex_floor(&link, r->out, r->in);
      double lru = duplex_floor(&link, (uint64_t)lru_bytes, (uint64_t)lru_bytes);
      printf("| %" PRIu64 " | %.3f | %.3f | %.2f | %.2f | %.2f | %.3f | %.3f | %.2f | %.2f | "
             "%.2f | %" PRIu64 " |\n",
             r->depth, r->seconds, r->seconds / (double)passes, (double)r->out / BENCH_GIB,
             (double)r->in / BENCH_GIB, (double)r->unspills / ((double)passes * (double)n),
             serial, duplex, serial > 0 ? r->seconds / serial : 0,
             duplex > 0 ? r->seconds / duplex : 0, lru > 0 ? r->seconds / lru : 0,
             r->oom_retries);
    }
    printf("\nspills per sweep (on demand / background / clean, moving no bytes):");
    for (size_t i = 0; i < done; i++)
      printf(" depth %" PRIu64 ": %" PRIu64 " / %" PRIu64 " / %" PRIu64 ";", res[i].depth,
             res[i].on_demand, res[i].background, res[i].clean);
    printf("\npinned host memory before / after each sweep:");
    for (size_t i = 0; i < done; i++)
      printf(" depth %" PRIu64 ": %.2f / %.2f GiB;", res[i].depth,
             (double)res[i].pinned_before / BENCH_GIB, (double)res[i].pinned_after / BENCH_GIB);
    printf("\nLRU must move %.2f GiB each way per sweep (every acquire misses)\n",
           lru_bytes / BENCH_GIB);
    if (peer_lend) print_peer_table(&link, res, done, peer_down, peer_up);
    for (size_t i = 0; i < done; i++)
      if (res[i].disk)
        printf("note: depth %" PRIu64 " went to disk (%.2f GiB): the host limit was too small\n",
               res[i].depth, (double)res[i].disk / BENCH_GIB);
    /* Pinning costs about 0.3 s a GiB, and paid mid-sweep it stalls the transfers. */
    for (size_t i = 0; i < done; i++)
      if (res[i].pinned_after > res[i].pinned_before)
        printf("note: depth %" PRIu64 " pinned %.2f GiB of host memory during its sweep, while "
               "transfers ran: --host-reserve=%" PRIu64 "MiB (spw_host_reserve) pins it ahead\n",
               res[i].depth, (double)(res[i].pinned_after - res[i].pinned_before) / BENCH_GIB,
               res[i].pinned_after >> 20);
    printf("\ngoal%s: wall time <= 1.25x the duplex floor:",
           cuda ? "" : " (for an H100/H200; on the host backend only relative)");
    for (size_t i = 0; i < done; i++) {
      double f = duplex_floor(&link, res[i].out, res[i].in);
      double lru = duplex_floor(&link, (uint64_t)lru_bytes, (uint64_t)lru_bytes);
      double x = f > 0 ? res[i].seconds / f : 0;
      printf(" depth %" PRIu64 ": %.2fx %s (%.2fx the floor at LRU bytes);", res[i].depth, x,
             x <= 1.25 ? "met" : "NOT met", lru > 0 ? res[i].seconds / lru : 0);
    }
    printf("\n");
  }
  printf("\ndata check: %s (%" PRIu64 " wrong words in the sampled buffers)\n",
         bad == 0 && st == SPW_OK ? "ok" : "FAILED", bad);

  for (size_t i = 0; i < made; i++) spw_free(rt, bufs[i]);
  free(bufs);
  int dst = spw_runtime_destroy(rt);
  if (dst == SPW_OK && lender) dst = spw_runtime_destroy(lender);
  if (dst != SPW_OK) bench_fail(NULL, "spw_runtime_destroy", dst);
  if (st != SPW_OK) fprintf(stderr, "oversubscribe: stopped early: %s\n", spw_err_name(st));
  return st != SPW_OK || dst != SPW_OK || bad != 0 ? 1 : 0;
}
