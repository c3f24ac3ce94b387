/* SPDX-License-Identifier: Apache-2.0 */
/* The disk tier (see disk_tier.h): the spill file, the I/O path and the staging slots.
 *
 * Staging is bounded: SPW_DISK_PIPES pipelines of SPW_DISK_SLOTS slots of `chunk` bytes,
 * pinned through the backend and registered with io_uring as fixed buffers. A device
 * transfer (a batch of buffers) takes one pipeline for its duration; its slots rotate so
 * that the device copy of one slot overlaps the disk transfers of the others. A slot is
 * reused only after both its disk transfers and its device copy are known complete. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "disk_tier.h"

#include "clock.h"

/* One pipeline: every pipeline reaps from the one completion list of the tier's I/O, so
 * with two a reaper could take the other pipeline's completion for its own and upload a
 * staging slot whose read had not landed (seen as stale or foreign pages under concurrent
 * disk reads). Two pipelines need completions routed to their owner first. */
#define SPW_DISK_PIPES 1
/* Slots of 4 MiB (`chunk`), 64 MiB in flight: the H100 machine's virtual disk moves more
 * the more bytes are in flight (raw io_uring 1.6 GB/s with 16 x 1 MiB, KvikIO 2.1 with 16
 * threads x 4 MiB), and small buffers packed into a slot go out as one request anyway. */
#define SPW_DISK_SLOTS 16
/* Freed space goes back to the file system (a sweep step) only once no transfer has run for
 * this long. A hole punch takes the file's inode lock and waits for every direct transfer
 * in flight (ext4, XFS), and on a file system mounted with discard it discards the range:
 * on an H100 machine's virtual disk, steps run beside reads back drained its queue at every
 * punch, and 256 MiB buffers came back at 0.53-0.69 of the raw disk against 0.95-1.06 with
 * no sweep (docs/benchmarks.md, 2026-11-27). */
#define SPW_DISK_QUIET_NS ((uint64_t)50 * 1000 * 1000)

typedef struct pipe {
  int busy;
  uint8_t *slot[SPW_DISK_SLOTS];
  spw_bevent_t *ev[SPW_DISK_SLOTS];
} pipe_t;

struct spw_disk {
  const spw_backend_ops_t *ops;
  spw_backend_t *be;
  spw_spill_file_t *file;
  spw_io_t *io;
  size_t chunk;
  uint8_t *staging;
  size_t staging_bytes;
  _Atomic uint64_t *requests;
  uint64_t quiet_ns;
  void (*test_in_sweep)(void *test_ctx);
  void *test_ctx;
  pthread_mutex_t mu; /* guards pipes[].busy, moving, quiet_since, sweeping */
  pthread_cond_t cv;  /* a pipe came free, or a sweep step ended */
  unsigned moving;      /* transfers under way (batches holding a pipe, host writes) */
  uint64_t quiet_since; /* when the last one ended (spw__now_ns) */
  int sweeping;         /* a sweep step runs: transfers wait for it to end */
  pipe_t pipes[SPW_DISK_PIPES];
};

void spw__disk_destroy(spw_disk_t *d) {
  if (!d) return;
  if (d->io) spw__io_close(d->io);
  for (int p = 0; p < SPW_DISK_PIPES; p++)
    for (int i = 0; i < SPW_DISK_SLOTS; i++)
      if (d->pipes[p].ev[i]) d->ops->event_destroy(d->be, d->pipes[p].ev[i]);
  if (d->staging) {
    d->ops->host_unregister(d->be, d->staging);
    munmap(d->staging, d->staging_bytes);
  }
  if (d->file) spw__spill_file_close(d->file);
  pthread_cond_destroy(&d->cv);
  pthread_mutex_destroy(&d->mu);
  free(d);
}

static void report(const spw_disk_params_t *p, const char *name, const char *text) {
  if (p->on_error) p->on_error(p->ctx, name, text);
}

