/* SPDX-License-Identifier: Apache-2.0 */
/* vmm_chunks: what CUDA virtual memory management costs, measured before the address-stable
 * buffers of issue 21 are designed on it (docs/design.md, "Address-stable buffers").
 *
 * Per physical chunk of the device's allocation granularity (2 MiB on current GPUs), and for
 * runs of 1, 8, 64 and 512 chunks, it times:
 *   - cuMemAddressReserve / cuMemAddressFree of the run's range;
 *   - cuMemCreate of each chunk, and cuMemRelease of each;
 *   - cuMemMap of each chunk into the range, then one cuMemSetAccess over the whole run (a
 *     fresh mapping has no access), first with new chunks, then again with the same chunks
 *     after an unmap (what a pooled chunk costs an unspill);
 *   - cuMemUnmap of each chunk, and of the whole run in one call (allowed when the range
 *     covers whole mappings), since the spill path may do either.
 * Then whether an unmap stalls other streams: a spin kernel, and separately a large device
 * to host copy, run on their own stream, timed with events, alone and while the host maps
 * and unmaps 64 chunks of an unrelated range; the unmap's own host time is shown busy and
 * idle, which tells whether it waits for the device. Last, single physical allocations of
 * 2 to 512 MiB (one create, map, access, unmap, release each), idle and while a copy runs on
 * another stream: whether a mapping costs per call or per byte, which sets the chunk size.
 *
 * It calls the driver through cudaGetDriverEntryPointByVersion, as the library does, so it
 * links only the CUDA runtime. Every number is a median of --reps runs (default 5). It exits
 * 77 without a GPU. Options: --reps=N, --max-run=N (largest run, default 512),
 * --stall-ms=N (length of the busy kernel, default 200). */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <cudaTypedefs.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static PFN_cuMemAddressReserve_v10020 p_reserve;
static PFN_cuMemAddressFree_v10020 p_addr_free;
static PFN_cuMemCreate_v10020 p_create;
static PFN_cuMemRelease_v10020 p_release;
static PFN_cuMemMap_v10020 p_map;
static PFN_cuMemUnmap_v10020 p_unmap;
static PFN_cuMemSetAccess_v10020 p_access;
static PFN_cuMemGetAllocationGranularity_v10020 p_gran;

#define CK_RT(x)                                                                                \
  do {                                                                                         \
    cudaError_t e_ = (x);                                                                      \
    if (e_ != cudaSuccess) {                                                                   \
      fprintf(stderr, "vmm_chunks: %s: %s (%s:%d)\n", #x, cudaGetErrorString(e_), __FILE__,   \
              __LINE__);                                                                       \
      exit(1);                                                                                 \
    }                                                                                          \
  } while (0)

#define CK_DRV(x)                                                                               \
  do {                                                                                         \
    CUresult r_ = (x);                                                                         \
    if (r_ != CUDA_SUCCESS) {                                                                  \
      fprintf(stderr, "vmm_chunks: %s: CUresult %d (%s:%d)\n", #x, (int)r_, __FILE__,          \
              __LINE__);                                                                       \
      exit(1);                                                                                 \
    }                                                                                          \
  } while (0)

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static void *entry(const char *name) {
  void *fn = NULL;
  cudaDriverEntryPointQueryResult q;
  CK_RT(cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &q));
  if (!fn || q != cudaDriverEntryPointSuccess) {
    fprintf(stderr, "vmm_chunks: driver entry point %s not found\n", name);
    exit(1);
  }
  return fn;
}

static long opt(int argc, char **argv, const char *name, long def) {
  size_t n = strlen(name);
  for (int i = 1; i < argc; i++)
    if (!strncmp(argv[i], "--", 2) && !strncmp(argv[i] + 2, name, n) && argv[i][2 + n] == '=')
      return strtol(argv[i] + 3 + n, NULL, 10);
  return def;
}

/* Pinned device memory on `dev`, and read-write access to it from `dev`. */
static void device_memory(int dev, CUmemAllocationProp *prop, CUmemAccessDesc *acc) {
  memset(prop, 0, sizeof *prop);
  prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop->location.id = dev;
  memset(acc, 0, sizeof *acc);
  acc->location = prop->location;
  acc->flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
}

