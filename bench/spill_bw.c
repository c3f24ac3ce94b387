/* SPDX-License-Identifier: Apache-2.0 */
/* spill_bw: spill (device -> pinned host) and unspill (host -> device) throughput through
 * Spillway by buffer size, next to raw cudaMemcpyAsync between device memory and pinned
 * host memory (anonymous mmap + cudaHostRegister) measured in the same run.
 *
 * Per size: `count` buffers are allocated and filled with the check pattern, then warmed up
 * (one spill + writable-acquire pass, untimed). Each of `reps` rounds (the median is shown)
 * times, in order:
 *  - spill: spw_spill_n(all, HOST) + spw_wait_idle (one batch);
 *  - unspill (prefetch): spw_prefetch_n(all, stream) + spw_wait_idle (one batch). A prefetch keeps a clean
 *    host copy, so the buffers are then spilled again untimed (moving no bytes) before:
 *  - unspill (acquire): a writable spw_acquire of all + synchronize (which releases them);
 *    then, after an untimed spill of all again:
 *  - unspill (acquire_n): one writable spw_acquire_n of all + synchronize.
 * Raw: one cudaMemcpyAsync per buffer each way and, below 4 MiB, one copy of the whole
 * working set (the ceiling batching can reach). Duplex: half the buffers spill while the
 * other half are prefetched, from two threads, against raw D2H and H2D of the same pieces on
 * two streams from two threads.
 *
 * Small-buffer variants (cuda only, sizes below 1 MiB), both directions over the raw
 * buffers, each timed with CUDA events on one stream (warm-up, then the median of `reps`):
 * one cudaMemcpyAsync per buffer; the same with a cudaEventRecord after each copy (the
 * work a single acquire of a spilled buffer enqueues, its floor); the first with the
 * direction given instead of cudaMemcpyDefault (what it saves the driver: looking up where
 * each pointer lives); one cudaMemcpyBatchAsync
 * of all of them; a gather kernel into a device staging buffer plus one copy of it to
 * pinned memory (up: one copy into the staging buffer plus a scatter kernel). The raw
 * device region holds a pattern before the D2H passes and the pinned region another before
 * the H2D passes; a sample of destination buffers is poisoned before each variant and
 * compared with the pattern after it. They are printed in a second table next to
 * Spillway's spill and prefetch.
 *
 * Every timed pass is checked: after a spill all buffers must be on host and the spill byte
 * counter must have grown by the working set; after an unspill all must be resident. At the
 * end of each size a sample of buffers is read back and compared word for word with the
 * pattern. Held stream (cuda, below 1 MiB, with the stage variants): the calling thread's
 * time per call while a kernel holds the stream (bench_cuda_spin, 20 ms) and at most 512
 * calls are enqueued behind it, for one H2D cudaMemcpyAsync, the same + cudaEventRecord, and
 * a single writable spw_acquire of a spilled buffer: each call's own cost, which the GPU's
 * time per copy hides once the queue is full. Device and host limits are set to twice the
 * largest working set, so no spill on
 * demand or background spill interferes. Nothing here asserts on time.
 *
 * Stage variants (sizes below `stages-below`, default 1 MiB; 0 turns them off): Spillway's
 * passes timed again where one or more stages have nothing to do, side by side in the same
 * rounds, so that the time of each stage is a difference of two columns (measure_spillway
 * says which); printed in a third table, in µs per buffer, and checked like the others.
 *
 * Options (--NAME=VALUE or SPW_BENCH_NAME): sizes (list), total (bytes per size; the count
 * is total/size, at least 2, at most max-count), max-count, reps, stages-below. Defaults on cuda: sizes
 * 4KiB..1GiB, total 1 GiB, max-count 65536 (4 KiB x 65536 = 256 MiB; 1 GiB x 2), reps 3; on
 * host: sizes 4KiB..64MiB, total 64 MiB, max-count 4096, reps 3.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_common.h"

#ifdef SPW_BENCH_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "bench_kernels.h"

/* The ways spill_bw moves many small buffers itself, in table order. */
enum { SMALL_MEMCPY, SMALL_MEMCPY_EVENT, SMALL_MEMCPY_KIND, SMALL_BATCH, SMALL_GATHER, SMALL_NVAR };
static const char *const small_name[SMALL_NVAR] = {"per-buffer memcpy", "per-buffer memcpy + event",
                                                   "per-buffer memcpy, kind given",
                                                   "cudaMemcpyBatchAsync", "gather+copy"};
/* Events recorded in turn by the memcpy + event variant (an acquire records one per copy). */
#define SMALL_EVENTS 256
#define SMALL_MAX_SIZE BENCH_MIB /* variants run below this buffer size */
/* Held stream: the calls enqueued behind a kernel that holds the stream this long, so that
 * no queue fills and the GPU's pace does not set theirs (about 3 µs a call: 1.5 ms). */
#define HELD_CALLS 512
#define HELD_NS 20000000ull
#endif

/* Stage variants: Spillway's passes with one stage left out (see measure_spillway), seconds
 * per pass (median); 0 where not measured. */
enum { STAGE_SPILL, STAGE_SPILL_NO_COPY, STAGE_SPILL_HINTS, STAGE_PREFETCH,
       STAGE_PREFETCH_HINTS, STAGE_ACQUIRE, STAGE_ACQUIRE_CALLS, STAGE_N };

typedef struct result {
  uint64_t size;
  size_t count;
  double spill, raw_d2h, prefetch, raw_h2d, acquire, acquire_n, big_d2h, big_h2d;
  double stage_s[STAGE_N];
  double duplex, raw_duplex;
#ifdef SPW_BENCH_HAVE_CUDA
  double small_d2h[SMALL_NVAR], small_h2d[SMALL_NVAR]; /* 0: not measured */
  double small_enq_h2d[SMALL_NVAR]; /* host seconds to enqueue one H2D pass, median */
  /* Seconds per call, the stream held (HELD_NS): one H2D memcpy, memcpy + event, and a
   * single acquire of a spilled buffer. 0: not measured. */
  double held_memcpy, held_memcpy_event, held_acquire;
#endif
  uint64_t arena_before; /* pinned arena bytes mapped when the first timed spill started */
  uint64_t bad;          /* wrong words in the checked sample */
  unsigned anomalies;    /* passes whose end state or byte count was not as expected */
} result_t;

typedef struct ctx {
  const bench_env_t *env;
  spw_runtime_t *rt;
  spw_stream_t s, s2;
  spw_buf_t *bufs;
  size_t count;
  uint64_t size;
  unsigned reps;
  uint64_t stages_below; /* stage variants for buffer sizes below this */
  result_t *res;
} ctx_t;

/* ---- passes over a range of buffers ---- */

/* One request for the whole range: the engine moves it as one batch. */
static int spill_range(spw_runtime_t *rt, const spw_buf_t *b, size_t from, size_t to) {
  int st = spw_spill_n(rt, b + from, to - from, SPW_TIER_HOST);
  if (st != SPW_OK) return bench_fail(rt, "spw_spill_n", st);
  st = spw_wait_idle(rt);
  return st != SPW_OK ? bench_fail(rt, "spw_wait_idle (spill)", st) : SPW_OK;
}

