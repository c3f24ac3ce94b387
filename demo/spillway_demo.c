/* SPDX-License-Identifier: Apache-2.0 */
/* spillway-demo: device-memory oversubscription, end to end.
 *
 * Allocates buffers totalling --factor times the device budget, fills each one, applies
 * --rounds rounds of an invertible, position-dependent transform to every buffer, then
 * checksums every buffer where it computes (GPU kernels on the CUDA backend, host funcs on
 * the host backend) and compares each checksum with one the host derives from the seed
 * alone. Every buffer is touched only between spw_acquire and the
 * spw_stream_release_async that follows its group, so the runtime spills and brings back
 * buffers behind the work. A second phase repeats the workload with a small host limit, so
 * that data also passes through the disk tier.
 *
 * Invariants: buffer i is always used on the same stream, so its steps run in order
 * without cross-stream waits; the arguments of a host func live in arrays that outlive the
 * streams' work (one slot per buffer and step, never rewritten); the progress thread only
 * reads atomics and spw_get_stats. Exit status: 0 only if every buffer verified, 1 on a
 * mismatch or an error, 2 on bad options, 77 when the requested backend is not available.
 */
#include <getopt.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "demo_kernels.h"
#include "spillway/spillway.h"

#define MiB ((uint64_t)1 << 20)
#define GiB ((uint64_t)1 << 30)
#define CEILING_BYTES (256 * MiB)
#define PACE_TRIES 2000 /* x 1 ms: how long an all-locked device may take to drain */

typedef struct options {
  uint64_t budget, buffer_size; /* 0 = the backend's default */
  double factor;
  unsigned rounds, streams;
  int disk_phase;
  spw_backend_kind_t backend;
  const char *trace; /* --trace: the main phase's trace file; the disk phase's gets ".disk" */
} options_t;

/* One workload: a runtime, its buffers and the state of the run. */
typedef struct work work_t;

typedef struct job { /* a host func's argument (host backend) */
  uint32_t *p;
  size_t words;
  uint32_t key;
  uint64_t *out;
} job_t;

typedef struct tick { /* a group's completion: adds n to its step's counter */
  _Atomic uint64_t *done;
  uint64_t n;
} tick_t;

struct work {
  const char *name;
  spw_runtime_t *rt;
  spw_backend_kind_t kind;
  uint64_t budget, buf_bytes, host_limit;
  size_t nbuf, group;
  unsigned rounds, nstreams, nsteps; /* steps: fill, the rounds, verify */
  spw_stream_t *streams;
  spw_buf_t *bufs;
  job_t *jobs;     /* [step][buffer] */
  tick_t *ticks;   /* [step][group] */
  _Atomic uint64_t *done; /* [step]: buffers whose step has completed on the device */
  uint64_t *sums;  /* checksums computed where the data lives */
  uint64_t *dev_sums;
  uint64_t paced; /* times the host had to let the streams catch up */
  atomic_int stop;
  int tty;
  char err[512];
};

/* ---- small helpers ----------------------------------------------------------------------- */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static const char *human(uint64_t b, char *buf, size_t len) {
  static const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = (double)b;
  int u = 0;
  for (; v >= 1024.0 && u < 4; u++) v /= 1024.0;
  snprintf(buf, len, u ? "%.1f %s" : "%.0f %s", v, unit[u]);
  return buf;
}

/* Records the first error of a workload; returns 1 (the exit status) for `return fail(...)`. */
static int fail(work_t *w, const char *fmt, ...) {
  if (w->err[0]) return 1;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(w->err, sizeof w->err, fmt, ap);
  va_end(ap);
  return 1;
}

static int fail_spw(work_t *w, const char *what, int st) {
  return fail(w, "%s: %s (%s) %s", what, spw_err_name(st), spw_strerror(st),
              spw_last_error(w->rt));
}

/* "256MiB", "4G", "1.5GiB", "1048576": binary multiples, as the runtime's own settings. */
static int parse_size(const char *s, uint64_t *out) {
  uint64_t v;
  if (spw_parse_size(s, &v) != SPW_OK || v == 0) return -1;
  *out = v;
  return 0;
}

static int parse_uint(const char *s, unsigned lo, unsigned hi, unsigned *out) {
  char *end;
  unsigned long v = strtoul(s, &end, 10);
  if (end == s || *end || v < lo || v > hi) return -1;
  *out = (unsigned)v;
  return 0;
}

