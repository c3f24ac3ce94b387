/* SPDX-License-Identifier: Apache-2.0 */
/* The io_uring I/O path (liburing 2.3 API; contract: disk_io.h; shared machinery:
 * io_impl.h): one ring per spw_io_t, the spill file registered (IOSQE_FIXED_FILE), the
 * staging buffers registered where the kernel and RLIMIT_MEMLOCK allow.
 *
 * Threads: any thread may submit and any may wait. The submission side (get_sqe, prep,
 * io_uring_submit) is serialized by sq_mu, held only for those few calls; the completion
 * side (peek / wait, cqe_seen, and acting on results) by cq_mu, which a waiter keeps while
 * it sleeps in io_uring_wait_cqe: submitters never take cq_mu (unless the ring is full and
 * they need a completion themselves), so they are not stuck behind a sleeping reaper.
 * Lock order: cq_mu -> sq_mu (a short transfer is resubmitted from the completion side),
 * cq_mu -> done_mu (posting).
 *
 * Invariants:
 *  - `busy` counts requests owning a ring slot, from the slot's reservation (before the SQE
 *    is prepared) until their last CQE has been handled; busy <= slots <= SQ entries, so
 *    there is always an SQE for a request that owns a slot, and the CQ ring (twice the SQ)
 *    cannot overflow;
 *  - a request has at most one SQE in the kernel at a time; its user_data is the request,
 *    and NULL marks a NOP nobody waits for;
 *  - an injected failure is not issued: a NOP carries the request through the ring instead,
 *    and its CQE stands for the failed transfer, so completions flow one way only.
 *
 * Setup flags: IORING_SETUP_SINGLE_ISSUER is not used because it lets only one thread
 * submit (others get -EEXIST), and IORING_SETUP_COOP_TASKRUN is not used because completion
 * work then waits for the submitting thread to enter the kernel, which stalls a waiter on
 * another thread (io_uring_setup(2) names this case); both break the contract that any
 * thread may submit and reap. IORING_SETUP_CLAMP is asked for and dropped if refused.
 */
#ifdef SPW_HAVE_URING

#include <errno.h>
#include <liburing.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#include "io_impl.h"

/* ThreadSanitizer and the rings' memory. liburing maps a ring (io_uring_queue_init) and
 * unmaps it (io_uring_queue_exit) with raw system calls, not libc's mmap/munmap, so TSan's
 * interceptors see neither: when a ring of a later runtime is mapped where a destroyed
 * runtime's ring was, TSan still holds the old ring's accesses at those addresses and
 * reports them as races with the new ring's (docs/reliability.md, "TSan and the io_uring
 * rings"). The kernel orders the two: a mapping that reuses an address begins after the
 * unmapping that freed it. TSan is told exactly that, page by page of a ring's mappings: a
 * release on each page just before the ring is unmapped, an acquire on each page as soon as
 * a ring is mapped. Nothing else is hidden: a ring touched after its teardown comes after
 * the release and is still reported, and so is any race between users of a live ring. */
#if defined(__SANITIZE_THREAD__)
#define SPW_TSAN_RINGS 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define SPW_TSAN_RINGS 1
#endif
#endif

#ifdef SPW_TSAN_RINGS
void __tsan_acquire(void *addr); /* <sanitizer/tsan_interface.h> */
void __tsan_release(void *addr);

static void tsan_pages(void *p, size_t len, int release) {
  const uintptr_t page = 4096; /* the smallest page: covers any mapping's start */
  if (!p || len == 0) return;
  uintptr_t a = (uintptr_t)p & ~(page - 1), end = (uintptr_t)p + len;
  for (; a < end; a += page) {
    if (release) __tsan_release((void *)a);
    else __tsan_acquire((void *)a);
  }
}

