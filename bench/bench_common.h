/* SPDX-License-Identifier: Apache-2.0 */
/* Benchmark-private header, never installed: what spill_bw, oversubscribe and disk_bw share.
 *
 *  - options: each benchmark option NAME is read from argv as --NAME=VALUE, else from the
 *    environment as SPW_BENCH_NAME (upper case, '-' -> '_'), else its default, which depends
 *    on the backend (small on host, full size on cuda);
 *  - the backend (cuda when SPILLWAY_BACKEND is not "host" and a device is present) and the
 *    device's name, picked once so the runtime and the raw ceilings use the same one;
 *  - the raw side: device memory outside Spillway (cudaMalloc; host: aligned host memory),
 *    pinned host memory (anonymous mmap, touched, cudaHostRegister'ed), copy streams and
 *    copies of equal pieces (cudaMemcpyAsync; host: memcpy on the calling thread, which is
 *    what the host backend's streams do), so ceilings are measured in the same run;
 *  - the Spillway side: filling an acquired buffer with the check pattern, the add kernel,
 *    and checking a sample of a buffer's words through spw_memcpy_async;
 *  - a two-thread runner for the duplex measurements.
 *
 * Every function that can fail returns SPW_OK or a negative spw_status_t, after printing
 * what failed to stderr (these are programs: the message is the report). Nothing here keeps
 * global state; a bench_env_t is filled once and only read afterwards.
 */
#ifndef SPILLWAY_BENCH_COMMON_H
#define SPILLWAY_BENCH_COMMON_H

#include <stddef.h>
#include <stdint.h>

#include "spillway/spillway.h"

#define BENCH_KIB ((uint64_t)1 << 10)
#define BENCH_MIB ((uint64_t)1 << 20)
#define BENCH_GIB ((uint64_t)1 << 30)
#define BENCH_MAX_LIST 32

typedef struct bench_env {
  spw_backend_kind_t kind; /* SPW_BACKEND_CUDA or SPW_BACKEND_HOST, never AUTO */
  int device;              /* CUDA ordinal (SPILLWAY_DEVICE, default 0) */
  char device_name[256];   /* cudaGetDeviceProperties name, or "host" */
} bench_env_t;

/* ---- options ---- */
/* Sizes accept a binary suffix: 4096, 64KiB, 64K, 1MiB, 1M, 1GiB, 1G (case-insensitive). */
int bench_opt_size(int argc, char **argv, const char *name, uint64_t def, uint64_t *out);
/* As bench_opt_size, for an option where 0 means "off" (stages-below, host-reserve). */
int bench_opt_size_or_zero(int argc, char **argv, const char *name, uint64_t def,
                           uint64_t *out);
int bench_opt_uint(int argc, char **argv, const char *name, uint64_t def, uint64_t *out);
/* A comma-separated list of sizes; `def` is used when the option is absent. */
int bench_opt_size_list(int argc, char **argv, const char *name, const uint64_t *def,
                        size_t ndef, uint64_t *out, size_t *n);
/* A comma-separated list of non-negative integers. */
int bench_opt_uint_list(int argc, char **argv, const char *name, const uint64_t *def,
                        size_t ndef, uint64_t *out, size_t *n);
/* A string option (a path); *out points into argv or the environment, or is `def`. */
void bench_opt_str(int argc, char **argv, const char *name, const char *def, const char **out);
/* Fails with SPW_ERR_INVALID_ARG, naming it, on an argv entry that is not --NAME=VALUE with
 * NAME in `known` (NULL-terminated), so a typo does not silently run the defaults. */
int bench_opt_check(int argc, char **argv, const char *const *known);

/* ---- environment ---- */
int bench_env_init(bench_env_t *env);
/* Another GPU than env's when there are two or more (the peer tier's lender), else env's. */
int bench_other_device(const bench_env_t *env);
/* A runtime on env's backend and device, with the given limits (0 = library default) and
 * the emulated device sized for device_limit on the host backend. */
int bench_runtime_create(const bench_env_t *env, uint64_t device_limit, uint64_t host_limit,
                         const char *spill_dir, spw_runtime_t **out);

double bench_now(void);                                  /* seconds, monotonic */
double bench_gbs(uint64_t bytes, double seconds);        /* GB/s, 1e9 bytes */
void bench_fmt_size(uint64_t bytes, char *buf, size_t len); /* "64 KiB", "1 GiB" */
double bench_median(double *v, size_t n);                /* sorts v */

