/* SPDX-License-Identifier: Apache-2.0 */
/* peer_bw: raw copies between GPU 0 and GPU 1, the ceiling the peer tier (issue 23) is
 * measured against, and the numbers that decide how that tier copies: cudaMemcpyPeerAsync,
 * or a kernel across the peer mapping.
 *
 * Per buffer size (--sizes, default 64 KiB, 1 MiB, 16 MiB, 256 MiB) it moves --total bytes
 * (default 1 GiB, rounded up to whole buffers) from GPU 0 to GPU 1 in these ways:
 *   - "memcpy peer": one cudaMemcpyPeerAsync per buffer, on one stream of the source GPU;
 *   - "push": a copy kernel on the source GPU writes through the peer mapping, one launch
 *     per buffer; "push gather": one launch for the whole batch, one block per buffer, from
 *     a descriptor array in device memory (how Spillway batches small buffers), for sizes up
 *     to 1 MiB;
 *   - "pull", "pull gather": the same kernels on the destination GPU, reading through the
 *     peer mapping.
 * Then the fastest of them both ways at once (GPU 0 -> 1 on a stream of one GPU, 1 -> 0 on
 * a stream of the other, enqueued alternately), and, for the ratio, the host link:
 * cudaMemcpyAsync GPU 0 -> pinned host at the largest size.
 *
 * Times are CUDA events around the enqueued work, so the enqueue rate (one API call or
 * launch per buffer) counts, as it will for Spillway. Each figure is the median of --reps
 * runs (default 5) after one warm-up run; GB/s are 1e9 bytes per second, both directions
 * counted for the duplex figure. Before each measurement the destination is cleared; after
 * it a sample of buffers is checked against the pattern the source was filled with (the
 * word's index in the slab mixed in, so a buffer copied to the wrong place fails). Without
 * peer access only cudaMemcpyPeerAsync is measured (the driver stages it through the host).
 * With fewer than two GPUs it says so and exits 0. Not a test: nothing asserts on time; it
 * exits 1 if a CUDA call fails or a word is wrong, 2 on a bad option. */
#include <cuda_runtime.h>

#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "bench_common.h"
}
#include "bench_kernels.h"

#define CK(x)                                                                                  \
  do {                                                                                         \
    cudaError_t e_ = (x);                                                                      \
    if (e_ != cudaSuccess) {                                                                   \
      fprintf(stderr, "peer_bw: %s: %s (%s:%d)\n", #x, cudaGetErrorString(e_), __FILE__,      \
              __LINE__);                                                                       \
      exit(1);                                                                                 \
    }                                                                                          \
  } while (0)