/* release = 1 before io_uring_queue_exit, 0 after io_uring_queue_init. */
static void tsan_ring_pages(struct io_uring *ring, int release) {
  size_t sqe = sizeof(struct io_uring_sqe) << ((ring->flags & IORING_SETUP_SQE128) ? 1 : 0);
  tsan_pages(ring->sq.ring_ptr, ring->sq.ring_sz, release);
  if (ring->cq.ring_ptr != ring->sq.ring_ptr) /* no IORING_FEAT_SINGLE_MMAP */
    tsan_pages(ring->cq.ring_ptr, ring->cq.ring_sz, release);
  tsan_pages(ring->sq.sqes, sqe * ring->sq.ring_entries, release);
}
#else
static void tsan_ring_pages(struct io_uring *ring, int release) {
  (void)ring;
  (void)release;
}
#endif

typedef struct uring_impl {
  struct io_uring ring;
  pthread_mutex_t sq_mu;
  pthread_mutex_t cq_mu;
  _Atomic unsigned busy;
  unsigned slots;
  int fixed_file; /* the fd is registered at index 0 */
  int fixed_bufs; /* fixed_bufs[] are registered, same indices */
  int ext_arg;    /* io_uring_wait_cqe_timeout needs no SQE (IORING_FEAT_EXT_ARG) */
} uring_impl_t;

/* io_uring_submit, retried while the kernel is only busy. Needs sq_mu. */
static int submit_sqes(uring_impl_t *u) {
  for (int tries = 0;; tries++) {
    int ret = io_uring_submit(&u->ring);
    if (ret >= 0) return 0;
    if ((ret == -EINTR || ret == -EAGAIN || ret == -EBUSY) && tries < 1000) {
      sched_yield();
      continue;
    }
    return ret;
  }
}

/* Issues the next transfer of `r`, which owns a slot. Needs sq_mu. Returns 0 or -errno
 * (nothing of r is then in the kernel). */
static int issue(spw_io_t *io, uring_impl_t *u, spw__io_req_t *r) {
  struct io_uring_sqe *sqe = io_uring_get_sqe(&u->ring);
  if (!sqe) {
    /* Everything prepared is submitted under sq_mu, so this only follows a failed submit
     * that left SQEs behind; flushing them frees entries. */
    int ret = submit_sqes(u);
    if (ret < 0) return ret;
    sqe = io_uring_get_sqe(&u->ring);
    if (!sqe) return -EBUSY;
  }
  size_t len;
  int inj = spw__io_next_transfer(io, r, &len);
  int fd = u->fixed_file ? 0 : io->fd;
  char *p = r->buf + r->done;
  uint64_t off = r->off + r->done;
  if (inj) {
    io_uring_prep_nop(sqe);
    r->inject_res = inj;
  } else if (r->fixed_index >= 0 && u->fixed_bufs) {
    if (r->is_write)
      io_uring_prep_write_fixed(sqe, fd, p, (unsigned)len, off, r->fixed_index);
    else
      io_uring_prep_read_fixed(sqe, fd, p, (unsigned)len, off, r->fixed_index);
  } else {
    if (r->is_write) io_uring_prep_write(sqe, fd, p, (unsigned)len, off);
    else io_uring_prep_read(sqe, fd, p, (unsigned)len, off);
  }
  if (!inj && u->fixed_file) sqe->flags |= IOSQE_FIXED_FILE;
  io_uring_sqe_set_data(sqe, r);
  atomic_fetch_add_explicit(&r->handoff, 1, memory_order_release);
  int ret = submit_sqes(u);
  if (ret < 0) {
    /* The SQE sits in the ring for the next submit; as a NOP with no owner it harms no
     * one, and r can be failed now. No other thread submits while we hold sq_mu. */
    io_uring_prep_nop(sqe);
    io_uring_sqe_set_data(sqe, NULL);
    r->inject_res = 0;
    return ret;
  }
  return 0;
}

