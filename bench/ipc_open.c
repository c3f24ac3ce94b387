/* SPDX-License-Identifier: Apache-2.0 */
/* ipc_open: what opening another process's buffer costs, by kind of handle.
 *
 * The parent makes a runtime with config.ipc on, and for each size an ordinary buffer (its
 * handle names a CUDA IPC region: cudaIpcOpenMemHandle underneath, the raw way) and an
 * address-stable one (its chunks' descriptors come over the exporter's socket, then are
 * imported and mapped), both filled and locked, and exports both. A child (this program
 * again) opens and closes each handle `reps` times, timing each call, checks the first
 * and last words of the memory once, and prints the medians. The ratio is stable / region.
 * Not a test: it asserts nothing about time.
 *
 *   ipc_open [--sizes=64KiB,2MiB,64MiB,1GiB] [--reps=20]
 * (the child gets the handle on its standard input: a handle is plain bytes)
 */
#include <inttypes.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_common.h"
#include "bench_kernels.h"

extern char **environ;

#define MAX_REPS 1000

/* ---- the child: opens and closes one handle, reps times --------------------------------- */

/* The handle, raw, from standard input (the parent writes it there). */
static int read_handle(spw_ipc_handle_t *h) {
  size_t got = 0;
  while (got < sizeof *h) {
    ssize_t r = read(0, (char *)h + got, sizeof *h - got);
    if (r <= 0) return -1;
    got += (size_t)r;
  }
  return 0;
}

/* Prints "open_us close_us ok|bad" for the handle on standard input. */
static int child(unsigned reps, uint32_t seed) {
  spw_ipc_handle_t h;
  if (read_handle(&h) != 0) return 2;
  bench_env_t env;
  spw_runtime_t *rt = NULL;
  if (bench_env_init(&env) != SPW_OK || bench_runtime_create(&env, 0, 0, NULL, &rt) != SPW_OK)
    return 2;
  spw_stream_t s;
  if (spw_stream_create(rt, &s) != SPW_OK) return 2;
  double open_s[MAX_REPS], close_s[MAX_REPS];
  int ok = 1;
  for (unsigned r = 0; r < reps; r++) {
    void *d = NULL;
    double t0 = bench_now();
    int st = spw_ipc_open(rt, &h, &d);
    double t1 = bench_now();
    if (st != SPW_OK) {
      bench_fail(rt, "spw_ipc_open", st);
      return 3;
    }
    if (r == 0) { /* the pattern's first and last words */
      uint32_t first = 0, last = 0;
      size_t n = (size_t)h.bytes / 4;
      st = spw_memcpy_async(rt, &first, d, 4, s);
      if (st == SPW_OK) st = spw_memcpy_async(rt, &last, (char *)d + 4 * (n - 1), 4, s);
      if (st == SPW_OK) st = spw_stream_synchronize(rt, s);
      ok = st == SPW_OK && first == bench_pattern(seed, 0) && last == bench_pattern(seed, n - 1);
    }
    double t2 = bench_now();
    st = spw_ipc_close(rt, d);
    double t3 = bench_now();
    if (st != SPW_OK) {
      bench_fail(rt, "spw_ipc_close", st);
      return 3;
    }
    open_s[r] = t1 - t0;
    close_s[r] = t3 - t2;
  }
  printf("%.2f %.2f %s\n", 1e6 * bench_median(open_s, reps), 1e6 * bench_median(close_s, reps),
         ok ? "ok" : "bad");
  spw_stream_destroy(rt, s);
  spw_runtime_destroy(rt);
  return 0;
}

/* ---- the parent ------------------------------------------------------------------------ */

