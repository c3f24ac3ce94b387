/* SPDX-License-Identifier: Apache-2.0 */
/* The host backend: a GPU emulated in host memory, so that machines without one exercise
 * the runtime's asynchronous paths for real (backend.h states the contract).
 *
 * Owns the emulated device memory (host blocks behind a 256-byte header, all on one list so
 * that destroy frees what the caller left behind), its capacity accounting, the streams (one
 * FIFO worker thread each) and the events. A "kernel" is a host function
 * (spw_host_kernel_fn) run on the stream's worker with a copy of its arguments.
 *
 * Invariants:
 *  - a stream runs its ops one at a time in enqueue order; op number k (1-based) is done
 *    exactly when completed >= k; enqueued and completed only grow, completed <= enqueued;
 *  - an event is (stream, seq) and is complete once that stream's completed >= seq; a NULL
 *    stream means complete (never recorded, or recorded on a stream with nothing pending);
 *  - a stream's struct lives while it has references: one for its worker (dropped after the
 *    join), one per event recorded on it and one per pending cross-stream wait, so an event
 *    stays usable after its stream is destroyed, as in CUDA;
 *  - allocated <= capacity; capacity is taken when alloc_async is called and given back when
 *    the stream reaches the free.
 * Locks: backend.mu (stream list, allocation list, allocated), stream.mu (queue, counters,
 * free ops), event.mu (its stream and seq). No code path holds two of them at once, and none
 * is held while a host func or the error sink runs.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "backend.h"
#include "grow.h"
#include "host_ipc.h"

#define HOST_ALIGN 256
#define HOST_DEFAULT_CAPACITY ((uint64_t)1 << 30)
/* Enough recycled ops that a stream in steady state never calls malloc, few enough that an
 * idle stream holds next to nothing. */
#define HOST_FREE_OPS_MAX 64
/* The emulated granularity of address-stable memory: smaller than a GPU's 2 MiB so that the
 * suite's buffers (4 KiB to a few MiB, under budgets of a few MiB) exercise both the shared
 * small pages and the multi-chunk ranges, and a multiple of any page size Linux uses. */
#define HOST_VM_GRANULE ((size_t)64 << 10)
/* Tags a chunk that has a descriptor of its own (an entry of fd_chunks: imported, or one of
 * several granules); offsets in vm_fd never reach it. */
#define HOST_CHUNK_FD (1ull << 63)

/* Precedes every block handed out; HOST_ALIGN bytes so that the block stays aligned. */
typedef struct host_block {
  struct host_block *prev, *next;
  size_t bytes; /* as requested: what the capacity accounting took */
} host_block_t;

_Static_assert(sizeof(host_block_t) <= HOST_ALIGN, "block header must fit in its slot");

typedef struct host_stream host_stream_t;

typedef enum host_op_kind {
  OP_COPY,
  OP_BATCH,
  OP_HOST_FN,
  OP_FREE,
  OP_WAIT,
  OP_KERNEL,
} host_op_kind_t;

typedef struct host_op {
  struct host_op *next;
  host_op_kind_t kind;
  union {
    struct {
      void *dst;
      const void *src;
      size_t bytes;
    } copy;
    struct {
      spw_copy_desc_t *descs; /* our own copy: the caller may reuse its array */
      size_t n;
      spw_copy_dir_t dir;
    } batch;
    struct {
      spw_host_fn fn;
      void *arg;
    } host;
    struct {
      void *ptr;
    } free;
    struct {
      host_stream_t *stream; /* referenced until the wait is over */
      uint64_t seq;
    } wait;
    struct {
      spw_host_kernel_fn fn;
      void **args; /* one block: the argument pointers, then the values they point to */
    } kernel;
  } u;
} host_op_t;

struct host_stream {
  struct spw_backend *b;
  pthread_t thread;
  atomic_uint refs;

  pthread_mutex_t mu;
  pthread_cond_t work_cv; /* the worker waits here for ops or stop */
  pthread_cond_t done_cv; /* sync, events and other streams' workers wait here for progress */
  host_op_t *head, *tail;
  host_op_t *free_ops;
  unsigned n_free_ops;
  uint64_t enqueued, completed;
  unsigned waiters; /* threads in done_cv: the worker broadcasts only when someone listens */
  bool worker_idle;
  bool stop;

  host_stream_t *list_prev, *list_next; /* backend.streams, under backend.mu */
};

struct spw_bevent {
  pthread_mutex_t mu;
  host_stream_t *stream; /* NULL: complete; else referenced */
  uint64_t seq;
};

struct spw_backend {
  /* First, in the layout backend.h gives every backend, so the runtime can reach the sink. */
  spw_error_sink_fn on_error;
  void *err_ctx;

  int device; /* the ordinal asked for: what stream_device answers for this backend's streams */

  uint64_t capacity;
  host_stream_t *default_stream;

  pthread_mutex_t mu;
  uint64_t allocated;
  host_block_t *blocks;    /* live allocations, freed at destroy if the caller did not */
  host_stream_t *streams;  /* every live stream, the default one included */

