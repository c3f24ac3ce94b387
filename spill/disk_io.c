/* SPDX-License-Identifier: Apache-2.0 */
/* The I/O seam of the disk tier (contract: disk_io.h): picks the implementation, checks
 * arguments, owns the requests, the completion list, fault injection and the meaning of a
 * transfer's result, so that io_uring.c and io_posix.c only issue transfers.
 *
 * Invariants:
 *  - a request is complete only when all its bytes moved or a transfer failed; a short
 *    transfer makes spw__io_transfer_done ask for another one, for the rest;
 *  - `inflight` counts requests from submit until reap (or the synchronous helper) hands
 *    them back; `pending` counts asynchronous ones not yet on the completion list;
 *  - injected faults are consumed at the point a transfer would be issued, one per
 *    transfer, on both paths, and then travel the same road as a real failure;
 *  - the error sink and the log run on the caller's thread with no lock held.
 */
#include "disk_io.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "io_impl.h"

#define SPW_IO_DEFAULT_DEPTH 32u
#define SPW_IO_MAX_DEPTH 4096u
#define SPW_IO_MIN_ALIGN 4096u
/* One transfer moves at most this much; the rest goes as further transfers (io_uring's
 * length field is 32 bits, and the kernel caps one read or write below 2 GiB anyway). */
#define SPW_IO_MAX_CHUNK ((size_t)1 << 30)
/* Consecutive EINTR / EAGAIN results tolerated before a transfer counts as failed. */
#define SPW_IO_MAX_RETRIES 1000u

void spw__io_log(spw_io_t *io, int level, const char *fmt, ...) {
  if (!io->log) return;
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  io->log(io->ctx, level, msg);
}

static int is_disk_full_errno(int e) { return e == ENOSPC || e == EDQUOT || e == EFBIG; }

/* ---- transfers: shared by both implementations ----------------------------------------- */

int spw__io_next_transfer(spw_io_t *io, spw__io_req_t *r, size_t *len) {
  size_t n = r->len - r->done;
  if (n > SPW_IO_MAX_CHUNK) n = SPW_IO_MAX_CHUNK;
  uint64_t f = atomic_load(&io->fault);
  while ((uint32_t)f != 0) {
    if (!atomic_compare_exchange_weak(&io->fault, &f, f - 1)) continue;
    int st = (int32_t)(uint32_t)(f >> 32);
    if (st == 1) {
      /* Half, kept aligned so an O_DIRECT transfer stays legal; a transfer too small to
       * halve goes whole (the fault is still used up). */
      size_t half = n / 2 / io->align * io->align;
      if (half > 0) n = half;
      break;
    }
    r->injected = 1;
    *len = 0;
    return st == SPW_ERR_DISK_FULL ? -ENOSPC : -EIO;
  }
  *len = n;
  return 0;
}

int spw__io_transfer_done(spw_io_t *io, spw__io_req_t *r, int64_t res) {
  (void)io;
  if (res > 0) {
    r->retries = 0;
    r->done += (size_t)res;
    if (r->done < r->len) return 1;
    r->done = r->len;
    r->status = SPW_OK;
    return 0;
  }
  if ((res == -EINTR || res == -EAGAIN) && ++r->retries < SPW_IO_MAX_RETRIES) return 1;
  /* 0 bytes for a non-empty transfer: end of file on a read, or a device that took
   * nothing; retrying would spin. */
  r->err = res == 0 ? 0 : (int)-res;
  r->status = res != 0 && is_disk_full_errno(r->err) ? SPW_ERR_DISK_FULL : SPW_ERR_IO;
  return 0;
}

void spw__io_post(spw_io_t *io, spw__io_req_t *r) {
  pthread_mutex_lock(&io->done_mu);
  if (r->sync) {
    r->finished = 1; /* its waiter may return and drop r as soon as done_mu is released */
  } else {
    r->next = NULL;
    if (io->done_tail) io->done_tail->next = r;
    else io->done_head = r;
    io->done_tail = r;
    io->pending--;
  }
  atomic_fetch_add(&io->posted_gen, 1);
  pthread_cond_broadcast(&io->done_cv);
  pthread_mutex_unlock(&io->done_mu);
}

