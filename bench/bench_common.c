/* SPDX-License-Identifier: Apache-2.0 */
/* What the benchmarks share (contract in bench_common.h): options, the backend choice, the
 * raw ceilings (device memory, pinned memory, copy streams outside Spillway), the pattern
 * fill and check of Spillway buffers, and the two-thread runner.
 *
 * On cuda every raw function first makes env->device current on the calling thread, since
 * the runner's threads start on device 0. On host, raw copies are memcpy on the calling
 * thread: the host backend's streams are threads doing exactly that, so memcpy is the
 * ceiling the emulation can reach. */
#include "bench_common.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "bench_kernels.h"

#ifdef SPW_BENCH_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

/* ---- options ---------------------------------------------------------------------------- */

/* The value of option `name`: the last --name=VALUE in argv, else SPW_BENCH_NAME. */
static const char *opt_value(int argc, char **argv, const char *name) {
  size_t n = strlen(name);
  const char *v = NULL;
  for (int i = 1; i < argc; i++)
    if (strncmp(argv[i], "--", 2) == 0 && strncmp(argv[i] + 2, name, n) == 0 &&
        argv[i][2 + n] == '=')
      v = argv[i] + 3 + n;
  if (v) return v;
  char env[96] = "SPW_BENCH_";
  size_t k = strlen(env);
  for (size_t i = 0; name[i] && k + 1 < sizeof env; i++)
    env[k++] = name[i] == '-' ? '_' : (char)toupper((unsigned char)name[i]);
  env[k] = '\0';
  v = getenv(env);
  return v && *v ? v : NULL;
}

/* Sizes as the runtime reads its own (spw_parse_size), more than zero. */
static int parse_size(const char *s, uint64_t *out) {
  uint64_t v;
  if (spw_parse_size(s, &v) != SPW_OK || v == 0) return SPW_ERR_INVALID_ARG;
  *out = v;
  return SPW_OK;
}

static int bad_option(const char *name, const char *value, const char *expected) {
  fprintf(stderr, "option %s='%s': expected %s\n", name, value, expected);
  return SPW_ERR_INVALID_ARG;
}

int bench_opt_size(int argc, char **argv, const char *name, uint64_t def, uint64_t *out) {
  const char *v = opt_value(argc, argv, name);
  if (!v) {
    *out = def;
    return SPW_OK;
  }
  if (parse_size(v, out) != SPW_OK) return bad_option(name, v, "a size such as 4096, 64KiB, 1GiB");
  return SPW_OK;
}

int bench_opt_size_or_zero(int argc, char **argv, const char *name, uint64_t def,
                           uint64_t *out) {
  const char *v = opt_value(argc, argv, name);
  uint64_t z;
  if (v && spw_parse_size(v, &z) == SPW_OK && z == 0) {
    *out = 0;
    return SPW_OK;
  }
  return bench_opt_size(argc, argv, name, def, out);
}

