/* SPDX-License-Identifier: Apache-2.0 */
/* lock_latency: the cost of one spw_acquire + spw_release pair on a resident buffer, on 1,
 * 2, 4, 8 and 16 threads, next to the floor measured in the same run: one pthread mutex
 * lock/unlock pair per thread, each thread its own mutex (uncontended). Uncontended
 * spillway: each thread its own buffer and its own stream. Contended: every thread
 * acquires the same buffer, each on its own stream.
 *
 * Every configuration is warmed up, then timed `iters` pairs per thread (argv[1], default
 * 2,000,000) from a common start barrier; it is repeated 5 times and the median is shown.
 * ns/pair is the mean over threads of each thread's own time per pair; M pairs/s is all
 * pairs of all threads over the slowest thread's time. The backend comes from
 * SPILLWAY_BACKEND (default auto). No assertion is made on time: this is a measurement. */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "spillway/spillway.h"

enum { REPEATS = 5, MAX_THREADS = 16, WARMUP_DIVISOR = 10 };

typedef enum mode { MODE_SPILLWAY = 0, MODE_MUTEX = 1, MODE_SHARED = 2 } bench_mode_t;

typedef struct run {
  spw_runtime_t *rt;
  bench_mode_t mode;
  int threads;
  uint64_t iters;
  pthread_barrier_t start;
  spw_buf_t shared_buf;
  int failed; /* first failing status, written once under `mu` */
  pthread_mutex_t mu;
} run_t;

typedef struct thread_ctx {
  run_t *run;
  spw_stream_t stream;
  spw_buf_t buf;
  pthread_mutex_t mutex;
  double seconds;
} thread_ctx_t;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void note_failure(run_t *r, int status) {
  pthread_mutex_lock(&r->mu);
  if (r->failed == SPW_OK) r->failed = status;
  pthread_mutex_unlock(&r->mu);
}

/* One acquire+release pair per iteration; returns the first error. */
static int spillway_pairs(spw_runtime_t *rt, spw_buf_t buf, spw_stream_t s, uint64_t n) {
  for (uint64_t i = 0; i < n; i++) {
    void *d;
    int st = spw_acquire(rt, buf, s, 0, &d);
    if (st != SPW_OK) return st;
    st = spw_release(rt, buf, s);
    if (st != SPW_OK) return st;
  }
  return SPW_OK;
}

static void mutex_pairs(pthread_mutex_t *m, uint64_t n) {
  for (uint64_t i = 0; i < n; i++) {
    pthread_mutex_lock(m);
    pthread_mutex_unlock(m);
  }
}

static void *thread_main(void *arg) {
  thread_ctx_t *t = arg;
  run_t *r = t->run;
  spw_buf_t buf = r->mode == MODE_SHARED ? r->shared_buf : t->buf;
  const uint64_t warm = r->iters / WARMUP_DIVISOR + 1;
  int st = SPW_OK;
  if (r->mode == MODE_MUTEX)
    mutex_pairs(&t->mutex, warm);
  else
    st = spillway_pairs(r->rt, buf, t->stream, warm);
  pthread_barrier_wait(&r->start);
  const double t0 = now_s();
  if (st == SPW_OK) {
    if (r->mode == MODE_MUTEX)
      mutex_pairs(&t->mutex, r->iters);
    else
      st = spillway_pairs(r->rt, buf, t->stream, r->iters);
  }
  t->seconds = now_s() - t0;
  if (st != SPW_OK) note_failure(r, st);
  return NULL;
}

typedef struct result {
  double ns_per_pair; /* mean over threads */
  double mpairs_s;    /* all pairs over the slowest thread's time */
} result_t;