int spw__disk_create(const spw_disk_params_t *par, spw_disk_t **out) {
  spw_disk_t *d = calloc(1, sizeof *d);
  if (!d) return SPW_ERR_SYSTEM;
  d->ops = par->ops;
  d->be = par->be;
  d->requests = par->requests;
  d->quiet_ns = par->quiet_ns ? par->quiet_ns : SPW_DISK_QUIET_NS;
  d->test_in_sweep = par->test_in_sweep;
  d->test_ctx = par->test_ctx;
  pthread_mutex_init(&d->mu, NULL);
  pthread_cond_init(&d->cv, NULL);
  d->chunk = (size_t)4 << 20;
  int st = spw__spill_file_open(par->dir, par->limit, par->grow_step, par->log, par->ctx, &d->file);
  if (st == SPW_OK) {
    d->staging_bytes = d->chunk * SPW_DISK_SLOTS * SPW_DISK_PIPES;
    d->staging = mmap(NULL, d->staging_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                      -1, 0);
    if (d->staging == MAP_FAILED) {
      d->staging = NULL;
      report(par, "mmap", "mapping the disk staging slots failed");
      st = SPW_ERR_SYSTEM;
    }
  }
  if (st == SPW_OK) {
    memset(d->staging, 0, d->staging_bytes); /* touch before pinning: much faster */
    st = d->ops->host_register(d->be, d->staging, d->staging_bytes);
    if (st != SPW_OK) {
      munmap(d->staging, d->staging_bytes);
      d->staging = NULL;
    }
  }
  void *bufs[SPW_DISK_PIPES * SPW_DISK_SLOTS];
  size_t lens[SPW_DISK_PIPES * SPW_DISK_SLOTS];
  for (int p = 0; st == SPW_OK && p < SPW_DISK_PIPES; p++) {
    for (int i = 0; i < SPW_DISK_SLOTS && st == SPW_OK; i++) {
      int k = p * SPW_DISK_SLOTS + i;
      d->pipes[p].slot[i] = d->staging + (size_t)k * d->chunk;
      bufs[k] = d->pipes[p].slot[i];
      lens[k] = d->chunk;
      st = d->ops->event_create(d->be, &d->pipes[p].ev[i]);
    }
  }
  if (st == SPW_OK) {
    spw_io_params_t p = {.fd = spw__spill_file_fd(d->file),
                         .kind = par->io,
                         .queue_depth = 32,
                         .fixed_bufs = bufs,
                         .fixed_lens = lens,
                         .n_fixed = SPW_DISK_PIPES * SPW_DISK_SLOTS,
                         .log = par->log,
                         .on_error = par->on_error,
                         .ctx = par->ctx};
    st = spw__io_open(&p, &d->io);
  }
  if (st != SPW_OK) {
    spw__disk_destroy(d);
    return st;
  }
  if (par->log) {
    char line[512];
    snprintf(line, sizeof line, "disk tier open in %s: %s I/O, %s, staging %zu x %zu B", par->dir,
             spw__io_kind(d->io) == SPW_IO_URING ? "io_uring" : "POSIX",
             spw__spill_file_is_direct(d->file) ? "O_DIRECT" : "buffered",
             (size_t)(SPW_DISK_PIPES * SPW_DISK_SLOTS), d->chunk);
    par->log(par->ctx, SPW_LOG_INFO, line);
  }
  *out = d;
  return SPW_OK;
}

int spw__disk_free(spw_disk_t *d, spw_disk_extent_t *e) {
  int due = e->bytes && d ? spw__spill_file_free(d->file, e) : 0;
  *e = (spw_disk_extent_t){0};
  return due;
}

int spw__disk_sweep(spw_disk_t *d, unsigned max_punches, uint64_t *later_ns) {
  if (later_ns) *later_ns = 0;
  if (!d || !spw__spill_file_sweep_due(d->file)) return 0;
  pthread_mutex_lock(&d->mu);
  uint64_t quiet = spw__now_ns() - d->quiet_since;
  if (d->moving > 0 || quiet < d->quiet_ns) {
    if (later_ns) *later_ns = d->moving > 0 ? d->quiet_ns : d->quiet_ns - quiet;
    pthread_mutex_unlock(&d->mu);
    return 0;
  }
  d->sweeping = 1;
  pthread_mutex_unlock(&d->mu);
  if (d->test_in_sweep) d->test_in_sweep(d->test_ctx);
  int more = spw__spill_file_sweep(d->file, max_punches);
  pthread_mutex_lock(&d->mu);
  d->sweeping = 0;
  pthread_cond_broadcast(&d->cv);
  pthread_mutex_unlock(&d->mu);
  return more;
}