/* Splits a comma-separated option into entries parsed by `one`. */
static int parse_list(const char *name, const char *v, int (*one)(const char *, uint64_t *),
                      const char *expected, uint64_t *out, size_t *n) {
  char tmp[512];
  if (strlen(v) >= sizeof tmp) return bad_option(name, v, "a shorter list");
  strcpy(tmp, v);
  size_t k = 0;
  char *save = NULL;
  for (char *tok = strtok_r(tmp, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    if (k == BENCH_MAX_LIST) return bad_option(name, v, "at most 32 entries");
    if (one(tok, &out[k]) != SPW_OK) return bad_option(name, v, expected);
    k++;
  }
  if (k == 0) return bad_option(name, v, "at least one entry");
  *n = k;
  return SPW_OK;
}

static int parse_uint(const char *v, uint64_t *out) {
  char *end = NULL;
  errno = 0;
  unsigned long long x = strtoull(v, &end, 10);
  if (end == v || *end != '\0' || errno != 0 || v[0] == '-') return SPW_ERR_INVALID_ARG;
  *out = x;
  return SPW_OK;
}

static int list_opt(int argc, char **argv, const char *name, const uint64_t *def, size_t ndef,
                    int (*one)(const char *, uint64_t *), const char *expected, uint64_t *out,
                    size_t *n) {
  const char *v = opt_value(argc, argv, name);
  if (v) return parse_list(name, v, one, expected, out, n);
  if (ndef > BENCH_MAX_LIST) ndef = BENCH_MAX_LIST;
  memcpy(out, def, ndef * sizeof *out);
  *n = ndef;
  return SPW_OK;
}

int bench_opt_size_list(int argc, char **argv, const char *name, const uint64_t *def,
                        size_t ndef, uint64_t *out, size_t *n) {
  return list_opt(argc, argv, name, def, ndef, parse_size,
                  "comma-separated sizes such as 4KiB,64KiB,1MiB", out, n);
}

int bench_opt_uint_list(int argc, char **argv, const char *name, const uint64_t *def,
                        size_t ndef, uint64_t *out, size_t *n) {
  return list_opt(argc, argv, name, def, ndef, parse_uint,
                  "comma-separated non-negative integers", out, n);
}

int bench_opt_uint(int argc, char **argv, const char *name, uint64_t def, uint64_t *out) {
  const char *v = opt_value(argc, argv, name);
  if (!v) {
    *out = def;
    return SPW_OK;
  }
  if (parse_uint(v, out) != SPW_OK) return bad_option(name, v, "a non-negative integer");
  return SPW_OK;
}

void bench_opt_str(int argc, char **argv, const char *name, const char *def, const char **out) {
  const char *v = opt_value(argc, argv, name);
  *out = v ? v : def;
}

int bench_opt_check(int argc, char **argv, const char *const *known) {
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    const char *eq = strchr(a, '=');
    int ok = 0;
    if (strncmp(a, "--", 2) == 0 && eq) {
      size_t len = (size_t)(eq - a - 2);
      for (const char *const *k = known; *k && !ok; k++)
        ok = strlen(*k) == len && strncmp(a + 2, *k, len) == 0;
    }
    if (!ok) {
      fprintf(stderr, "unknown argument '%s'; options (--NAME=VALUE or SPW_BENCH_NAME):", a);
      for (const char *const *k = known; *k; k++) fprintf(stderr, " %s", *k);
      fprintf(stderr, "\n");
      return SPW_ERR_INVALID_ARG;
    }
  }
  return SPW_OK;
}

/* ---- environment ------------------------------------------------------------------------ */

#ifdef SPW_BENCH_HAVE_CUDA
static int cuda_fail(const char *what, cudaError_t e) {
  fprintf(stderr, "%s: %s: %s\n", what, cudaGetErrorName(e), cudaGetErrorString(e));
  return SPW_ERR_CUDA;
}

static int use_device(const bench_env_t *env) {
  cudaError_t e = cudaSetDevice(env->device);
  return e == cudaSuccess ? SPW_OK : cuda_fail("cudaSetDevice", e);
}
#endif

int bench_env_init(bench_env_t *env) {
  memset(env, 0, sizeof *env);
  const char *b = getenv("SPILLWAY_BACKEND");
  const char *d = getenv("SPILLWAY_DEVICE");
  if (d && *d) {
    char *end = NULL;
    long v = strtol(d, &end, 10);
    if (*end != '\0' || v < 0 || v > 1024) return bad_option("SPILLWAY_DEVICE", d, "an ordinal");
    env->device = (int)v;
  }
  int want_host = b && strcasecmp(b, "host") == 0;
  int want_cuda = b && strcasecmp(b, "cuda") == 0;
  env->kind = SPW_BACKEND_HOST;
  snprintf(env->device_name, sizeof env->device_name, "host");
  if (want_host) return SPW_OK;
#ifdef SPW_BENCH_HAVE_CUDA
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n <= env->device) {
    (void)cudaGetLastError();
    if (want_cuda) {
      fprintf(stderr, "SPILLWAY_BACKEND=cuda but no CUDA device %d (%s)\n", env->device,
              e != cudaSuccess ? cudaGetErrorName(e) : "too few devices");
      return SPW_ERR_NO_DEVICE;
    }
    return SPW_OK;
  }
  env->kind = SPW_BACKEND_CUDA;
  int st = use_device(env);
  if (st != SPW_OK) return st;
  struct cudaDeviceProp prop;
  e = cudaGetDeviceProperties(&prop, env->device);
  if (e != cudaSuccess) return cuda_fail("cudaGetDeviceProperties", e);
  snprintf(env->device_name, sizeof env->device_name, "%s", prop.name);
  return SPW_OK;