static int prefetch_range(spw_runtime_t *rt, const spw_buf_t *b, size_t from, size_t to,
                          spw_stream_t s) {
  int st = spw_prefetch_n(rt, b + from, to - from, s);
  if (st != SPW_OK) return bench_fail(rt, "spw_prefetch_n", st);
  st = spw_wait_idle(rt);
  if (st == SPW_OK) st = spw_stream_synchronize(rt, s);
  return st != SPW_OK ? bench_fail(rt, "spw_wait_idle (prefetch)", st) : SPW_OK;
}

/* `calls` (may be NULL): the time of the acquires alone, before the synchronize (what the
 * calling thread spends enqueueing the copies back). */
static int acquire_range_timed(spw_runtime_t *rt, const spw_buf_t *b, size_t from, size_t to,
                               spw_stream_t s, double *calls) {
  int st = SPW_OK;
  double t0 = bench_now();
  for (size_t i = from; i < to && st == SPW_OK; i++) {
    void *d;
    st = spw_acquire(rt, b[i], s, 0, &d);
    if (st != SPW_OK) bench_fail(rt, "spw_acquire", st);
  }
  if (calls) *calls = bench_now() - t0;
  int sst = spw_stream_synchronize(rt, s); /* also drops the locks taken before a failure */
  if (st == SPW_OK && sst != SPW_OK) st = bench_fail(rt, "spw_stream_synchronize", sst);
  return st;
}

static int acquire_range(spw_runtime_t *rt, const spw_buf_t *b, size_t from, size_t to,
                         spw_stream_t s) {
  return acquire_range_timed(rt, b, from, to, s, NULL);
}

/* One writable spw_acquire_n of the range, then a synchronize (which releases them). */
static int acquire_n_range(spw_runtime_t *rt, const spw_buf_t *b, size_t from, size_t to,
                           spw_stream_t s) {
  void **d = malloc((to - from) * sizeof *d);
  if (!d) return SPW_ERR_SYSTEM;
  int st = spw_acquire_n(rt, b + from, to - from, s, 0, d);
  if (st != SPW_OK) bench_fail(rt, "spw_acquire_n", st);
  free(d);
  int sst = spw_stream_synchronize(rt, s);
  if (st == SPW_OK && sst != SPW_OK) st = bench_fail(rt, "spw_stream_synchronize", sst);
  return st;
}

/* How many of b[from, to) are not in `want`. */
static size_t count_not_in(spw_runtime_t *rt, const spw_buf_t *b, size_t from, size_t to,
                           spw_state_t want) {
  return bench_count_not_in(rt, b + from, to - from, want);
}

static void anomaly(ctx_t *c, const char *what, size_t n) {
  char sz[32];
  bench_fmt_size(c->size, sz, sizeof sz);
  fprintf(stderr, "spill_bw: %s x %zu: %s (%zu)\n", sz, c->count, what, n);
  c->res->anomalies++;
}

/* ---- duplex: one thread spills the first half, another prefetches the second ---- */

typedef struct half_task {
  ctx_t *c;
  size_t from, to;
} half_task_t;

static int duplex_spill(void *p) {
  half_task_t *t = p;
  return spill_range(t->c->rt, t->c->bufs, t->from, t->to);
}

static int duplex_prefetch(void *p) {
  half_task_t *t = p;
  return prefetch_range(t->c->rt, t->c->bufs, t->from, t->to, t->c->s2);
}

/* ---- one size ---- */

static int measure_raw(ctx_t *c, void *dev, void *pinned) {
  const bench_env_t *env = c->env;
  result_t *r = c->res;
  bench_rstream_t rs;
  int st = bench_rstream_create(env, &rs);
  if (st != SPW_OK) return st;
  st = bench_raw_copy_gbs(env, &rs, pinned, dev, c->size, c->count, c->reps, &r->raw_d2h);
  if (st == SPW_OK)
    st = bench_raw_copy_gbs(env, &rs, dev, pinned, c->size, c->count, c->reps, &r->raw_h2d);
  if (st == SPW_OK && c->size < 4 * BENCH_MIB) {
    size_t all = c->size * c->count;
    st = bench_raw_copy_gbs(env, &rs, pinned, dev, all, 1, c->reps, &r->big_d2h);
    if (st == SPW_OK) st = bench_raw_copy_gbs(env, &rs, dev, pinned, all, 1, c->reps, &r->big_h2d);
  }
  bench_rstream_destroy(env, &rs);
  if (st == SPW_OK)
    st = bench_raw_duplex_gbs(env, dev, pinned, c->size, c->count / 2, c->reps, &r->raw_duplex);
  return st;
}

#ifdef SPW_BENCH_HAVE_CUDA
/* ---- small-buffer variants (raw, cuda only) ---- */

/* Buffer i is dev + i*size on the device and pinned + i*size on the host, as in the raw
 * columns; the staging buffer has the same layout, so one copy of it lands every buffer at
 * its place in the pinned region. */
typedef struct small_ctx {
  cudaStream_t s;
  cudaEvent_t e0, e1;
  cudaEvent_t ring[SMALL_EVENTS]; /* SMALL_MEMCPY_EVENT's */
  char *dev, *pinned, *staging;
  size_t size, count;
  void **dptr, **hptr; /* per-buffer addresses, for cudaMemcpyBatchAsync */
  size_t *sizes;
  bench_copy_desc_t *gather, *scatter; /* device memory */
  uint32_t *check;                     /* host scratch holding one buffer read back */
} small_ctx_t;

static int cuda_err(const char *what, cudaError_t e) {
  if (e == cudaSuccess) return SPW_OK;
  fprintf(stderr, "spill_bw: %s: %s: %s\n", what, cudaGetErrorName(e), cudaGetErrorString(e));
  return SPW_ERR_CUDA;
}

