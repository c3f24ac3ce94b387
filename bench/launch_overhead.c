/* SPDX-License-Identifier: Apache-2.0 */
/* launch_overhead: what the launch wrappers add to a kernel launch. An empty kernel with 1, 4
 * and 16 pointer arguments, each a resident buffer, is launched `batch` times back to back
 * in four ways:
 *  - raw: cudaLaunchKernel with the device pointers (host backend: spw_launch_kernel with the
 *    pointers as plain values, which locks nothing: the emulation's own launch cost);
 *  - spw_launch_kernel: every pointer a buffer argument, acquired, substituted, and released
 *    once the kernel has completed (spw_release_n_async);
 *  - spw_lock_and_launch: the C wrapper, its fn doing the raw launch;
 *  - locks kept: spw_launch_kernel with SPW_LAUNCH_KEEP_LOCKS (acquire and launch only; a
 *    synchronize after the batch releases), which splits the cost between lock and release.
 * The time of a launch is the batch's time on the calling thread over `batch`. Between
 * batches, untimed, the stream is waited for and the pending releases drained, so that each
 * batch starts from the same state. The four ways alternate batch by batch, `reps` times,
 * and each figure is the median over the reps.
 *
 * Options (--NAME=VALUE or SPW_BENCH_NAME): buffers (list, default 1,4,16; on CUDA only
 * those three), batch (launches per batch; cuda 256, host 16), reps (cuda 200, host 3). No
 * assertion on time: the run fails only if a call fails or a buffer is left locked, which
 * makes the host-backend run a smoke test.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_common.h"

#ifdef SPW_BENCH_HAVE_CUDA
const void *lo_empty_kernel(int nptr); /* launch_overhead_kernels.cu */
int lo_raw_launch(const void *func, void **args, void *stream);
#endif

#define MAX_BUFS 16
#define BUF_BYTES 4096

enum { RAW = 0, LAUNCHER, WRAPPER, KEPT, WAYS };
static const char *const way_names[WAYS] = {"raw", "spw_launch_kernel", "spw_lock_and_launch",
                                            "locks kept"};

typedef struct ctx {
  const bench_env_t *env;
  spw_runtime_t *rt;
  spw_stream_t s;
  const void *func;
  size_t n;
  spw_buf_t bufs[MAX_BUFS];
  void *ptrs[MAX_BUFS];      /* device pointers, held by a lock on another stream */
  void *raw_args[MAX_BUFS];  /* raw_args[i] = &ptrs[i] */
  spw_kernel_arg_t kbuf[MAX_BUFS], kval[MAX_BUFS];
  spw_buf_arg_t bargs[MAX_BUFS];
} ctx_t;

static void host_empty(void **args) { (void)args; }

static int launch_values(ctx_t *c, void *const *ptrs, spw_stream_t s) {
#ifdef SPW_BENCH_HAVE_CUDA
  if (c->env->kind == SPW_BACKEND_CUDA) {
    void *args[MAX_BUFS];
    for (size_t i = 0; i < c->n; i++) args[i] = (void *)&ptrs[i];
    return lo_raw_launch(c->func, args, s) == 0 ? SPW_OK : SPW_ERR_CUDA;
  }
#endif
  spw_kernel_arg_t a[MAX_BUFS];
  for (size_t i = 0; i < c->n; i++) a[i] = spw_karg_value(&ptrs[i], sizeof ptrs[i]);
  return spw_launch_kernel(c->rt, c->func, spw_dim3(1, 1, 1), spw_dim3(1, 1, 1), a, c->n, 0, s,
                           0);
}

static int wrapper_fn(void *user, void *const *dptrs, spw_stream_t s) {
  return launch_values(user, dptrs, s);
}