namespace {

constexpr unsigned kThreads = 256;
constexpr unsigned kBlocksPerSm = 4;
constexpr size_t kGatherMax = 1u << 20; /* gather only where buffers are small enough to batch */
constexpr size_t kSample = 16;          /* buffers checked per measurement */
constexpr size_t kMaxSizes = BENCH_MAX_LIST;

enum variant { V_MEMCPY, V_PUSH, V_PUSH_GATHER, V_PULL, V_PULL_GATHER, V_COUNT };
const char *const kName[V_COUNT] = {"memcpy peer", "push", "push gather", "pull",
                                    "pull gather"};

/* One GPU's side. Its `src` slab holds the pattern seeded with its ordinal and is what it
 * sends; its `dst` slab receives what the other GPU sends. The descriptor arrays describe
 * the current size's batch: `push_descs` this->src to other->dst, read by a kernel on this
 * GPU; `pull_descs` other->src to this->dst, also read here. */
typedef struct gpu {
  int dev;
  int sms;
  char *src, *dst;
  bench_copy_desc_t *push_descs, *pull_descs;
  unsigned long long *bad; /* the check kernel's count of wrong words */
  cudaStream_t s;
  cudaEvent_t start, stop, done;
} gpu_t;

typedef struct bench {
  gpu_t g[2];
  int peer;            /* peer access enabled both ways: the kernel variants can run */
  size_t size, count;  /* the batch being measured */
  unsigned reps;
  uint64_t bad_words;  /* wrong words over every check */
} bench_t;

typedef struct row {
  size_t size, count;
  double gbs[V_COUNT]; /* GPU 0 -> 1; < 0: not measured */
  int best;
  double duplex;
} row_t;

uint32_t seed_of(int dev) { return 0x9ee7u + (uint32_t)dev; }

/* The kernel variants run on the destination GPU when they pull. */
int exec_dev(int v, int from) { return v == V_PULL || v == V_PULL_GATHER ? 1 - from : from; }

int is_gather(int v) { return v == V_PUSH_GATHER || v == V_PULL_GATHER; }

int available(const bench_t *b, int v, size_t size) {
  if (v == V_MEMCPY) return 1;
  return b->peer && (!is_gather(v) || size <= kGatherMax);
}

/* Grid-stride copy of n 16-byte words. Four loads are issued before their stores: a read
 * across the link takes microseconds, and pulling fills the link only with many in flight. */
__global__ void __launch_bounds__(kThreads)
    copy_kernel(uint4 *__restrict__ d, const uint4 *__restrict__ s, size_t n) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + 3 * stride < n; i += 4 * stride) {
    const uint4 a = s[i], c = s[i + stride], e = s[i + 2 * stride], f = s[i + 3 * stride];
    d[i] = a;
    d[i + stride] = c;
    d[i + 2 * stride] = e;
    d[i + 3 * stride] = f;
  }
  for (; i < n; i += stride) d[i] = s[i];
}

/* Adds to *bad the number of the `words` words at p that are not bench_pattern(seed, first + i). */
__global__ void check_kernel(const uint32_t *__restrict__ p, size_t words, uint32_t seed,
                             uint64_t first, unsigned long long *bad) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  unsigned long long n = 0;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < words;
       i += stride)
    n += p[i] != bench_pattern(seed, first + i);
  if (n) atomicAdd(bad, n);
}

unsigned grid_for(const gpu_t *x, size_t n) {
  size_t blocks = (n + kThreads - 1) / kThreads, cap = (size_t)x->sms * kBlocksPerSm;
  return (unsigned)(blocks < cap ? blocks : cap);
}

/* ---- set-up ---- */

/* Enables access from `dev` to `peer`'s memory; 0 if the GPUs cannot. */
int enable_peer(int dev, int peer) {
  int can = 0;
  CK(cudaDeviceCanAccessPeer(&can, dev, peer));
  if (!can) return 0;
  CK(cudaSetDevice(dev));
  cudaError_t e = cudaDeviceEnablePeerAccess(peer, 0);
  if (e == cudaErrorPeerAccessAlreadyEnabled) {
    (void)cudaGetLastError(); /* not sticky, but would show in the next CK otherwise */
    e = cudaSuccess;
  }
  CK(e);
  return 1;
}

void gpu_init(gpu_t *x, int dev, size_t slab, size_t max_count) {
  memset(x, 0, sizeof *x);
  x->dev = dev;
  CK(cudaSetDevice(dev));
  CK(cudaDeviceGetAttribute(&x->sms, cudaDevAttrMultiProcessorCount, dev));
  CK(cudaMalloc((void **)&x->src, slab));
  CK(cudaMalloc((void **)&x->dst, slab));
  CK(cudaMalloc((void **)&x->push_descs, max_count * sizeof(bench_copy_desc_t)));
  CK(cudaMalloc((void **)&x->pull_descs, max_count * sizeof(bench_copy_desc_t)));
  CK(cudaMalloc((void **)&x->bad, sizeof *x->bad));
  CK(cudaStreamCreateWithFlags(&x->s, cudaStreamNonBlocking));
  CK(cudaEventCreate(&x->start));
  CK(cudaEventCreate(&x->stop));
  CK(cudaEventCreateWithFlags(&x->done, cudaEventDisableTiming));
  CK((cudaError_t)bench_cuda_fill_u32(x->src, slab / 4, seed_of(dev), x->s));
  CK(cudaStreamSynchronize(x->s));
}