/* Sends a failed request's errno name and text to the sink (no lock held). */
static void report_error(spw_io_t *io, const spw__io_req_t *r) {
  if (!io->on_error) return;
  char text[384];
  const char *name;
  if (r->err) {
    name = strerrorname_np(r->err);
    if (!name) name = "EIO";
    snprintf(text, sizeof text, "%s of %zu B at offset %" PRIu64 ": %s%s",
             r->is_write ? "write" : "read", r->len, r->off, strerrordesc_np(r->err),
             r->injected ? " (injected)" : "");
  } else {
    name = "EIO";
    snprintf(text, sizeof text,
             "%s of %zu B at offset %" PRIu64 ": no progress after %zu B (end of file?)",
             r->is_write ? "write" : "read", r->len, r->off, r->done);
  }
  io->on_error(io->ctx, name, text);
}

/* ---- requests ------------------------------------------------------------------------------ */

static int fixed_covers(const spw_io_t *io, unsigned i, const void *buf, size_t len) {
  uintptr_t b = (uintptr_t)io->fixed_bufs[i], p = (uintptr_t)buf;
  return p >= b && p - b <= io->fixed_lens[i] && len <= io->fixed_lens[i] - (p - b);
}

static int check_args(const spw_io_t *io, const void *buf, size_t len, uint64_t off,
                      int fixed_index) {
  if (!io || !buf || len == 0) return SPW_ERR_INVALID_ARG;
  if (off > (uint64_t)INT64_MAX || len > (uint64_t)INT64_MAX - off) return SPW_ERR_INVALID_ARG;
  if ((uintptr_t)buf % io->align || len % io->align || off % io->align)
    return SPW_ERR_INVALID_ARG;
  if (fixed_index >= 0 &&
      ((unsigned)fixed_index >= io->n_fixed || !fixed_covers(io, (unsigned)fixed_index, buf, len)))
    return SPW_ERR_INVALID_ARG;
  return SPW_OK;
}

static void req_init(spw__io_req_t *r, void *buf, size_t len, uint64_t off, int fixed_index,
                     uint64_t tag, int is_write) {
  memset(r, 0, sizeof *r);
  atomic_init(&r->handoff, 0);
  r->tag = tag;
  r->buf = buf;
  r->len = len;
  r->off = off;
  r->fixed_index = fixed_index >= 0 ? fixed_index : -1;
  r->is_write = is_write;
}

static int submit_async(spw_io_t *io, void *buf, size_t len, uint64_t off, int fixed_index,
                        uint64_t tag, int is_write) {
  int st = check_args(io, buf, len, off, fixed_index);
  if (st != SPW_OK) return st;
  spw__io_req_t *r = malloc(sizeof *r);
  if (!r) return SPW_ERR_SYSTEM;
  req_init(r, buf, len, off, fixed_index, tag, is_write);
  /* Counted before the implementation sees it: it may complete before submit returns. */
  pthread_mutex_lock(&io->done_mu);
  io->pending++;
  pthread_mutex_unlock(&io->done_mu);
  atomic_fetch_add(&io->inflight, 1);
  st = io->ops->submit(io, r);
  if (st != SPW_OK) {
    pthread_mutex_lock(&io->done_mu);
    io->pending--;
    /* A POSIX reaper may be asleep counting on this request. */
    pthread_cond_broadcast(&io->done_cv);
    pthread_mutex_unlock(&io->done_mu);
    atomic_fetch_sub(&io->inflight, 1);
    free(r);
  }
  return st;
}

int spw__io_submit_write(spw_io_t *io, const void *buf, size_t len, uint64_t off,
                         int fixed_index, uint64_t tag) {
  /* The buffer is only read; the request type is shared with reads. */
  return submit_async(io, (void *)(uintptr_t)buf, len, off, fixed_index, tag, 1);
}

int spw__io_submit_read(spw_io_t *io, void *buf, size_t len, uint64_t off, int fixed_index,
                        uint64_t tag) {
  return submit_async(io, buf, len, off, fixed_index, tag, 0);
}

