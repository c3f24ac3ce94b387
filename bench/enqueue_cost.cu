/* SPDX-License-Identifier: Apache-2.0 */
/* enqueue_cost: what one small host-to-device copy costs the thread that enqueues it, next
 * to what it costs the GPU: the floor under issue 20's goal 2 (a single acquire of a spilled
 * buffer at least as fast as one raw cudaMemcpyAsync). An acquire enqueues one such copy and
 * an event record, and does its bookkeeping, on the caller's thread; where that takes longer
 * than the GPU takes per copy, a loop of acquires runs at the caller's pace instead of the
 * GPU's, behind a raw loop that the GPU paces.
 *
 * For each size (--sizes, default 4 KiB and 64 KiB) and each kind of memory the library or an
 * application copies between (host: cudaMallocHost, or mmap + cudaHostRegister(portable |
 * mapped) as the host arena's slabs; device: cudaMalloc, or cudaMallocFromPoolAsync from a
 * pool of its own as the library's device pool), it times:
 *   - "memcpy": one cudaMemcpyAsync (cudaMemcpyDefault) per buffer, --calls of them (default
 *     512), enqueued behind a kernel that holds the stream 20 ms, so that the calling
 *     thread's own cost is timed and not the GPU's pace;
 *   - "+ event": the same with a cudaEventRecord after each copy (what an acquire enqueues);
 *   - "kind given": the first with cudaMemcpyHostToDevice instead of cudaMemcpyDefault;
 *   - "GPU per copy": the copies alone, timed with CUDA events around the loop without the
 *     held stream: the GPU's pace, which a raw loop keeps to where its caller is faster.
 * Each figure is the median of --reps rounds (default 7), in microseconds per copy. The last
 * column is the caller's cost with the event over the GPU's pace: below 1, a caller that
 * does nothing else keeps ahead of the copies. No Spillway call. Not a test: nothing asserts
 * on time; it exits 77 without a GPU, 1 if a CUDA call fails, 2 on a bad option. */
#include <cuda_runtime.h>
#include <sys/mman.h>

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
      fprintf(stderr, "enqueue_cost: %s: %s (%s:%d)\n", #x, cudaGetErrorString(e_), __FILE__, \
              __LINE__);                                                                       \
      exit(1);                                                                                 \
    }                                                                                          \
  } while (0)

namespace {

constexpr uint64_t kHeldNs = 20000000; /* long enough for every call of a round */
constexpr size_t kMaxReps = 64;

/* Timed rounds whose calls took longer than half the held stream's time: the driver stalled
 * the caller (the GPU's pace may then show in them). Reported, and left to the medians. */
unsigned past_held;

enum mode { M_MEMCPY, M_EVENT, M_KIND, M_GPU, M_COUNT };

struct memory {
  const char *host_kind, *device_kind;
  char *host;
  void **dev; /* one pointer per call */
};

struct bench {
  cudaStream_t s;
  cudaMemPool_t pool;
  cudaEvent_t *ev, t0, t1; /* ev: one per call, as each acquire records its buffer's */
  size_t calls;
  unsigned reps;
};

/* One round of `mode`: microseconds per copy (the caller's, or the GPU's for M_GPU). A
 * warm-up round (the first copies of fresh memory, the spin kernel's first launch) may
 * outlast the held stream; a timed one says so if it does. */
double round_us(const bench &b, const memory &m, size_t size, mode md, bool timed) {
  if (md != M_GPU) {
    int e = bench_cuda_spin(kHeldNs, b.s);
    if (e != 0) CK((cudaError_t)e);
  } else {
    CK(cudaEventRecord(b.t0, b.s));
  }
  const cudaMemcpyKind kind = md == M_KIND ? cudaMemcpyHostToDevice : cudaMemcpyDefault;
  const double t0 = bench_now();
  for (size_t i = 0; i < b.calls; i++) {
    CK(cudaMemcpyAsync(m.dev[i], m.host + i * size, size, kind, b.s));
    if (md == M_EVENT) CK(cudaEventRecord(b.ev[i], b.s));
  }
  const double caller = (bench_now() - t0) / (double)b.calls * 1e6;
  float ms = 0;
  if (md == M_GPU) {
    CK(cudaEventRecord(b.t1, b.s));
    CK(cudaEventSynchronize(b.t1));
    CK(cudaEventElapsedTime(&ms, b.t0, b.t1));
  }
  CK(cudaStreamSynchronize(b.s));
  if (timed && md != M_GPU && caller * 1e3 * (double)b.calls > (double)kHeldNs / 2)
    past_held++;
  return md == M_GPU ? (double)ms * 1e3 / (double)b.calls : caller;
}

void measure(const bench &b, const memory &m, size_t size) {
  double r[M_COUNT][kMaxReps], med[M_COUNT];
  for (int md = 0; md < M_COUNT; md++) round_us(b, m, size, (mode)md, false);
  for (unsigned k = 0; k < b.reps; k++) /* interleaved: a drift touches every mode alike */
    for (int md = 0; md < M_COUNT; md++) r[md][k] = round_us(b, m, size, (mode)md, true);
  for (int md = 0; md < M_COUNT; md++) med[md] = bench_median(r[md], b.reps);
  char sz[32];
  bench_fmt_size(size, sz, sizeof sz);
  printf("| %s | %s | %s | %.3f | %.3f | %.3f | %.3f | %.2f |\n", sz, m.host_kind, m.device_kind,
         med[M_MEMCPY], med[M_EVENT], med[M_KIND], med[M_GPU], med[M_EVENT] / med[M_GPU]);
}

void run_size(const bench &b, size_t size) {
  const size_t bytes = size * b.calls;
  char *pinned, *mapped;
  CK(cudaMallocHost((void **)&pinned, bytes));
  mapped = (char *)mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS |
                        MAP_POPULATE, -1, 0);
  if (mapped == MAP_FAILED) {
    fprintf(stderr, "enqueue_cost: mmap of %zu bytes failed\n", bytes);
    exit(1);
  }
  CK(cudaHostRegister(mapped, bytes, cudaHostRegisterPortable | cudaHostRegisterMapped));
  memset(pinned, 1, bytes);
  memset(mapped, 2, bytes);
  char *slab;
  CK(cudaMalloc((void **)&slab, bytes));
  void **plain = (void **)malloc(b.calls * sizeof *plain);
  void **pooled = (void **)malloc(b.calls * sizeof *pooled);
  if (!plain || !pooled) {
    fprintf(stderr, "enqueue_cost: out of host memory\n");
    exit(1);
  }
  for (size_t i = 0; i < b.calls; i++) {
    plain[i] = slab + i * size;
    CK(cudaMallocFromPoolAsync(&pooled[i], size, b.pool, b.s));
  }
  CK(cudaStreamSynchronize(b.s));
  const memory kinds[] = {{"cudaMallocHost", "cudaMalloc", pinned, plain},
                          {"cudaMallocHost", "pool", pinned, pooled},
                          {"registered", "cudaMalloc", mapped, plain},
                          {"registered", "pool", mapped, pooled}};
  for (const memory &m : kinds) measure(b, m, size);
  for (size_t i = 0; i < b.calls; i++) CK(cudaFreeAsync(pooled[i], b.s));
  CK(cudaStreamSynchronize(b.s));
  free(pooled);
  free(plain);
  CK(cudaFree(slab));
  CK(cudaHostUnregister(mapped));
  munmap(mapped, bytes);
  CK(cudaFreeHost(pinned));
}

} // namespace