  /* Address-stable memory: "physical" chunks are granules of one memfd, opened at the first
   * chunk_create, so that mapping one at a reserved address (mmap MAP_FIXED | MAP_SHARED)
   * shows the same bytes wherever it lands; unmapping puts PROT_NONE back. Under mu. */
  int vm_fd;                  /* -1 until needed */
  uint64_t vm_next;           /* file offsets [0, vm_next) have been handed out once */
  uint64_t *vm_free;          /* offsets given back, reused first */
  size_t vm_nfree, vm_cap;
  int vm_shareable;           /* chunk_export allowed (config.ipc) */
  /* Chunks with a descriptor of their own: imported from another process (chunk_import:
   * its memfd and an offset in it), or ours of more than one granule (a memfd each, so that
   * no run of contiguous offsets is needed in vm_fd; `own` is their size). Their handles
   * carry HOST_CHUNK_FD and index this table; a free entry has fd -1. Under mu. */
  struct host_fd_chunk {
    int fd;
    uint64_t offset;
    size_t own; /* bytes counted in `allocated`; 0 for an imported chunk */
  } *fd_chunks;
  size_t nfd_chunks, fd_chunks_cap;

  spw_host_ipc_t *ipc; /* regions shared with other processes; NULL until the first */
};

static spw_stream_t to_handle(host_stream_t *s) { return (spw_stream_t)(void *)s; }
static host_stream_t *from_handle(spw_stream_t s) { return (host_stream_t *)(void *)s; }

static void report(spw_backend_t *b, const char *name, const char *text) {
  if (b->on_error) b->on_error(b->err_ctx, name, text);
}

static int report_errno(spw_backend_t *b, const char *call, int err) {
  char text[128];
  /* The GNU strerror_r may return a static string instead of filling `text`. */
  const char *msg = strerror_r(err, text, sizeof text);
  report(b, call, msg);
  return SPW_ERR_SYSTEM;
}

/* ---- stream lifetime ------------------------------------------------------------------ */

static void stream_ref(host_stream_t *s) {
  atomic_fetch_add_explicit(&s->refs, 1, memory_order_relaxed);
}

static void stream_unref(host_stream_t *s) {
  if (atomic_fetch_sub_explicit(&s->refs, 1, memory_order_acq_rel) != 1) return;
  /* The last reference: the worker is joined and nobody waits on the condvars. */
  host_op_t *op = s->free_ops;
  while (op) {
    host_op_t *next = op->next;
    free(op);
    op = next;
  }
  pthread_cond_destroy(&s->done_cv);
  pthread_cond_destroy(&s->work_cv);
  pthread_mutex_destroy(&s->mu);
  free(s);
}

/* ---- the worker ----------------------------------------------------------------------- */

static void block_release(spw_backend_t *b, void *ptr) {
  host_block_t *h = (host_block_t *)(void *)((char *)ptr - HOST_ALIGN);
  pthread_mutex_lock(&b->mu);
  if (h->prev)
    h->prev->next = h->next;
  else
    b->blocks = h->next;
  if (h->next) h->next->prev = h->prev;
  b->allocated -= h->bytes;
  pthread_mutex_unlock(&b->mu);
  free(h);
}

static void wait_for_seq(host_stream_t *s, uint64_t seq) {
  pthread_mutex_lock(&s->mu);
  s->waiters++;
  while (s->completed < seq) pthread_cond_wait(&s->done_cv, &s->mu);
  s->waiters--;
  pthread_mutex_unlock(&s->mu);
}

static void op_run(host_stream_t *s, host_op_t *op) {
  switch (op->kind) {
  case OP_COPY:
    /* cudaMemcpy leaves overlap undefined; memmove costs nothing and hides nothing. */
    memmove(op->u.copy.dst, op->u.copy.src, op->u.copy.bytes);
    break;
  case OP_BATCH:
    for (size_t i = 0; i < op->u.batch.n; i++) {
      const spw_copy_desc_t *d = &op->u.batch.descs[i];
      memmove(d->dst, d->src, d->bytes);
    }
    free(op->u.batch.descs);
    break;
  case OP_HOST_FN:
    op->u.host.fn(op->u.host.arg);
    break;
  case OP_FREE:
    block_release(s->b, op->u.free.ptr);
    break;
  case OP_WAIT:
    wait_for_seq(op->u.wait.stream, op->u.wait.seq);
    stream_unref(op->u.wait.stream);
    break;
  case OP_KERNEL:
    op->u.kernel.fn(op->u.kernel.args);
    free(op->u.kernel.args);
    break;
  }
}

static void *worker_main(void *arg) {
  host_stream_t *s = arg;
  pthread_mutex_lock(&s->mu);
  for (;;) {
    while (!s->head && !s->stop) {
      s->worker_idle = true;
      pthread_cond_wait(&s->work_cv, &s->mu);
      s->worker_idle = false;
    }
    host_op_t *op = s->head;
    if (!op) break; /* stopped, and the queue is drained */
    s->head = op->next;
    if (!s->head) s->tail = NULL;
    pthread_mutex_unlock(&s->mu);

    op_run(s, op);

    pthread_mutex_lock(&s->mu);
    s->completed++;
    if (s->n_free_ops < HOST_FREE_OPS_MAX) {
      op->next = s->free_ops;
      s->free_ops = op;
      s->n_free_ops++;
      op = NULL;
    }
    if (s->waiters) pthread_cond_broadcast(&s->done_cv);
    if (op) {
      pthread_mutex_unlock(&s->mu);
      free(op);
      pthread_mutex_lock(&s->mu);
    }
  }
  pthread_mutex_unlock(&s->mu);
  return NULL;
}

/* Takes an op from the stream's free list, or mallocs one. */
static int op_get(spw_backend_t *b, host_stream_t *s, host_op_t **out) {
  pthread_mutex_lock(&s->mu);
  host_op_t *op = s->free_ops;
  if (op) {
    s->free_ops = op->next;
    s->n_free_ops--;
  }
  pthread_mutex_unlock(&s->mu);
  if (!op && !(op = malloc(sizeof *op))) return report_errno(b, "malloc", ENOMEM);
  *out = op;
  return SPW_OK;
}