static int small_setup(const bench_env_t *env, small_ctx_t *x, void *dev, void *pinned,
                       uint64_t size, size_t count) {
  memset(x, 0, sizeof *x);
  x->dev = dev;
  x->pinned = pinned;
  x->size = (size_t)size;
  x->count = count;
  const size_t ws = x->size * count, dn = count * sizeof(bench_copy_desc_t);
  int st = cuda_err("cudaSetDevice", cudaSetDevice(env->device));
  if (st == SPW_OK)
    st = cuda_err("cudaStreamCreateWithFlags",
                  cudaStreamCreateWithFlags(&x->s, cudaStreamNonBlocking));
  if (st == SPW_OK) st = cuda_err("cudaEventCreate", cudaEventCreate(&x->e0));
  if (st == SPW_OK) st = cuda_err("cudaEventCreate", cudaEventCreate(&x->e1));
  for (int i = 0; i < SMALL_EVENTS && st == SPW_OK; i++)
    st = cuda_err("cudaEventCreateWithFlags",
                  cudaEventCreateWithFlags(&x->ring[i], cudaEventDisableTiming));
  if (st == SPW_OK) st = cuda_err("cudaMalloc (staging)", cudaMalloc((void **)&x->staging, ws));
  if (st == SPW_OK) st = cuda_err("cudaMalloc (gather)", cudaMalloc((void **)&x->gather, dn));
  if (st == SPW_OK) st = cuda_err("cudaMalloc (scatter)", cudaMalloc((void **)&x->scatter, dn));
  if (st != SPW_OK) return st;
  x->dptr = malloc(count * sizeof *x->dptr);
  x->hptr = malloc(count * sizeof *x->hptr);
  x->sizes = malloc(count * sizeof *x->sizes);
  x->check = malloc(x->size);
  bench_copy_desc_t *g = malloc(dn), *sc = malloc(dn);
  if (!x->dptr || !x->hptr || !x->sizes || !x->check || !g || !sc) {
    free(g);
    free(sc);
    fprintf(stderr, "spill_bw: out of host memory for the small-buffer variants\n");
    return SPW_ERR_SYSTEM;
  }
  for (size_t i = 0; i < count; i++) {
    x->dptr[i] = x->dev + i * x->size;
    x->hptr[i] = x->pinned + i * x->size;
    x->sizes[i] = x->size;
    g[i] = (bench_copy_desc_t){x->staging + i * x->size, x->dptr[i], x->size};
    sc[i] = (bench_copy_desc_t){x->dptr[i], x->staging + i * x->size, x->size};
  }
  /* Uploaded once, outside every timing: a real gather would keep its list on the device. */
  st = cuda_err("cudaMemcpy (gather list)", cudaMemcpy(x->gather, g, dn, cudaMemcpyHostToDevice));
  if (st == SPW_OK)
    st = cuda_err("cudaMemcpy (scatter list)",
                  cudaMemcpy(x->scatter, sc, dn, cudaMemcpyHostToDevice));
  free(g);
  free(sc);
  return st;
}

/* Waits for what is queued (a failed pass may leave copies in flight), then frees. */
static int small_teardown(small_ctx_t *x) {
  int st = SPW_OK, k;
  if (x->s) st = cuda_err("cudaStreamSynchronize", cudaStreamSynchronize(x->s));
  if (x->staging && (k = cuda_err("cudaFree (staging)", cudaFree(x->staging))) && !st) st = k;
  if (x->gather && (k = cuda_err("cudaFree (gather)", cudaFree(x->gather))) && !st) st = k;
  if (x->scatter && (k = cuda_err("cudaFree (scatter)", cudaFree(x->scatter))) && !st) st = k;
  if (x->e0 && (k = cuda_err("cudaEventDestroy", cudaEventDestroy(x->e0))) && !st) st = k;
  if (x->e1 && (k = cuda_err("cudaEventDestroy", cudaEventDestroy(x->e1))) && !st) st = k;
  for (int i = 0; i < SMALL_EVENTS; i++)
    if (x->ring[i] && (k = cuda_err("cudaEventDestroy", cudaEventDestroy(x->ring[i]))) && !st)
      st = k;
  if (x->s && (k = cuda_err("cudaStreamDestroy", cudaStreamDestroy(x->s))) && !st) st = k;
  free(x->dptr);
  free(x->hptr);
  free(x->sizes);
  free(x->check);
  memset(x, 0, sizeof *x);
  return st;
}

/* Enqueues one pass of variant `v` over all buffers, device to host when `down`. */
static int small_enqueue(small_ctx_t *x, int v, int down) {
  const size_t ws = x->size * x->count;
  if (v == SMALL_MEMCPY || v == SMALL_MEMCPY_EVENT || v == SMALL_MEMCPY_KIND) {
    /* cudaMemcpyDefault makes the driver find where each pointer lives; a caller that knows
     * the direction can say it. */
    enum cudaMemcpyKind down_kind = v == SMALL_MEMCPY_KIND ? cudaMemcpyDeviceToHost : cudaMemcpyDefault;
    enum cudaMemcpyKind up_kind = v == SMALL_MEMCPY_KIND ? cudaMemcpyHostToDevice : cudaMemcpyDefault;
    for (size_t i = 0; i < x->count; i++) {
      cudaError_t e = down ? cudaMemcpyAsync(x->hptr[i], x->dptr[i], x->size, down_kind, x->s)
                           : cudaMemcpyAsync(x->dptr[i], x->hptr[i], x->size, up_kind, x->s);
      if (e != cudaSuccess) return cuda_err("cudaMemcpyAsync", e);
      /* What a single unspill adds to its copy: an event others wait on (unspill_move.c). */
      if (v == SMALL_MEMCPY_EVENT &&
          (e = cudaEventRecord(x->ring[i % SMALL_EVENTS], x->s)) != cudaSuccess)
        return cuda_err("cudaEventRecord", e);
    }
    return SPW_OK;
  }
  if (v == SMALL_BATCH) {
    int devid = 0;
    int st = cuda_err("cudaGetDevice", cudaGetDevice(&devid));
    if (st != SPW_OK) return st;
    /* The location hints only matter for managed or pageable memory; they are stated so
     * the attribute describes these copies exactly. */
    struct cudaMemLocation on_dev = {cudaMemLocationTypeDevice, devid};
    struct cudaMemLocation on_host = {cudaMemLocationTypeHost, 0};
    struct cudaMemcpyAttributes attr;
    memset(&attr, 0, sizeof attr);
    attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    attr.srcLocHint = down ? on_dev : on_host;
    attr.dstLocHint = down ? on_host : on_dev;
    attr.flags = cudaMemcpyFlagDefault;
    size_t first = 0;
    void **dst = down ? x->hptr : x->dptr, **src = down ? x->dptr : x->hptr;
    return cuda_err("cudaMemcpyBatchAsync",
                    cudaMemcpyBatchAsync(dst, (const void *const *)src, x->sizes, x->count,
                                         &attr, &first, 1, x->s));
  }
  if (down) {
    int e = bench_cuda_copy_desc(x->gather, x->count, x->s);
    if (e != 0) return cuda_err("gather kernel", (cudaError_t)e);
    return cuda_err("cudaMemcpyAsync (staging to pinned)",
                    cudaMemcpyAsync(x->pinned, x->staging, ws, cudaMemcpyDefault, x->s));
  }
  int st = cuda_err("cudaMemcpyAsync (pinned to staging)",
                    cudaMemcpyAsync(x->staging, x->pinned, ws, cudaMemcpyDefault, x->s));
  if (st != SPW_OK) return st;
  int e = bench_cuda_copy_desc(x->scatter, x->count, x->s);
  return e == 0 ? SPW_OK : cuda_err("scatter kernel", (cudaError_t)e);
}

/* Pass 0 warms up untimed; each later one is bracketed by events on the stream. `enq`: the
 * calling thread's time to enqueue a pass (the GPU may still run it), median. */