uint64_t spw__disk_in_use(const spw_disk_t *d) { return spw__spill_file_bytes_in_use(d->file); }

void spw__disk_inject_fault(spw_disk_t *d, int status, unsigned count) {
  spw__io_inject_fault(d->io, status, count);
}

static size_t round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

static void count_request(spw_disk_t *d) {
  if (d->requests) atomic_fetch_add_explicit(d->requests, 1, memory_order_relaxed);
}

/* A transfer outside the pipelines (a host write) waits for a sweep step to end, and counts
 * as one under way: no step starts beside it. */
static void transfer_begin(spw_disk_t *d) {
  pthread_mutex_lock(&d->mu);
  while (d->sweeping) pthread_cond_wait(&d->cv, &d->mu);
  d->moving++;
  pthread_mutex_unlock(&d->mu);
}

static void transfer_end(spw_disk_t *d) {
  pthread_mutex_lock(&d->mu);
  d->moving--;
  d->quiet_since = spw__now_ns();
  pthread_mutex_unlock(&d->mu);
}

int spw__disk_write_host(spw_disk_t *d, const void *host_src, size_t bytes,
                         spw_disk_extent_t *out) {
  spw_disk_extent_t e;
  int st = spw__spill_file_alloc(d->file, bytes, &e);
  if (st != SPW_OK) return st;
  size_t len = round_up(bytes, spw__spill_file_alignment(d->file));
  count_request(d);
  transfer_begin(d);
  st = spw__io_write_all(d->io, host_src, len, e.off);
  transfer_end(d);
  if (st != SPW_OK) {
    spw__spill_file_free(d->file, &e);
    return st;
  }
  *out = e;
  return SPW_OK;
}

static pipe_t *take_pipe(spw_disk_t *d, int *index) {
  pthread_mutex_lock(&d->mu);
  for (;;) {
    for (int p = 0; p < SPW_DISK_PIPES && !d->sweeping; p++) {
      if (!d->pipes[p].busy) {
        d->pipes[p].busy = 1;
        d->moving++;
        pthread_mutex_unlock(&d->mu);
        *index = p;
        return &d->pipes[p];
      }
    }
    pthread_cond_wait(&d->cv, &d->mu);
  }
}

static void give_pipe(spw_disk_t *d, pipe_t *p) {
  pthread_mutex_lock(&d->mu);
  p->busy = 0;
  d->moving--;
  d->quiet_since = spw__now_ns();
  pthread_cond_broadcast(&d->cv); /* host writers wait on it too */
  pthread_mutex_unlock(&d->mu);
}

/* ---- batched device transfers -------------------------------------------------------------
 *
 * The items are cut into pieces of at most one chunk, and the pieces packed in order into
 * groups of at most one chunk of staging (each piece padded to the alignment): a large item
 * spans whole groups, small ones share a group, staged together in a free slot. A group
 * moves as one copy batch and, where consecutive pieces are also consecutive in the file
 * (extents allocated one after another usually are), one disk request per such run: small
 * buffers then cost the disk what large ones do. A run's request is tagged with its first
 * piece, which knows its slot and how many pieces the run covers. */

typedef struct piece {
  uint32_t item;
  uint32_t slot;
  uint32_t run;  /* pieces in the run this one heads; 0 when it heads none */
  int live;      /* a write: its copy was enqueued (the guard let it) */
  size_t off;    /* in the item */
  size_t len;
  size_t at;     /* in the slot */
} piece_t;

typedef struct batch {
  spw_disk_t *d;
  spw_disk_item_t *items;
  pipe_t *p;
  int pi;
  size_t align;
  piece_t *pc;
  size_t np;
  size_t *group; /* group g's pieces are pc[group[g]] .. pc[group[g + 1] - 1] */
  size_t ng;
  unsigned outstanding[SPW_DISK_SLOTS]; /* requests in flight per slot */
  unsigned pending;                     /* in all */
  spw_copy_desc_t descs[];              /* one group's copies */
} batch_t;