void gpu_free(gpu_t *x) {
  CK(cudaSetDevice(x->dev));
  CK(cudaFree(x->src));
  CK(cudaFree(x->dst));
  CK(cudaFree(x->push_descs));
  CK(cudaFree(x->pull_descs));
  CK(cudaFree(x->bad));
  CK(cudaStreamDestroy(x->s));
  CK(cudaEventDestroy(x->start));
  CK(cudaEventDestroy(x->stop));
  CK(cudaEventDestroy(x->done));
}

/* Describes the batch from->src to the other GPU's dst in `descs`, on the GPU `where`. */
void upload_descs(const bench_t *b, int from, bench_copy_desc_t *descs, int where) {
  const gpu_t *s = &b->g[from], *d = &b->g[1 - from];
  bench_copy_desc_t *h = (bench_copy_desc_t *)malloc(b->count * sizeof *h);
  if (!h) CK(cudaErrorMemoryAllocation);
  for (size_t k = 0; k < b->count; k++)
    h[k] = bench_copy_desc_t{d->dst + k * b->size, s->src + k * b->size, b->size};
  CK(cudaSetDevice(where));
  CK(cudaMemcpy(descs, h, b->count * sizeof *h, cudaMemcpyHostToDevice));
  free(h);
}

void set_batch(bench_t *b, size_t size, size_t count) {
  b->size = size;
  b->count = count;
  for (int i = 0; i < 2; i++) {
    upload_descs(b, i, b->g[i].push_descs, i);
    upload_descs(b, 1 - i, b->g[i].pull_descs, i);
  }
}

/* ---- one measurement ---- */

/* Enqueues launch k of variant v in direction from -> other on the executing GPU's stream:
 * buffer k, or for a gather the whole batch (its only launch). */
void enqueue(bench_t *b, int v, int from, size_t k) {
  gpu_t *s = &b->g[from], *d = &b->g[1 - from], *x = &b->g[exec_dev(v, from)];
  const size_t off = k * b->size;
  if (v == V_MEMCPY) {
    CK(cudaMemcpyPeerAsync(d->dst + off, d->dev, s->src + off, s->dev, b->size, x->s));
    return;
  }
  CK(cudaSetDevice(x->dev));
  if (is_gather(v)) {
    CK((cudaError_t)bench_cuda_copy_desc(v == V_PUSH_GATHER ? x->push_descs : x->pull_descs,
                                         b->count, x->s));
    return;
  }
  const size_t n = b->size / sizeof(uint4);
  copy_kernel<<<grid_for(x, n), kThreads, 0, x->s>>>((uint4 *)(d->dst + off),
                                                    (const uint4 *)(s->src + off), n);
  CK(cudaGetLastError());
}

/* One run of variant v in the `ndirs` directions from[] (a source GPU each), timed on the
 * first direction's executing stream: the others start after its start event and it waits
 * for theirs before its stop event. Launches alternate between directions so that both
 * links are busy from the start. Returns seconds. */
double run_once(bench_t *b, int v, const int *from, int ndirs) {
  gpu_t *lead = &b->g[exec_dev(v, from[0])];
  CK(cudaEventRecord(lead->start, lead->s));
  for (int i = 1; i < ndirs; i++)
    CK(cudaStreamWaitEvent(b->g[exec_dev(v, from[i])].s, lead->start, 0));
  const size_t launches = is_gather(v) ? 1 : b->count;
  for (size_t k = 0; k < launches; k++)
    for (int i = 0; i < ndirs; i++) enqueue(b, v, from[i], k);
  for (int i = 1; i < ndirs; i++) {
    gpu_t *x = &b->g[exec_dev(v, from[i])];
    CK(cudaEventRecord(x->done, x->s));
    CK(cudaStreamWaitEvent(lead->s, x->done, 0));
  }
  CK(cudaEventRecord(lead->stop, lead->s));
  CK(cudaEventSynchronize(lead->stop));
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, lead->start, lead->stop));
  return ms / 1e3;
}