#else
  if (want_cuda) {
    fprintf(stderr, "SPILLWAY_BACKEND=cuda but the benchmarks were built without CUDA\n");
    return SPW_ERR_NO_DEVICE;
  }
  return SPW_OK;
#endif
}

int bench_runtime_create(const bench_env_t *env, uint64_t device_limit, uint64_t host_limit,
                         const char *spill_dir, spw_runtime_t **out) {
  spw_config_t cfg = SPW_CONFIG_INIT;
  cfg.backend = env->kind;
  cfg.device = env->device;
  cfg.device_limit = device_limit;
  cfg.host_limit = host_limit;
  cfg.spill_dir = spill_dir;
  /* The emulated device must hold the budget, plus room for what is queued to be freed. */
  if (env->kind == SPW_BACKEND_HOST && device_limit > 0)
    cfg.host_device_bytes = device_limit + device_limit / 4 + 64 * BENCH_MIB;
  int st = spw_runtime_create(&cfg, out);
  if (st != SPW_OK) {
    char msg[512] = "";
    spw_config_validate(&cfg, msg, sizeof msg);
    fprintf(stderr, "spw_runtime_create: %s %s\n", spw_err_name(st), msg);
  }
  return st;
}

double bench_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double bench_gbs(uint64_t bytes, double seconds) {
  return seconds > 0 ? (double)bytes / seconds / 1e9 : 0.0;
}

void bench_fmt_size(uint64_t bytes, char *buf, size_t len) {
  static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  double v = (double)bytes;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    u++;
  }
  if (v == floor(v)) snprintf(buf, len, "%.0f %s", v, units[u]);
  else snprintf(buf, len, "%.2f %s", v, units[u]);
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