/* Spins for about `cycles` SM clock cycles: a kernel that occupies the device for a known
 * time without touching memory the test maps or unmaps. */
__global__ void spin(long long cycles, int *sink) {
  long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
  if (threadIdx.x == 0 && blockIdx.x == 0) *sink = 1;
}

typedef struct run_times {
  double reserve, addr_free, create, map_access, remap_access, unmap_each, unmap_whole,
      release;
} run_times_t;

/* One run of n chunks: every operation timed once. */
static void one_run(int dev, size_t gran, int n, CUmemGenericAllocationHandle *h, run_times_t *t) {
  CUmemAllocationProp prop;
  CUmemAccessDesc acc;
  device_memory(dev, &prop, &acc);
  size_t bytes = gran * (size_t)n;

  CUdeviceptr va;
  double t0 = now_us();
  CK_DRV(p_reserve(&va, bytes, gran, 0, 0));
  t->reserve = now_us() - t0;

  t0 = now_us();
  for (int i = 0; i < n; i++) CK_DRV(p_create(&h[i], gran, &prop, 0));
  t->create = now_us() - t0;

  t0 = now_us();
  for (int i = 0; i < n; i++) CK_DRV(p_map(va + (size_t)i * gran, gran, 0, h[i], 0));
  CK_DRV(p_access(va, bytes, &acc, 1));
  t->map_access = now_us() - t0;
  /* Touch it, so that an unmap has written memory behind it, as after real use. */
  CK_RT(cudaMemset((void *)va, 1, bytes));
  CK_RT(cudaDeviceSynchronize());

  t0 = now_us();
  for (int i = 0; i < n; i++) CK_DRV(p_unmap(va + (size_t)i * gran, gran));
  t->unmap_each = now_us() - t0;

  /* The same chunks again: a pooled chunk brought back by an unspill. */
  t0 = now_us();
  for (int i = 0; i < n; i++) CK_DRV(p_map(va + (size_t)i * gran, gran, 0, h[i], 0));
  CK_DRV(p_access(va, bytes, &acc, 1));
  t->remap_access = now_us() - t0;
  CK_RT(cudaMemset((void *)va, 2, bytes));
  CK_RT(cudaDeviceSynchronize());

  /* One call over several mappings: if the driver refuses it, the run is unmapped chunk by
   * chunk instead and the column says so (a negative time). */
  t0 = now_us();
  CUresult whole = p_unmap(va, bytes);
  t->unmap_whole = now_us() - t0;
  if (whole != CUDA_SUCCESS) {
    if (n > 1) fprintf(stderr, "vmm_chunks: cuMemUnmap of %d mappings at once: CUresult %d\n", n,
                       (int)whole);
    for (int i = 0; i < n; i++) CK_DRV(p_unmap(va + (size_t)i * gran, gran));
    t->unmap_whole = -1;
  }

  t0 = now_us();
  for (int i = 0; i < n; i++) CK_DRV(p_release(h[i]));
  t->release = now_us() - t0;

  t0 = now_us();
  CK_DRV(p_addr_free(va, bytes));
  t->addr_free = now_us() - t0;
}

/* The stall test: `work` (0: spin kernel, 1: device-to-host copy) on stream `s`, timed with
 * events; with `churn`, the host maps and unmaps 64 chunks of another range meanwhile and
 * *unmap_us gets the median host time of one cuMemUnmap. Returns the work's device time. */