static void batch_free(batch_t *b) {
  if (!b) return;
  free(b->pc);
  free(b->group);
  free(b);
}

/* Cuts and packs the items whose status is SPW_OK. NULL when out of memory. */
static batch_t *batch_plan(spw_disk_t *d, spw_disk_item_t *items, size_t n) {
  size_t align = spw__spill_file_alignment(d->file), np = 0;
  for (size_t i = 0; i < n; i++)
    if (items[i].status == SPW_OK) np += (items[i].bytes + d->chunk - 1) / d->chunk;
  /* A group holds at most chunk / align pieces. */
  size_t per_group = d->chunk / align;
  batch_t *b = calloc(1, sizeof *b + per_group * sizeof(spw_copy_desc_t));
  if (!b) return NULL;
  b->pc = malloc((np ? np : 1) * sizeof *b->pc);
  b->group = malloc((np + 1) * sizeof *b->group);
  if (!b->pc || !b->group) {
    batch_free(b);
    return NULL;
  }
  b->d = d;
  b->items = items;
  b->align = align;
  size_t used = d->chunk; /* staging bytes of the open group; full: none open yet */
  for (size_t i = 0; i < n; i++) {
    if (items[i].status != SPW_OK) continue;
    for (size_t off = 0; off < items[i].bytes; off += d->chunk) {
      size_t len = items[i].bytes - off < d->chunk ? items[i].bytes - off : d->chunk;
      size_t padded = round_up(len, align);
      if (used + padded > d->chunk) {
        b->group[b->ng++] = b->np;
        used = 0;
      }
      b->pc[b->np++] = (piece_t){.item = (uint32_t)i, .off = off, .len = len, .at = used};
      used += padded;
    }
  }
  b->group[b->ng] = b->np;
  return b;
}

static uint64_t file_off(const batch_t *b, const piece_t *q) {
  return b->items[q->item].ext.off + q->off;
}

/* Whether `next` continues `q` in the slot and in the file. */
static int continues(const batch_t *b, const piece_t *q, const piece_t *next) {
  size_t padded = round_up(q->len, b->align);
  return next->at == q->at + padded && file_off(b, next) == file_off(b, q) + padded;
}

/* Submits the requests of group g, staged in slot k: one per run of consecutive pieces to
 * move (for a write, the live ones; for a read, those of items still OK). */
static int submit_group(batch_t *b, size_t g, unsigned k, int is_write) {
  uint8_t *slot = b->p->slot[k];
  for (size_t j = b->group[g]; j < b->group[g + 1]; j++) b->pc[j].slot = k;
  for (size_t j = b->group[g]; j < b->group[g + 1];) {
    piece_t *q = &b->pc[j];
    int moves = is_write ? q->live : b->items[q->item].status == SPW_OK;
    if (!moves) {
      j++;
      continue;
    }
    size_t end = j + 1, len = round_up(q->len, b->align);
    for (; end < b->group[g + 1]; end++) {
      piece_t *nx = &b->pc[end];
      int nx_moves = is_write ? nx->live : b->items[nx->item].status == SPW_OK;
      if (!nx_moves || !continues(b, &b->pc[end - 1], nx)) break;
      len += round_up(nx->len, b->align);
    }
    int fixed = b->pi * SPW_DISK_SLOTS + (int)q->slot;
    int st = is_write
                 ? spw__io_submit_write(b->d->io, slot + q->at, len, file_off(b, q), fixed, j)
                 : spw__io_submit_read(b->d->io, slot + q->at, len, file_off(b, q), fixed, j);
    if (st != SPW_OK) return st;
    count_request(b->d);
    q->run = (uint32_t)(end - j);
    b->outstanding[k]++;
    b->pending++;
    j = end;
  }
  return SPW_OK;
}

/* Reaps one request: a failed one fails the items of its run. Returns the slot through
 * *slot, or a negative status when reaping itself failed. */