/* Appends a filled op; it becomes number s->enqueued. */
static void op_push(host_stream_t *s, host_op_t *op) {
  op->next = NULL;
  pthread_mutex_lock(&s->mu);
  if (s->tail)
    s->tail->next = op;
  else
    s->head = op;
  s->tail = op;
  s->enqueued++;
  if (s->worker_idle) pthread_cond_signal(&s->work_cv);
  pthread_mutex_unlock(&s->mu);
}

static int stream_new(spw_backend_t *b, host_stream_t **out) {
  host_stream_t *s = calloc(1, sizeof *s);
  if (!s) return report_errno(b, "calloc", ENOMEM);
  s->b = b;
  atomic_init(&s->refs, 1); /* the worker's, dropped by stream_stop after the join */
  int err = pthread_mutex_init(&s->mu, NULL);
  if (err) {
    free(s);
    return report_errno(b, "pthread_mutex_init", err);
  }
  if ((err = pthread_cond_init(&s->work_cv, NULL)) != 0) {
    pthread_mutex_destroy(&s->mu);
    free(s);
    return report_errno(b, "pthread_cond_init", err);
  }
  if ((err = pthread_cond_init(&s->done_cv, NULL)) != 0) {
    pthread_cond_destroy(&s->work_cv);
    pthread_mutex_destroy(&s->mu);
    free(s);
    return report_errno(b, "pthread_cond_init", err);
  }

  /* Signals belong to the application's threads: the worker starts with all of them
   * blocked (it inherits the mask of the thread that creates it). */
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  err = pthread_create(&s->thread, NULL, worker_main, s);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (err) {
    stream_unref(s);
    return report_errno(b, "pthread_create", err);
  }
  pthread_setname_np(s->thread, "spw-host-stream");

  pthread_mutex_lock(&b->mu);
  s->list_next = b->streams;
  if (b->streams) b->streams->list_prev = s;
  b->streams = s;
  pthread_mutex_unlock(&b->mu);
  *out = s;
  return SPW_OK;
}

/* Lets the worker drain the queue, joins it and drops its reference. The stream must
 * already be off the backend's list. */
static void stream_stop(host_stream_t *s) {
  pthread_mutex_lock(&s->mu);
  s->stop = true;
  pthread_cond_signal(&s->work_cv);
  pthread_mutex_unlock(&s->mu);
  pthread_join(s->thread, NULL);
  stream_unref(s);
}

static void stream_unlist(spw_backend_t *b, host_stream_t *s) {
  pthread_mutex_lock(&b->mu);
  if (s->list_prev)
    s->list_prev->list_next = s->list_next;
  else
    b->streams = s->list_next;
  if (s->list_next) s->list_next->list_prev = s->list_prev;
  s->list_prev = s->list_next = NULL;
  pthread_mutex_unlock(&b->mu);
}

/* ---- backend lifecycle and memory ------------------------------------------------------ */

static void host_destroy(spw_backend_t *b);

static int host_create(const spw_backend_params_t *p, spw_backend_t **out) {
  if (!p || !out) return SPW_ERR_INVALID_ARG;
  spw_backend_t *b = calloc(1, sizeof *b);
  if (!b) {
    if (p->on_error) p->on_error(p->err_ctx, "calloc", strerror(ENOMEM));
    return SPW_ERR_SYSTEM;
  }
  b->on_error = p->on_error;
  b->err_ctx = p->err_ctx;
  b->device = p->device;
  b->capacity = p->host_device_bytes ? p->host_device_bytes : HOST_DEFAULT_CAPACITY;
  b->vm_fd = -1;
  b->vm_shareable = p->vm_shareable;
  int err = pthread_mutex_init(&b->mu, NULL);
  if (err) {
    int st = report_errno(b, "pthread_mutex_init", err);
    free(b);
    return st;
  }
  int st = stream_new(b, &b->default_stream);
  if (st != SPW_OK) {
    host_destroy(b);
    return st;
  }
  *out = b;
  return SPW_OK;
}

static void host_destroy(spw_backend_t *b) {
  if (!b) return;
  /* Streams first: their queued frees still touch the block list. */
  for (;;) {
    pthread_mutex_lock(&b->mu);
    host_stream_t *s = b->streams;
    pthread_mutex_unlock(&b->mu);
    if (!s) break;
    stream_unlist(b, s);
    stream_stop(s);
  }
  host_block_t *h = b->blocks;
  while (h) {
    host_block_t *next = h->next;
    free(h);
    h = next;
  }
  if (b->vm_fd >= 0) close(b->vm_fd);
  free(b->vm_free);
  for (size_t i = 0; i < b->nfd_chunks; i++)
    if (b->fd_chunks[i].fd >= 0) close(b->fd_chunks[i].fd);
  free(b->fd_chunks);
  spw__host_ipc_destroy(b->ipc);
  pthread_mutex_destroy(&b->mu);
  free(b);
}

static int host_mem_info(spw_backend_t *b, size_t *free_bytes, size_t *total_bytes) {
  pthread_mutex_lock(&b->mu);
  uint64_t used = b->allocated;
  pthread_mutex_unlock(&b->mu);
  if (free_bytes) *free_bytes = (size_t)(b->capacity - used);
  if (total_bytes) *total_bytes = (size_t)b->capacity;
  return SPW_OK;
}