static double stall_once(int dev, size_t gran, cudaStream_t s, int work, int churn,
                         long long cycles, void *dsrc, void *hdst, size_t copy_bytes,
                         int *sink, double *unmap_us, double *unmap_max_us) {
  enum { N = 64 };
  CUmemGenericAllocationHandle h[N];
  CUmemAllocationProp prop;
  CUmemAccessDesc acc;
  device_memory(dev, &prop, &acc);
  CUdeviceptr va;
  CK_DRV(p_reserve(&va, gran * N, gran, 0, 0));
  for (int i = 0; i < N; i++) {
    CK_DRV(p_create(&h[i], gran, &prop, 0));
    CK_DRV(p_map(va + (size_t)i * gran, gran, 0, h[i], 0));
  }
  CK_DRV(p_access(va, gran * N, &acc, 1));

  cudaEvent_t a, b;
  CK_RT(cudaEventCreate(&a));
  CK_RT(cudaEventCreate(&b));
  CK_RT(cudaEventRecord(a, s));
  if (work == 0) spin<<<1, 32, 0, s>>>(cycles, sink);
  else CK_RT(cudaMemcpyAsync(hdst, dsrc, copy_bytes, cudaMemcpyDeviceToHost, s));
  CK_RT(cudaGetLastError());
  CK_RT(cudaEventRecord(b, s));
  double per[N];
  int nper = 0;
  if (churn) {
    /* Map-unmap cycles until the work ends, each unmap timed. */
    while (cudaEventQuery(b) == cudaErrorNotReady && nper < N) {
      double t0 = now_us();
      CK_DRV(p_unmap(va + (size_t)nper * gran, gran));
      per[nper] = now_us() - t0;
      CK_DRV(p_map(va + (size_t)nper * gran, gran, 0, h[nper], 0));
      CK_DRV(p_access(va + (size_t)nper * gran, gran, &acc, 1));
      nper++;
    }
    (void)cudaGetLastError();
  }
  CK_RT(cudaEventSynchronize(b));
  if (!churn) {
    /* The same unmaps with the device idle, for comparison. */
    for (nper = 0; nper < 8; nper++) {
      double t0 = now_us();
      CK_DRV(p_unmap(va + (size_t)nper * gran, gran));
      per[nper] = now_us() - t0;
      CK_DRV(p_map(va + (size_t)nper * gran, gran, 0, h[nper], 0));
      CK_DRV(p_access(va + (size_t)nper * gran, gran, &acc, 1));
    }
  }
  float ms = 0;
  CK_RT(cudaEventElapsedTime(&ms, a, b));
  /* The maximum too: an unmap that waits for the device once (the first one) would hide
   * behind the median of the others. */
  *unmap_max_us = -1;
  for (int i = 0; i < nper; i++)
    if (per[i] > *unmap_max_us) *unmap_max_us = per[i];
  *unmap_us = nper ? median(per, nper) : -1;
  CK_RT(cudaEventDestroy(a));
  CK_RT(cudaEventDestroy(b));
  CK_DRV(p_unmap(va, gran * N));
  for (int i = 0; i < N; i++) CK_DRV(p_release(h[i]));
  CK_DRV(p_addr_free(va, gran * N));
  return ms;
}

typedef struct alloc_times {
  double create, map_access, unmap, release;
  int overlapped; /* the other stream's copy was still running when the last call returned */
} alloc_times_t;

/* One physical allocation of `bytes` (a multiple of the granule): created, mapped with one
 * cuMemMap and one cuMemSetAccess, unmapped, released, each timed once. With `busy`, a D2H
 * copy of `copy_bytes` runs on stream `s` meanwhile, as the spill engine's copies do. This
 * tells whether a mapping costs per call or per byte: if per call, larger chunks pay. */