/* Runs the child, hands it `h` on its standard input, and reads its line. */
static int run_child(const spw_ipc_handle_t *h, unsigned reps, uint32_t seed, double *open_us,
                     double *close_us, int *ok) {
  char r[16], sd[16];
  snprintf(r, sizeof r, "%u", reps);
  snprintf(sd, sizeof sd, "%u", seed);
  int in[2], out[2];
  if (pipe(in) != 0) return SPW_ERR_SYSTEM;
  if (pipe(out) != 0) {
    close(in[0]);
    close(in[1]);
    return SPW_ERR_SYSTEM;
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, in[0], 0);
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  posix_spawn_file_actions_addclose(&fa, in[1]);
  posix_spawn_file_actions_addclose(&fa, out[0]);
  char *argv[] = {"ipc_open", "--child", r, sd, NULL};
  pid_t pid;
  int e = posix_spawn(&pid, "/proc/self/exe", &fa, NULL, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  close(in[0]);
  close(out[1]);
  int wrote = e == 0 && write(in[1], h, sizeof *h) == (ssize_t)sizeof *h;
  close(in[1]);
  if (e != 0) {
    close(out[0]);
    return SPW_ERR_SYSTEM;
  }
  FILE *f = fdopen(out[0], "r");
  char word[8] = "";
  int got = f ? fscanf(f, "%lf %lf %7s", open_us, close_us, word) : 0;
  if (f) fclose(f);
  else close(out[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  *ok = strcmp(word, "ok") == 0;
  return wrote && got == 3 && WIFEXITED(status) && WEXITSTATUS(status) == 0 ? SPW_OK
                                                                           : SPW_ERR_INTERNAL;
}

/* A filled buffer of `bytes` (stable or not), locked on `keep`, and its handle. */
static int exported(const bench_env_t *env, spw_runtime_t *rt, spw_stream_t s,
                    spw_stream_t keep, size_t bytes, int stable, uint32_t seed, spw_buf_t *b,
                    spw_ipc_handle_t *h, double *export_us) {
  int st = spw_alloc_ex(rt, bytes, s, stable ? SPW_ALLOC_STABLE : SPW_ALLOC_MOVABLE, b);
  if (st != SPW_OK) return st;
  void *d = NULL;
  if ((st = spw_acquire(rt, *b, s, 0, &d)) != SPW_OK) return st;
  if ((st = bench_fill(env, rt, d, bytes, seed, s)) != SPW_OK) return st;
  /* The fill is done before anyone reads (the exporter's ordering, as for any CUDA IPC);
   * then `keep` holds the buffer in place until the end. */
  if ((st = spw_stream_synchronize(rt, s)) != SPW_OK) return st;
  if ((st = spw_acquire(rt, *b, keep, 0, &d)) != SPW_OK) return st;
  double t0 = bench_now();
  st = spw_ipc_export(rt, *b, h);
  *export_us = 1e6 * (bench_now() - t0);
  return st;
}

int main(int argc, char **argv) {
  if (argc == 4 && strcmp(argv[1], "--child") == 0)
    return child((unsigned)strtoul(argv[2], NULL, 10), (uint32_t)strtoul(argv[3], NULL, 10));
  static const char *const known[] = {"sizes", "reps", NULL};
  if (bench_opt_check(argc, argv, known) != SPW_OK) return 2;
  bench_env_t env;
  if (bench_env_init(&env) != SPW_OK) return 1;
  const uint64_t def_cuda[] = {64 * BENCH_KIB, 2 * BENCH_MIB, 64 * BENCH_MIB, BENCH_GIB};
  const uint64_t def_host[] = {64 * BENCH_KIB, 2 * BENCH_MIB, 16 * BENCH_MIB};
  int cuda = env.kind == SPW_BACKEND_CUDA;
  uint64_t sizes[BENCH_MAX_LIST], reps;
  size_t nsizes;
  if (bench_opt_size_list(argc, argv, "sizes", cuda ? def_cuda : def_host, cuda ? 4 : 3, sizes,
                          &nsizes) != SPW_OK ||
      bench_opt_uint(argc, argv, "reps", 20, &reps) != SPW_OK)
    return 2;
  if (reps == 0 || reps > MAX_REPS) {
    fprintf(stderr, "ipc_open: --reps must be 1 to %d\n", MAX_REPS);
    return 2;
  }
  uint64_t largest = 0;
  for (size_t i = 0; i < nsizes; i++) largest = sizes[i] > largest ? sizes[i] : largest;
  setenv("SPILLWAY_IPC", "1", 1);
  spw_runtime_t *rt = NULL;
  if (bench_runtime_create(&env, 4 * largest + 64 * BENCH_MIB, 0, NULL, &rt) != SPW_OK) return 1;
  spw_stream_t s, keep;
  if (spw_stream_create(rt, &s) != SPW_OK || spw_stream_create(rt, &keep) != SPW_OK) return 1;
  printf("ipc_open: backend %s, device %s, median of %" PRIu64 " opens and closes in another "
         "process\n\n", cuda ? "cuda" : "host", env.device_name, reps);
  printf("| size | kind | export us | open us | close us | data | open: stable / region |\n");
  printf("| ---: | --- | ---: | ---: | ---: | --- | ---: |\n");
  int failed = 0;
  for (size_t i = 0; i < nsizes; i++) {
    char sz[32];
    bench_fmt_size(sizes[i], sz, sizeof sz);
    double region_open = 0;
    for (int stable = 0; stable < 2; stable++) {
      spw_buf_t b;
      spw_ipc_handle_t h;
      double ex = 0, op = 0, cl = 0;
      int ok = 0;
      uint32_t seed = 1000u * (uint32_t)i + (uint32_t)stable;
      int st = exported(&env, rt, s, keep, (size_t)sizes[i], stable, seed, &b, &h, &ex);
      if (st == SPW_ERR_UNSUPPORTED && stable) {
        printf("| %s | stable | - | - | - | - | (no virtual memory management) |\n", sz);
        continue;
      }
      if (st == SPW_OK) st = run_child(&h, (unsigned)reps, seed, &op, &cl, &ok);
      if (st != SPW_OK) {
        bench_fail(rt, stable ? "stable buffer" : "ordinary buffer", st);
        failed = 1;
        continue;
      }
      if (!stable) region_open = op;
      char ratio[32] = "";
      if (stable && region_open > 0) snprintf(ratio, sizeof ratio, "%.2fx", op / region_open);
      printf("| %s | %s | %.1f | %.1f | %.1f | %s | %s |\n", sz, stable ? "stable" : "region", ex,
             op, cl, ok ? "ok" : "WRONG", ratio);
      failed |= !ok;
      /* The children have closed it: its lock and the buffer can go. */
      if (spw_stream_synchronize(rt, keep) != SPW_OK || spw_free(rt, b) != SPW_OK) failed = 1;
    }
  }
  spw_runtime_destroy(rt);
  printf("\nregion: a CUDA IPC region (cudaIpcOpenMemHandle); stable: an address-stable "
         "buffer's chunks, asked of the exporter's socket, imported and mapped.\n");
  return failed;
}