static int small_time(small_ctx_t *x, int v, int down, unsigned reps, double *gbs,
                      double *enq) {
  double t[16], te[16];
  for (unsigned r = 0; r <= reps; r++) {
    int st = cuda_err("cudaEventRecord", cudaEventRecord(x->e0, x->s));
    double t0 = bench_now();
    if (st == SPW_OK) st = small_enqueue(x, v, down);
    if (r > 0) te[r - 1] = bench_now() - t0;
    if (st == SPW_OK) st = cuda_err("cudaEventRecord", cudaEventRecord(x->e1, x->s));
    if (st == SPW_OK) st = cuda_err("cudaEventSynchronize", cudaEventSynchronize(x->e1));
    float ms = 0;
    if (st == SPW_OK)
      st = cuda_err("cudaEventElapsedTime", cudaEventElapsedTime(&ms, x->e0, x->e1));
    if (st != SPW_OK) return st;
    if (r > 0) t[r - 1] = ms * 1e-3;
  }
  *gbs = bench_gbs((uint64_t)x->size * x->count, bench_median(t, reps));
  *enq = bench_median(te, reps);
  return SPW_OK;
}

/* Buffer k of the checked sample: 9 spread over the set, first and last included. */
static size_t small_pick(size_t count, size_t k) {
  return count <= 9 ? k : (count - 1) * k / 8;
}

/* Poisons the sampled destination buffers, so a variant that skips one is caught. */
static int small_poison(small_ctx_t *x, int down) {
  size_t n = x->count < 9 ? x->count : 9;
  for (size_t k = 0; k < n; k++) {
    size_t i = small_pick(x->count, k);
    if (down) {
      memset(x->hptr[i], 0xA5, x->size); /* the stream is idle: the last pass synchronized */
    } else {
      int st = cuda_err("cudaMemsetAsync", cudaMemsetAsync(x->dptr[i], 0xA5, x->size, x->s));
      if (st != SPW_OK) return st;
    }
  }
  return SPW_OK;
}

/* Word w of buffer i must be bench_pattern(seed, i*words + w): a buffer landing at another
 * buffer's place, or shifted within it, does not match. */
static int small_check(small_ctx_t *x, int v, int down, uint32_t seed, uint64_t *bad) {
  const size_t words = x->size / sizeof(uint32_t);
  size_t n = x->count < 9 ? x->count : 9;
  for (size_t k = 0; k < n; k++) {
    size_t i = small_pick(x->count, k);
    const uint32_t *got = x->hptr[i];
    if (!down) {
      int st = cuda_err("cudaMemcpyAsync (check)", cudaMemcpyAsync(x->check, x->dptr[i], x->size,
                                                                  cudaMemcpyDefault, x->s));
      if (st == SPW_OK) st = cuda_err("cudaStreamSynchronize", cudaStreamSynchronize(x->s));
      if (st != SPW_OK) return st;
      got = x->check;
    }
    for (size_t w = 0; w < words; w++) {
      uint32_t want = bench_pattern(seed, (uint64_t)i * words + w);
      if (got[w] != want && (*bad)++ == 0)
        fprintf(stderr, "spill_bw: %s %s: buffer %zu word %zu: got %#x, expected %#x\n",
                small_name[v], down ? "D2H" : "H2D", i, w, got[w], want);
    }
  }
  return SPW_OK;
}

/* The calling thread's time per H2D copy (with an event after each when `event`) of the
 * first HELD_CALLS buffers, enqueued behind bench_cuda_spin: the enqueue alone, nothing
 * throttled by the GPU's pace. Median of `reps`. The copies are those of the memcpy
 * variants, whose checks they follow. */
static int small_held(small_ctx_t *x, int event, unsigned reps, double *per_call) {
  const size_t n = x->count < HELD_CALLS ? x->count : HELD_CALLS;
  double t[16];
  for (unsigned r = 0; r < reps; r++) {
    int e = bench_cuda_spin(HELD_NS, x->s);
    if (e != 0) return cuda_err("spin kernel", (cudaError_t)e);
    double t0 = bench_now();
    for (size_t i = 0; i < n; i++) {
      cudaError_t ce = cudaMemcpyAsync(x->dptr[i], x->hptr[i], x->size, cudaMemcpyDefault, x->s);
      if (ce == cudaSuccess && event) ce = cudaEventRecord(x->ring[i % SMALL_EVENTS], x->s);
      if (ce != cudaSuccess) return cuda_err("cudaMemcpyAsync (held stream)", ce);
    }
    t[r] = (bench_now() - t0) / (double)n;
    int st = cuda_err("cudaStreamSynchronize", cudaStreamSynchronize(x->s));
    if (st != SPW_OK) return st;
  }
  *per_call = bench_median(t, reps);
  return SPW_OK;
}

/* All variants down, then all up. The device region holds `seed` before the first and the
 * pinned region `seed + 1` before the second (written through the staging buffer, which
 * is free then). */
static int small_run(ctx_t *c, small_ctx_t *x, uint32_t seed) {
  result_t *r = c->res;
  const size_t ws = x->size * x->count;
  int st = SPW_OK;
  for (int down = 1; down >= 0 && st == SPW_OK; down--) {
    uint32_t sd = down ? seed : seed + 1;
    int e = bench_cuda_fill_u32(down ? x->dev : x->staging, ws / sizeof(uint32_t), sd, x->s);
    st = e == 0 ? SPW_OK : cuda_err("fill kernel", (cudaError_t)e);
    if (st == SPW_OK && !down)
      st = cuda_err("cudaMemcpyAsync (fill pinned)",
                    cudaMemcpyAsync(x->pinned, x->staging, ws, cudaMemcpyDefault, x->s));
    if (st == SPW_OK) st = cuda_err("cudaStreamSynchronize", cudaStreamSynchronize(x->s));
    for (int v = 0; v < SMALL_NVAR && st == SPW_OK; v++) {
      uint64_t bad = 0;
      double enq;
      st = small_poison(x, down);
      if (st == SPW_OK)
        st = small_time(x, v, down, c->reps, down ? &r->small_d2h[v] : &r->small_h2d[v],
                        down ? &enq : &r->small_enq_h2d[v]);
      if (st == SPW_OK) st = small_check(x, v, down, sd, &bad);
      r->bad += bad;
    }
  }
  if (st == SPW_OK) st = small_held(x, 0, c->reps, &r->held_memcpy);
  if (st == SPW_OK) st = small_held(x, 1, c->reps, &r->held_memcpy_event);
  return st;
}

static int measure_small(ctx_t *c, void *dev, void *pinned) {
  if (c->env->kind != SPW_BACKEND_CUDA || c->size >= SMALL_MAX_SIZE) return SPW_OK;
  small_ctx_t x;
  int st = small_setup(c->env, &x, dev, pinned, c->size, c->count);
  if (st == SPW_OK) st = small_run(c, &x, (uint32_t)c->size * 0x9E37u + (uint32_t)c->count);
  int tst = small_teardown(&x);
  return st != SPW_OK ? st : tst;
}
#endif /* SPW_BENCH_HAVE_CUDA */