static int host_alloc_async(spw_backend_t *b, size_t bytes, spw_stream_t s, void **out) {
  (void)s; /* the memory exists at once, so it is ready for whatever follows on `s` */
  if (!out || bytes == 0) return SPW_ERR_INVALID_ARG;

  pthread_mutex_lock(&b->mu);
  bool fits = bytes <= b->capacity - b->allocated;
  if (fits) b->allocated += bytes;
  pthread_mutex_unlock(&b->mu);
  if (!fits) {
    report(b, "cudaErrorMemoryAllocation", "out of memory (host backend: emulated device "
                                           "capacity exhausted)");
    return SPW_ERR_OUT_OF_MEMORY;
  }

  void *mem = NULL;
  /* bytes <= capacity, but capacity is the caller's number: guard the header's addition. */
  int err = bytes > SIZE_MAX - HOST_ALIGN ? ENOMEM
                                          : posix_memalign(&mem, HOST_ALIGN, HOST_ALIGN + bytes);
  if (err) {
    pthread_mutex_lock(&b->mu);
    b->allocated -= bytes;
    pthread_mutex_unlock(&b->mu);
    report(b, "cudaErrorMemoryAllocation", "out of memory (host backend: host allocation of "
                                           "the emulated device memory failed)");
    return SPW_ERR_OUT_OF_MEMORY;
  }

  host_block_t *h = mem;
  h->bytes = bytes;
  h->prev = NULL;
  pthread_mutex_lock(&b->mu);
  h->next = b->blocks;
  if (b->blocks) b->blocks->prev = h;
  b->blocks = h;
  pthread_mutex_unlock(&b->mu);
  *out = (char *)mem + HOST_ALIGN;
  return SPW_OK;
}

static int host_free_async(spw_backend_t *b, void *ptr, spw_stream_t s) {
  if (!ptr) return SPW_OK;
  host_stream_t *hs = from_handle(s);
  host_op_t *op = NULL;
  int st = op_get(b, hs, &op);
  if (st != SPW_OK) return st;
  op->kind = OP_FREE;
  op->u.free.ptr = ptr;
  op_push(hs, op);
  return SPW_OK;
}

static int host_trim(spw_backend_t *b) {
  (void)b; /* freed blocks go straight back to the C library: nothing is cached */
  return SPW_OK;
}

/* ---- streams -------------------------------------------------------------------------- */

static spw_stream_t host_default_stream(spw_backend_t *b) { return to_handle(b->default_stream); }

static int host_stream_create(spw_backend_t *b, spw_stream_t *out) {
  if (!out) return SPW_ERR_INVALID_ARG;
  host_stream_t *s = NULL;
  int st = stream_new(b, &s);
  if (st == SPW_OK) *out = to_handle(s);
  return st;
}

static int host_stream_destroy(spw_backend_t *b, spw_stream_t s) {
  host_stream_t *hs = from_handle(s);
  /* The default stream lives as long as the backend: the runtime maps NULL to it. */
  if (!hs || hs == b->default_stream) return SPW_ERR_INVALID_STREAM;
  stream_unlist(b, hs);
  stream_stop(hs);
  return SPW_OK;
}

static int host_stream_sync(spw_backend_t *b, spw_stream_t s) {
  (void)b;
  host_stream_t *hs = from_handle(s);
  pthread_mutex_lock(&hs->mu);
  uint64_t target = hs->enqueued; /* work enqueued later, by other threads, is not waited for */
  pthread_mutex_unlock(&hs->mu);
  wait_for_seq(hs, target);
  return SPW_OK;
}

/* Whether `hs` is one of b's live streams; compares addresses only. */
static bool owns_stream(spw_backend_t *b, const host_stream_t *hs) {
  pthread_mutex_lock(&b->mu);
  const host_stream_t *s = b->streams;
  while (s && s != hs) s = s->list_next;
  pthread_mutex_unlock(&b->mu);
  return s != NULL;
}

/* Only this backend's own streams have a device here: another runtime's stream is unknown
 * (its emulated memory is another), and a stream is never read before it is found among the
 * live ones, since the application may pass any value. */
static int host_stream_device(spw_backend_t *b, spw_stream_t s, int *device) {
  if (!owns_stream(b, from_handle(s))) return SPW_ERR_INVALID_STREAM;
  *device = b->device;
  return SPW_OK;
}

/* ---- events --------------------------------------------------------------------------- */

static int host_event_create(spw_backend_t *b, spw_bevent_t **out) {
  if (!out) return SPW_ERR_INVALID_ARG;
  spw_bevent_t *e = calloc(1, sizeof *e);
  if (!e) return report_errno(b, "calloc", ENOMEM);
  int err = pthread_mutex_init(&e->mu, NULL);
  if (err) {
    free(e);
    return report_errno(b, "pthread_mutex_init", err);
  }
  *out = e;
  return SPW_OK;
}

static void host_event_destroy(spw_backend_t *b, spw_bevent_t *e) {
  (void)b;
  if (!e) return;
  if (e->stream) stream_unref(e->stream);
  pthread_mutex_destroy(&e->mu);
  free(e);
}

static int host_event_record(spw_backend_t *b, spw_bevent_t *e, spw_stream_t s) {
  (void)b;
  host_stream_t *hs = from_handle(s);
  pthread_mutex_lock(&hs->mu);
  uint64_t seq = hs->enqueued;
  bool done = hs->completed >= seq;
  pthread_mutex_unlock(&hs->mu);
  /* Nothing pending: the event is complete now and needs no hold on the stream. */
  if (done)
    hs = NULL;
  else
    stream_ref(hs);

  pthread_mutex_lock(&e->mu);
  host_stream_t *old = e->stream;
  e->stream = hs;
  e->seq = seq;
  pthread_mutex_unlock(&e->mu);
  if (old) stream_unref(old);
  return SPW_OK;
}