/* ---- the work on the host backend: host funcs on the streams' worker threads ------------ */

static void host_fill(void *arg) {
  job_t *j = arg;
  for (size_t k = 0; k < j->words; k++) j->p[k] = demo_fill_word(j->key, k);
}

static void host_transform(void *arg) {
  job_t *j = arg;
  for (size_t k = 0; k < j->words; k++) j->p[k] = demo_transform_word(j->p[k], k, j->key);
}

static void host_checksum(void *arg) {
  job_t *j = arg;
  uint64_t sum = 0;
  for (size_t k = 0; k < j->words; k++) sum += demo_checksum_term(j->p[k], k);
  *j->out = sum;
}

static void tick_fn(void *arg) {
  tick_t *t = arg;
  atomic_fetch_add(t->done, t->n);
}

/* The seed and the per-round keys of buffer i: distinct per buffer and round, so a buffer
 * handed another's data, or a round skipped, shows up. */
static uint32_t seed_of(size_t i) { return (uint32_t)i * 0x85EBCA6Bu + 0x165667B1u; }
static uint32_t key_of(size_t i, unsigned round) { return ((uint32_t)i << 8) ^ round; }

/* The checksum buffer i must have after `rounds` rounds, computed on the host from the same
 * functions, without touching the buffer. Block by block, so that each round is a loop the
 * compiler can vectorize. */
#define EXPECT_BLOCK 4096
static uint64_t expected_sum(size_t i, size_t words, unsigned rounds) {
  uint32_t x[EXPECT_BLOCK], seed = seed_of(i);
  uint64_t sum = 0;
  for (size_t base = 0; base < words; base += EXPECT_BLOCK) {
    size_t n = words - base < EXPECT_BLOCK ? words - base : EXPECT_BLOCK;
    for (size_t k = 0; k < n; k++) x[k] = demo_fill_word(seed, base + k);
    for (unsigned r = 1; r <= rounds; r++) {
      uint32_t key = key_of(i, r);
      for (size_t k = 0; k < n; k++) x[k] = demo_transform_word(x[k], base + k, key);
    }
    for (size_t k = 0; k < n; k++) sum += demo_checksum_term(x[k], base + k);
  }
  return sum;
}

typedef struct expect_part {
  const work_t *w;
  uint64_t *want;
  unsigned first, step;
} expect_part_t;

static void *expect_main(void *arg) {
  expect_part_t *e = arg;
  for (size_t i = e->first; i < e->w->nbuf; i += e->step)
    e->want[i] = expected_sum(i, e->w->buf_bytes / 4, e->w->rounds);
  return NULL;
}

/* All expected checksums, on every core: with the CUDA defaults they cover 12 GiB. A part
 * whose thread cannot be started runs on this thread instead. */
static void compute_expected(const work_t *w, uint64_t *want) {
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  unsigned n = cpus < 1 ? 1 : cpus > 32 ? 32 : (unsigned)cpus;
  pthread_t thr[32];
  expect_part_t part[32];
  int started[32] = {0};
  for (unsigned t = 0; t < n; t++) {
    part[t] = (expect_part_t){w, want, t, n};
    if (t > 0) started[t] = pthread_create(&thr[t], NULL, expect_main, &part[t]) == 0;
  }
  for (unsigned t = 0; t < n; t++)
    if (!started[t]) expect_main(&part[t]);
  for (unsigned t = 1; t < n; t++)
    if (started[t]) pthread_join(thr[t], NULL);
}

/* Enqueues step `step` of buffer i on stream s, p being its acquired device pointer. */
static int enqueue_step(work_t *w, unsigned step, size_t i, spw_stream_t s, void *p) {
  size_t words = w->buf_bytes / 4;
  uint32_t key = step == 0 ? seed_of(i) : key_of(i, step);
  if (w->kind == SPW_BACKEND_HOST) {
    job_t *j = &w->jobs[(size_t)step * w->nbuf + i];
    *j = (job_t){p, words, key, &w->sums[i]};
    void (*fn)(void *) = step == 0 ? host_fill : step <= w->rounds ? host_transform : host_checksum;
    int st = spw_launch_host_func(w->rt, s, fn, j);
    return st == SPW_OK ? 0 : fail_spw(w, "spw_launch_host_func", st);
  }
#ifdef SPW_DEMO_HAVE_CUDA
  int e = step == 0 ? demo_cuda_fill(p, words, key, s)
          : step <= w->rounds ? demo_cuda_transform(p, words, key, s)
                               : demo_cuda_checksum(p, words, &w->dev_sums[i], s);
  return e == 0 ? 0 : fail(w, "kernel launch on buffer %zu: %s", i, demo_cuda_error_text(e));
#else
  return fail(w, "CUDA backend in a demo built without CUDA");
#endif
}