#ifdef SPW_BENCH_HAVE_CUDA
/* Single writable acquires of spilled buffers, HELD_CALLS a round (fewer when the set is
 * small), enqueued behind bench_cuda_spin on the acquiring stream: the calling thread's own
 * cost per acquire with no copy engine setting the pace, next to small_held's raw copies.
 * Every buffer is resident (and dirty) at the end, as the duplex that follows expects. */
static int measure_held_acquire(ctx_t *c) {
  const size_t n = c->count, per = n / c->reps < HELD_CALLS ? n / c->reps : HELD_CALLS;
  if (per == 0) return SPW_OK;
  double t[16];
  int st = spill_range(c->rt, c->bufs, 0, n);
  for (unsigned k = 0; k < c->reps && st == SPW_OK; k++) {
    int e = bench_cuda_spin(HELD_NS, c->s);
    if (e != 0) return cuda_err("spin kernel", (cudaError_t)e);
    double calls = 0;
    st = acquire_range_timed(c->rt, c->bufs, k * per, (k + 1) * per, c->s, &calls);
    t[k] = calls / (double)per;
    if (calls * 1e9 > HELD_NS / 2) anomaly(c, "the held stream ran on before the acquires "
                                              "were enqueued", 1);
  }
  if (st == SPW_OK) st = acquire_range(c->rt, c->bufs, 0, n, c->s);
  if (st != SPW_OK) return st;
  size_t off = count_not_in(c->rt, c->bufs, 0, n, SPW_STATE_RESIDENT);
  if (off) anomaly(c, "buffers not resident after the held-stream acquires", off);
  c->res->held_acquire = bench_median(t, c->reps);
  return SPW_OK;
}
#endif

/* A pass timed as a stage variant: the same call as a full pass, on buffers where one or
 * more stages have nothing to do. Afterwards every buffer must still be in `want` and the
 * spill byte counter must not have grown (no bytes moved). */
static int stage_pass(ctx_t *c, int spill, spw_state_t want, const char *what, double *t) {
  spw_stats_t s0, s1;
  int st = bench_get_stats(c->rt, &s0);
  if (st != SPW_OK) return st;
  double t0 = bench_now();
  st = spill ? spill_range(c->rt, c->bufs, 0, c->count)
             : prefetch_range(c->rt, c->bufs, 0, c->count, c->s);
  *t = bench_now() - t0;
  if (st == SPW_OK) st = bench_get_stats(c->rt, &s1);
  if (st != SPW_OK) return st;
  size_t off = count_not_in(c->rt, c->bufs, 0, c->count, want);
  if (off) anomaly(c, what, off);
  if (s1.spill_bytes != s0.spill_bytes || s1.unspill_bytes != s0.unspill_bytes)
    anomaly(c, "a stage variant that moves no bytes moved some", 1);
  return SPW_OK;
}

/* Each round times, in order: spill (full), then the stage variants where enabled:
 *  - spill, bookkeeping only: spw_spill_n of buffers already on host (argument checks, the
 *    pending hints, the down lane's take and its look at each buffer; no claim, no move);
 *  - prefetch (full), then prefetch, bookkeeping only: spw_prefetch_n of buffers already
 *    resident (the same, on the up lane);
 *  - spill without the copy: the buffers, resident with a clean host copy after the
 *    prefetch, spill again (claim, commit, device memory freed, no host memory taken and
 *    no byte copied); this pass runs in every round anyway, untimed without stages;
 *  - acquire (full), and its calls alone: the time of the spw_acquire loop before the
 *    synchronize, the calling thread's own cost per spilled buffer it brings back.
 * So copy = full - without copy, and claim + host extent + commit + free = without copy -
 * bookkeeping only, each measured side by side in the same rounds. */
static int measure_spillway(ctx_t *c) {
  spw_runtime_t *rt = c->rt;
  result_t *r = c->res;
  const size_t n = c->count;
  const uint64_t ws = c->size * n;
  const int stages = c->size < c->stages_below;
  double t_spill[16], t_pre[16], t_acq[16], t_acqn[16], t_dup[16], t_st[STAGE_N][16];

  /* Warm-up: the engine, the copy paths and the host arena see one full cycle. */
  int st = spill_range(rt, c->bufs, 0, n);
  if (st == SPW_OK) st = acquire_range(rt, c->bufs, 0, n, c->s);

  for (unsigned k = 0; k < c->reps && st == SPW_OK; k++) {
    spw_stats_t s0, s1;
    st = bench_get_stats(rt, &s0);
    if (st != SPW_OK) break;
    if (k == 0) r->arena_before = s0.host_pinned_bytes;

    double t0 = bench_now();
    st = spill_range(rt, c->bufs, 0, n);
    t_spill[k] = bench_now() - t0;
    if (st == SPW_OK) st = bench_get_stats(rt, &s1);
    if (st != SPW_OK) break;
    size_t off = count_not_in(rt, c->bufs, 0, n, SPW_STATE_HOST);
    if (off) anomaly(c, "buffers not on host after the timed spill", off);
    if (s1.spill_bytes - s0.spill_bytes != ws)
      anomaly(c, "spill byte counter did not grow by the working set",
              (size_t)(s1.spill_bytes - s0.spill_bytes));
    t_st[STAGE_SPILL][k] = t_spill[k];
    if (stages && (st = stage_pass(c, 1, SPW_STATE_HOST, "buffers not on host after the "
                                   "bookkeeping-only spill", &t_st[STAGE_SPILL_HINTS][k])) != SPW_OK)
      break;

    t0 = bench_now();
    st = prefetch_range(rt, c->bufs, 0, n, c->s);
    t_pre[k] = bench_now() - t0;
    if (st != SPW_OK) break;
    off = count_not_in(rt, c->bufs, 0, n, SPW_STATE_RESIDENT);
    if (off) anomaly(c, "buffers not resident after the timed prefetch", off);
    t_st[STAGE_PREFETCH][k] = t_pre[k];
    if (stages && (st = stage_pass(c, 0, SPW_STATE_RESIDENT, "buffers not resident after the "
                                   "bookkeeping-only prefetch",
                                   &t_st[STAGE_PREFETCH_HINTS][k])) != SPW_OK)
      break;

    /* Clean copies: no bytes move. */
    st = stage_pass(c, 1, SPW_STATE_HOST, "buffers not on host after the clean respill",
                    &t_st[STAGE_SPILL_NO_COPY][k]);
    if (st != SPW_OK) break;

    t0 = bench_now();
    st = acquire_range_timed(rt, c->bufs, 0, n, c->s, &t_st[STAGE_ACQUIRE_CALLS][k]);
    t_acq[k] = bench_now() - t0;
    t_st[STAGE_ACQUIRE][k] = t_acq[k];
    if (st != SPW_OK) break;
    off = count_not_in(rt, c->bufs, 0, n, SPW_STATE_RESIDENT);
    if (off) anomaly(c, "buffers not resident after the timed acquire", off);

    if ((st = spill_range(rt, c->bufs, 0, n)) != SPW_OK) break;
    t0 = bench_now();
    st = acquire_n_range(rt, c->bufs, 0, n, c->s);
    t_acqn[k] = bench_now() - t0;
    if (st != SPW_OK) break;
    off = count_not_in(rt, c->bufs, 0, n, SPW_STATE_RESIDENT);
    if (off) anomaly(c, "buffers not resident after the timed acquire_n", off);
  }
  if (st != SPW_OK) return st;
  r->spill = bench_gbs(ws, bench_median(t_spill, c->reps));
  r->prefetch = bench_gbs(ws, bench_median(t_pre, c->reps));
  r->acquire = bench_gbs(ws, bench_median(t_acq, c->reps));
  r->acquire_n = bench_gbs(ws, bench_median(t_acqn, c->reps));
  if (stages)
    for (int v = 0; v < STAGE_N; v++) r->stage_s[v] = bench_median(t_st[v], c->reps);

#ifdef SPW_BENCH_HAVE_CUDA
  if (stages && c->env->kind == SPW_BACKEND_CUDA && c->size < SMALL_MAX_SIZE &&
      (st = measure_held_acquire(c)) != SPW_OK)
    return st;
#endif

  /* Duplex. Every buffer is resident and dirty now; the second half goes to host first. */
  const size_t half = n / 2;
  half_task_t down = {c, 0, half}, up = {c, half, n};
  st = spill_range(rt, c->bufs, half, n);
  for (unsigned k = 0; k < c->reps && st == SPW_OK; k++) {
    st = bench_run_pair(duplex_spill, &down, duplex_prefetch, &up, &t_dup[k]);
    if (st != SPW_OK) break;
    size_t off = count_not_in(rt, c->bufs, 0, half, SPW_STATE_HOST) +
                 count_not_in(rt, c->bufs, half, n, SPW_STATE_RESIDENT);
    if (off) anomaly(c, "buffers not where the duplex pass should have put them", off);
    /* Back to the start state with dirty data on both sides: no clean copies anywhere. */
    st = acquire_range(rt, c->bufs, 0, n, c->s);
    if (st == SPW_OK) st = spill_range(rt, c->bufs, half, n);
  }
  if (st != SPW_OK) return st;
  r->duplex = bench_gbs(ws, bench_median(t_dup, c->reps));
  return SPW_OK;
}