/* One timed repetition of `mode` on `threads` threads. */
static int measure(spw_runtime_t *rt, bench_mode_t mode, int threads, uint64_t iters,
                   result_t *out) {
  run_t r;
  memset(&r, 0, sizeof r);
  r.rt = rt;
  r.mode = mode;
  r.threads = threads;
  r.iters = iters;
  pthread_mutex_init(&r.mu, NULL);
  pthread_barrier_init(&r.start, NULL, (unsigned)threads);
  thread_ctx_t ctx[MAX_THREADS];
  pthread_t tid[MAX_THREADS];
  int st = SPW_OK;
  memset(ctx, 0, sizeof ctx);
  for (int i = 0; i < threads; i++) {
    ctx[i].run = &r;
    pthread_mutex_init(&ctx[i].mutex, NULL);
  }
  if (mode == MODE_SHARED) st = spw_alloc(rt, 4096, NULL, &r.shared_buf);
  for (int i = 0; i < threads && st == SPW_OK; i++) {
    if (mode == MODE_MUTEX) continue;
    st = spw_stream_create(rt, &ctx[i].stream);
    if (st == SPW_OK && mode == MODE_SPILLWAY) st = spw_alloc(rt, 4096, ctx[i].stream, &ctx[i].buf);
  }
  if (st == SPW_OK) {
    for (int i = 0; i < threads; i++) pthread_create(&tid[i], NULL, thread_main, &ctx[i]);
    for (int i = 0; i < threads; i++) pthread_join(tid[i], NULL);
    st = r.failed;
  }
  double sum = 0, slowest = 0;
  for (int i = 0; i < threads; i++) {
    sum += ctx[i].seconds / (double)iters * 1e9;
    if (ctx[i].seconds > slowest) slowest = ctx[i].seconds;
    if (ctx[i].buf) spw_free(rt, ctx[i].buf);
    if (ctx[i].stream) spw_stream_destroy(rt, ctx[i].stream);
    pthread_mutex_destroy(&ctx[i].mutex);
  }
  if (r.shared_buf) spw_free(rt, r.shared_buf);
  out->ns_per_pair = sum / threads;
  out->mpairs_s = slowest > 0 ? (double)threads * (double)iters / slowest / 1e6 : 0;
  pthread_barrier_destroy(&r.start);
  pthread_mutex_destroy(&r.mu);
  return st;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v) {
  qsort(v, REPEATS, sizeof *v, cmp_double);
  return v[REPEATS / 2];
}

/* The median over REPEATS repetitions of both numbers. */
static int measure_median(spw_runtime_t *rt, bench_mode_t mode, int threads, uint64_t iters,
                          result_t *out) {
  double ns[REPEATS], mp[REPEATS];
  for (int i = 0; i < REPEATS; i++) {
    result_t r;
    int st = measure(rt, mode, threads, iters, &r);
    if (st != SPW_OK) return st;
    ns[i] = r.ns_per_pair;
    mp[i] = r.mpairs_s;
  }
  out->ns_per_pair = median(ns);
  out->mpairs_s = median(mp);
  return SPW_OK;
}

int main(int argc, char **argv) {
  uint64_t iters = 2000000;
  if (argc > 1) {
    char *end = NULL;
    unsigned long long v = strtoull(argv[1], &end, 10);
    if (!end || *end != '\0' || v == 0) {
      fprintf(stderr, "usage: %s [iterations per thread, default 2000000]\n", argv[0]);
      return 2;
    }
    iters = v;
  }
  spw_runtime_t *rt = NULL;
  int st = spw_runtime_create(NULL, &rt); /* backend from SPILLWAY_BACKEND, default auto */
  if (st != SPW_OK) {
    char msg[512];
    spw_config_validate(NULL, msg, sizeof msg);
    fprintf(stderr, "spw_runtime_create: %s %s\n", spw_err_name(st), msg);
    return 1;
  }
  spw_backend_kind_t kind = SPW_BACKEND_AUTO;
  spw_runtime_backend(rt, &kind);
  printf("lock_latency: backend %s, %" PRIu64 " pairs per thread, median of %d\n\n",
         kind == SPW_BACKEND_CUDA ? "cuda" : "host", iters, REPEATS);
  printf("| threads | spillway ns/pair | mutex ns/pair | ratio | total M pairs/s | "
         "contended ns/pair |\n");
  printf("| ---: | ---: | ---: | ---: | ---: | ---: |\n");
  const int counts[] = {1, 2, 4, 8, 16};
  for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++) {
    result_t spw, mtx, shared;
    int n = counts[i];
    if ((st = measure_median(rt, MODE_SPILLWAY, n, iters, &spw)) != SPW_OK ||
        (st = measure_median(rt, MODE_MUTEX, n, iters, &mtx)) != SPW_OK ||
        (st = measure_median(rt, MODE_SHARED, n, iters, &shared)) != SPW_OK) {
      fprintf(stderr, "lock_latency: %d threads: %s (%s)\n", n, spw_err_name(st),
              spw_last_error(rt));
      spw_runtime_destroy(rt);
      return 1;
    }
    printf("| %d | %.1f | %.1f | %.2f | %.2f | %.1f |\n", n, spw.ns_per_pair, mtx.ns_per_pair,
           spw.ns_per_pair / mtx.ns_per_pair, spw.mpairs_s, shared.ns_per_pair);
    fflush(stdout);
  }
  printf("\ngoal: <= 100 ns/pair on 1 thread, throughput growing with threads\n");
  st = spw_runtime_destroy(rt);
  if (st != SPW_OK) {
    fprintf(stderr, "spw_runtime_destroy: %s\n", spw_err_name(st));
    return 1;
  }
  return 0;
}