/* ---- pacing -------------------------------------------------------------------------------
 * The host enqueues faster than the streams run, and each buffer stays locked until its
 * group's work completes. When everything that would fit is locked by work still queued,
 * acquire and alloc say SPW_ERR_OUT_OF_MEMORY; the host then waits for the streams (the
 * only place it blocks) and tries again. */
static int wait_streams(work_t *w) {
  for (unsigned k = 0; k < w->nstreams; k++) {
    int st = spw_stream_synchronize(w->rt, w->streams[k]);
    if (st != SPW_OK) return fail_spw(w, "spw_stream_synchronize", st);
  }
  return 0;
}

static int paced(work_t *w, int st, int *tries) {
  if (st != SPW_ERR_OUT_OF_MEMORY || ++*tries > PACE_TRIES) return 0;
  if (*tries == 1) w->paced++;
  if (wait_streams(w)) return 0;
  struct timespec ts = {0, 1000000}; /* let the released locks' completions run */
  nanosleep(&ts, NULL);
  return 1;
}

/* Groups prefetched ahead of the one being worked on: their copies back run on the engine
 * while the current group's kernels run and earlier groups are spilled. */
#define PREFETCH_GROUPS 2

/* One step over every buffer: acquire on the buffer's stream, enqueue, and after each group
 * a tick and spw_stream_release_async. */
static int run_step(work_t *w, unsigned step) {
  unsigned flags = step == w->nsteps - 1 ? SPW_ACQUIRE_READ : 0;
  for (size_t i = 0; i < w->nbuf; i++) {
    size_t g = i / w->group;
    spw_stream_t s = w->streams[g % w->nstreams];
    int st, tries = 0;
    size_t ahead = i + PREFETCH_GROUPS * w->group;
    if (step > 0 && i % w->group == 0 && ahead < w->nbuf) {
      size_t n = w->nbuf - ahead < w->group ? w->nbuf - ahead : w->group;
      st = spw_prefetch_n(w->rt, &w->bufs[ahead], n, s);
      if (st != SPW_OK) return fail_spw(w, "spw_prefetch_n", st);
    }
    if (step == 0) {
      do st = spw_alloc(w->rt, w->buf_bytes, s, &w->bufs[i]);
      while (paced(w, st, &tries));
      if (st != SPW_OK) return fail_spw(w, "spw_alloc", st);
    }
    void *p;
    tries = 0;
    do st = spw_acquire(w->rt, w->bufs[i], s, flags, &p);
    while (paced(w, st, &tries));
    if (st != SPW_OK) return fail_spw(w, "spw_acquire", st);
    if (enqueue_step(w, step, i, s, p)) return 1;
    if ((i + 1) % w->group == 0 || i + 1 == w->nbuf) {
      size_t ngroups = (w->nbuf + w->group - 1) / w->group;
      tick_t *t = &w->ticks[(size_t)step * ngroups + g];
      *t = (tick_t){&w->done[step], i + 1 - g * w->group};
      st = spw_launch_host_func(w->rt, s, tick_fn, t);
      if (st != SPW_OK) return fail_spw(w, "spw_launch_host_func", st);
      st = spw_stream_release_async(w->rt, s);
      if (st != SPW_OK) return fail_spw(w, "spw_stream_release_async", st);
    }
  }
  return 0;
}

/* ---- progress -------------------------------------------------------------------------- */

static void progress_line(work_t *w, char *line, size_t len, uint64_t *total_done) {
  unsigned step = 0;
  uint64_t total = 0, cur = 0;
  for (unsigned k = 0; k < w->nsteps; k++) {
    uint64_t d = atomic_load(&w->done[k]);
    total += d;
    if (step == k && d >= w->nbuf && k + 1 < w->nsteps) step = k + 1;
  }
  cur = atomic_load(&w->done[step]);
  spw_stats_t st = {.struct_size = sizeof st};
  char a[32] = "?", b[32] = "?", c[32] = "?", phase[32];
  if (spw_get_stats(w->rt, &st) == SPW_OK) {
    human(st.device_bytes, a, sizeof a);
    human(st.host_bytes, b, sizeof b);
    human(st.disk_bytes, c, sizeof c);
  }
  if (step == 0) snprintf(phase, sizeof phase, "fill");
  else if (step <= w->rounds) snprintf(phase, sizeof phase, "round %u/%u", step, w->rounds);
  else snprintf(phase, sizeof phase, "verify");
  snprintf(line, len, "[%s] %-11s buffers %4llu/%zu | device %9s  host %9s  disk %9s", w->name,
           phase, (unsigned long long)cur, w->nbuf, a, b, c);
  *total_done = total;
}

