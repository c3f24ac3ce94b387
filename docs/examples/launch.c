/* SPDX-License-Identifier: Apache-2.0 */
/* launch.c: Spillway's C launch wrappers, end to end.
 *
 * Sixteen vectors of 4 MiB (64 MiB) live under a 24 MiB device budget, so most of them are
 * spilled at any moment. Step i computes v[i] += 2 * v[i-1] with spw_launch_kernel, which
 * brings both vectors back, locks them for the kernel (v[i-1] read-only), passes their device
 * pointers, and releases them once the kernel has run, without blocking. Writing the initial
 * values and reading the results uses spw_lock_and_launch, whose function enqueues copies.
 *
 * On the CUDA backend the kernel is axpy_kernel.cu's. On the host backend (no GPU) there are
 * no kernels: spw_launch_kernel runs a host function with the same arguments on the stream's
 * worker thread, so this program runs, and checks its results, everywhere.
 *
 *   ./example_launch_c              # SPILLWAY_BACKEND=host|cuda to choose
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <spillway/spillway.h>

#define VECTORS 16
#define N ((uint64_t)1 << 20) /* floats per vector */

#ifdef EXAMPLE_HAVE_CUDA
const void *example_axpy_kernel(void); /* axpy_kernel.cu */
#endif

/* The host backend's stand-in for the kernel: the same arguments, by pointer. */
static void axpy_host(void **args) {
  float *y = *(float **)args[0];
  const float *x = *(const float **)args[1];
  float a = *(const float *)args[2];
  uint64_t n = *(const uint64_t *)args[3];
  for (uint64_t i = 0; i < n; i++) y[i] += a * x[i];
}

/* A launch function: copies between the host array in `user` and the buffer. */
typedef struct copy {
  spw_runtime_t *rt;
  float *host;
  int to_device;
} copy_t;

static int copy_fn(void *user, void *const *dptrs, spw_stream_t stream) {
  copy_t *c = user;
  void *dst = c->to_device ? dptrs[0] : (void *)c->host;
  const void *src = c->to_device ? (const void *)c->host : dptrs[0];
  return spw_memcpy_async(c->rt, dst, src, N * sizeof(float), stream);
}

static int fail(spw_runtime_t *rt, const char *what, int st) {
  fprintf(stderr, "%s: %s: %s\n", what, spw_err_name(st), spw_last_error(rt));
  return 1;
}

int main(void) {
  spw_config_t cfg = SPW_CONFIG_INIT;
  cfg.device_limit = 24u << 20;
  spw_runtime_t *rt;
  int st = spw_runtime_create(&cfg, &rt);
  if (st == SPW_ERR_NO_DEVICE) {
    printf("skipped: SPILLWAY_BACKEND=cuda and no CUDA device\n");
    return 77;
  }
  if (st != SPW_OK) return fail(NULL, "spw_runtime_create", st);
  spw_backend_kind_t kind;
  spw_runtime_backend(rt, &kind);
  const void *axpy = spw_host_kernel(axpy_host);
#ifdef EXAMPLE_HAVE_CUDA
  if (kind == SPW_BACKEND_CUDA) axpy = example_axpy_kernel();
#endif
  if (!axpy) return fail(rt, "example_axpy_kernel", SPW_ERR_CUDA);

  spw_stream_t s;
  spw_buf_t v[VECTORS];
  float *host = malloc(N * sizeof *host);
  if (!host) return 1;
  if ((st = spw_stream_create(rt, &s)) != SPW_OK) return fail(rt, "spw_stream_create", st);

  /* v[k][j] = k. SPW_LAUNCH_BLOCK: `host` is rewritten for the next vector right after. */
  copy_t up = {rt, host, 1};
  for (int k = 0; k < VECTORS; k++) {
    if ((st = spw_alloc(rt, N * sizeof(float), s, &v[k])) != SPW_OK) return fail(rt, "alloc", st);
    for (uint64_t j = 0; j < N; j++) host[j] = (float)k;
    spw_buf_arg_t arg = spw_buf_arg(v[k], 0, 0);
    st = spw_lock_and_launch(rt, &arg, 1, s, SPW_LAUNCH_BLOCK, copy_fn, &up);
    if (st != SPW_OK) return fail(rt, "write", st);
  }

  /* v[i] += 2 * v[i-1], one kernel per step, each step's buffers locked only for its kernel. */
  float a = 2.0f;
  uint64_t n = N;
  for (int i = 1; i < VECTORS; i++) {
    spw_kernel_arg_t args[4] = {
        spw_karg_buf(v[i], 0, 0),                    /* y: written */
        spw_karg_buf(v[i - 1], 0, SPW_ACQUIRE_READ), /* x: read-only, a clean copy survives */
        SPW_KARG(a), SPW_KARG(n)};
    st = spw_launch_kernel(rt, axpy, spw_dim3((unsigned)((N + 255) / 256), 1, 1),
                           spw_dim3(256, 1, 1), args, 4, 0, s, 0);
    if (st != SPW_OK) return fail(rt, "spw_launch_kernel", st);
  }

  /* Read back and check: v[0] = 0, v[i] = i + 2 * v[i-1]. */
  copy_t down = {rt, host, 0};
  float want = 0.0f;
  for (int k = 0; k < VECTORS; k++) {
    want = k == 0 ? 0.0f : (float)k + 2.0f * want;
    spw_buf_arg_t arg = spw_buf_arg(v[k], 0, SPW_ACQUIRE_READ);
    st = spw_lock_and_launch(rt, &arg, 1, s, SPW_LAUNCH_BLOCK, copy_fn, &down);
    if (st != SPW_OK) return fail(rt, "read", st);
    for (uint64_t j = 0; j < N; j++) {
      if (host[j] != want) {
        fprintf(stderr, "v[%d][%llu] = %g, expected %g\n", k, (unsigned long long)j, host[j],
                want);
        return 1;
      }
    }
  }

  char line[512];
  spw_stats_summary(rt, line, sizeof line);
  printf("ok (%s backend): %s\n", kind == SPW_BACKEND_CUDA ? "cuda" : "host", line);
  for (int k = 0; k < VECTORS; k++) spw_free(rt, v[k]);
  free(host);
  st = spw_runtime_destroy(rt);
  return st == SPW_OK ? 0 : fail(NULL, "spw_runtime_destroy", st);
}