/* ---- raw side ---- */
int bench_dev_alloc(const bench_env_t *env, size_t bytes, void **out);
void bench_dev_free(const bench_env_t *env, void *p);
/* `bytes` is rounded up to the page size internally; pass the same value to free. */
int bench_pinned_alloc(const bench_env_t *env, size_t bytes, void **out);
void bench_pinned_free(const bench_env_t *env, void *p, size_t bytes);

typedef struct bench_rstream {
  void *s; /* cudaStream_t; NULL on host (copies run on the calling thread) */
} bench_rstream_t;

int bench_rstream_create(const bench_env_t *env, bench_rstream_t *out);
void bench_rstream_destroy(const bench_env_t *env, bench_rstream_t *rs);
int bench_rstream_sync(const bench_env_t *env, bench_rstream_t *rs);
/* Enqueues `count` copies of `piece` bytes: piece i from src + i*piece to dst + i*piece. */
int bench_raw_copies(const bench_env_t *env, bench_rstream_t *rs, void *dst, const void *src,
                     size_t piece, size_t count);
/* Times `count` copies of `piece` bytes (enqueue and wait), median of `reps`; GB/s. */
int bench_raw_copy_gbs(const bench_env_t *env, bench_rstream_t *rs, void *dst, const void *src,
                       size_t piece, size_t count, unsigned reps, double *gbs);

/* Raw copies of `count` pieces between two devices, one way then the other (cuda: peer
 * access turned on both ways where the devices have it, then one cudaMemcpyPeerAsync each,
 * timed with events; host: memcpy between two regions); median of `reps`, GB/s. The peer
 * tier's ceiling. */
int bench_raw_peer_gbs(const bench_env_t *env, int dev_a, int dev_b, size_t piece, size_t count,
                       unsigned reps, double *a_to_b, double *b_to_a);

/* ---- two threads at once ---- */
typedef int (*bench_task_fn)(void *arg);
/* Runs a(arg_a) and b(arg_b) on two threads released together; *seconds is from the
 * earlier start to the later end. Returns the first failing status. */
int bench_run_pair(bench_task_fn a, void *arg_a, bench_task_fn b, void *arg_b,
                   double *seconds);

/* Raw duplex: `count` pieces device -> host and `count` pieces host -> device at once, on
 * two streams from two threads (the first half of each region goes down, the second half
 * comes up). Median of `reps`; GB/s of both directions together. The regions hold at
 * least 2 * count * piece bytes. */
int bench_raw_duplex_gbs(const bench_env_t *env, void *dev, void *host, size_t piece,
                         size_t count, unsigned reps, double *gbs);

/* ---- Spillway side ---- */
/* Enqueues on `stream` the pattern fill of an acquired buffer (kernel; host: host func). */
int bench_fill(const bench_env_t *env, spw_runtime_t *rt, void *dptr, size_t bytes,
               uint32_t seed, spw_stream_t stream);
/* Enqueues on `stream` the addition of `add` to every u32 word of an acquired buffer. */
int bench_add(const bench_env_t *env, spw_runtime_t *rt, void *dptr, size_t bytes,
              uint32_t add, spw_stream_t stream);
/* Allocates a buffer on `stream`, fills it with `seed`, and leaves it locked on `stream`
 * (release with spw_stream_synchronize or spw_stream_release_async). */
int bench_alloc_filled(const bench_env_t *env, spw_runtime_t *rt, size_t bytes, uint32_t seed,
                       spw_stream_t stream, spw_buf_t *out);
/* Checks that word i of `buf` is bench_pattern(seed, i) + add: the whole buffer up to
 * 16 MiB, else three 4 MiB windows (start, middle, end). Synchronizes `stream` (which
 * releases its locks). *bad receives the number of wrong words seen (0 = correct). */
int bench_verify(spw_runtime_t *rt, spw_buf_t buf, size_t bytes, uint32_t seed, uint32_t add,
                 spw_stream_t stream, uint64_t *bad);

/* Prints "what: SPW_ERR_X (last error text)" to stderr; returns st. */
int bench_fail(spw_runtime_t *rt, const char *what, int st);

/* The runtime's statistics, the whole struct; a failure is printed (bench_fail). */
int bench_get_stats(spw_runtime_t *rt, spw_stats_t *out);

/* How many of b[0, n) are not in state `want` (a failed query counts as not). */
size_t bench_count_not_in(spw_runtime_t *rt, const spw_buf_t *b, size_t n, spw_state_t want);

#endif /* SPILLWAY_BENCH_COMMON_H */