int main(int argc, char **argv) {
  static const char *const known[] = {"sizes", "calls", "reps", NULL};
  static const uint64_t def_sizes[] = {4096, 65536};
  uint64_t sizes[BENCH_MAX_LIST], calls = 0, reps = 0;
  size_t nsizes = 0;
  if (bench_opt_check(argc, argv, known) ||
      bench_opt_size_list(argc, argv, "sizes", def_sizes, 2, sizes, &nsizes) ||
      bench_opt_uint(argc, argv, "calls", 512, &calls) ||
      bench_opt_uint(argc, argv, "reps", 7, &reps))
    return 2;
  if (calls < 1 || calls > 65536 || reps < 1 || reps > kMaxReps) {
    fprintf(stderr, "enqueue_cost: --calls is 1 to 65536, --reps 1 to %zu\n", kMaxReps);
    return 2;
  }
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    printf("enqueue_cost: needs a GPU\n");
    return 77;
  }
  bench_env_t env;
  if (bench_env_init(&env) != 0) return 1;
  CK(cudaSetDevice(env.device));
  bench b;
  b.calls = (size_t)calls;
  b.reps = (unsigned)reps;
  CK(cudaStreamCreateWithFlags(&b.s, cudaStreamNonBlocking));
  cudaMemPoolProps props;
  memset(&props, 0, sizeof props);
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = env.device;
  CK(cudaMemPoolCreate(&b.pool, &props));
  b.ev = (cudaEvent_t *)malloc(b.calls * sizeof *b.ev);
  if (!b.ev) return 1;
  for (size_t i = 0; i < b.calls; i++)
    CK(cudaEventCreateWithFlags(&b.ev[i], cudaEventDisableTiming));
  CK(cudaEventCreate(&b.t0));
  CK(cudaEventCreate(&b.t1));

  printf("## enqueue_cost: %s, %zu host-to-device copies per round, median of %u rounds\n\n",
         env.device_name, b.calls, b.reps);
  printf("the calling thread's µs per copy with the stream held (memcpy, + event record, "
         "direction given), the GPU's µs per copy, and the caller's cost with the event over "
         "the GPU's\n\n");
  printf("| size | host | device | memcpy | + event | kind given | GPU per copy | "
         "(+ event) / GPU |\n| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: |\n");
  for (size_t i = 0; i < nsizes; i++) run_size(b, (size_t)sizes[i]);
  if (past_held)
    printf("\n%u timed round(s) of %zu took the caller longer than half the held stream's %.0f "
           "ms (a stall in the driver): in the medians, not removed\n",
           past_held, nsizes * 4 * 3 * (size_t)b.reps, kHeldNs / 1e6);

  for (size_t i = 0; i < b.calls; i++) CK(cudaEventDestroy(b.ev[i]));
  free(b.ev);
  CK(cudaEventDestroy(b.t0));
  CK(cudaEventDestroy(b.t1));
  CK(cudaMemPoolDestroy(b.pool));
  CK(cudaStreamDestroy(b.s));
  return 0;
}
