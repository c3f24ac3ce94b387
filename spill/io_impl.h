/* SPDX-License-Identifier: Apache-2.0 */
/* Private header, never installed: what the two I/O implementations (io_uring.c,
 * io_posix.c) share with the dispatch layer (disk_io.c). Nothing outside these three files
 * includes it; the contract for everyone else is disk_io.h.
 *
 * The split: disk_io.c owns requests, argument checks, fault injection, the meaning of a
 * transfer's result (short -> again for the rest, errno -> status) and the completion list
 * that reap drains; an implementation only issues transfers and feeds their raw results
 * (byte count or -errno) back through spw__io_transfer_done, so both paths behave alike by
 * construction.
 *
 * Locks (io_uring path; the POSIX path has only q_mu and done_mu, never nested):
 *   cq_mu -> sq_mu, cq_mu -> done_mu; done_mu is never held while taking another lock,
 *   and no callback (log, on_error) runs under any of them.
 */
#ifndef SPILLWAY_SPILL_IO_IMPL_H
#define SPILLWAY_SPILL_IO_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "disk_io.h"

typedef struct spw__io_req {
  struct spw__io_req *next; /* queue / completion list link */
  uint64_t tag;
  char *buf;
  size_t len;
  size_t done; /* bytes moved so far */
  uint64_t off;
  int fixed_index; /* registered buffer, or -1 */
  int is_write;
  int sync;        /* a synchronous helper waits for it: never on the completion list */
  int finished;    /* sync only, under done_mu */
  int status;      /* SPW_OK / SPW_ERR_DISK_FULL / SPW_ERR_IO once complete */
  int err;         /* errno of the failure; 0 when a transfer made no progress */
  int injected;    /* the failure was injected by spw__io_inject_fault */
  int inject_res;  /* io_uring: -errno the carrier NOP stands for (0: a real transfer) */
  unsigned retries; /* consecutive EINTR / EAGAIN */
  /* io_uring: released by the issuing thread before the kernel sees the SQE, acquired by
   * the thread that handles the CQE. The ring's own barriers already order the request's
   * fields; this makes the hand-over explicit in C11 terms (and visible to TSan). */
  _Atomic unsigned handoff;
} spw__io_req_t;

typedef struct spw__io_ops {
  /* Takes the request (validated, done == 0); may block while the queue is full. Returns
   * SPW_OK, or an error and the request was not taken. */
  int (*submit)(spw_io_t *io, spw__io_req_t *r);
  /* Called with done_mu held, returns with it held: waits until the completion list or a
   * sync request may have changed (at least one completion posted, or none can come). */
  void (*wait)(spw_io_t *io);
  /* Waits for every request handed to submit to be posted, then frees the implementation. */
  void (*shutdown)(spw_io_t *io);
} spw__io_ops_t;

struct spw_io {
  const spw__io_ops_t *ops;
  void *impl;
  spw_io_kind_t kind;
  int fd;
  size_t align;   /* granularity of injected short transfers */
  unsigned depth; /* requests in the kernel / in the queue at once */
  void **fixed_bufs;
  size_t *fixed_lens;
  unsigned n_fixed;
  spw_io_log_fn log;
  spw_io_error_fn on_error;
  void *ctx;

  _Atomic uint64_t fault;    /* injected fault: status in the high half, count in the low */
  _Atomic unsigned inflight; /* submitted and not yet reaped (sync ones until collected) */

  pthread_mutex_t done_mu; /* guards the completion list, pending and sync `finished` */
  pthread_cond_t done_cv;  /* POSIX path: a completion was posted */
  spw__io_req_t *done_head, *done_tail;
  unsigned pending;           /* async requests submitted and not yet posted */
  _Atomic uint64_t posted_gen; /* bumped by every post, so a waiter can tell it missed one */
};

/* The length of the next transfer of `r` (the rest of it, shorter when a short fault is
 * injected or the rest is huge) in *len, and 0; or the -errno an injected fault stands for,
 * in which case nothing may be issued and that value is the transfer's result. */
int spw__io_next_transfer(spw_io_t *io, spw__io_req_t *r, size_t *len);
/* Feeds a transfer's result (bytes moved, or -errno). Returns 1 when the request needs
 * another transfer, 0 when it is complete (r->status set). */
int spw__io_transfer_done(spw_io_t *io, spw__io_req_t *r, int64_t res);
/* Posts a complete request: onto the completion list, or to its synchronous waiter. Takes
 * done_mu; must not be called with it held. */
void spw__io_post(spw_io_t *io, spw__io_req_t *r);
/* Logs through the sink (no lock may be held). */
void spw__io_log(spw_io_t *io, int level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Implementations. open: fills io->ops / io->impl (io->fd, depth and fixed buffers set).
 * uring open returns SPW_ERR_UNSUPPORTED with *why set to the errno when the kernel refuses
 * io_uring. */
int spw__io_posix_open(spw_io_t *io);
#ifdef SPW_HAVE_URING
int spw__io_uring_open(spw_io_t *io, int *why);
#endif

#endif /* SPILLWAY_SPILL_IO_IMPL_H */