static int reap_run(batch_t *b, unsigned *slot) {
  spw_io_completion_t c;
  int n = spw__io_reap(b->d->io, &c, 1, 1);
  if (n < 0) return n;
  if (n == 0) return SPW_ERR_INTERNAL; /* nothing was in flight: a bookkeeping bug */
  piece_t *q = &b->pc[c.tag];
  for (uint32_t r = 0; r < q->run && c.status != SPW_OK; r++) {
    spw_disk_item_t *it = &b->items[q[r].item];
    if (it->status == SPW_OK) it->status = c.status;
  }
  *slot = q->slot;
  b->outstanding[q->slot]--;
  b->pending--;
  return SPW_OK;
}

/* Gives every item still OK the batch's failure. */
static void fail_rest(batch_t *b, int st) {
  for (size_t j = 0; j < b->np; j++) {
    spw_disk_item_t *it = &b->items[b->pc[j].item];
    if (it->status == SPW_OK) it->status = st;
  }
}

/* Enqueues group g's device -> staging copies (asking the guard item by item) and records
 * its slot's event. */
static int stage_group(batch_t *b, size_t g, unsigned k, spw_stream_t d2h,
                       const spw_copy_guard_t *guard) {
  spw_disk_t *d = b->d;
  size_t nd = 0;
  if (guard) pthread_mutex_lock(guard->gate);
  for (size_t j = b->group[g]; j < b->group[g + 1]; j++) {
    piece_t *q = &b->pc[j];
    spw_disk_item_t *it = &b->items[q->item];
    if (it->status == SPW_OK && guard && !guard->wanted(it->guard_ctx)) it->status = SPW_ERR_BUSY;
    if (it->status != SPW_OK) continue;
    q->live = 1;
    b->descs[nd++] = (spw_copy_desc_t){b->p->slot[k] + q->at, (uint8_t *)it->dptr + q->off, q->len};
  }
  int st = nd ? d->ops->copy_batch_async(d->be, b->descs, nd, SPW_COPY_D2H, d2h) : SPW_OK;
  if (st == SPW_OK && nd) st = d->ops->event_record(d->be, b->p->ev[k], d2h);
  if (guard) pthread_mutex_unlock(guard->gate);
  return st;
}

/* Enqueues group g's staging -> device copies, for the items still OK, and records its
 * slot's event. */
static int upload_group(batch_t *b, size_t g, unsigned k, spw_stream_t h2d) {
  spw_disk_t *d = b->d;
  size_t nd = 0;
  for (size_t j = b->group[g]; j < b->group[g + 1]; j++) {
    const piece_t *q = &b->pc[j];
    spw_disk_item_t *it = &b->items[q->item];
    if (it->status == SPW_OK)
      b->descs[nd++] = (spw_copy_desc_t){(uint8_t *)it->dptr + q->off, b->p->slot[k] + q->at, q->len};
  }
  if (nd == 0) return SPW_OK;
  int st = d->ops->copy_batch_async(d->be, b->descs, nd, SPW_COPY_H2D, h2d);
  if (st == SPW_OK) st = d->ops->event_record(d->be, b->p->ev[k], h2d);
  return st;
}