/* Index of the j-th of n sampled buffers among count: first and last always included. */
size_t sample_index(size_t j, size_t n, size_t count) {
  return n < 2 ? 0 : j * (count - 1) / (n - 1);
}

/* Checks a sample of the buffers that direction `from` delivered; counts wrong words. */
void check_dir(bench_t *b, int from) {
  gpu_t *d = &b->g[1 - from];
  const size_t n = b->count < kSample ? b->count : kSample, words = b->size / 4;
  CK(cudaSetDevice(d->dev));
  CK(cudaMemsetAsync(d->bad, 0, sizeof *d->bad, d->s));
  for (size_t j = 0; j < n; j++) {
    const size_t k = sample_index(j, n, b->count);
    check_kernel<<<grid_for(d, words), kThreads, 0, d->s>>>(
        (const uint32_t *)(d->dst + k * b->size), words, seed_of(from), (uint64_t)k * words,
        d->bad);
    CK(cudaGetLastError());
  }
  unsigned long long bad = 0;
  CK(cudaMemcpyAsync(&bad, d->bad, sizeof bad, cudaMemcpyDeviceToHost, d->s));
  CK(cudaStreamSynchronize(d->s));
  if (bad)
    fprintf(stderr, "peer_bw: %llu wrong words, GPU %d -> %d, %zu B x %zu\n", bad, from,
            1 - from, b->size, b->count);
  b->bad_words += bad;
}

/* Clears the destinations, runs once to warm up, then --reps timed runs; checks the data.
 * Returns GB/s of the median run, all directions counted. */
double measure(bench_t *b, int v, const int *from, int ndirs) {
  for (int i = 0; i < ndirs; i++) {
    gpu_t *d = &b->g[1 - from[i]];
    CK(cudaMemsetAsync(d->dst, 0, b->count * b->size, d->s));
    CK(cudaStreamSynchronize(d->s));
  }
  (void)run_once(b, v, from, ndirs);
  double t[1000];
  for (unsigned r = 0; r < b->reps; r++) t[r] = run_once(b, v, from, ndirs);
  for (int i = 0; i < ndirs; i++) check_dir(b, from[i]);
  return bench_gbs((uint64_t)ndirs * b->count * b->size, bench_median(t, b->reps));
}

void measure_size(bench_t *b, size_t size, size_t count, row_t *row) {
  static const int one_way[1] = {0}, both[2] = {0, 1};
  set_batch(b, size, count);
  row->size = size;
  row->count = count;
  row->best = V_MEMCPY;
  for (int v = 0; v < V_COUNT; v++) {
    row->gbs[v] = available(b, v, size) ? measure(b, v, one_way, 1) : -1;
    if (row->gbs[v] > row->gbs[row->best]) row->best = v;
  }
  row->duplex = measure(b, row->best, both, 2);
}

/* ---- host link ---- */

/* GB/s of cudaMemcpyAsync GPU 0 -> pinned host, one copy per buffer of `size` bytes; a
 * strided sample of each checked buffer is compared with the pattern. */