static void alloc_once(int dev, size_t gran, size_t bytes, int busy, cudaStream_t s, void *dsrc,
                       void *hdst, size_t copy_bytes, alloc_times_t *t) {
  CUmemAllocationProp prop;
  CUmemAccessDesc acc;
  device_memory(dev, &prop, &acc);
  CUdeviceptr va;
  CK_DRV(p_reserve(&va, bytes, gran, 0, 0));
  cudaEvent_t done;
  CK_RT(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  if (busy) CK_RT(cudaMemcpyAsync(hdst, dsrc, copy_bytes, cudaMemcpyDeviceToHost, s));
  CK_RT(cudaEventRecord(done, s));
  CUmemGenericAllocationHandle h;
  double t0 = now_us();
  CK_DRV(p_create(&h, bytes, &prop, 0));
  t->create = now_us() - t0;
  t0 = now_us();
  CK_DRV(p_map(va, bytes, 0, h, 0));
  CK_DRV(p_access(va, bytes, &acc, 1));
  t->map_access = now_us() - t0;
  t0 = now_us();
  CK_DRV(p_unmap(va, bytes));
  t->unmap = now_us() - t0;
  t0 = now_us();
  CK_DRV(p_release(h));
  t->release = now_us() - t0;
  t->overlapped = busy && cudaEventQuery(done) == cudaErrorNotReady;
  (void)cudaGetLastError();
  CK_RT(cudaEventSynchronize(done));
  CK_RT(cudaEventDestroy(done));
  CK_DRV(p_addr_free(va, bytes));
}

/* Sixteen 2 MiB chunks mapped one after another while a copy of `copy_bytes` (direction
 * `kind`) runs on stream `s`, cuMemMap and cuMemSetAccess timed apart: first[0..1] the first
 * chunk's map and access, rest[0..1] the medians of the others. Whether the cost of a
 * mapping under copy traffic is paid once or by every call decides whether an unspill can
 * map the next part while the previous one copies. */
static void maps_under_copy(int dev, size_t gran, cudaStream_t s, cudaMemcpyKind kind,
                            void *dbuf, void *hbuf, size_t copy_bytes, double first[2],
                            double rest[2], int *ended_early) {
  enum { N = 16 };
  CUmemAllocationProp prop;
  CUmemAccessDesc acc;
  device_memory(dev, &prop, &acc);
  CUdeviceptr va;
  CUmemGenericAllocationHandle h[N];
  CK_DRV(p_reserve(&va, gran * N, gran, 0, 0));
  for (int i = 0; i < N; i++) CK_DRV(p_create(&h[i], gran, &prop, 0));
  cudaEvent_t done;
  CK_RT(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  if (kind == cudaMemcpyDeviceToHost) CK_RT(cudaMemcpyAsync(hbuf, dbuf, copy_bytes, kind, s));
  else CK_RT(cudaMemcpyAsync(dbuf, hbuf, copy_bytes, kind, s));
  CK_RT(cudaEventRecord(done, s));
  double m[N], a[N];
  for (int i = 0; i < N; i++) {
    double t0 = now_us();
    CK_DRV(p_map(va + (size_t)i * gran, gran, 0, h[i], 0));
    double t1 = now_us();
    CK_DRV(p_access(va + (size_t)i * gran, gran, &acc, 1));
    m[i] = t1 - t0;
    a[i] = now_us() - t1;
  }
  *ended_early = cudaEventQuery(done) != cudaErrorNotReady;
  (void)cudaGetLastError();
  CK_RT(cudaEventSynchronize(done));
  CK_RT(cudaEventDestroy(done));
  first[0] = m[0];
  first[1] = a[0];
  rest[0] = median(m + 1, N - 1);
  rest[1] = median(a + 1, N - 1);
  CK_DRV(p_unmap(va, gran * N));
  for (int i = 0; i < N; i++) CK_DRV(p_release(h[i]));
  CK_DRV(p_addr_free(va, gran * N));
}

int main(int argc, char **argv) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    fprintf(stderr, "vmm_chunks: no CUDA device: skipped\n");
    return 77;
  }
  int reps = (int)opt(argc, argv, "reps", 5);
  int max_run = (int)opt(argc, argv, "max-run", 512);
  long stall_ms = opt(argc, argv, "stall-ms", 200);
  if (reps < 1 || reps > 1000 || max_run < 1 || stall_ms < 1) {
    fprintf(stderr, "vmm_chunks: --reps 1..1000, --max-run >= 1, --stall-ms >= 1\n");
    return 2;
  }
  int dev = 0;
  CK_RT(cudaSetDevice(dev));
  CK_RT(cudaFree(0));
  p_reserve = (PFN_cuMemAddressReserve_v10020)entry("cuMemAddressReserve");
  p_addr_free = (PFN_cuMemAddressFree_v10020)entry("cuMemAddressFree");
  p_create = (PFN_cuMemCreate_v10020)entry("cuMemCreate");
  p_release = (PFN_cuMemRelease_v10020)entry("cuMemRelease");
  p_map = (PFN_cuMemMap_v10020)entry("cuMemMap");
  p_unmap = (PFN_cuMemUnmap_v10020)entry("cuMemUnmap");
  p_access = (PFN_cuMemSetAccess_v10020)entry("cuMemSetAccess");
  p_gran = (PFN_cuMemGetAllocationGranularity_v10020)entry("cuMemGetAllocationGranularity");

  cudaDeviceProp props;
  CK_RT(cudaGetDeviceProperties(&props, dev));
  int vmm = 0;
  PFN_cuDeviceGetAttribute_v2000 p_attr =
      (PFN_cuDeviceGetAttribute_v2000)entry("cuDeviceGetAttribute");
  CK_DRV(p_attr(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev));
  if (!vmm) {
    fprintf(stderr, "vmm_chunks: %s does not support virtual memory management: skipped\n",
            props.name);
    return 77;
  }
  CUmemAllocationProp prop;
  CUmemAccessDesc acc;
  device_memory(dev, &prop, &acc);
  size_t gran = 0, rec = 0;
  CK_DRV(p_gran(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  CK_DRV(p_gran(&rec, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
  int drv = 0;
  CK_RT(cudaDriverGetVersion(&drv));
  printf("# vmm_chunks on %s (driver %d), granularity %zu KiB (recommended %zu KiB), "
         "median of %d\n\n", props.name, drv, gran >> 10, rec >> 10, reps);

  /* Warm-up: the first VMM calls of a process load driver state. */
  CUmemGenericAllocationHandle *h = (CUmemGenericAllocationHandle *)malloc(
      sizeof *h * (size_t)max_run);
  run_times_t warm;
  one_run(dev, gran, 1, h, &warm);

  printf("| chunks | reserve | create | map+access (new) | unmap (each) | map+access (pooled) | "
         "unmap (one call) | release | address free |\n");
  printf("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n");
  const int runs[] = {1, 8, 64, 512};
  double *v = (double *)malloc(sizeof *v * 8 * (size_t)reps);
  for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
    int n = runs[r];
    if (n > max_run) break;
    run_times_t *t = (run_times_t *)calloc((size_t)reps, sizeof *t);
    for (int k = 0; k < reps; k++) one_run(dev, gran, n, h, &t[k]);
    /* Per chunk, except reserve and address free, which are one call per run. */
    double med[8];
    for (int f = 0; f < 8; f++) {
      for (int k = 0; k < reps; k++) v[k] = ((double *)&t[k])[f];
      med[f] = median(v, reps);
    }
    char whole[32];
    if (med[6] < 0) snprintf(whole, sizeof whole, "refused");
    else snprintf(whole, sizeof whole, "%.1f us/chunk", med[6] / n);
    printf("| %d | %.1f us | %.1f us/chunk | %.1f us/chunk | %.1f us/chunk | %.1f us/chunk | "
           "%s | %.1f us/chunk | %.1f us |\n",
           n, med[0], med[2] / n, med[3] / n, med[5] / n, med[4] / n, whole, med[7] / n, med[1]);
    free(t);
  }
  free(v);
  free(h);

  /* Stall test. */
  cudaStream_t s;
  CK_RT(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  int *sink;
  CK_RT(cudaMalloc((void **)&sink, sizeof *sink));
  int khz = 0;
  CK_RT(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, dev));
  long long cycles = (long long)khz * stall_ms;
  size_t copy_bytes = (size_t)1 << 30;
  void *dsrc = NULL, *hdst = NULL;
  CK_RT(cudaMalloc(&dsrc, copy_bytes));
  CK_RT(cudaMallocHost(&hdst, copy_bytes));
  printf("\n| other stream's work | alone | while 64 chunks are unmapped and mapped | "
         "one unmap, device idle | one unmap, device busy |\n");
  printf("| --- | ---: | ---: | ---: | ---: |\n");
  const char *what[2] = {"spin kernel", "1 GiB D2H copy"};
  for (int w = 0; w < 2; w++) {
    double alone[64], busy[64], idle_u[64], busy_u[64], idle_max[64], busy_max[64];
    int sreps = reps < 64 ? reps : 64;
    for (int k = 0; k < sreps; k++) {
      alone[k] = stall_once(dev, gran, s, w, 0, cycles, dsrc, hdst, copy_bytes, sink, &idle_u[k],
                            &idle_max[k]);
      busy[k] = stall_once(dev, gran, s, w, 1, cycles, dsrc, hdst, copy_bytes, sink, &busy_u[k],
                           &busy_max[k]);
    }
    printf("| %s | %.2f ms | %.2f ms | %.1f us (max %.1f) | %.1f us (max %.1f) |\n", what[w],
           median(alone, sreps), median(busy, sreps), median(idle_u, sreps),
           median(idle_max, sreps), median(busy_u, sreps), median(busy_max, sreps));
  }
  printf("\nAn unmap that waits for the other stream shows as 'device busy' near the work's "
         "length; a stall of other streams shows as 'while ... unmapped' above 'alone'.\n");

  /* Larger physical allocations: one cuMemCreate / cuMemMap / cuMemSetAccess each. */
  printf("\n| one allocation | other stream | create | map+access | unmap | release | "
         "map+access per 2 MiB |\n");
  printf("| ---: | --- | ---: | ---: | ---: | ---: | ---: |\n");
  const size_t sizes_mib[] = {2, 8, 32, 128, 512};
  for (size_t z = 0; z < sizeof sizes_mib / sizeof sizes_mib[0]; z++) {
    size_t bytes = (sizes_mib[z] << 20) < gran ? gran : sizes_mib[z] << 20;
    for (int busy = 0; busy < 2; busy++) {
      double c[64], m[64], u[64], r[64];
      int sreps = reps < 64 ? reps : 64, late = 0;
      for (int k = 0; k < sreps; k++) {
        alloc_times_t t;
        alloc_once(dev, gran, bytes, busy, s, dsrc, hdst, copy_bytes, &t);
        c[k] = t.create;
        m[k] = t.map_access;
        u[k] = t.unmap;
        r[k] = t.release;
        late += busy && !t.overlapped;
      }
      double mm = median(m, sreps);
      printf("| %zu MiB | %s | %.1f us | %.1f us | %.1f us | %.1f us | %.2f us |\n", bytes >> 20,
             busy ? (late ? "D2H copy (ended early)" : "D2H copy") : "idle", median(c, sreps), mm,
             median(u, sreps), median(r, sreps), mm / (double)(bytes / ((size_t)2 << 20)));
    }
  }

  printf("\n| 16 chunks mapped while | first map | first access | later map (median) | "
         "later access (median) |\n");
  printf("| --- | ---: | ---: | ---: | ---: |\n");
  const struct { const char *name; cudaMemcpyKind kind; size_t bytes; } loads[] = {
      {"nothing runs", cudaMemcpyDeviceToHost, 0},
      {"a 1 GiB D2H copy runs", cudaMemcpyDeviceToHost, copy_bytes},
      {"a 1 GiB H2D copy runs", cudaMemcpyHostToDevice, copy_bytes},
  };
  for (size_t l = 0; l < sizeof loads / sizeof loads[0]; l++) {
    double f0[64], f1[64], r0[64], r1[64];
    int sreps = reps < 64 ? reps : 64, early = 0;
    for (int k = 0; k < sreps; k++) {
      double f[2], r[2];
      int e;
      maps_under_copy(dev, gran, s, loads[l].kind, dsrc, hdst, loads[l].bytes, f, r, &e);
      f0[k] = f[0], f1[k] = f[1], r0[k] = r[0], r1[k] = r[1];
      early += loads[l].bytes && e;
    }
    printf("| %s%s | %.1f us | %.1f us | %.1f us | %.1f us |\n", loads[l].name,
           early ? " (ended early)" : "", median(f0, sreps), median(f1, sreps),
           median(r0, sreps), median(r1, sreps));
  }
  CK_RT(cudaFree(dsrc));
  CK_RT(cudaFreeHost(hdst));
  CK_RT(cudaFree(sink));
  CK_RT(cudaStreamDestroy(s));
  return 0;
}
