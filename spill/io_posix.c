/* SPDX-License-Identifier: Apache-2.0 */
/* The POSIX I/O path: pread / pwrite from a small pool of worker threads, for kernels or
 * sandboxes that refuse io_uring (contract: disk_io.h; shared machinery: io_impl.h).
 *
 * Submit appends to a FIFO that the workers drain; a worker carries one request through to
 * the end (every transfer, short ones included) and posts it to the completion list.
 * Invariants, under q_mu: queued <= depth (submit blocks while it is full, and the workers
 * drain it whatever the reapers do, so a full queue always empties); a worker exits only
 * when `stop` is set and the queue is empty, so shutdown finishes every request.
 * Locks: q_mu and done_mu are never held together.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include "io_impl.h"

#define SPW_POSIX_THREADS 4u

typedef struct posix_impl {
  pthread_mutex_t q_mu;
  pthread_cond_t work_cv;  /* a request was queued, or stop */
  pthread_cond_t space_cv; /* the queue has room */
  spw__io_req_t *head, *tail;
  unsigned queued;
  int stop;
  unsigned n_threads;
  pthread_t threads[SPW_POSIX_THREADS];
} posix_impl_t;

/* Carries a request through all of its transfers. */
static void run_request(spw_io_t *io, spw__io_req_t *r) {
  for (;;) {
    size_t len;
    int64_t res = spw__io_next_transfer(io, r, &len);
    if (res == 0) {
      ssize_t n = r->is_write ? pwrite(io->fd, r->buf + r->done, len, (off_t)(r->off + r->done))
                              : pread(io->fd, r->buf + r->done, len, (off_t)(r->off + r->done));
      res = n >= 0 ? (int64_t)n : -(int64_t)errno;
    }
    if (!spw__io_transfer_done(io, r, res)) return;
  }
}

static void *worker(void *arg) {
  spw_io_t *io = arg;
  posix_impl_t *p = io->impl;
  pthread_mutex_lock(&p->q_mu);
  for (;;) {
    while (!p->head && !p->stop) pthread_cond_wait(&p->work_cv, &p->q_mu);
    spw__io_req_t *r = p->head;
    if (!r) break; /* stop, and nothing left */
    p->head = r->next;
    if (!p->head) p->tail = NULL;
    p->queued--;
    pthread_cond_signal(&p->space_cv);
    pthread_mutex_unlock(&p->q_mu);
    run_request(io, r);
    spw__io_post(io, r);
    pthread_mutex_lock(&p->q_mu);
  }
  pthread_mutex_unlock(&p->q_mu);
  return NULL;
}

static int posix_submit(spw_io_t *io, spw__io_req_t *r) {
  posix_impl_t *p = io->impl;
  pthread_mutex_lock(&p->q_mu);
  while (p->queued >= io->depth) pthread_cond_wait(&p->space_cv, &p->q_mu);
  r->next = NULL;
  if (p->tail) p->tail->next = r;
  else p->head = r;
  p->tail = r;
  p->queued++;
  pthread_cond_signal(&p->work_cv);
  pthread_mutex_unlock(&p->q_mu);
  return SPW_OK;
}

static void posix_wait(spw_io_t *io) { pthread_cond_wait(&io->done_cv, &io->done_mu); }

static void posix_free(posix_impl_t *p) {
  pthread_cond_destroy(&p->space_cv);
  pthread_cond_destroy(&p->work_cv);
  pthread_mutex_destroy(&p->q_mu);
  free(p);
}

static void posix_shutdown(spw_io_t *io) {
  posix_impl_t *p = io->impl;
  pthread_mutex_lock(&p->q_mu);
  p->stop = 1;
  pthread_cond_broadcast(&p->work_cv);
  pthread_mutex_unlock(&p->q_mu);
  for (unsigned i = 0; i < p->n_threads; i++) pthread_join(p->threads[i], NULL);
  posix_free(p);
  io->impl = NULL;
}

static const spw__io_ops_t posix_ops = {posix_submit, posix_wait, posix_shutdown};

int spw__io_posix_open(spw_io_t *io) {
  posix_impl_t *p = calloc(1, sizeof *p);
  if (!p) return SPW_ERR_SYSTEM;
  if (pthread_mutex_init(&p->q_mu, NULL) != 0) {
    free(p);
    return SPW_ERR_SYSTEM;
  }
  if (pthread_cond_init(&p->work_cv, NULL) != 0) {
    pthread_mutex_destroy(&p->q_mu);
    free(p);
    return SPW_ERR_SYSTEM;
  }
  if (pthread_cond_init(&p->space_cv, NULL) != 0) {
    pthread_cond_destroy(&p->work_cv);
    pthread_mutex_destroy(&p->q_mu);
    free(p);
    return SPW_ERR_SYSTEM;
  }
  io->impl = p;
  io->ops = &posix_ops;
  unsigned want = io->depth < SPW_POSIX_THREADS ? io->depth : SPW_POSIX_THREADS;
  /* The workers take no signals: the application's handlers belong on its own threads. */
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  for (unsigned i = 0; i < want; i++) {
    if (pthread_create(&p->threads[i], NULL, worker, io) != 0) break;
    p->n_threads++;
  }
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (p->n_threads == 0) {
    posix_free(p);
    io->impl = NULL;
    io->ops = NULL;
    return SPW_ERR_SYSTEM;
  }
  return SPW_OK;
}