double host_link(bench_t *b, size_t size, size_t count) {
  gpu_t *x = &b->g[0];
  const size_t bytes = count * size, words = size / 4;
  char *h = NULL;
  CK(cudaSetDevice(x->dev));
  CK(cudaMallocHost((void **)&h, bytes));
  memset(h, 0, bytes);
  double t[1000];
  for (unsigned r = 0; r <= b->reps; r++) { /* run 0 warms up */
    CK(cudaEventRecord(x->start, x->s));
    for (size_t k = 0; k < count; k++)
      CK(cudaMemcpyAsync(h + k * size, x->src + k * size, size, cudaMemcpyDeviceToHost, x->s));
    CK(cudaEventRecord(x->stop, x->s));
    CK(cudaEventSynchronize(x->stop));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, x->start, x->stop));
    if (r) t[r - 1] = ms / 1e3;
  }
  const size_t n = count < kSample ? count : kSample;
  for (size_t j = 0; j < n; j++) {
    const size_t k = sample_index(j, n, count);
    const uint32_t *w = (const uint32_t *)(h + k * size);
    for (size_t i = 0; i < words; i += 97) /* every 97th word: a few ms per GiB */
      b->bad_words += w[i] != bench_pattern(seed_of(x->dev), (uint64_t)k * words + i);
  }
  CK(cudaFreeHost(h));
  return bench_gbs(bytes, bench_median(t, b->reps));
}

/* ---- report ---- */

void print_header(const bench_t *b, uint64_t total) {
  cudaDeviceProp p0, p1;
  CK(cudaGetDeviceProperties(&p0, 0));
  CK(cudaGetDeviceProperties(&p1, 1));
  int rank = -1, atomics = 0, drv = 0;
  if (b->peer) {
    CK(cudaDeviceGetP2PAttribute(&rank, cudaDevP2PAttrPerformanceRank, 0, 1));
    CK(cudaDeviceGetP2PAttribute(&atomics, cudaDevP2PAttrNativeAtomicSupported, 0, 1));
  }
  CK(cudaDriverGetVersion(&drv));
  char tot[32];
  bench_fmt_size(total, tot, sizeof tot);
  printf("# peer_bw: GPU 0 %s, GPU 1 %s, driver %d\n", p0.name, p1.name, drv);
  if (b->peer)
    printf("# peer access: enabled both ways (performance rank %d, native atomics %s)\n", rank,
           atomics ? "yes" : "no");
  else
    printf("# peer access: NOT supported between GPU 0 and GPU 1: only cudaMemcpyPeerAsync "
           "(staged through the host) is measured\n");
  printf("# GB/s (1e9 B/s), GPU 0 -> GPU 1 unless duplex; >= %s per measurement; median of "
         "%u after a warm-up\n\n", tot, b->reps);
}

void fmt_gbs(double gbs, char *buf, size_t len) {
  if (gbs < 0) snprintf(buf, len, "n/a");
  else snprintf(buf, len, "%.1f", gbs);
}

void print_table(const row_t *rows, size_t nrows) {
  printf("| size | count |");
  for (int v = 0; v < V_COUNT; v++) printf(" %s |", kName[v]);
  printf(" faster | vs memcpy peer | duplex (faster, both ways) |\n|");
  for (int c = 0; c < V_COUNT + 5; c++) printf(c == V_COUNT + 2 ? " --- |" : " ---: |");
  printf("\n");
  for (size_t r = 0; r < nrows; r++) {
    const row_t *w = &rows[r];
    char sz[32], cell[32];
    bench_fmt_size(w->size, sz, sizeof sz);
    printf("| %s | %zu |", sz, w->count);
    for (int v = 0; v < V_COUNT; v++) {
      fmt_gbs(w->gbs[v], cell, sizeof cell);
      printf(" %s |", cell);
    }
    printf(" %s | %.2fx | %.1f |\n", kName[w->best], w->gbs[w->best] / w->gbs[V_MEMCPY],
           w->duplex);
  }
}

/* The decision the table is for: per size, whether a kernel beats cudaMemcpyPeerAsync. */
void print_verdict(const row_t *rows, size_t nrows) {
  printf("\npeer tier copy:");
  for (size_t r = 0; r < nrows; r++) {
    char sz[32];
    bench_fmt_size(rows[r].size, sz, sizeof sz);
    printf("%s %s: %s", r ? ";" : "", sz,
           rows[r].best == V_MEMCPY ? "cudaMemcpyPeerAsync" : kName[rows[r].best]);
  }
  printf("\n");
}

