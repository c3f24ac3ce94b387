/* SPDX-License-Identifier: Apache-2.0 */
/* Private header, never installed: the I/O seam of the disk tier.
 *
 * Two implementations behind one table: io_uring (liburing; registered file, registered
 * staging buffers, a tuned queue depth) and POSIX (pread/pwrite from a small pool of
 * threads). spw__io_open probes io_uring by trying it (never by kernel version), drops
 * setup flags the kernel refuses, and falls back to POSIX on EPERM / ENOSYS / EINVAL when
 * the kind is SPW_IO_AUTO, logging the reason once through the sink.
 *
 * Contract:
 *  - offsets, lengths and buffer addresses are multiples of the file's direct-I/O
 *    alignment (spw__spill_file_alignment); the callers pad;
 *  - submit_* queue a request and return at once (or block while the queue is full);
 *    reap returns completions in any order; a request is complete only when all of its
 *    bytes moved: short transfers are resubmitted internally for the rest, and a transfer
 *    that makes no progress completes with SPW_ERR_IO;
 *  - results: SPW_OK, SPW_ERR_DISK_FULL (ENOSPC, EDQUOT, EFBIG), SPW_ERR_IO (EIO and any
 *    other errno, whose text goes to the error sink);
 *  - one spw_io_t may be used by several threads; submissions and reaps are serialized
 *    inside. Each request carries a caller tag returned by reap.
 */
#ifndef SPILLWAY_SPILL_DISK_IO_H
#define SPILLWAY_SPILL_DISK_IO_H

#include <stddef.h>
#include <stdint.h>

#include "spillway/spillway.h"

typedef struct spw_io spw_io_t;

typedef void (*spw_io_log_fn)(void *ctx, int level, const char *msg);
typedef void (*spw_io_error_fn)(void *ctx, const char *name, const char *text);

typedef struct spw_io_params {
  int fd;                     /* the spill file, opened O_DIRECT where the FS allows */
  spw_io_kind_t kind;         /* AUTO, URING or POSIX */
  unsigned queue_depth;       /* 0 = 32 */
  void *const *fixed_bufs;    /* staging buffers to register with io_uring (may be NULL) */
  const size_t *fixed_lens;
  unsigned n_fixed;
  spw_io_log_fn log;          /* where "io_uring refused (EPERM): using POSIX" goes */
  spw_io_error_fn on_error;   /* errno name and text of a failed transfer */
  void *ctx;
} spw_io_params_t;

typedef struct spw_io_completion {
  uint64_t tag;
  int status; /* SPW_OK / SPW_ERR_DISK_FULL / SPW_ERR_IO */
} spw_io_completion_t;

/* SPW_ERR_UNSUPPORTED when kind is URING and io_uring is refused or not built in. */
int spw__io_open(const spw_io_params_t *p, spw_io_t **out);
/* Waits for outstanding requests, then releases the ring or the threads. */
void spw__io_close(spw_io_t *io);
spw_io_kind_t spw__io_kind(const spw_io_t *io); /* URING or POSIX, never AUTO */

/* fixed_index: index into fixed_bufs when `buf` lies inside that registered buffer, else -1. */
int spw__io_submit_write(spw_io_t *io, const void *buf, size_t len, uint64_t off,
                         int fixed_index, uint64_t tag);
int spw__io_submit_read(spw_io_t *io, void *buf, size_t len, uint64_t off, int fixed_index,
                        uint64_t tag);
/* Blocks until at least `min` completions are available (min may be 0), writes up to `max`
 * into `out`, and returns how many (>= 0), or a negative status. */
int spw__io_reap(spw_io_t *io, spw_io_completion_t *out, unsigned max, unsigned min);
/* Number of submitted requests not yet reaped. */
unsigned spw__io_inflight(const spw_io_t *io);

/* Synchronous helpers on top of submit + reap (for callers without a pipeline). */
int spw__io_write_all(spw_io_t *io, const void *buf, size_t len, uint64_t off);
int spw__io_read_all(spw_io_t *io, void *buf, size_t len, uint64_t off);

/* Test hook: the next `count` transfers fail with `status` (SPW_ERR_IO or
 * SPW_ERR_DISK_FULL), or complete short by half when status is 1 (to exercise the
 * resubmission path). */
void spw__io_inject_fault(spw_io_t *io, int status, unsigned count);

#endif /* SPILLWAY_SPILL_DISK_IO_H */