int spw__io_reap(spw_io_t *io, spw_io_completion_t *out, unsigned max, unsigned min) {
  if (!io || (max > 0 && !out)) return SPW_ERR_INVALID_ARG;
  if (min > max) min = max;
  unsigned n = 0;
  spw__io_req_t *got = NULL, **got_tail = &got;
  pthread_mutex_lock(&io->done_mu);
  for (;;) {
    while (n < max && io->done_head) {
      spw__io_req_t *r = io->done_head;
      io->done_head = r->next;
      if (!io->done_head) io->done_tail = NULL;
      out[n].tag = r->tag;
      out[n].status = r->status;
      n++;
      r->next = NULL;
      *got_tail = r;
      got_tail = &r->next;
    }
    /* Fewer than min only when no more can come: waiting then would never end. */
    if (n >= min || io->pending == 0) break;
    io->ops->wait(io);
  }
  pthread_mutex_unlock(&io->done_mu);
  while (got) {
    spw__io_req_t *r = got;
    got = r->next;
    if (r->status != SPW_OK) report_error(io, r);
    atomic_fetch_sub(&io->inflight, 1);
    free(r);
  }
  return (int)n;
}

unsigned spw__io_inflight(const spw_io_t *io) {
  /* atomic_load wants a non-const pointer in C11; reading does not modify. */
  return io ? atomic_load(&((spw_io_t *)io)->inflight) : 0;
}

/* The registered buffer holding [buf, buf+len), if any, so that synchronous callers get
 * fixed-buffer transfers without having to say so. */
static int find_fixed(const spw_io_t *io, const void *buf, size_t len) {
  for (unsigned i = 0; i < io->n_fixed; i++)
    if (fixed_covers(io, i, buf, len)) return (int)i;
  return -1;
}

static int transfer_sync(spw_io_t *io, void *buf, size_t len, uint64_t off, int is_write) {
  int st = check_args(io, buf, len, off, -1);
  if (st != SPW_OK) return st;
  /* On the stack: the caller waits here until the request is finished, and a finished
   * sync request is never touched again by the implementation. */
  spw__io_req_t r;
  req_init(&r, buf, len, off, find_fixed(io, buf, len), 0, is_write);
  r.sync = 1;
  atomic_fetch_add(&io->inflight, 1);
  st = io->ops->submit(io, &r);
  if (st == SPW_OK) {
    pthread_mutex_lock(&io->done_mu);
    while (!r.finished) io->ops->wait(io);
    pthread_mutex_unlock(&io->done_mu);
    st = r.status;
    if (st != SPW_OK) report_error(io, &r);
  }
  atomic_fetch_sub(&io->inflight, 1);
  return st;
}

int spw__io_write_all(spw_io_t *io, const void *buf, size_t len, uint64_t off) {
  return transfer_sync(io, (void *)(uintptr_t)buf, len, off, 1);
}

int spw__io_read_all(spw_io_t *io, void *buf, size_t len, uint64_t off) {
  return transfer_sync(io, buf, len, off, 0);
}

void spw__io_inject_fault(spw_io_t *io, int status, unsigned count) {
  if (!io) return;
  if (status != SPW_ERR_IO && status != SPW_ERR_DISK_FULL && status != 1) count = 0;
  atomic_store(&io->fault, (uint64_t)(uint32_t)status << 32 | count);
}

/* ---- open / close -------------------------------------------------------------------------- */

/* What callers must align to: 4096, or more where statx says an O_DIRECT file needs it.
 * Enforced for buffered files too, so that a caller's mistake shows on every file system
 * and not only on those that take O_DIRECT. */
static size_t file_alignment(int fd) {
  int fl = fcntl(fd, F_GETFL);
  int direct = fl >= 0 && (fl & O_DIRECT);
  size_t align = SPW_IO_MIN_ALIGN;
#ifdef STATX_DIOALIGN
  struct statx sx;
  if (direct && statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) == 0 &&
      (sx.stx_mask & STATX_DIOALIGN)) {
    uint32_t m = sx.stx_dio_mem_align > sx.stx_dio_offset_align ? sx.stx_dio_mem_align
                                                               : sx.stx_dio_offset_align;
    if (m > align && m <= (1u << 20) && (m & (m - 1)) == 0) align = m;
  }
#endif
  return align;
}

static void io_free(spw_io_t *io) {
  pthread_cond_destroy(&io->done_cv);
  pthread_mutex_destroy(&io->done_mu);
  free(io->fixed_bufs);
  free(io->fixed_lens);
  free(io);
}