double bench_median(double *v, size_t n) {
  if (n == 0) return 0;
  qsort(v, n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

int bench_fail(spw_runtime_t *rt, const char *what, int st) {
  const char *detail = rt ? spw_last_error(rt) : "";
  fprintf(stderr, "%s: %s%s%s%s\n", what, spw_err_name(st), *detail ? " (" : "", detail,
          *detail ? ")" : "");
  return st;
}

int bench_get_stats(spw_runtime_t *rt, spw_stats_t *out) {
  memset(out, 0, sizeof *out);
  out->struct_size = sizeof *out;
  int st = spw_get_stats(rt, out);
  return st != SPW_OK ? bench_fail(rt, "spw_get_stats", st) : SPW_OK;
}

size_t bench_count_not_in(spw_runtime_t *rt, const spw_buf_t *b, size_t n, spw_state_t want) {
  size_t off = 0;
  for (size_t i = 0; i < n; i++) {
    spw_state_t st;
    if (spw_buf_state(rt, b[i], &st) != SPW_OK || st != want) off++;
  }
  return off;
}

/* ---- raw side --------------------------------------------------------------------------- */

static size_t page_round(size_t bytes) {
  long pg = sysconf(_SC_PAGESIZE);
  size_t p = pg > 0 ? (size_t)pg : 4096;
  return (bytes + p - 1) / p * p;
}

int bench_dev_alloc(const bench_env_t *env, size_t bytes, void **out) {
#ifdef SPW_BENCH_HAVE_CUDA
  if (env->kind == SPW_BACKEND_CUDA) {
    int st = use_device(env);
    if (st != SPW_OK) return st;
    cudaError_t e = cudaMalloc(out, bytes);
    return e == cudaSuccess ? SPW_OK : cuda_fail("cudaMalloc", e);
  }
#endif
  (void)env;
  void *p = aligned_alloc(4096, page_round(bytes));
  if (!p) {
    fprintf(stderr, "aligned_alloc of %zu bytes failed\n", bytes);
    return SPW_ERR_SYSTEM;
  }
  memset(p, 0, bytes); /* as device memory would be touched by first use: not in a timing */
  *out = p;
  return SPW_OK;
}

void bench_dev_free(const bench_env_t *env, void *p) {
  if (!p) return;
#ifdef SPW_BENCH_HAVE_CUDA
  if (env->kind == SPW_BACKEND_CUDA) {
    if (use_device(env) == SPW_OK) {
      cudaError_t e = cudaFree(p);
      if (e != cudaSuccess) cuda_fail("cudaFree", e);
    }
    return;
  }
#endif
  (void)env;
  free(p);
}

int bench_pinned_alloc(const bench_env_t *env, size_t bytes, void **out) {
  size_t len = page_round(bytes);
  void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    fprintf(stderr, "mmap of %zu bytes failed: %s\n", len, strerror(errno));
    return SPW_ERR_SYSTEM;
  }
  memset(p, 0, len); /* touched before registering: registration is then ~20x faster */
#ifdef SPW_BENCH_HAVE_CUDA
  if (env->kind == SPW_BACKEND_CUDA) {
    int st = use_device(env);
    cudaError_t e = st == SPW_OK ? cudaHostRegister(p, len, cudaHostRegisterPortable) : cudaSuccess;
    if (st != SPW_OK || e != cudaSuccess) {
      munmap(p, len);
      return st != SPW_OK ? st : cuda_fail("cudaHostRegister", e);
    }
  }
#endif
  (void)env;
  *out = p;
  return SPW_OK;
}

void bench_pinned_free(const bench_env_t *env, void *p, size_t bytes) {
  if (!p) return;
#ifdef SPW_BENCH_HAVE_CUDA
  if (env->kind == SPW_BACKEND_CUDA && use_device(env) == SPW_OK) {
    cudaError_t e = cudaHostUnregister(p);
    if (e != cudaSuccess) cuda_fail("cudaHostUnregister", e);
  }
#endif
  (void)env;
  munmap(p, page_round(bytes));
}

int bench_rstream_create(const bench_env_t *env, bench_rstream_t *out) {
  out->s = NULL;
#ifdef SPW_BENCH_HAVE_CUDA
  if (env->kind == SPW_BACKEND_CUDA) {
    int st = use_device(env);
    if (st != SPW_OK) return st;
    cudaStream_t s;
    cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    if (e != cudaSuccess) return cuda_fail("cudaStreamCreateWithFlags", e);
    out->s = s;
  }
#endif
  (void)env;
  return SPW_OK;
}

void bench_rstream_destroy(const bench_env_t *env, bench_rstream_t *rs) {
#ifdef SPW_BENCH_HAVE_CUDA
  if (env->kind == SPW_BACKEND_CUDA && rs->s && use_device(env) == SPW_OK) {
    cudaError_t e = cudaStreamDestroy((cudaStream_t)rs->s);
    if (e != cudaSuccess) cuda_fail("cudaStreamDestroy", e);
  }
#endif
  (void)env;
  rs->s = NULL;
}

int bench_rstream_sync(const bench_env_t *env, bench_rstream_t *rs) {
#ifdef SPW_BENCH_HAVE_CUDA
  if (env->kind == SPW_BACKEND_CUDA) {
    int st = use_device(env);
    if (st != SPW_OK) return st;
    cudaError_t e = cudaStreamSynchronize((cudaStream_t)rs->s);
    return e == cudaSuccess ? SPW_OK : cuda_fail("cudaStreamSynchronize", e);
  }
#endif
  (void)env;
  (void)rs;
  return SPW_OK;
}

int bench_raw_copies(const bench_env_t *env, bench_rstream_t *rs, void *dst, const void *src,
                     size_t piece, size_t count) {
#ifdef SPW_BENCH_HAVE_CUDA
  if (env->kind == SPW_BACKEND_CUDA) {
    int st = use_device(env);
    if (st != SPW_OK) return st;
    for (size_t i = 0; i < count; i++) {
      cudaError_t e = cudaMemcpyAsync((char *)dst + i * piece, (const char *)src + i * piece,
                                      piece, cudaMemcpyDefault, (cudaStream_t)rs->s);
      if (e != cudaSuccess) return cuda_fail("cudaMemcpyAsync", e);
    }
    return SPW_OK;
  }
#endif
  (void)env;
  (void)rs;
  for (size_t i = 0; i < count; i++)
    memcpy((char *)dst + i * piece, (const char *)src + i * piece, piece);
  return SPW_OK;
}

int bench_raw_copy_gbs(const bench_env_t *env, bench_rstream_t *rs, void *dst, const void *src,
                       size_t piece, size_t count, unsigned reps, double *gbs) {
  double t[16];
  if (reps == 0) reps = 1;
  if (reps > 16) reps = 16;
  int st = SPW_OK;
  for (unsigned r = 0; r <= reps && st == SPW_OK; r++) { /* r == 0: warm-up, untimed */
    double t0 = bench_now();
    st = bench_raw_copies(env, rs, dst, src, piece, count);
    if (st == SPW_OK) st = bench_rstream_sync(env, rs);
    if (r > 0) t[r - 1] = bench_now() - t0;
  }
  if (st != SPW_OK) return st;
  *gbs = bench_gbs((uint64_t)piece * count, bench_median(t, reps));
  return SPW_OK;
}

int bench_other_device(const bench_env_t *env) {
  int n = 1;
#ifdef SPW_BENCH_HAVE_CUDA
  if (env->kind == SPW_BACKEND_CUDA && cudaGetDeviceCount(&n) != cudaSuccess) n = 1;
#endif
  return n > 1 ? (env->device == 0 ? 1 : 0) : env->device;
}

/* ---- raw copies between two devices ------------------------------------------------------ */

#ifdef SPW_BENCH_HAVE_CUDA
static int cuda_peer_fail(const char *what, cudaError_t e) {
  fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
  return SPW_ERR_CUDA;
}

/* `count` cudaMemcpyPeerAsync of `piece` bytes, timed with events on a stream of the
 * source device; median of reps. */
static int cuda_peer_gbs(int ddev, void *dst, int sdev, const void *src, size_t piece,
                         size_t count, unsigned reps, double *gbs) {
  cudaStream_t st;
  cudaEvent_t a, b;
  cudaError_t e = cudaSetDevice(sdev);
  if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
  if (e != cudaSuccess) return cuda_peer_fail("raw peer stream", e);
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  double t[16];
  for (unsigned r = 0; r <= reps && e == cudaSuccess; r++) { /* r == 0: warm-up, untimed */
    e = cudaEventRecord(a, st);
    for (size_t i = 0; i < count && e == cudaSuccess; i++)
      e = cudaMemcpyPeerAsync((char *)dst + i * piece, ddev, (const char *)src + i * piece, sdev,
                              piece, st);
    if (e == cudaSuccess) e = cudaEventRecord(b, st);
    if (e == cudaSuccess) e = cudaEventSynchronize(b);
    float ms = 0;
    if (e == cudaSuccess) e = cudaEventElapsedTime(&ms, a, b);
    if (r > 0) t[r - 1] = ms / 1e3;
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaStreamDestroy(st);
  if (e != cudaSuccess) return cuda_peer_fail("cudaMemcpyPeerAsync", e);
  *gbs = bench_gbs((uint64_t)piece * count, bench_median(t, reps));
  return SPW_OK;
}

/* Peer access from `dev` to `peer`'s memory, as a runtime lending between them turns on:
 * without it cudaMemcpyPeerAsync is staged through the host (38 GB/s instead of 394 on an
 * H200 pair). Already on (a runtime did it) is fine. */
static void enable_peer_access(int dev, int peer) {
  int can = 0;
  if (dev == peer || cudaDeviceCanAccessPeer(&can, dev, peer) != cudaSuccess || !can) return;
  if (cudaSetDevice(dev) == cudaSuccess &&
      cudaDeviceEnablePeerAccess(peer, 0) == cudaErrorPeerAccessAlreadyEnabled)
    (void)cudaGetLastError();
}

static int cuda_region(int dev, size_t bytes, void **out) {
  cudaError_t e = cudaSetDevice(dev);
  if (e == cudaSuccess) e = cudaMalloc(out, bytes);
  return e == cudaSuccess ? SPW_OK : cuda_peer_fail("cudaMalloc (raw peer region)", e);
}
#endif

int bench_raw_peer_gbs(const bench_env_t *env, int dev_a, int dev_b, size_t piece, size_t count,
                       unsigned reps, double *a_to_b, double *b_to_a) {
  if (reps == 0) reps = 1;
  if (reps > 16) reps = 16;
  size_t bytes = piece * count;
#ifdef SPW_BENCH_HAVE_CUDA
  if (env->kind == SPW_BACKEND_CUDA) {
    enable_peer_access(dev_a, dev_b);
    enable_peer_access(dev_b, dev_a);
    void *a = NULL, *b = NULL;
    int st = cuda_region(dev_a, bytes, &a);
    if (st == SPW_OK) st = cuda_region(dev_b, bytes, &b);
    if (st == SPW_OK) st = cuda_peer_gbs(dev_b, b, dev_a, a, piece, count, reps, a_to_b);
    if (st == SPW_OK) st = cuda_peer_gbs(dev_a, a, dev_b, b, piece, count, reps, b_to_a);
    cudaFree(a);
    cudaFree(b);
    cudaSetDevice(env->device);
    return st;
  }
#endif
  (void)dev_a;
  (void)dev_b;
  void *a = NULL, *b = NULL;
  bench_rstream_t rs = {0};
  int st = bench_dev_alloc(env, bytes, &a);
  if (st == SPW_OK) st = bench_dev_alloc(env, bytes, &b);
  if (st == SPW_OK) st = bench_rstream_create(env, &rs);
  if (st == SPW_OK) st = bench_raw_copy_gbs(env, &rs, b, a, piece, count, reps, a_to_b);
  if (st == SPW_OK) st = bench_raw_copy_gbs(env, &rs, a, b, piece, count, reps, b_to_a);
  bench_rstream_destroy(env, &rs);
  bench_dev_free(env, a);
  bench_dev_free(env, b);
  return st;
}

/* ---- two threads at once ---------------------------------------------------------------- */

typedef struct pair_side {
  bench_task_fn fn;
  void *arg;
  pthread_barrier_t *go;
  double start, end;
  int status;
} pair_side_t;

static void *pair_main(void *p) {
  pair_side_t *s = p;
  pthread_barrier_wait(s->go);
  s->start = bench_now();
  s->status = s->fn(s->arg);
  s->end = bench_now();
  return NULL;
}

int bench_run_pair(bench_task_fn a, void *arg_a, bench_task_fn b, void *arg_b,
                   double *seconds) {
  pthread_barrier_t go;
  if (pthread_barrier_init(&go, NULL, 2) != 0) return SPW_ERR_SYSTEM;
  pair_side_t side[2] = {{a, arg_a, &go, 0, 0, SPW_OK}, {b, arg_b, &go, 0, 0, SPW_OK}};
  pthread_t t[2];
  if (pthread_create(&t[0], NULL, pair_main, &side[0]) != 0) {
    pthread_barrier_destroy(&go);
    return SPW_ERR_SYSTEM;
  }
  if (pthread_create(&t[1], NULL, pair_main, &side[1]) != 0) {
    /* The first thread waits at the barrier for a partner: be it, on this thread. */
    pair_main(&side[1]);
    pthread_join(t[0], NULL);
    pthread_barrier_destroy(&go);
    return SPW_ERR_SYSTEM;
  }
  pthread_join(t[0], NULL);
  pthread_join(t[1], NULL);
  pthread_barrier_destroy(&go);
  double start = side[0].start < side[1].start ? side[0].start : side[1].start;
  double end = side[0].end > side[1].end ? side[0].end : side[1].end;
  *seconds = end - start;
  return side[0].status != SPW_OK ? side[0].status : side[1].status;
}

typedef struct raw_dir_task {
  const bench_env_t *env;
  bench_rstream_t rs;
  void *dst;
  const void *src;
  size_t piece, count;
} raw_dir_task_t;

static int raw_dir_run(void *p) {
  raw_dir_task_t *t = p;
  int st = bench_raw_copies(t->env, &t->rs, t->dst, t->src, t->piece, t->count);
  return st == SPW_OK ? bench_rstream_sync(t->env, &t->rs) : st;
}

int bench_raw_duplex_gbs(const bench_env_t *env, void *dev, void *host, size_t piece,
                         size_t count, unsigned reps, double *gbs) {
  size_t half = piece * count;
  raw_dir_task_t down = {env, {NULL}, host, dev, piece, count};
  raw_dir_task_t up = {env, {NULL}, (char *)dev + half, (char *)host + half, piece, count};
  int st = bench_rstream_create(env, &down.rs);
  if (st == SPW_OK) st = bench_rstream_create(env, &up.rs);
  double t[16];
  if (reps == 0) reps = 1;
  if (reps > 16) reps = 16;
  for (unsigned r = 0; r <= reps && st == SPW_OK; r++) {
    double s = 0;
    st = bench_run_pair(raw_dir_run, &down, raw_dir_run, &up, &s);
    if (r > 0) t[r - 1] = s;
  }
  bench_rstream_destroy(env, &down.rs);
  bench_rstream_destroy(env, &up.rs);
  if (st != SPW_OK) return st;
  *gbs = bench_gbs(2 * (uint64_t)half, bench_median(t, reps));
  return SPW_OK;
}

/* ---- Spillway side ---------------------------------------------------------------------- */

typedef struct host_job {
  uint32_t *p;
  size_t words;
  uint32_t value; /* the seed (fill) or the addend (add) */
  int fill;
} host_job_t;

static void host_job_run(void *arg) {
  host_job_t *j = arg;
  if (j->fill)
    for (size_t i = 0; i < j->words; i++) j->p[i] = bench_pattern(j->value, i);
  else
    for (size_t i = 0; i < j->words; i++) j->p[i] += j->value;
  free(j);
}

static int enqueue_job(const bench_env_t *env, spw_runtime_t *rt, void *dptr, size_t bytes,
                       uint32_t value, int fill, spw_stream_t stream) {
  size_t words = bytes / sizeof(uint32_t);
#ifdef SPW_BENCH_HAVE_CUDA
  if (env->kind == SPW_BACKEND_CUDA) {
    int st = use_device(env);
    if (st != SPW_OK) return st;
    int e = fill ? bench_cuda_fill_u32(dptr, words, value, stream)
                 : bench_cuda_add_u32(dptr, words, value, stream);
    return e == 0 ? SPW_OK : cuda_fail(fill ? "fill kernel" : "add kernel", (cudaError_t)e);
  }
#endif
  (void)env;
  host_job_t *j = malloc(sizeof *j);
  if (!j) return SPW_ERR_SYSTEM;
  *j = (host_job_t){dptr, words, value, fill};
  int st = spw_launch_host_func(rt, stream, host_job_run, j);
  if (st != SPW_OK) {
    free(j);
    return bench_fail(rt, "spw_launch_host_func", st);
  }
  return SPW_OK;
}

int bench_fill(const bench_env_t *env, spw_runtime_t *rt, void *dptr, size_t bytes,
               uint32_t seed, spw_stream_t stream) {
  return enqueue_job(env, rt, dptr, bytes, seed, 1, stream);
}

int bench_add(const bench_env_t *env, spw_runtime_t *rt, void *dptr, size_t bytes,
              uint32_t add, spw_stream_t stream) {
  return enqueue_job(env, rt, dptr, bytes, add, 0, stream);
}

int bench_alloc_filled(const bench_env_t *env, spw_runtime_t *rt, size_t bytes, uint32_t seed,
                       spw_stream_t stream, spw_buf_t *out) {
  spw_buf_t b;
  int st = spw_alloc(rt, bytes, stream, &b);
  if (st != SPW_OK) return bench_fail(rt, "spw_alloc", st);
  void *d;
  st = spw_acquire(rt, b, stream, 0, &d);
  if (st != SPW_OK) {
    spw_free(rt, b);
    return bench_fail(rt, "spw_acquire", st);
  }
  st = bench_fill(env, rt, d, bytes, seed, stream);
  if (st != SPW_OK) {
    spw_free(rt, b); /* the lock is dropped with the stream's others at its synchronize */
    return st;
  }
  *out = b;
  return SPW_OK;
}

#define VERIFY_WHOLE_MAX (16 * BENCH_MIB)
#define VERIFY_WINDOW (4 * BENCH_MIB)

int bench_verify(spw_runtime_t *rt, spw_buf_t buf, size_t bytes, uint32_t seed, uint32_t add,
                 spw_stream_t stream, uint64_t *bad) {
  size_t off[3], len[3], nw;
  if (bytes <= VERIFY_WHOLE_MAX) {
    off[0] = 0;
    len[0] = bytes;
    nw = 1;
  } else {
    size_t mid = bytes / 2 / VERIFY_WINDOW * VERIFY_WINDOW;
    size_t last = (bytes - VERIFY_WINDOW) / sizeof(uint32_t) * sizeof(uint32_t);
    off[0] = 0;
    off[1] = mid;
    off[2] = last;
    len[0] = len[1] = len[2] = VERIFY_WINDOW;
    nw = 3;
  }
  size_t total = 0;
  for (size_t i = 0; i < nw; i++) total += len[i];
  uint32_t *h = malloc(total);
  if (!h) return SPW_ERR_SYSTEM;
  void *d;
  int st = spw_acquire(rt, buf, stream, SPW_ACQUIRE_READ, &d);
  if (st != SPW_OK) {
    free(h);
    return bench_fail(rt, "spw_acquire (verify)", st);
  }
  size_t at = 0;
  for (size_t i = 0; i < nw && st == SPW_OK; i++) {
    st = spw_memcpy_async(rt, (char *)h + at, (const char *)d + off[i], len[i], stream);
    at += len[i];
  }
  int sst = spw_stream_synchronize(rt, stream); /* waits for the copies, drops the lock */
  if (st != SPW_OK || sst != SPW_OK) {
    free(h);
    return bench_fail(rt, "verify copy", st != SPW_OK ? st : sst);
  }
  uint64_t wrong = 0;
  at = 0;
  for (size_t i = 0; i < nw; i++) {
    size_t first = off[i] / sizeof(uint32_t), n = len[i] / sizeof(uint32_t);
    for (size_t k = 0; k < n; k++) {
      uint32_t want = bench_pattern(seed, first + k) + add;
      uint32_t got = h[at + k];
      if (got != want && wrong++ == 0)
        fprintf(stderr, "verify: buffer %#llx word %zu: got %#x, expected %#x\n",
                (unsigned long long)buf, first + k, got, want);
    }
    at += n;
  }
  free(h);
  *bad = wrong;
  return SPW_OK;
}