int spw__disk_write_device_n(spw_disk_t *d, spw_disk_item_t *items, size_t n, spw_stream_t d2h,
                             const spw_copy_guard_t *guard) {
  for (size_t i = 0; i < n; i++) {
    items[i].ext = (spw_disk_extent_t){0};
    if (items[i].status == SPW_OK)
      items[i].status = spw__spill_file_alloc(d->file, items[i].bytes, &items[i].ext);
  }
  batch_t *b = batch_plan(d, items, n);
  int st = b ? SPW_OK : SPW_ERR_SYSTEM;
  if (b) {
    b->p = take_pipe(d, &b->pi);
    /* Group g waits for its slot's previous writes, is staged, and once staged its writes go
     * out: the device copy of one group overlaps the writes of the groups before it. */
    for (size_t g = 0; g < b->ng && st == SPW_OK; g++) {
      unsigned k = (unsigned)(g % SPW_DISK_SLOTS), done;
      while (b->outstanding[k] > 0 && st == SPW_OK) st = reap_run(b, &done);
      if (st == SPW_OK) st = stage_group(b, g, k, d2h, guard);
      if (st == SPW_OK) st = d->ops->event_sync(d->be, b->p->ev[k]);
      if (st == SPW_OK) st = submit_group(b, g, k, 1);
    }
    while (b->pending > 0) { /* drain, keeping the first error */
      unsigned done;
      int r = reap_run(b, &done);
      if (r != SPW_OK) {
        if (st == SPW_OK) st = r;
        break;
      }
    }
    if (st != SPW_OK) {
      fail_rest(b, st);
      /* A copy may have been enqueued without its event: none may still write a slot when
       * the next transfer takes the pipeline. */
      d->ops->stream_sync(d->be, d2h);
    }
    give_pipe(d, b->p);
    batch_free(b);
  } else {
    for (size_t i = 0; i < n; i++)
      if (items[i].status == SPW_OK) items[i].status = st;
  }
  for (size_t i = 0; i < n; i++)
    if (items[i].status != SPW_OK) spw__disk_free(d, &items[i].ext);
  return st;
}

/* Slot k's group has landed and its upload is enqueued: once the upload has left the slot,
 * the slot reads the next group (uploading it at once if it has nothing to read). */
static int refill(batch_t *b, unsigned k, size_t *in_slot, size_t *next, spw_stream_t h2d) {
  int st = b->d->ops->event_sync(b->d->be, b->p->ev[k]);
  in_slot[k] = (*next)++;
  if (st == SPW_OK) st = submit_group(b, in_slot[k], k, 0);
  if (st == SPW_OK && b->outstanding[k] == 0) st = upload_group(b, in_slot[k], k, h2d);
  return st;
}

int spw__disk_read_device_n(spw_disk_t *d, spw_disk_item_t *items, size_t n, spw_stream_t h2d) {
  batch_t *b = batch_plan(d, items, n);
  if (!b) {
    for (size_t i = 0; i < n; i++)
      if (items[i].status == SPW_OK) items[i].status = SPW_ERR_SYSTEM;
    return SPW_ERR_SYSTEM;
  }
  b->p = take_pipe(d, &b->pi);
  size_t in_slot[SPW_DISK_SLOTS]; /* the group each slot holds */
  int used[SPW_DISK_SLOTS] = {0};
  size_t next = 0;
  int st = SPW_OK;
  /* Every slot reads a group; when a group's reads have all landed its upload is enqueued,
   * and once the upload has left the slot, the slot reads the next group. A group with
   * nothing to read (its items failed already) lands at once. */
  for (unsigned k = 0; k < SPW_DISK_SLOTS && next < b->ng && st == SPW_OK; k++) {
    in_slot[k] = next;
    used[k] = 1;
    st = submit_group(b, next++, k, 0);
    while (st == SPW_OK && b->outstanding[k] == 0 && next < b->ng) st = refill(b, k, in_slot, &next, h2d);
  }
  while (b->pending > 0) {
    unsigned k;
    int r = reap_run(b, &k);
    if (r != SPW_OK) {
      if (st == SPW_OK) st = r;
      break;
    }
    if (b->outstanding[k] > 0 || st != SPW_OK) continue;
    st = upload_group(b, in_slot[k], k, h2d);
    while (st == SPW_OK && b->outstanding[k] == 0 && next < b->ng) st = refill(b, k, in_slot, &next, h2d);
  }
  /* Every upload must have left the staging slots before they are reused, and the data must
   * be on the device when we return. After a failure an upload may have been enqueued
   * without its event: the stream itself is waited for then. */
  for (int k = 0; k < SPW_DISK_SLOTS; k++) {
    if (!used[k]) continue;
    int r = d->ops->event_sync(d->be, b->p->ev[k]);
    if (r != SPW_OK && st == SPW_OK) st = r;
  }
  if (st != SPW_OK) {
    fail_rest(b, st);
    d->ops->stream_sync(d->be, h2d);
  }
  give_pipe(d, b->p);
  batch_free(b);
  return st;
}