static int launch_once(ctx_t *c, int way) {
  spw_dim3_t one = spw_dim3(1, 1, 1);
  switch (way) {
  case RAW:
#ifdef SPW_BENCH_HAVE_CUDA
    if (c->env->kind == SPW_BACKEND_CUDA)
      return lo_raw_launch(c->func, c->raw_args, c->s) == 0 ? SPW_OK : SPW_ERR_CUDA;
#endif
    return spw_launch_kernel(c->rt, c->func, one, one, c->kval, c->n, 0, c->s, 0);
  case LAUNCHER:
    return spw_launch_kernel(c->rt, c->func, one, one, c->kbuf, c->n, 0, c->s, 0);
  case WRAPPER:
    return spw_lock_and_launch(c->rt, c->bargs, c->n, c->s, 0, wrapper_fn, c);
  default:
    return spw_launch_kernel(c->rt, c->func, one, one, c->kbuf, c->n, 0, c->s,
                             SPW_LAUNCH_KEEP_LOCKS);
  }
}

/* One timed batch; then, untimed, the stream waited for and every release done. */
static int batch_us(ctx_t *c, int way, uint64_t batch, double *us) {
  double t0 = bench_now();
  for (uint64_t k = 0; k < batch; k++) {
    int st = launch_once(c, way);
    if (st != SPW_OK) return bench_fail(c->rt, way_names[way], st);
  }
  double t1 = bench_now();
  int st = way == KEPT ? spw_stream_synchronize(c->rt, c->s) : spw_stream_wait(c->rt, c->s);
  if (st == SPW_OK) st = spw_wait_idle(c->rt);
  if (st != SPW_OK) return bench_fail(c->rt, "settle", st);
  *us = (t1 - t0) / (double)batch * 1e6;
  return SPW_OK;
}

static int measure(const bench_env_t *env, spw_runtime_t *rt, size_t n, uint64_t batch,
                   uint64_t reps, double med[WAYS]) {
  ctx_t c;
  memset(&c, 0, sizeof c);
  c.env = env;
  c.rt = rt;
  c.n = n;
  c.func = spw_host_kernel(host_empty);
#ifdef SPW_BENCH_HAVE_CUDA
  if (env->kind == SPW_BACKEND_CUDA) c.func = lo_empty_kernel((int)n);
  if (!c.func) return bench_fail(rt, "cudaGetKernel", SPW_ERR_CUDA);
#endif
  spw_stream_t hold;
  int st = spw_stream_create(rt, &c.s);
  if (st == SPW_OK) st = spw_stream_create(rt, &hold);
  if (st != SPW_OK) return bench_fail(rt, "spw_stream_create", st);
  for (size_t i = 0; i < n && st == SPW_OK; i++) {
    st = spw_alloc(rt, BUF_BYTES, c.s, &c.bufs[i]);
    if (st == SPW_OK) st = spw_acquire(rt, c.bufs[i], hold, 0, &c.ptrs[i]);
    c.raw_args[i] = &c.ptrs[i];
    c.kval[i] = spw_karg_value(&c.ptrs[i], sizeof c.ptrs[i]);
    c.kbuf[i] = spw_karg_buf(c.bufs[i], 0, 0);
    c.bargs[i] = spw_buf_arg(c.bufs[i], 0, 0);
  }
  if (st != SPW_OK) return bench_fail(rt, "buffers", st);

  double *samples = malloc(WAYS * reps * sizeof *samples);
  if (!samples) return bench_fail(rt, "malloc", SPW_ERR_SYSTEM);
  for (int way = 0; way < WAYS && st == SPW_OK; way++) /* warm-up */
    st = batch_us(&c, way, batch, &samples[0]);
  for (uint64_t r = 0; r < reps && st == SPW_OK; r++)
    for (int way = 0; way < WAYS && st == SPW_OK; way++)
      st = batch_us(&c, (int)((way + r) % WAYS), batch, &samples[((way + r) % WAYS) * reps + r]);
  for (int way = 0; way < WAYS && st == SPW_OK; way++)
    med[way] = bench_median(&samples[way * reps], reps);
  free(samples);
  if (st != SPW_OK) return st;

  if ((st = spw_stream_synchronize(rt, hold)) != SPW_OK) return bench_fail(rt, "hold", st);
  for (size_t i = 0; i < n; i++) {
    uint32_t locks = 1;
    st = spw_buf_lock_count(rt, c.bufs[i], &locks);
    if (st != SPW_OK || locks != 0) {
      fprintf(stderr, "buffer %zu left with %" PRIu32 " locks\n", i, locks);
      return st != SPW_OK ? st : SPW_ERR_INTERNAL;
    }
    spw_free(rt, c.bufs[i]);
  }
  spw_stream_destroy(rt, hold);
  spw_stream_destroy(rt, c.s);
  return SPW_OK;
}