/* Redraws one line on a terminal; elsewhere (CI logs) prints a line per 10% of the work. */
static void *progress_main(void *arg) {
  work_t *w = arg;
  uint64_t total = (uint64_t)w->nsteps * w->nbuf, done = 0;
  unsigned next_tenth = 1;
  char line[160];
  while (!atomic_load(&w->stop)) {
    struct timespec ts = {0, 100000000};
    nanosleep(&ts, NULL);
    progress_line(w, line, sizeof line, &done);
    if (w->tty) {
      printf("\r%s", line);
      fflush(stdout);
    } else if (done * 10 >= next_tenth * total && next_tenth <= 10) {
      while (next_tenth <= 10 && done * 10 >= next_tenth * total) next_tenth++;
      printf("%s\n", line);
      fflush(stdout);
    }
  }
  return NULL;
}

/* ---- one workload --------------------------------------------------------------------- */

static void print_summary(work_t *w, const spw_stats_t *s, double wall, double ceil_d2h,
                          double ceil_h2d) {
  char a[32], b[32], c[32], d[32];
  double d2h = s->spill_ns ? (double)s->spill_bytes / (double)s->spill_ns : 0.0;
  double h2d = s->unspill_ns ? (double)s->unspill_bytes / (double)s->unspill_ns : 0.0;
  printf("[%s] %s in %zu buffers, budget %s, %u rounds on %u streams: %.2f s wall\n", w->name,
         human((uint64_t)w->nbuf * w->buf_bytes, a, sizeof a), w->nbuf,
         human(w->budget, b, sizeof b), w->rounds, w->nstreams, wall);
  printf("[%s]   spilled %s (%llu spills), unspilled %s (%llu), disk written %s (%llu), "
         "disk read %s (%llu)\n",
         w->name, human(s->spill_bytes, a, sizeof a), (unsigned long long)s->spills,
         human(s->unspill_bytes, b, sizeof b), (unsigned long long)s->unspills,
         human(s->disk_write_bytes, c, sizeof c), (unsigned long long)s->disk_writes,
         human(s->disk_read_bytes, d, sizeof d), (unsigned long long)s->disk_reads);
  /* spill_ns / unspill_ns are the engine's time for the moves, so these are the rates the
   * engine achieved while it worked, set against what the link did at start. */
  printf("[%s]   device->host %.2f GB/s (%.2f of the %.2f GB/s ceiling), host->device %.2f "
         "GB/s (%.2f of %.2f); %.2f GB/s both ways over the wall time\n",
         w->name, d2h, ceil_d2h > 0 ? d2h / ceil_d2h : 0.0, ceil_d2h, h2d,
         ceil_h2d > 0 ? h2d / ceil_h2d : 0.0, ceil_h2d,
         (double)(s->spill_bytes + s->unspill_bytes) / wall / 1e9);
  if (s->disk_reads)
    printf("[%s]   disk read %.2f GB/s in engine time\n", w->name,
           s->disk_read_ns ? (double)s->disk_read_bytes / (double)s->disk_read_ns : 0.0);
  printf("[%s]   %llu spills on demand, %llu background, %llu abandoned, %llu clean re-spills, "
         "%llu failures; the host waited for the streams %llu times\n",
         w->name, (unsigned long long)s->spills_on_demand,
         (unsigned long long)s->spills_background, (unsigned long long)s->spills_abandoned,
         (unsigned long long)s->clean_respills, (unsigned long long)s->failures,
         (unsigned long long)w->paced);
}