/* Reads back up to 9 buffers spread over the set (both halves: some on host, some not). */
static int verify_sample(ctx_t *c, uint32_t seed0) {
  size_t picks[9];
  size_t np = 0;
  for (size_t k = 0; k < 9 && k < c->count; k++) {
    size_t i = c->count <= 9 ? k : (c->count - 1) * k / 8;
    picks[np++] = i;
  }
  for (size_t k = 0; k < np; k++) {
    uint64_t bad = 0;
    size_t i = picks[k];
    int st = bench_verify(c->rt, c->bufs[i], c->size, seed0 + (uint32_t)i, 0, c->s, &bad);
    if (st != SPW_OK) return st;
    c->res->bad += bad;
  }
  return SPW_OK;
}

static int run_size(ctx_t *c, void *dev, void *pinned, uint32_t seed0) {
  int st = SPW_OK;
  size_t made = 0;
  c->bufs = calloc(c->count, sizeof *c->bufs);
  if (!c->bufs) return SPW_ERR_SYSTEM;
  for (; made < c->count && st == SPW_OK; made++)
    st = bench_alloc_filled(c->env, c->rt, c->size, seed0 + (uint32_t)made, c->s,
                            &c->bufs[made]);
  if (st != SPW_OK) made--; /* the failed one was not allocated */
  int sst = spw_stream_synchronize(c->rt, c->s);
  if (st == SPW_OK && sst != SPW_OK) st = bench_fail(c->rt, "spw_stream_synchronize (fill)", sst);

  if (st == SPW_OK) st = measure_raw(c, dev, pinned);
#ifdef SPW_BENCH_HAVE_CUDA
  if (st == SPW_OK) st = measure_small(c, dev, pinned);
#endif
  if (st == SPW_OK) st = measure_spillway(c);
  if (st == SPW_OK) st = verify_sample(c, seed0);

  for (size_t i = 0; i < made; i++) spw_free(c->rt, c->bufs[i]);
  int wst = spw_wait_idle(c->rt);
  if (st == SPW_OK && wst != SPW_OK) st = bench_fail(c->rt, "spw_wait_idle (free)", wst);
  free(c->bufs);
  c->bufs = NULL;
  return st;
}

/* ---- report ---- */

static double ratio(double a, double b) { return b > 0 ? a / b : 0; }

static const result_t *find_row(const result_t *r, size_t n, uint64_t size) {
  for (size_t i = 0; i < n; i++)
    if (r[i].size == size) return &r[i];
  return NULL;
}

#ifdef SPW_BENCH_HAVE_CUDA
/* A second table, so the main one keeps its width: only rows where the variants ran. */
static void print_small_table(const result_t *r, size_t n) {
  int any = 0;
  for (size_t i = 0; i < n; i++) any |= r[i].small_d2h[SMALL_MEMCPY] > 0;
  if (!any) return;
  printf("\nsmall-buffer variants: GB/s D2H / H2D\n\n| size | count |");
  for (int v = 0; v < SMALL_NVAR; v++) printf(" %s |", small_name[v]);
  printf(" Spillway (spill / prefetch) |\n| ---: | ---: |");
  for (int v = 0; v <= SMALL_NVAR; v++) printf(" ---: |");
  printf("\n");
  for (size_t i = 0; i < n; i++) {
    if (!(r[i].small_d2h[SMALL_MEMCPY] > 0)) continue;
    char sz[32];
    bench_fmt_size(r[i].size, sz, sizeof sz);
    printf("| %s | %zu |", sz, r[i].count);
    for (int v = 0; v < SMALL_NVAR; v++)
      printf(" %.1f / %.1f |", r[i].small_d2h[v], r[i].small_h2d[v]);
    printf(" %.1f / %.1f |\n", r[i].spill, r[i].prefetch);
  }
  printf("\nvariants over the raw buffers, timed with CUDA events on one stream: one "
         "cudaMemcpyAsync per buffer; the same with a cudaEventRecord after each copy (what a "
         "single acquire of a spilled buffer enqueues); the first with the direction given "
         "(cudaMemcpyHostToDevice / DeviceToHost) instead of cudaMemcpyDefault; one "
         "cudaMemcpyBatchAsync for all; a gather kernel into a "
         "device staging buffer + one copy to pinned memory (H2D: one copy + a scatter "
         "kernel). Spillway: the spill and prefetch columns above (wall clock, request to "
         "idle).\n");
  printf("\nthe calling thread's time to enqueue, µs per buffer (H2D): what a single acquire "
         "of a spilled buffer costs its caller (stage table: acquire: calls) next to the raw "
         "copies it stands for\n\n| size | per-buffer memcpy | per-buffer memcpy + event | "
         "per-buffer memcpy, kind given | Spillway acquire: calls |\n| ---: | ---: | ---: | "
         "---: | ---: |\n");
  for (size_t i = 0; i < n; i++) {
    if (!(r[i].small_d2h[SMALL_MEMCPY] > 0)) continue;
    char sz[32];
    bench_fmt_size(r[i].size, sz, sizeof sz);
    double per = 1e6 / (double)r[i].count;
    printf("| %s | %.3f | %.3f | %.3f | %.3f |\n", sz, r[i].small_enq_h2d[SMALL_MEMCPY] * per,
           r[i].small_enq_h2d[SMALL_MEMCPY_EVENT] * per, r[i].small_enq_h2d[SMALL_MEMCPY_KIND] * per,
           r[i].stage_s[STAGE_ACQUIRE_CALLS] * per);
  }
  printf("\nthe same with the stream held (a kernel holds it %.0f ms while at most %d calls are "
         "enqueued behind it): the calling thread's own cost, µs per call, that the GPU's pace "
         "does not set; an acquire keeps up with the raw copy where its cost stays below the "
         "GPU's time per copy\n\n| size | per-buffer memcpy | per-buffer memcpy + event | "
         "Spillway acquire | acquire - (memcpy + event) |\n| ---: | ---: | ---: | ---: | ---: "
         "|\n", HELD_NS / 1e6, HELD_CALLS);
  for (size_t i = 0; i < n; i++) {
    if (!(r[i].held_memcpy > 0) || !(r[i].held_acquire > 0)) continue;
    char sz[32];
    bench_fmt_size(r[i].size, sz, sizeof sz);
    printf("| %s | %.3f | %.3f | %.3f | %.3f |\n", sz, r[i].held_memcpy * 1e6,
           r[i].held_memcpy_event * 1e6, r[i].held_acquire * 1e6,
           (r[i].held_acquire - r[i].held_memcpy_event) * 1e6);
  }
}
#endif