/* Acts on every completion available now. Needs cq_mu. Returns how many CQEs it saw. */
static unsigned process_cqes(spw_io_t *io, uring_impl_t *u) {
  unsigned seen = 0;
  struct io_uring_cqe *cqe;
  while (io_uring_peek_cqe(&u->ring, &cqe) == 0) {
    spw__io_req_t *r = io_uring_cqe_get_data(cqe);
    int res = cqe->res;
    io_uring_cqe_seen(&u->ring, cqe);
    seen++;
    if (!r) continue;
    (void)atomic_load_explicit(&r->handoff, memory_order_acquire);
    if (r->inject_res) {
      res = r->inject_res;
      r->inject_res = 0;
    }
    if (spw__io_transfer_done(io, r, res)) {
      pthread_mutex_lock(&u->sq_mu);
      int ret = issue(io, u, r);
      pthread_mutex_unlock(&u->sq_mu);
      if (ret == 0) continue;
      /* Not through spw__io_transfer_done: EAGAIN there would mean "try again". */
      r->err = -ret;
      r->status = SPW_ERR_IO;
    }
    atomic_fetch_sub(&u->busy, 1);
    spw__io_post(io, r); /* r may be gone from here on */
  }
  return seen;
}

/* Sleeps until a CQE is available. Needs cq_mu; only called while busy > 0, so one will
 * come. The timeout, where it costs no SQE, bounds the sleep should that slot's owner fail
 * to issue after all. */
static void wait_one(uring_impl_t *u) {
  struct io_uring_cqe *cqe;
  if (u->ext_arg) {
    struct __kernel_timespec ts = {.tv_sec = 0, .tv_nsec = 200 * 1000 * 1000};
    (void)io_uring_wait_cqe_timeout(&u->ring, &cqe, &ts);
  } else {
    (void)io_uring_wait_cqe(&u->ring, &cqe);
  }
}

/* Takes a ring slot, handling completions while the ring is full. */
static void reserve_slot(spw_io_t *io, uring_impl_t *u) {
  for (;;) {
    unsigned v = atomic_load(&u->busy);
    while (v < u->slots)
      if (atomic_compare_exchange_weak(&u->busy, &v, v + 1)) return;
    pthread_mutex_lock(&u->cq_mu);
    if (atomic_load(&u->busy) >= u->slots && process_cqes(io, u) == 0) {
      wait_one(u);
      process_cqes(io, u);
    }
    pthread_mutex_unlock(&u->cq_mu);
  }
}

static int uring_submit(spw_io_t *io, spw__io_req_t *r) {
  uring_impl_t *u = io->impl;
  reserve_slot(io, u);
  pthread_mutex_lock(&u->sq_mu);
  int ret = issue(io, u, r);
  pthread_mutex_unlock(&u->sq_mu);
  if (ret == 0) return SPW_OK;
  atomic_fetch_sub(&u->busy, 1);
  spw__io_log(io, SPW_LOG_ERROR, "io_uring submit: %s", strerror(-ret));
  return SPW_ERR_IO;
}

static void uring_wait(spw_io_t *io) {
  uring_impl_t *u = io->impl;
  /* Stable: posts change it under done_mu, which we hold. */
  uint64_t gen = atomic_load(&io->posted_gen);
  pthread_mutex_unlock(&io->done_mu);
  pthread_mutex_lock(&u->cq_mu);
  /* Whoever held cq_mu before us may have posted what our caller waits for. */
  if (atomic_load(&io->posted_gen) == gen && process_cqes(io, u) == 0 &&
      atomic_load(&u->busy) > 0) {
    wait_one(u);
    process_cqes(io, u);
  }
  pthread_mutex_unlock(&u->cq_mu);
  pthread_mutex_lock(&io->done_mu);
}

static void uring_free(uring_impl_t *u) {
  pthread_mutex_destroy(&u->cq_mu);
  pthread_mutex_destroy(&u->sq_mu);
  free(u);
}