int spw__io_open(const spw_io_params_t *p, spw_io_t **out) {
  if (!p || !out || p->fd < 0) return SPW_ERR_INVALID_ARG;
  if (p->kind != SPW_IO_AUTO && p->kind != SPW_IO_URING && p->kind != SPW_IO_POSIX)
    return SPW_ERR_INVALID_ARG;
  if (p->n_fixed > 0 && (!p->fixed_bufs || !p->fixed_lens)) return SPW_ERR_INVALID_ARG;
  for (unsigned i = 0; i < p->n_fixed; i++)
    if (!p->fixed_bufs[i] || p->fixed_lens[i] == 0) return SPW_ERR_INVALID_ARG;
  if (fcntl(p->fd, F_GETFL) < 0) return SPW_ERR_INVALID_ARG;

  spw_io_t *io = calloc(1, sizeof *io);
  if (!io) return SPW_ERR_SYSTEM;
  if (pthread_mutex_init(&io->done_mu, NULL) != 0) {
    free(io);
    return SPW_ERR_SYSTEM;
  }
  if (pthread_cond_init(&io->done_cv, NULL) != 0) {
    pthread_mutex_destroy(&io->done_mu);
    free(io);
    return SPW_ERR_SYSTEM;
  }
  io->fd = p->fd;
  io->align = file_alignment(p->fd);
  io->depth = p->queue_depth ? p->queue_depth : SPW_IO_DEFAULT_DEPTH;
  if (io->depth > SPW_IO_MAX_DEPTH) io->depth = SPW_IO_MAX_DEPTH;
  io->log = p->log;
  io->on_error = p->on_error;
  io->ctx = p->ctx;
  atomic_init(&io->fault, 0);
  atomic_init(&io->inflight, 0);
  atomic_init(&io->posted_gen, 0);
  if (p->n_fixed > 0) {
    io->fixed_bufs = malloc(p->n_fixed * sizeof *io->fixed_bufs);
    io->fixed_lens = malloc(p->n_fixed * sizeof *io->fixed_lens);
    if (!io->fixed_bufs || !io->fixed_lens) {
      io_free(io);
      return SPW_ERR_SYSTEM;
    }
    memcpy(io->fixed_bufs, p->fixed_bufs, p->n_fixed * sizeof *io->fixed_bufs);
    memcpy(io->fixed_lens, p->fixed_lens, p->n_fixed * sizeof *io->fixed_lens);
    io->n_fixed = p->n_fixed;
  }

  int st = SPW_ERR_UNSUPPORTED;
  if (p->kind != SPW_IO_POSIX) {
#ifdef SPW_HAVE_URING
    int why = 0;
    st = spw__io_uring_open(io, &why);
    if (st == SPW_OK) {
      io->kind = SPW_IO_URING;
    } else if (p->kind == SPW_IO_AUTO) {
      spw__io_log(io, SPW_LOG_WARN, "io_uring refused (%s: %s): using POSIX I/O",
                  why ? strerrorname_np(why) : spw_err_name(st),
                  why ? strerrordesc_np(why) : spw_strerror(st));
    } else {
      spw__io_log(io, SPW_LOG_ERROR, "io_uring refused (%s: %s) and SPILLWAY_IO=uring",
                  why ? strerrorname_np(why) : spw_err_name(st),
                  why ? strerrordesc_np(why) : spw_strerror(st));
    }
#else
    if (p->kind == SPW_IO_AUTO)
      spw__io_log(io, SPW_LOG_INFO, "io_uring not built in: using POSIX I/O");
    else
      spw__io_log(io, SPW_LOG_ERROR, "io_uring not built in and SPILLWAY_IO=uring");
#endif
    if (st != SPW_OK && p->kind == SPW_IO_URING) {
      io_free(io);
      return st;
    }
  }
  if (st != SPW_OK) {
    st = spw__io_posix_open(io);
    if (st != SPW_OK) {
      io_free(io);
      return st;
    }
    io->kind = SPW_IO_POSIX;
  }
  *out = io;
  return SPW_OK;
}

void spw__io_close(spw_io_t *io) {
  if (!io) return;
  io->ops->shutdown(io);
  /* Completions nobody reaped: their requests are ours to free. */
  while (io->done_head) {
    spw__io_req_t *r = io->done_head;
    io->done_head = r->next;
    free(r);
  }
  io_free(io);
}

spw_io_kind_t spw__io_kind(const spw_io_t *io) { return io ? io->kind : SPW_IO_POSIX; }