int main(int argc, char **argv) {
  static const char *const known[] = {"buffers", "batch", "reps", NULL};
  bench_env_t env;
  int st = bench_opt_check(argc, argv, known);
  if (st == SPW_OK) st = bench_env_init(&env);
  if (st != SPW_OK) return 2;
  int cuda = env.kind == SPW_BACKEND_CUDA;
  const uint64_t def_bufs[] = {1, 4, 16};
  uint64_t bufs[BENCH_MAX_LIST], batch, reps;
  size_t nb;
  st = bench_opt_uint_list(argc, argv, "buffers", def_bufs, 3, bufs, &nb);
  if (st == SPW_OK) st = bench_opt_uint(argc, argv, "batch", cuda ? 256 : 16, &batch);
  if (st == SPW_OK) st = bench_opt_uint(argc, argv, "reps", cuda ? 200 : 3, &reps);
  if (st != SPW_OK) return 2;
  for (size_t i = 0; i < nb; i++) {
    if (bufs[i] < 1 || bufs[i] > MAX_BUFS || (cuda && bufs[i] != 1 && bufs[i] != 4 &&
                                              bufs[i] != 16)) {
      fprintf(stderr, "buffers=%" PRIu64 ": expected 1 to %d (on CUDA: 1, 4 or 16)\n", bufs[i],
              MAX_BUFS);
      return 2;
    }
  }
  if (batch == 0 || reps == 0) {
    fprintf(stderr, "batch and reps must be at least 1\n");
    return 2;
  }
  spw_runtime_t *rt;
  if (bench_runtime_create(&env, 0, 0, NULL, &rt) != SPW_OK) return 1;

  printf("## launch_overhead: %s (%s backend), %" PRIu64 " launches per batch, median of %" PRIu64
         " batches\n\n", env.device_name, cuda ? "cuda" : "host", batch, reps);
  printf("| buffers | raw launch (µs) | spw_launch_kernel (µs) | spw_lock_and_launch (µs) | "
         "locks kept (µs) | added per launch (µs) | added per buffer (µs) | goal: 1 + 0.1/buffer "
         "(µs) |\n");
  printf("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n");
  double added_first = 0, added_last = 0;
  for (size_t i = 0; i < nb && st == SPW_OK; i++) {
    double med[WAYS];
    st = measure(&env, rt, (size_t)bufs[i], batch, reps, med);
    if (st != SPW_OK) break;
    double added = med[LAUNCHER] - med[RAW], goal = 1.0 + 0.1 * (double)bufs[i];
    if (i == 0) added_first = added;
    added_last = added;
    printf("| %" PRIu64 " | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.1f: %s |\n", bufs[i],
           med[RAW], med[LAUNCHER], med[WRAPPER], med[KEPT], added, added / (double)bufs[i],
           goal, cuda ? (added <= goal ? "met" : "missed") : "n/a (cpu)");
  }
  if (st == SPW_OK && nb > 1 && bufs[nb - 1] != bufs[0])
    printf("\nmarginal cost of one more buffer (from %" PRIu64 " to %" PRIu64
           " buffers): %.3f µs\n", bufs[0], bufs[nb - 1],
           (added_last - added_first) / (double)(bufs[nb - 1] - bufs[0]));
  if (!cuda) printf("\n(host backend: a smoke run; its times say nothing about a GPU)\n");
  int dst = spw_runtime_destroy(rt);
  if (st == SPW_OK && dst != SPW_OK) st = bench_fail(NULL, "spw_runtime_destroy", dst);
  return st == SPW_OK ? 0 : 1;
}