/* Runs the workload on an existing runtime; cleanup is the caller's. */
static int run_work(work_t *w, double ceil_d2h, double ceil_h2d, int need_disk) {
  pthread_t prog;
  int st;
  for (unsigned k = 0; k < w->nstreams; k++) {
    st = spw_stream_create(w->rt, &w->streams[k]);
    if (st != SPW_OK) return fail_spw(w, "spw_stream_create", st);
  }
#ifdef SPW_DEMO_HAVE_CUDA
  if (w->kind == SPW_BACKEND_CUDA) {
    /* After stream creation: the runtime has made its device current on this thread. */
    int e = demo_cuda_results_alloc(w->nbuf, &w->dev_sums);
    if (e) return fail(w, "checksum array: %s", demo_cuda_error_text(e));
  }
#endif
  if (pthread_create(&prog, NULL, progress_main, w) != 0) return fail(w, "pthread_create failed");
  double t0 = now_s();
  int rc = 0;
  for (unsigned step = 0; step < w->nsteps && !rc; step++) rc = run_step(w, step);
  if (!rc) rc = wait_streams(w);
  double wall = now_s() - t0;
  atomic_store(&w->stop, 1);
  pthread_join(prog, NULL);
  if (w->tty) printf("\n");
  if (rc) return rc;
  if ((st = spw_wait_idle(w->rt)) != SPW_OK) return fail_spw(w, "background spill work", st);

#ifdef SPW_DEMO_HAVE_CUDA
  if (w->kind == SPW_BACKEND_CUDA) {
    int e = demo_cuda_results_fetch(w->dev_sums, w->sums, w->nbuf);
    if (e) return fail(w, "reading the checksums back: %s", demo_cuda_error_text(e));
  }
#endif
  spw_stats_t s = {.struct_size = sizeof s};
  if ((st = spw_get_stats(w->rt, &s)) != SPW_OK) return fail_spw(w, "spw_get_stats", st);
  print_summary(w, &s, wall, ceil_d2h, ceil_h2d);

  uint64_t *want = malloc(w->nbuf * sizeof *want);
  if (!want) return fail(w, "out of host memory");
  compute_expected(w, want);
  size_t bad = 0;
  for (size_t i = 0; i < w->nbuf; i++) {
    if (w->sums[i] == want[i]) continue;
    if (bad++ < 20)
      printf("[%s] MISMATCH buffer %zu: checksum %016llx, expected %016llx\n", w->name, i,
             (unsigned long long)w->sums[i], (unsigned long long)want[i]);
  }
  free(want);
  if (bad) return fail(w, "%zu of %zu buffers failed verification", bad, w->nbuf);
  if (s.spills == 0 || s.unspills + s.disk_reads == 0)
    return fail(w, "nothing was spilled and brought back: the data fit the budget");
  if (need_disk && (s.disk_writes == 0 || s.disk_reads == 0))
    return fail(w, "the disk tier was not used (%llu writes, %llu reads)",
                (unsigned long long)s.disk_writes, (unsigned long long)s.disk_reads);
  printf("[%s] verified %zu buffers: OK\n", w->name, w->nbuf);
  return 0;
}

static spw_config_t config_for(spw_backend_kind_t kind, uint64_t budget, uint64_t host_limit) {
  spw_config_t cfg = SPW_CONFIG_INIT;
  cfg.backend = kind;
  cfg.device_limit = budget;
  cfg.host_limit = host_limit;
  /* The host backend emulates a device twice the budget: the budget, not the "device",
   * is what forces spilling, as on a GPU shared with others. */
  if (kind == SPW_BACKEND_HOST) cfg.host_device_bytes = 2 * budget;
  return cfg;
}