/* The event's (stream, seq) with a reference on the stream, or NULL for complete. */
static host_stream_t *event_snapshot(spw_bevent_t *e, uint64_t *seq) {
  pthread_mutex_lock(&e->mu);
  host_stream_t *s = e->stream;
  *seq = e->seq;
  if (s) stream_ref(s);
  pthread_mutex_unlock(&e->mu);
  return s;
}

static int host_event_query(spw_backend_t *b, spw_bevent_t *e) {
  (void)b;
  uint64_t seq;
  host_stream_t *s = event_snapshot(e, &seq);
  if (!s) return SPW_OK;
  pthread_mutex_lock(&s->mu);
  bool done = s->completed >= seq;
  pthread_mutex_unlock(&s->mu);
  stream_unref(s);
  return done ? SPW_OK : SPW_ERR_NOT_READY;
}

static int host_event_sync(spw_backend_t *b, spw_bevent_t *e) {
  (void)b;
  uint64_t seq;
  host_stream_t *s = event_snapshot(e, &seq);
  if (!s) return SPW_OK;
  wait_for_seq(s, seq);
  stream_unref(s);
  return SPW_OK;
}

static int host_stream_wait_event(spw_backend_t *b, spw_stream_t s, spw_bevent_t *e) {
  host_stream_t *hs = from_handle(s);
  uint64_t seq;
  host_stream_t *es = event_snapshot(e, &seq);
  if (!es) return SPW_OK;
  /* A stream already runs in order, and work already done needs no op. */
  pthread_mutex_lock(&es->mu);
  bool done = es->completed >= seq;
  pthread_mutex_unlock(&es->mu);
  if (done || es == hs) {
    stream_unref(es);
    return SPW_OK;
  }
  host_op_t *op = NULL;
  int st = op_get(b, hs, &op);
  if (st != SPW_OK) {
    stream_unref(es);
    return st;
  }
  op->kind = OP_WAIT;
  op->u.wait.stream = es; /* the snapshot's reference passes to the op */
  op->u.wait.seq = seq;
  op_push(hs, op);
  return SPW_OK;
}

/* ---- copies and host functions ---------------------------------------------------------- */

static int host_memcpy_async(spw_backend_t *b, void *dst, const void *src, size_t bytes,
                             spw_stream_t s) {
  if (bytes == 0) return SPW_OK;
  if (!dst || !src) return SPW_ERR_INVALID_ARG;
  host_stream_t *hs = from_handle(s);
  host_op_t *op = NULL;
  int st = op_get(b, hs, &op);
  if (st != SPW_OK) return st;
  op->kind = OP_COPY;
  op->u.copy.dst = dst;
  op->u.copy.src = src;
  op->u.copy.bytes = bytes;
  op_push(hs, op);
  return SPW_OK;
}

static int host_copy_batch_async(spw_backend_t *b, const spw_copy_desc_t *descs, size_t n,
                                 spw_copy_dir_t dir, spw_stream_t s) {
  if (dir != SPW_COPY_D2H && dir != SPW_COPY_H2D) return SPW_ERR_INVALID_ARG;
  if (n == 0) return SPW_OK;
  if (!descs || n > SIZE_MAX / sizeof *descs) return SPW_ERR_INVALID_ARG;
  for (size_t i = 0; i < n; i++)
    if (descs[i].bytes && (!descs[i].dst || !descs[i].src)) return SPW_ERR_INVALID_ARG;

  host_stream_t *hs = from_handle(s);
  spw_copy_desc_t *copy = malloc(n * sizeof *copy);
  if (!copy) return report_errno(b, "malloc", ENOMEM);
  memcpy(copy, descs, n * sizeof *copy);
  host_op_t *op = NULL;
  int st = op_get(b, hs, &op);
  if (st != SPW_OK) {
    free(copy);
    return st;
  }
  op->kind = OP_BATCH;
  op->u.batch.descs = copy;
  op->u.batch.n = n;
  op->u.batch.dir = dir;
  op_push(hs, op);
  return SPW_OK;
}

static int host_host_register(spw_backend_t *b, void *ptr, size_t bytes) {
  (void)b; /* host memory needs no pinning to be "device"-accessible here */
  return ptr && bytes ? SPW_OK : SPW_ERR_INVALID_ARG;
}

static int host_host_unregister(spw_backend_t *b, void *ptr) {
  (void)b;
  return ptr ? SPW_OK : SPW_ERR_INVALID_ARG;
}

static int host_launch_host_func(spw_backend_t *b, spw_stream_t s, spw_host_fn fn, void *arg) {
  if (!fn) return SPW_ERR_INVALID_ARG;
  host_stream_t *hs = from_handle(s);
  host_op_t *op = NULL;
  int st = op_get(b, hs, &op);
  if (st != SPW_OK) return st;
  op->kind = OP_HOST_FN;
  op->u.host.fn = fn;
  op->u.host.arg = arg;
  op_push(hs, op);
  return SPW_OK;
}

/* There are no kernels here: `func` is a spw_host_kernel_fn, run on the stream's worker. It
 * gets its own copy of the argument values, taken now, as cudaLaunchKernel copies them at
 * launch, so the caller may reuse its variables at once. */
#define KARG_ALIGN _Alignof(max_align_t)

static size_t karg_round(size_t n) { return (n + KARG_ALIGN - 1) / KARG_ALIGN * KARG_ALIGN; }