static void uring_shutdown(spw_io_t *io) {
  uring_impl_t *u = io->impl;
  pthread_mutex_lock(&u->cq_mu);
  while (atomic_load(&u->busy) > 0)
    if (process_cqes(io, u) == 0) wait_one(u);
  pthread_mutex_unlock(&u->cq_mu);
  tsan_ring_pages(&u->ring, 1);
  io_uring_queue_exit(&u->ring); /* also drops the registered file and buffers */
  uring_free(u);
  io->impl = NULL;
}

static const spw__io_ops_t uring_ops = {uring_submit, uring_wait, uring_shutdown};

/* The kernel's way of saying "no io_uring here": seccomp, kernel.io_uring_disabled, an old
 * kernel. */
static int refused(int e) { return e == EPERM || e == EACCES || e == ENOSYS || e == EINVAL; }

int spw__io_uring_open(spw_io_t *io, int *why) {
  *why = 0;
  uring_impl_t *u = calloc(1, sizeof *u);
  if (!u) return SPW_ERR_SYSTEM;
  if (pthread_mutex_init(&u->sq_mu, NULL) != 0) {
    free(u);
    return SPW_ERR_SYSTEM;
  }
  if (pthread_mutex_init(&u->cq_mu, NULL) != 0) {
    pthread_mutex_destroy(&u->sq_mu);
    free(u);
    return SPW_ERR_SYSTEM;
  }
  static const unsigned flag_sets[] = {IORING_SETUP_CLAMP, 0};
  int ret = -EINVAL;
  struct io_uring_params prm;
  for (size_t i = 0; i < sizeof flag_sets / sizeof flag_sets[0]; i++) {
    memset(&prm, 0, sizeof prm);
    prm.flags = flag_sets[i];
    ret = io_uring_queue_init_params(io->depth, &u->ring, &prm);
    if (ret != -EINVAL) break; /* EINVAL: a flag this kernel does not know; try fewer */
  }
  if (ret < 0) {
    *why = -ret;
    uring_free(u);
    return refused(-ret) ? SPW_ERR_UNSUPPORTED : SPW_ERR_SYSTEM;
  }
  tsan_ring_pages(&u->ring, 0);
  u->ext_arg = (prm.features & IORING_FEAT_EXT_ARG) != 0;
  u->slots = u->ring.sq.ring_entries < io->depth ? u->ring.sq.ring_entries : io->depth;
  atomic_init(&u->busy, 0);

  u->fixed_file = io_uring_register_files(&u->ring, &io->fd, 1) == 0;

  if (io->n_fixed > 0) {
    struct iovec *iov = malloc(io->n_fixed * sizeof *iov);
    int r = -ENOMEM;
    if (iov) {
      for (unsigned i = 0; i < io->n_fixed; i++) {
        iov[i].iov_base = io->fixed_bufs[i];
        iov[i].iov_len = io->fixed_lens[i];
      }
      r = io_uring_register_buffers(&u->ring, iov, io->n_fixed);
      free(iov);
    }
    if (r == 0) {
      u->fixed_bufs = 1;
    } else {
      /* Plain reads and writes from the same memory work as well, only a little slower:
       * not a reason to fail. ENOMEM is RLIMIT_MEMLOCK; EFAULT is memory the kernel will
       * not pin (cudaHostAlloc memory on older kernels). */
      spw__io_log(io, SPW_LOG_WARN,
                  "io_uring: registering %u staging buffers failed (%s: %s%s): "
                  "continuing without fixed buffers",
                  io->n_fixed, strerrorname_np(-r) ? strerrorname_np(-r) : "?",
                  strerrordesc_np(-r), r == -ENOMEM ? "; raise RLIMIT_MEMLOCK" : "");
    }
  }
  io->impl = u;
  io->ops = &uring_ops;
  return SPW_OK;
}

#else
/* ISO C forbids an empty translation unit. */
typedef int spw__io_uring_not_built;
#endif /* SPW_HAVE_URING */