/* Creates the runtime, runs, tears everything down; returns the exit status. */
static int workload(const char *name, spw_backend_kind_t kind, uint64_t budget, uint64_t buf_bytes,
                    double factor, uint64_t host_limit, const options_t *o, double ceil_d2h,
                    double ceil_h2d) {
  work_t w = {.name = name, .kind = kind, .budget = budget, .buf_bytes = buf_bytes,
              .host_limit = host_limit, .rounds = o->rounds, .nstreams = o->streams,
              .tty = isatty(STDOUT_FILENO)};
  w.nbuf = (size_t)ceil(factor * (double)budget / (double)buf_bytes);
  w.nsteps = o->rounds + 2;
  /* Groups small enough that every stream can hold two in flight within the budget. */
  w.group = (size_t)(budget / (buf_bytes * w.nstreams * 4));
  if (w.group < 1) w.group = 1;
  if (w.group > 8) w.group = 8;
  size_t ngroups = (w.nbuf + w.group - 1) / w.group;
  w.streams = calloc(w.nstreams, sizeof *w.streams);
  w.bufs = calloc(w.nbuf, sizeof *w.bufs);
  w.jobs = calloc((size_t)w.nsteps * w.nbuf, sizeof *w.jobs);
  w.ticks = calloc((size_t)w.nsteps * ngroups, sizeof *w.ticks);
  w.done = calloc(w.nsteps, sizeof *w.done);
  w.sums = calloc(w.nbuf, sizeof *w.sums);
  int rc = 0;
  if (!w.streams || !w.bufs || !w.jobs || !w.ticks || !w.done || !w.sums)
    rc = fail(&w, "out of host memory");

  spw_config_t cfg = config_for(kind, budget, host_limit);
  char trace[4096];
  if (o->trace) {
    /* trace.json -> trace.json for the main phase, trace.disk.json for the disk phase */
    const char *dot = strrchr(o->trace, '.'), *slash = strrchr(o->trace, '/');
    int stem = dot && (!slash || dot > slash) ? (int)(dot - o->trace) : (int)strlen(o->trace);
    if (strcmp(name, "main") == 0)
      snprintf(trace, sizeof trace, "%s", o->trace);
    else
      snprintf(trace, sizeof trace, "%.*s.%s%s", stem, o->trace, name, o->trace + stem);
    cfg.trace_path = trace;
  }
  int st = rc ? SPW_OK : spw_runtime_create(&cfg, &w.rt);
  if (st != SPW_OK) rc = fail(&w, "spw_runtime_create: %s", spw_err_name(st));
  if (!rc) {
    uint64_t dl = 0, hl = 0;
    char a[32], b[32], c[32], d[32];
    spw_runtime_limits(w.rt, &dl, &hl, NULL);
    printf("[%s] %zu buffers of %s = %s (%.1fx the device limit %s), host limit %s, group %zu\n",
           name, w.nbuf, human(buf_bytes, a, sizeof a),
           human((uint64_t)w.nbuf * buf_bytes, b, sizeof b),
           (double)w.nbuf * (double)buf_bytes / (double)dl, human(dl, c, sizeof c),
           human(hl, d, sizeof d), w.group);
    fflush(stdout);
    rc = run_work(&w, ceil_d2h, ceil_h2d, host_limit != 0);
  }
  if (w.rt) {
    /* Locks may remain after an error: synchronizing every stream drops them. */
    for (unsigned k = 0; k < w.nstreams; k++)
      if (w.streams[k]) (void)spw_stream_synchronize(w.rt, w.streams[k]);
    for (size_t i = 0; i < w.nbuf; i++)
      if (w.bufs[i]) (void)spw_free(w.rt, w.bufs[i]);
    st = spw_runtime_destroy(w.rt);
    if (st != SPW_OK && !rc) rc = fail(&w, "spw_runtime_destroy: %s", spw_err_name(st));
  }
#ifdef SPW_DEMO_HAVE_CUDA
  demo_cuda_results_free(w.dev_sums);
#endif
  if (rc) fprintf(stderr, "[%s] FAILED: %s\n", name, w.err);
  free(w.streams);
  free(w.bufs);
  free(w.jobs);
  free(w.ticks);
  free((void *)w.done);
  free(w.sums);
  return rc;
}

/* ---- setup ---------------------------------------------------------------------------- */

/* Which backend a runtime gets here (auto resolves to cuda only with a usable GPU). */
static int resolve_backend(spw_backend_kind_t want, spw_backend_kind_t *out) {
  spw_config_t cfg = config_for(want, 64 * MiB, 64 * MiB);
  spw_runtime_t *rt;
  int st = spw_runtime_create(&cfg, &rt);
  if (st != SPW_OK) return st;
  st = spw_runtime_backend(rt, out);
  spw_runtime_destroy(rt);
  return st;
}

/* Host backend: the "link" is memory bandwidth, one memcpy of CEILING_BYTES (best of two). */
static int host_ceiling(double *gbs) {
  char *a = malloc(CEILING_BYTES), *b = malloc(CEILING_BYTES);
  if (!a || !b) {
    free(a);
    free(b);
    return -1;
  }
  memset(a, 1, CEILING_BYTES); /* touched, so the copy does not time page faults */
  memset(b, 2, CEILING_BYTES);
  *gbs = 0;
  for (int rep = 0; rep < 2; rep++) {
    double t0 = now_s();
    memcpy(b, a, CEILING_BYTES);
    double t = now_s() - t0;
    if (t > 0 && CEILING_BYTES / t / 1e9 > *gbs) *gbs = CEILING_BYTES / t / 1e9;
  }
  free(a);
  free(b);
  return 0;
}