static int host_launch_kernel(spw_backend_t *b, spw_stream_t s, const void *func, spw_dim3_t grid,
                              spw_dim3_t block, size_t shared_bytes, void **args,
                              const size_t *sizes, size_t nargs) {
  (void)grid;
  (void)block;
  (void)shared_bytes;
  if (!func || (nargs && (!args || !sizes))) return SPW_ERR_INVALID_ARG;
  size_t head = karg_round(nargs * sizeof(void *)), total = head;
  for (size_t i = 0; i < nargs; i++) total += karg_round(sizes[i]);
  void **copy = malloc(total ? total : 1);
  if (!copy) return report_errno(b, "malloc", ENOMEM);
  char *at = (char *)copy + head;
  for (size_t i = 0; i < nargs; i++) {
    memcpy(at, args[i], sizes[i]);
    copy[i] = at;
    at += karg_round(sizes[i]);
  }
  spw_host_kernel_fn fn;
  memcpy(&fn, &func, sizeof fn); /* the inverse of spw_host_kernel() */

  host_stream_t *hs = from_handle(s);
  host_op_t *op = NULL;
  int st = op_get(b, hs, &op);
  if (st != SPW_OK) {
    free(copy);
    return st;
  }
  op->kind = OP_KERNEL;
  op->u.kernel.fn = fn;
  op->u.kernel.args = copy;
  op_push(hs, op);
  return SPW_OK;
}

/* There are no graphs here either: `graph_exec` is a spw_host_graph_t, read now (the caller
 * may reuse it at once), whose fn(user) runs on the stream's worker like a host function. */
static int host_graph_launch(spw_backend_t *b, spw_stream_t s, const void *graph_exec) {
  const spw_host_graph_t *g = graph_exec;
  if (!g || !g->fn) return SPW_ERR_INVALID_ARG;
  return host_launch_host_func(b, s, g->fn, g->user);
}

/* ---- address-stable memory ---------------------------------------------------------------- */

/* ---- the peer tier: every emulated device is in this process's memory ----------------- */

static int host_peer_access(spw_backend_t *b, int peer_device) {
  (void)b;
  (void)peer_device;
  return SPW_OK;
}

static int host_peer_alloc(spw_backend_t *b, size_t bytes, void **out) {
  return host_alloc_async(b, bytes, to_handle(b->default_stream), out);
}

static int host_peer_free(spw_backend_t *b, void *ptr) {
  spw_stream_t s = to_handle(b->default_stream);
  int st = host_free_async(b, ptr, s);
  return st == SPW_OK ? host_stream_sync(b, s) : st;
}

/* ---- memory other processes can map (host_ipc.h) --------------------------------------- */

static int ipc_state(spw_backend_t *b, spw_host_ipc_t **out) {
  pthread_mutex_lock(&b->mu);
  int st = b->ipc ? SPW_OK : spw__host_ipc_create(&b->ipc);
  *out = b->ipc;
  pthread_mutex_unlock(&b->mu);
  return st;
}

static int host_ipc_alloc(spw_backend_t *b, size_t bytes, void **out) {
  spw_host_ipc_t *x;
  int st = ipc_state(b, &x);
  if (st != SPW_OK) return st;
  pthread_mutex_lock(&b->mu);
  bool fits = bytes <= b->capacity - b->allocated;
  if (fits) b->allocated += bytes;
  pthread_mutex_unlock(&b->mu);
  if (!fits) {
    report(b, "cudaErrorMemoryAllocation", "out of memory (host backend: emulated device "
                                           "capacity exhausted)");
    return SPW_ERR_OUT_OF_MEMORY;
  }
  st = spw__host_ipc_alloc(x, bytes, out);
  if (st != SPW_OK) {
    int err = errno;
    pthread_mutex_lock(&b->mu);
    b->allocated -= bytes;
    pthread_mutex_unlock(&b->mu);
    report_errno(b, "memfd_create/mmap", err);
  }
  return st;
}

static int host_ipc_free(spw_backend_t *b, void *base) {
  size_t bytes = 0;
  spw_host_ipc_t *x;
  int st = ipc_state(b, &x);
  if (st == SPW_OK) st = spw__host_ipc_free(x, base, &bytes);
  if (st != SPW_OK) return st;
  pthread_mutex_lock(&b->mu);
  b->allocated -= bytes;
  pthread_mutex_unlock(&b->mu);
  return SPW_OK;
}

static int host_ipc_export(spw_backend_t *b, void *base, unsigned char handle[SPW_IPC_HANDLE_BYTES]) {
  spw_host_ipc_t *x;
  int st = ipc_state(b, &x);
  return st == SPW_OK ? spw__host_ipc_export(x, base, handle) : st;
}

static int host_ipc_open(spw_backend_t *b, const unsigned char handle[SPW_IPC_HANDLE_BYTES],
                         void **base) {
  spw_host_ipc_t *x;
  int st = ipc_state(b, &x);
  if (st == SPW_OK) st = spw__host_ipc_open(x, handle, base);
  if (st == SPW_ERR_SYSTEM) report_errno(b, "mmap", errno);
  if (st == SPW_ERR_CUDA)
    report(b, "cudaErrorInvalidValue", "host backend: the exporting process, or its region, "
                                       "is gone");
  return st;
}

static int host_ipc_close(spw_backend_t *b, void *base) {
  spw_host_ipc_t *x;
  int st = ipc_state(b, &x);
  return st == SPW_OK ? spw__host_ipc_close(x, base) : st;
}

