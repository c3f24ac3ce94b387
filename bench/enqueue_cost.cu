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
 *   - "driver API", "+ event": cuMemcpyHtoDAsync (and cuEventRecord), reached through
 *     cudaGetDriverEntryPointByVersion as the library reaches the driver;
 *   - "GPU per copy": the copies alone, timed with CUDA events around the loop without the
 *     held stream: the GPU's pace, which a raw loop keeps to where its caller is faster.
 * Each figure is the median of --reps rounds (default 7), in microseconds per copy. The last
 * column is the caller's cost with the event over the GPU's pace: below 1, a caller that
 * does nothing else keeps ahead of the copies.
 *
 * The same copies cost the caller more in some processes than in others. To see whether the
 * state a runtime such as Spillway keeps is why, options add some of it before the timing:
 * --events=N live events, each recorded once (Spillway keeps one per buffer that came back
 * from host); --streams=N more streams, each used once (its lanes, slices and stages);
 * --registered=BYTES more host memory registered as its arena's slabs are; --pollers=N
 * threads that each query a completed event every 20 us (its completion poller's pattern
 * while work flows). No Spillway call. Not a test: nothing asserts on time; it exits 77
 * without a GPU, 1 if a CUDA call fails, 2 on a bad option. */
#include <atomic>

#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>
#include <pthread.h>
#include <sys/mman.h>
#include <time.h>

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

enum mode { M_MEMCPY, M_EVENT, M_KIND, M_DRV, M_DRV_EVENT, M_GPU, M_COUNT };

/* The driver API's copy and event record, reached as the library reaches the driver
 * (cudaGetDriverEntryPointByVersion): what the runtime API's layer costs per call. */
PFN_cuMemcpyHtoDAsync_v3020 p_htod;
PFN_cuEventRecord_v2000 p_record;

void *entry(const char *name) {
  void *fn = NULL;
  cudaDriverEntryPointQueryResult q;
  CK(cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &q));
  if (!fn || q != cudaDriverEntryPointSuccess) {
    fprintf(stderr, "enqueue_cost: driver entry point %s not found\n", name);
    exit(1);
  }
  return fn;
}