/* The stage table: each variant's time per buffer, and the stages it isolates. */
static void print_stage_table(const result_t *r, size_t n) {
  int any = 0;
  for (size_t i = 0; i < n; i++) any |= r[i].stage_s[STAGE_SPILL_HINTS] > 0;
  if (!any) return;
  printf("\nstage variants: µs per buffer (wall clock, request to idle, median)\n\n"
         "| size | count | spill | spill without copy | spill bookkeeping only | "
         "prefetch | prefetch bookkeeping only | spill: copy | spill: claim + commit | "
         "prefetch: move | acquire | acquire: calls |\n| ---: | ---: | ---: | ---: | ---: | "
         "---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  for (size_t i = 0; i < n; i++) {
    if (!(r[i].stage_s[STAGE_SPILL_HINTS] > 0)) continue;
    char sz[32];
    bench_fmt_size(r[i].size, sz, sizeof sz);
    double us[STAGE_N];
    for (int v = 0; v < STAGE_N; v++) us[v] = r[i].stage_s[v] * 1e6 / (double)r[i].count;
    printf("| %s | %zu | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f "
           "|\n", sz, r[i].count, us[STAGE_SPILL], us[STAGE_SPILL_NO_COPY], us[STAGE_SPILL_HINTS],
           us[STAGE_PREFETCH], us[STAGE_PREFETCH_HINTS], us[STAGE_SPILL] - us[STAGE_SPILL_NO_COPY],
           us[STAGE_SPILL_NO_COPY] - us[STAGE_SPILL_HINTS],
           us[STAGE_PREFETCH] - us[STAGE_PREFETCH_HINTS], us[STAGE_ACQUIRE],
           us[STAGE_ACQUIRE_CALLS]);
  }
  printf("\nbookkeeping only: spw_spill_n of buffers already on host, spw_prefetch_n of "
         "buffers already resident (argument checks, pending hints, the lane's take and look); "
         "without copy: a spill of buffers with a clean host copy (claim, commit, device "
         "memory freed; no host memory, no byte copied). spill: copy, claim + commit and "
         "prefetch: move are differences of the variants, timed side by side in the same "
         "rounds. acquire: one writable spw_acquire per spilled buffer, then a synchronize; "
         "calls: the acquires alone, the calling thread's cost per buffer.\n");
}

static void print_tables(const bench_env_t *env, const result_t *r, size_t n) {
  char sz[32], ar[32];
  printf("| size | count | spill GB/s | raw D2H GB/s | ratio | unspill (prefetch) GB/s | "
         "raw H2D GB/s | ratio | unspill (acquire) GB/s | ratio | unspill (acquire_n) GB/s | "
         "ratio | one copy D2H / H2D GB/s | "
         "duplex GB/s | raw duplex GB/s | ratio | arena before spill |\n");
  printf("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | "
         "---: | ---: | ---: | ---: | ---: |\n");
  for (size_t i = 0; i < n; i++) {
    bench_fmt_size(r[i].size, sz, sizeof sz);
    bench_fmt_size(r[i].arena_before, ar, sizeof ar);
    char big[64] = "-";
    if (r[i].big_d2h > 0) snprintf(big, sizeof big, "%.1f / %.1f", r[i].big_d2h, r[i].big_h2d);
    printf("| %s | %zu | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | "
           "%s | %.2f | %.2f | %.2f | %s |\n",
           sz, r[i].count, r[i].spill, r[i].raw_d2h, ratio(r[i].spill, r[i].raw_d2h),
           r[i].prefetch, r[i].raw_h2d, ratio(r[i].prefetch, r[i].raw_h2d), r[i].acquire,
           ratio(r[i].acquire, r[i].raw_h2d), r[i].acquire_n, ratio(r[i].acquire_n, r[i].raw_h2d),
           big, r[i].duplex, r[i].raw_duplex,
           ratio(r[i].duplex, r[i].raw_duplex), ar);
  }
  printf("\nduplex: half the buffers spill while the other half are prefetched (2 threads), "
         "against raw D2H + H2D at once (2 streams, 2 threads); GB/s of both directions. "
         "arena: pinned host memory mapped when the first timed spill began.\n");
#ifdef SPW_BENCH_HAVE_CUDA
  print_small_table(r, n);
#endif
  print_stage_table(r, n);
  printf("\ngoals%s:\n", env->kind == SPW_BACKEND_HOST
                             ? " (set for an H100/H200 over PCIe; the host backend's numbers "
                               "only show relative costs)"
                             : "");
  double worst = 1e9;
  int any = 0;
  for (size_t i = 0; i < n; i++) {
    if (r[i].size < 4 * BENCH_MIB) continue;
    any = 1;
    double a = ratio(r[i].spill, r[i].raw_d2h), b = ratio(r[i].prefetch, r[i].raw_h2d);
    if (a < worst) worst = a;
    if (b < worst) worst = b;
  }
  if (any)
    printf("- spill and unspill >= 95%% of raw for sizes >= 4 MiB: worst %.0f%%: %s\n",
           worst * 100, worst >= 0.95 ? "met" : "NOT met");
  const struct {
    uint64_t size;
    size_t count;
    double goal;
  } abs_goals[] = {{64 * BENCH_KIB, 16384, 45.0}, {4 * BENCH_KIB, 65536, 40.0}};
  for (size_t g = 0; g < 2; g++) {
    const result_t *x = find_row(r, n, abs_goals[g].size);
    bench_fmt_size(abs_goals[g].size, sz, sizeof sz);
    if (!x) {
      printf("- %s x %zu >= %.0f GB/s both ways: not measured\n", sz, abs_goals[g].count,
             abs_goals[g].goal);
      continue;
    }
    double lo = x->spill < x->prefetch ? x->spill : x->prefetch;
    if (x->acquire_n < lo) lo = x->acquire_n;
    printf("- %s x %zu >= %.0f GB/s both ways: %s x %zu spill %.1f, unspill %.1f (prefetch) / "
           "%.1f (acquire_n) GB/s: %s\n", sz, abs_goals[g].count, abs_goals[g].goal, sz, x->count,
           x->spill, x->prefetch, x->acquire_n, lo >= abs_goals[g].goal ? "met" : "NOT met");
  }
  double dlo = 1e18, dhi = 0;
  for (size_t i = 0; i < n; i++) {
    if (r[i].duplex < dlo) dlo = r[i].duplex;
    if (r[i].duplex > dhi) dhi = r[i].duplex;
  }
  printf("- duplex >= 90 GB/s: %.1f to %.1f GB/s over the sizes: %s\n", dlo, dhi,
         dlo >= 90 ? "met at every size" : dhi >= 90 ? "met at some sizes" : "NOT met");
}