int parse_options(int argc, char **argv, uint64_t *sizes, size_t *nsizes, uint64_t *total,
                  uint64_t *reps) {
  static const char *const known[] = {"sizes", "total", "reps", NULL};
  static const uint64_t def_sizes[] = {64 * BENCH_KIB, BENCH_MIB, 16 * BENCH_MIB,
                                       256 * BENCH_MIB};
  if (bench_opt_check(argc, argv, known) != SPW_OK ||
      bench_opt_size_list(argc, argv, "sizes", def_sizes, 4, sizes, nsizes) != SPW_OK ||
      bench_opt_size(argc, argv, "total", BENCH_GIB, total) != SPW_OK ||
      bench_opt_uint(argc, argv, "reps", 5, reps) != SPW_OK)
    return -1;
  for (size_t i = 0; i < *nsizes; i++)
    if (sizes[i] == 0 || sizes[i] % 16) {
      fprintf(stderr, "peer_bw: --sizes: each a positive multiple of 16 bytes\n");
      return -1;
    }
  if (*reps < 1 || *reps > 1000 || *total == 0) {
    fprintf(stderr, "peer_bw: --reps 1..1000, --total > 0\n");
    return -1;
  }
  return 0;
}

}  // namespace

int main(int argc, char **argv) {
  uint64_t sizes[kMaxSizes], total = 0, reps = 0;
  size_t nsizes = 0;
  if (parse_options(argc, argv, sizes, &nsizes, &total, &reps)) return 2;
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess) ndev = 0; /* no driver: no GPU */
  if (ndev < 2) {
    printf("peer_bw: needs 2 GPUs (found %d)\n", ndev);
    return 0;
  }

  size_t counts[kMaxSizes], slab = 0, max_count = 0;
  for (size_t i = 0; i < nsizes; i++) {
    counts[i] = (size_t)((total + sizes[i] - 1) / sizes[i]);
    if (counts[i] * sizes[i] > slab) slab = counts[i] * sizes[i];
    if (counts[i] > max_count) max_count = counts[i];
  }
  bench_t b;
  memset(&b, 0, sizeof b);
  b.reps = (unsigned)reps;
  b.peer = enable_peer(0, 1) & enable_peer(1, 0); /* both calls, so each way is enabled */
  for (int i = 0; i < 2; i++) gpu_init(&b.g[i], i, slab, max_count);
  print_header(&b, total);

  row_t rows[kMaxSizes];
  for (size_t i = 0; i < nsizes; i++) measure_size(&b, sizes[i], counts[i], &rows[i]);
  /* The host link at the largest size, the one the peer tier's large buffers compare with. */
  size_t big = 0;
  for (size_t i = 1; i < nsizes; i++)
    if (sizes[i] > sizes[big]) big = i;
  const double host = host_link(&b, sizes[big], counts[big]);

  print_table(rows, nsizes);
  print_verdict(rows, nsizes);
  char sz[32];
  bench_fmt_size(sizes[big], sz, sizeof sz);
  const row_t *w = &rows[big];
  printf("host link (cudaMemcpyAsync GPU 0 -> pinned host, %s x %zu): %.1f GB/s; peer/host "
         "link: %.1fx one way (%s), %.1fx duplex vs host one way\n",
         sz, counts[big], host, w->gbs[w->best] / host, kName[w->best], w->duplex / host);
  printf("\ndata check: %s (%" PRIu64 " wrong words in the sampled buffers)\n",
         b.bad_words ? "FAILED" : "ok", b.bad_words);
  for (int i = 0; i < 2; i++) gpu_free(&b.g[i]);
  return b.bad_words ? 1 : 0;
}