void check_drv(CUresult r, const char *what) {
  if (r != CUDA_SUCCESS) {
    fprintf(stderr, "enqueue_cost: %s failed (CUresult %d)\n", what, (int)r);
    exit(1);
  }
}

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
  if (md == M_DRV || md == M_DRV_EVENT) {
    for (size_t i = 0; i < b.calls; i++) {
      check_drv(p_htod((CUdeviceptr)m.dev[i], m.host + i * size, size, (CUstream)b.s),
                "cuMemcpyHtoDAsync");
      if (md == M_DRV_EVENT) check_drv(p_record((CUevent)b.ev[i], (CUstream)b.s), "cuEventRecord");
    }
  } else {
    for (size_t i = 0; i < b.calls; i++) {
      CK(cudaMemcpyAsync(m.dev[i], m.host + i * size, size, kind, b.s));
      if (md == M_EVENT) CK(cudaEventRecord(b.ev[i], b.s));
    }
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
  printf("| %s | %s | %s | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.2f |\n", sz, m.host_kind,
         m.device_kind, med[M_MEMCPY], med[M_EVENT], med[M_KIND], med[M_DRV], med[M_DRV_EVENT],
         med[M_GPU], med[M_EVENT] / med[M_GPU]);
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

/* What --events, --streams, --registered and --pollers add to the process. */
struct extra_state {
  uint64_t nevents, nstreams, registered, npollers;
  cudaEvent_t *events, done;
  cudaStream_t *streams;
  void *host;
  pthread_t *pollers;
  std::atomic<bool> stop; /* read by the pollers, set once by main after the timing */
};

void *poll_loop(void *arg) {
  extra_state *x = (extra_state *)arg;
  const timespec pause = {0, 20000};
  while (!x->stop.load(std::memory_order_relaxed)) {
    (void)cudaEventQuery(x->done);
    nanosleep(&pause, NULL);
  }
  return NULL;
}

void extra_start(extra_state *x, cudaStream_t s) {
  x->events = (cudaEvent_t *)calloc(x->nevents + 1, sizeof *x->events);
  x->streams = (cudaStream_t *)calloc(x->nstreams + 1, sizeof *x->streams);
  x->pollers = (pthread_t *)calloc(x->npollers + 1, sizeof *x->pollers);
  if (!x->events || !x->streams || !x->pollers) {
    fprintf(stderr, "enqueue_cost: out of host memory\n");
    exit(1);
  }
  for (uint64_t i = 0; i < x->nevents; i++) {
    CK(cudaEventCreateWithFlags(&x->events[i], cudaEventDisableTiming));
    CK(cudaEventRecord(x->events[i], s));
  }
  void *scratch;
  if (x->nstreams) CK(cudaMalloc(&scratch, 4096));
  for (uint64_t i = 0; i < x->nstreams; i++) {
    CK(cudaStreamCreateWithFlags(&x->streams[i], cudaStreamNonBlocking));
    CK(cudaMemsetAsync(scratch, 0, 4096, x->streams[i]));
    CK(cudaStreamSynchronize(x->streams[i]));
  }
  if (x->nstreams) CK(cudaFree(scratch));
  if (x->registered) {
    x->host = mmap(NULL, x->registered, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (x->host == MAP_FAILED) {
      fprintf(stderr, "enqueue_cost: mmap of --registered failed\n");
      exit(1);
    }
    CK(cudaHostRegister(x->host, x->registered,
                        cudaHostRegisterPortable | cudaHostRegisterMapped));
  }
  CK(cudaEventCreateWithFlags(&x->done, cudaEventDisableTiming));
  CK(cudaEventRecord(x->done, s));
  CK(cudaStreamSynchronize(s));
  for (uint64_t i = 0; i < x->npollers; i++)
    if (pthread_create(&x->pollers[i], NULL, poll_loop, x) != 0) {
      fprintf(stderr, "enqueue_cost: pthread_create failed\n");
      exit(1);
    }
}

void extra_stop(extra_state *x) {
  x->stop.store(true);
  for (uint64_t i = 0; i < x->npollers; i++) pthread_join(x->pollers[i], NULL);
  for (uint64_t i = 0; i < x->nevents; i++) CK(cudaEventDestroy(x->events[i]));
  for (uint64_t i = 0; i < x->nstreams; i++) CK(cudaStreamDestroy(x->streams[i]));
  if (x->registered) {
    CK(cudaHostUnregister(x->host));
    munmap(x->host, x->registered);
  }
  CK(cudaEventDestroy(x->done));
  free(x->events);
  free(x->streams);
  free(x->pollers);
}

} // namespace

int main(int argc, char **argv) {
  static const char *const known[] = {"sizes",     "calls",      "reps",    "events",
                                      "streams",   "registered", "pollers", NULL};
  extra_state extra{};
  static const uint64_t def_sizes[] = {4096, 65536};
  uint64_t sizes[BENCH_MAX_LIST], calls = 0, reps = 0;
  size_t nsizes = 0;
  if (bench_opt_check(argc, argv, known) ||
      bench_opt_size_list(argc, argv, "sizes", def_sizes, 2, sizes, &nsizes) ||
      bench_opt_uint(argc, argv, "calls", 512, &calls) ||
      bench_opt_uint(argc, argv, "reps", 7, &reps) ||
      bench_opt_uint(argc, argv, "events", 0, &extra.nevents) ||
      bench_opt_uint(argc, argv, "streams", 0, &extra.nstreams) ||
      bench_opt_size_or_zero(argc, argv, "registered", 0, &extra.registered) ||
      bench_opt_uint(argc, argv, "pollers", 0, &extra.npollers))
    return 2;
  if (extra.nevents > (1u << 20) || extra.nstreams > 1024 || extra.npollers > 64) {
    fprintf(stderr, "enqueue_cost: --events is at most 1048576, --streams 1024, --pollers 64\n");
    return 2;
  }
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
  p_htod = (PFN_cuMemcpyHtoDAsync_v3020)entry("cuMemcpyHtoDAsync");
  p_record = (PFN_cuEventRecord_v2000)entry("cuEventRecord");
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

  extra_start(&extra, b.s);
  printf("## enqueue_cost: %s, %zu host-to-device copies per round, median of %u rounds\n\n",
         env.device_name, b.calls, b.reps);
  if (extra.nevents || extra.nstreams || extra.registered || extra.npollers)
    printf("added first: %llu live events, %llu streams, %llu MiB registered, %llu pollers\n\n",
           (unsigned long long)extra.nevents, (unsigned long long)extra.nstreams,
           (unsigned long long)(extra.registered >> 20), (unsigned long long)extra.npollers);
  printf("the calling thread's µs per copy with the stream held (memcpy, + event record, "
         "direction given; the driver API's cuMemcpyHtoDAsync, + cuEventRecord), the GPU's µs "
         "per copy, and the caller's cost with the runtime API's event over the GPU's\n\n");
  printf("| size | host | device | memcpy | + event | kind given | driver API | driver API + "
         "event | GPU per copy | (+ event) / GPU |\n| ---: | --- | --- | ---: | ---: | ---: | "
         "---: | ---: | ---: | ---: |\n");
  for (size_t i = 0; i < nsizes; i++) run_size(b, (size_t)sizes[i]);
  if (past_held)
    printf("\n%u timed round(s) of %zu took the caller longer than half the held stream's %.0f "
           "ms (a stall in the driver): in the medians, not removed\n",
           past_held, nsizes * 4 * (M_COUNT - 1) * (size_t)b.reps, kHeldNs / 1e6);

  extra_stop(&extra);
  for (size_t i = 0; i < b.calls; i++) CK(cudaEventDestroy(b.ev[i]));
  free(b.ev);
  CK(cudaEventDestroy(b.t0));
  CK(cudaEventDestroy(b.t1));
  CK(cudaMemPoolDestroy(b.pool));
  CK(cudaStreamDestroy(b.s));
  return 0;
}