int main(int argc, char **argv) {
  static const char *const known[] = {"sizes", "total", "max-count", "reps", "stages-below",
                                      NULL};
  bench_env_t env;
  if (bench_opt_check(argc, argv, known) != SPW_OK || bench_env_init(&env) != SPW_OK) return 2;
  const int cuda = env.kind == SPW_BACKEND_CUDA;
  static const uint64_t cuda_sizes[] = {4 * BENCH_KIB,  64 * BENCH_KIB,  BENCH_MIB,
                                        4 * BENCH_MIB,  16 * BENCH_MIB,  64 * BENCH_MIB,
                                        256 * BENCH_MIB, BENCH_GIB};
  static const uint64_t host_sizes[] = {4 * BENCH_KIB,  64 * BENCH_KIB, BENCH_MIB,
                                        4 * BENCH_MIB, 16 * BENCH_MIB, 64 * BENCH_MIB};
  uint64_t sizes[BENCH_MAX_LIST], total, max_count, reps, stages_below;
  size_t nsizes = 0;
  if (bench_opt_size_list(argc, argv, "sizes", cuda ? cuda_sizes : host_sizes,
                          cuda ? 8 : 6, sizes, &nsizes) != SPW_OK ||
      bench_opt_size(argc, argv, "total", cuda ? BENCH_GIB : 64 * BENCH_MIB, &total) != SPW_OK ||
      bench_opt_uint(argc, argv, "max-count", cuda ? 65536 : 4096, &max_count) != SPW_OK ||
      bench_opt_uint(argc, argv, "reps", 3, &reps) != SPW_OK ||
      bench_opt_size_or_zero(argc, argv, "stages-below", BENCH_MIB, &stages_below) != SPW_OK)
    return 2;
  if (reps < 1 || reps > 16 || max_count < 2) {
    fprintf(stderr, "spill_bw: reps must be 1..16 and max-count >= 2\n");
    return 2;
  }

  size_t counts[BENCH_MAX_LIST];
  uint64_t max_ws = 0;
  for (size_t i = 0; i < nsizes; i++) {
    if (sizes[i] % 4 != 0) {
      fprintf(stderr, "spill_bw: sizes must be multiples of 4 bytes\n");
      return 2;
    }
    uint64_t c = total / sizes[i];
    if (c < 2) c = 2;
    if (c > max_count) c = max_count;
    counts[i] = (size_t)c;
    if (c * sizes[i] > max_ws) max_ws = c * sizes[i];
  }

  spw_runtime_t *rt = NULL;
  if (bench_runtime_create(&env, 2 * max_ws + 64 * BENCH_MIB, 2 * max_ws + 256 * BENCH_MIB, NULL,
                           &rt) != SPW_OK)
    return 1;
  ctx_t c = {.env = &env, .rt = rt, .reps = (unsigned)reps, .stages_below = stages_below};
  void *dev = NULL, *pinned = NULL;
  int st = spw_stream_create(rt, &c.s);
  if (st == SPW_OK) st = spw_stream_create(rt, &c.s2);
  if (st != SPW_OK) bench_fail(rt, "spw_stream_create", st);
  if (st == SPW_OK) st = bench_dev_alloc(&env, max_ws, &dev);
  if (st == SPW_OK) st = bench_pinned_alloc(&env, max_ws, &pinned);

  char tot[32];
  bench_fmt_size(total, tot, sizeof tot);
  printf("spill_bw: backend %s, device %s, %s per size (count %" PRIu64 " at most), median of "
         "%" PRIu64 "\n\n",
         cuda ? "cuda" : "host", env.device_name, tot, max_count, reps);
  fflush(stdout);

  result_t res[BENCH_MAX_LIST];
  memset(res, 0, sizeof res);
  size_t done = 0;
  uint64_t bad = 0;
  for (size_t i = 0; i < nsizes && st == SPW_OK; i++) {
    res[i].size = sizes[i];
    res[i].count = counts[i];
    c.size = sizes[i];
    c.count = counts[i];
    c.res = &res[i];
    char sz[32];
    bench_fmt_size(sizes[i], sz, sizeof sz);
    fprintf(stderr, "spill_bw: %s x %zu ...\n", sz, counts[i]);
    st = run_size(&c, dev, pinned, (uint32_t)(i + 1) << 24);
    if (st == SPW_OK) done++;
    bad += res[i].bad;
  }
  if (done > 0) print_tables(&env, res, done);
  unsigned anomalies = 0;
  for (size_t i = 0; i < done; i++) anomalies += res[i].anomalies;
  printf("\ndata check: %s (%" PRIu64 " wrong words in the sampled buffers)%s\n",
         bad == 0 ? "ok" : "FAILED", bad,
         anomalies ? "; unexpected buffer states or byte counts: see stderr" : "");

  bench_dev_free(&env, dev);
  bench_pinned_free(&env, pinned, max_ws);
  int dst = spw_runtime_destroy(rt);
  if (dst != SPW_OK) bench_fail(NULL, "spw_runtime_destroy", dst);
  if (st != SPW_OK) fprintf(stderr, "spill_bw: stopped early: %s\n", spw_err_name(st));
  return st != SPW_OK || dst != SPW_OK || bad != 0 || anomalies != 0 ? 1 : 0;
}