/* Asks a throwaway runtime to put one buffer on disk: the disk tier may be refused here
 * (no writable spill directory, a build without it), which skips the phase, not fails it. */
static int disk_tier_usable(spw_backend_kind_t kind, int *status) {
  spw_config_t cfg = config_for(kind, 64 * MiB, 64 * MiB);
  spw_runtime_t *rt;
  spw_buf_t b = 0;
  spw_tier_t tier = SPW_TIER_DEVICE;
  int st = spw_runtime_create(&cfg, &rt);
  if (st != SPW_OK) {
    *status = st;
    return 0;
  }
  st = spw_alloc(rt, MiB, NULL, &b);
  if (st == SPW_OK) st = spw_spill(rt, b, SPW_TIER_DISK);
  if (st == SPW_OK) st = spw_wait_idle(rt);
  if (st == SPW_OK) st = spw_buf_tier(rt, b, &tier);
  if (st == SPW_OK && tier != SPW_TIER_DISK) st = SPW_ERR_INTERNAL;
  if (b) spw_free(rt, b);
  spw_runtime_destroy(rt);
  *status = st;
  return st == SPW_OK;
}

static void usage(FILE *f, const char *prog) {
  fprintf(f,
          "usage: %s [options]\n"
          "Oversubscribes device memory through Spillway and verifies every byte.\n\n"
          "  --budget BYTES      device budget (default: cuda 4GiB; host 256MiB, emulating a\n"
          "                      device of twice that)\n"
          "  --factor F          data = F x budget (default 3)\n"
          "  --buffer-size BYTES size of each buffer (default: cuda 64MiB; host 8MiB)\n"
          "  --rounds N          transform rounds over every buffer (default 3)\n"
          "  --streams N         streams the work is spread over (default 4)\n"
          "  --disk-phase on|off second phase through the disk tier (default on)\n"
          "  --backend auto|cuda|host (default auto: cuda when a GPU is usable)\n"
          "  --trace FILE        write a Chrome trace (Perfetto, chrome://tracing) of the main\n"
          "                      phase to FILE and of the disk phase to FILE with .disk\n"
          "                      before its extension; `python -m spillway.plot` draws one\n"
          "  --help\n\n"
          "BYTES takes K, M, G, T suffixes (binary: 1M = 1MiB). SPILLWAY_* variables apply\n"
          "to what these options do not set (e.g. SPILLWAY_SPILL_DIR, SPILLWAY_IO).\n",
          prog);
}

static int parse_options(int argc, char **argv, options_t *o) {
  static const struct option longs[] = {
      {"budget", required_argument, NULL, 'b'},  {"factor", required_argument, NULL, 'f'},
      {"buffer-size", required_argument, NULL, 's'}, {"rounds", required_argument, NULL, 'r'},
      {"streams", required_argument, NULL, 'n'}, {"disk-phase", required_argument, NULL, 'd'},
      {"backend", required_argument, NULL, 'k'}, {"trace", required_argument, NULL, 't'},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0}};
  *o = (options_t){0, 0, 3.0, 3, 4, 1, SPW_BACKEND_AUTO, NULL};
  int c, li = 0;
  while ((c = getopt_long(argc, argv, "", longs, &li)) != -1) {
    int bad = 0;
    char *end;
    switch (c) {
    case 'b': bad = parse_size(optarg, &o->budget); break;
    case 's': bad = parse_size(optarg, &o->buffer_size) || o->buffer_size % 4; break;
    case 'f':
      o->factor = strtod(optarg, &end);
      bad = end == optarg || *end || !(o->factor > 1.0 && o->factor <= 1000.0);
      break;
    case 'r': bad = parse_uint(optarg, 1, 1000, &o->rounds); break;
    case 'n': bad = parse_uint(optarg, 1, 64, &o->streams); break;
    case 'd':
      o->disk_phase = !strcmp(optarg, "on") ? 1 : !strcmp(optarg, "off") ? 0 : -1;
      bad = o->disk_phase < 0;
      break;
    case 'k':
      o->backend = !strcmp(optarg, "auto")   ? SPW_BACKEND_AUTO
                   : !strcmp(optarg, "cuda") ? SPW_BACKEND_CUDA
                   : !strcmp(optarg, "host") ? SPW_BACKEND_HOST
                                             : (spw_backend_kind_t)-1;
      bad = (int)o->backend < 0;
      break;
    case 't': o->trace = optarg; bad = optarg[0] == '\0'; break;
    case 'h': usage(stdout, argv[0]); exit(0);
    default: usage(stderr, argv[0]); return -1;
    }
    if (bad) {
      fprintf(stderr, "%s: bad value '%s' for --%s\n", argv[0], optarg, longs[li].name);
      return -1;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "%s: unexpected argument '%s'\n", argv[0], argv[optind]);
    return -1;
  }
  return 0;
}