static int host_vm_granularity(spw_backend_t *b, size_t *out) {
  (void)b;
  *out = HOST_VM_GRANULE;
  return SPW_OK;
}

static int host_vm_reserve(spw_backend_t *b, size_t bytes, void **out) {
  /* Over-reserve by a granule and trim, so that the range is granule-aligned as CUDA's is. */
  size_t span = bytes + HOST_VM_GRANULE;
  uint8_t *p = mmap(NULL, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return report_errno(b, "mmap", errno);
  uintptr_t a = ((uintptr_t)p + HOST_VM_GRANULE - 1) & ~(uintptr_t)(HOST_VM_GRANULE - 1);
  uint8_t *va = (uint8_t *)a;
  if (va > p) munmap(p, (size_t)(va - p));
  if (va + bytes < p + span) munmap(va + bytes, (size_t)(p + span - (va + bytes)));
  *out = va;
  return SPW_OK;
}

static int host_vm_free(spw_backend_t *b, void *va, size_t bytes) {
  return munmap(va, bytes) == 0 ? SPW_OK : report_errno(b, "munmap", errno);
}

/* A free entry of fd_chunks for `fd` (mu held); its handle in *out. */
static int fd_chunk_add(spw_backend_t *b, int fd, uint64_t offset, size_t own, uint64_t *out) {
  size_t i = 0;
  while (i < b->nfd_chunks && b->fd_chunks[i].fd >= 0) i++;
  if (i == b->nfd_chunks) {
    struct host_fd_chunk *g = spw__grow(b->fd_chunks, &b->fd_chunks_cap, i + 1, sizeof *g, 8);
    if (!g) return SPW_ERR_SYSTEM;
    b->fd_chunks = g;
    b->nfd_chunks++;
  }
  b->fd_chunks[i] = (struct host_fd_chunk){fd, offset, own};
  *out = HOST_CHUNK_FD | i;
  return SPW_OK;
}

/* A chunk of several granules: a memfd of its own, sparse as vm_fd is. */
static int host_chunk_create_large(spw_backend_t *b, size_t bytes, uint64_t *out) {
  pthread_mutex_lock(&b->mu);
  int st = bytes > b->capacity - b->allocated ? SPW_ERR_OUT_OF_MEMORY : SPW_OK;
  if (st == SPW_OK) b->allocated += bytes; /* taken now: the capacity check is atomic */
  pthread_mutex_unlock(&b->mu);
  if (st != SPW_OK) {
    report(b, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory (host backend: emulated device "
                                          "capacity exhausted)");
    return st;
  }
  int fd = memfd_create("spillway-vm-chunk", MFD_CLOEXEC);
  if (fd < 0 || ftruncate(fd, (off_t)bytes) != 0) st = report_errno(b, fd < 0 ? "memfd_create" : "ftruncate", errno);
  pthread_mutex_lock(&b->mu);
  if (st == SPW_OK) st = fd_chunk_add(b, fd, 0, bytes, out);
  if (st != SPW_OK) b->allocated -= bytes;
  pthread_mutex_unlock(&b->mu);
  if (st != SPW_OK && fd >= 0) close(fd);
  return st;
}

static int host_chunk_create(spw_backend_t *b, size_t bytes, uint64_t *out) {
  if (bytes == 0 || bytes % HOST_VM_GRANULE) return SPW_ERR_INVALID_ARG;
  if (bytes > HOST_VM_GRANULE) return host_chunk_create_large(b, bytes, out);
  pthread_mutex_lock(&b->mu);
  int st = SPW_OK;
  if (bytes > b->capacity - b->allocated) {
    st = SPW_ERR_OUT_OF_MEMORY;
  } else if (b->vm_fd < 0) {
    /* Sparse: ftruncate commits nothing; a granule takes memory when it is first written. */
    int fd = memfd_create("spillway-vm", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, (off_t)(b->capacity + HOST_VM_GRANULE)) != 0) {
      st = report_errno(b, fd < 0 ? "memfd_create" : "ftruncate", errno);
      if (fd >= 0) close(fd);
    } else {
      b->vm_fd = fd;
    }
  }
  if (st == SPW_OK) {
    /* Offsets handed out never pass capacity + a granule: allocated <= capacity keeps the
     * ones in use below it, and freed ones are reused before vm_next grows. */
    if (b->vm_nfree > 0) {
      *out = b->vm_free[--b->vm_nfree];
    } else {
      *out = b->vm_next;
      b->vm_next += bytes;
    }
    b->allocated += bytes;
  }
  pthread_mutex_unlock(&b->mu);
  if (st == SPW_ERR_OUT_OF_MEMORY)
    report(b, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory (host backend: emulated device "
                                          "capacity exhausted)");
  return st;
}

/* The entry of a chunk with a descriptor of its own, or NULL for a granule of vm_fd (mu
 * held). */
static struct host_fd_chunk *fd_chunk(spw_backend_t *b, uint64_t chunk) {
  if (!(chunk & HOST_CHUNK_FD)) return NULL;
  uint64_t i = chunk & ~HOST_CHUNK_FD;
  return i < b->nfd_chunks && b->fd_chunks[i].fd >= 0 ? &b->fd_chunks[i] : NULL;
}

static void host_chunk_release(spw_backend_t *b, uint64_t chunk, size_t bytes) {
  if (chunk & HOST_CHUNK_FD) {
    /* Closing the descriptor gives the memory back once no mapping holds it; an imported
     * chunk is the exporter's memory, and only our hold on it goes. */
    pthread_mutex_lock(&b->mu);
    struct host_fd_chunk *c = fd_chunk(b, chunk);
    int fd = c ? c->fd : -1;
    if (c) {
      b->allocated -= c->own;
      c->fd = -1;
    }
    pthread_mutex_unlock(&b->mu);
    if (fd >= 0) close(fd);
    return;
  }
  /* The granule's memory goes back to the system, as cuMemRelease gives it to the device. */
  (void)fallocate(b->vm_fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)chunk,
                  (off_t)bytes);
  pthread_mutex_lock(&b->mu);
  uint64_t *grown = spw__grow(b->vm_free, &b->vm_cap, b->vm_nfree + 1, sizeof *grown, 64);
  if (grown) {
    b->vm_free = grown;
    b->vm_free[b->vm_nfree++] = chunk;
  } /* else the offset is lost: the file only grows past capacity by what is lost */
  b->allocated -= bytes;
  pthread_mutex_unlock(&b->mu);
}

static int host_chunk_map(spw_backend_t *b, void *va, size_t bytes, uint64_t chunk) {
  int fd = b->vm_fd;
  uint64_t offset = chunk;
  if (chunk & HOST_CHUNK_FD) {
    pthread_mutex_lock(&b->mu);
    struct host_fd_chunk *c = fd_chunk(b, chunk);
    fd = c ? c->fd : -1;
    offset = c ? c->offset : 0;
    pthread_mutex_unlock(&b->mu);
    if (fd < 0) return SPW_ERR_INVALID_ARG;
  }
  void *p = mmap(va, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, (off_t)offset);
  return p == MAP_FAILED ? report_errno(b, "mmap", errno) : SPW_OK;
}

static int host_chunk_unmap(spw_backend_t *b, void *va, size_t bytes) {
  /* Back to an inaccessible reservation, not munmap: the range stays the caller's, and a
   * late access faults instead of landing in whatever the system maps there next. */
  void *p = mmap(va, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE,
                 -1, 0);
  return p == MAP_FAILED ? report_errno(b, "mmap", errno) : SPW_OK;
}

static int host_chunk_export(spw_backend_t *b, uint64_t chunk, int *fd, uint64_t *fd_offset) {
  if (!fd || !fd_offset) return SPW_ERR_INVALID_ARG;
  if (!b->vm_shareable) return SPW_ERR_UNSUPPORTED;
  pthread_mutex_lock(&b->mu);
  int own = b->vm_fd;
  uint64_t offset = chunk;
  if (chunk & HOST_CHUNK_FD) { /* ours of several granules, never an imported one */
    struct host_fd_chunk *c = fd_chunk(b, chunk);
    own = c && c->own ? c->fd : -1;
    offset = c ? c->offset : 0;
  }
  pthread_mutex_unlock(&b->mu);
  if (own < 0) return SPW_ERR_INVALID_ARG; /* no chunk was ever created */
  int d = fcntl(own, F_DUPFD_CLOEXEC, 0);
  if (d < 0) return report_errno(b, "fcntl(F_DUPFD_CLOEXEC)", errno);
  *fd = d;
  *fd_offset = offset;
  return SPW_OK;
}

static int host_chunk_import(spw_backend_t *b, int fd, uint64_t fd_offset, size_t bytes,
                             uint64_t *chunk) {
  if (fd < 0 || !chunk || bytes == 0 || bytes % HOST_VM_GRANULE || fd_offset % HOST_VM_GRANULE)
    return SPW_ERR_INVALID_ARG;
  int d = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (d < 0) return report_errno(b, "fcntl(F_DUPFD_CLOEXEC)", errno);
  pthread_mutex_lock(&b->mu);
  int st = fd_chunk_add(b, d, fd_offset, 0, chunk);
  pthread_mutex_unlock(&b->mu);
  if (st != SPW_OK) close(d);
  return st;
}

const spw_backend_ops_t spw__backend_host_ops = {
    .name = "host",
    .kind = SPW_BACKEND_HOST,
    .create = host_create,
    .destroy = host_destroy,
    .mem_info = host_mem_info,
    .alloc_async = host_alloc_async,
    .free_async = host_free_async,
    .trim = host_trim,
    .default_stream = host_default_stream,
    .stream_create = host_stream_create,
    .stream_destroy = host_stream_destroy,
    .stream_sync = host_stream_sync,
    .stream_device = host_stream_device,
    .event_create = host_event_create,
    .event_destroy = host_event_destroy,
    .event_record = host_event_record,
    .event_query = host_event_query,
    .event_sync = host_event_sync,
    .stream_wait_event = host_stream_wait_event,
    .memcpy_async = host_memcpy_async,
    .copy_batch_async = host_copy_batch_async,
    .host_register = host_host_register,
    .host_unregister = host_host_unregister,
    .launch_host_func = host_launch_host_func,
    .launch_kernel = host_launch_kernel,
    .graph_launch = host_graph_launch,
    .peer_access = host_peer_access,
    .peer_alloc = host_peer_alloc,
    .peer_free = host_peer_free,
    .ipc_alloc = host_ipc_alloc,
    .ipc_free = host_ipc_free,
    .ipc_export = host_ipc_export,
    .ipc_open = host_ipc_open,
    .ipc_close = host_ipc_close,
    .vm_granularity = host_vm_granularity,
    .vm_reserve = host_vm_reserve,
    .vm_free = host_vm_free,
    .chunk_create = host_chunk_create,
    .chunk_release = host_chunk_release,
    .chunk_map = host_chunk_map,
    .chunk_unmap = host_chunk_unmap,
    .chunk_export = host_chunk_export,
    .chunk_import = host_chunk_import,
};