int main(int argc, char **argv) {
  options_t o;
  if (parse_options(argc, argv, &o)) return 2;
  spw_backend_kind_t kind;
  int st = resolve_backend(o.backend, &kind);
  if (st == SPW_ERR_NO_DEVICE) {
    fprintf(stderr, "spillway-demo: the requested backend is not available here\n");
    return 77;
  }
  if (st != SPW_OK) {
    fprintf(stderr, "spillway-demo: runtime creation failed: %s\n", spw_err_name(st));
    return 1;
  }
  int cuda = kind == SPW_BACKEND_CUDA;
#ifndef SPW_DEMO_HAVE_CUDA
  if (cuda) {
    fprintf(stderr, "spillway-demo: built without its CUDA kernels; use --backend host\n");
    return 77;
  }
#endif
  uint64_t budget = o.budget ? o.budget : cuda ? 4 * GiB : 256 * MiB;
  uint64_t buf = o.buffer_size ? o.buffer_size : cuda ? 64 * MiB : 8 * MiB;
  if (buf > budget / 2) {
    fprintf(stderr, "spillway-demo: --buffer-size must be at most half the budget\n");
    return 2;
  }
  printf("spillway-demo: backend %s, budget %.2f GiB, factor %.1f, buffers of %.1f MiB, "
         "%u rounds, %u streams\n",
         cuda ? "cuda" : "host", (double)budget / (double)GiB, o.factor,
         (double)buf / (double)MiB, o.rounds, o.streams);

  double ceil_d2h = 0, ceil_h2d = 0;
  if (cuda) {
#ifdef SPW_DEMO_HAVE_CUDA
    /* resolve_backend's runtime left its device current on this thread. */
    int e = demo_cuda_link_ceiling(CEILING_BYTES, &ceil_d2h, &ceil_h2d);
    if (e) {
      fprintf(stderr, "spillway-demo: link ceiling: %s\n", demo_cuda_error_text(e));
      return 1;
    }
#endif
    printf("link ceiling (256 MiB pinned copies): device->host %.1f GB/s, host->device %.1f "
           "GB/s\n", ceil_d2h, ceil_h2d);
  } else {
    if (host_ceiling(&ceil_d2h)) {
      fprintf(stderr, "spillway-demo: out of host memory measuring the link ceiling\n");
      return 1;
    }
    ceil_h2d = ceil_d2h;
    printf("link ceiling (host backend: one 256 MiB memcpy): %.1f GB/s\n", ceil_d2h);
  }
  fflush(stdout);

  int rc = workload("main", kind, budget, buf, o.factor, 0, &o, ceil_d2h, ceil_h2d);
  if (rc || !o.disk_phase) return rc;

  /* The disk phase: an eighth of the budget, quarter-size buffers, and a host limit of a
   * quarter of the data, so that most spilled buffers must go on to disk. */
  int why;
  if (!disk_tier_usable(kind, &why)) {
    printf("[disk] skipped: the disk tier is not usable here (%s: %s)\n", spw_err_name(why),
           spw_strerror(why));
    if (why != SPW_ERR_UNSUPPORTED && why != SPW_ERR_IO && why != SPW_ERR_SYSTEM &&
        why != SPW_ERR_DISK_FULL && why != SPW_ERR_CONFIG) /* CONFIG: spill directory */
      return 1; /* not an environment limit: a failure */
    return 0;
  }
  uint64_t dbudget = budget / 8 < buf ? buf : budget / 8;
  uint64_t dbuf = buf / 4 < 4096 ? 4096 : buf / 4 / 4 * 4;
  uint64_t data = (uint64_t)ceil(o.factor * (double)dbudget / (double)dbuf) * dbuf;
  uint64_t hlimit = data / 4 < dbuf ? dbuf : data / 4;
  return workload("disk", kind, dbudget, dbuf, o.factor, hlimit, &o, ceil_d2h, ceil_h2d);
}
