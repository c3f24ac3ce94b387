/* SPDX-License-Identifier: Apache-2.0 */
/* The disk tier (see disk_tier.h): the spill file, the I/O path and the staging pipelines.
 *
 * Staging is bounded: SPW_DISK_PIPES pipelines of SPW_DISK_SLOTS slots of `chunk` bytes,
 * pinned through the backend and registered with io_uring as fixed buffers. A device
 * transfer takes one pipeline for its duration; its slots rotate so that the device copy of
 * one chunk overlaps the disk transfer of another. A slot is reused only after both its disk
 * transfer and its device copy are known complete. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "disk_tier.h"

/* One pipeline: every pipeline reaps from the one completion list of the tier's I/O, and
 * completions carry only the slot index, so with two a reaper could take the other
 * pipeline's completion for its own slot and upload a staging slot whose read had not
 * landed (seen as stale or foreign pages under concurrent disk reads). Two pipelines need
 * completions routed to their owner first. */
#define SPW_DISK_PIPES 1
/* Many moderate requests in flight suit NVMe better than a few large ones (raw io_uring
 * peaks at queue depth 16 with 1 MiB blocks on the reference machine). */
#define SPW_DISK_SLOTS 16

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
  pthread_mutex_t mu; /* guards pipes[].busy */
  pthread_cond_t cv;
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
  pthread_mutex_init(&d->mu, NULL);
  pthread_cond_init(&d->cv, NULL);
  d->chunk = (size_t)2 << 20;
  int st = spw__spill_file_open(par->dir, par->limit, 0, par->log, par->ctx, &d->file);
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

void spw__disk_free(spw_disk_t *d, spw_disk_extent_t *e) {
  if (e->bytes && d) spw__spill_file_free(d->file, e);
  *e = (spw_disk_extent_t){0};
}

uint64_t spw__disk_in_use(const spw_disk_t *d) { return spw__spill_file_bytes_in_use(d->file); }

void spw__disk_inject_fault(spw_disk_t *d, int status, unsigned count) {
  spw__io_inject_fault(d->io, status, count);
}

static size_t round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

int spw__disk_write_host(spw_disk_t *d, const void *host_src, size_t bytes,
                         spw_disk_extent_t *out) {
  spw_disk_extent_t e;
  int st = spw__spill_file_alloc(d->file, bytes, &e);
  if (st != SPW_OK) return st;
  size_t len = round_up(bytes, spw__spill_file_alignment(d->file));
  st = spw__io_write_all(d->io, host_src, len, e.off);
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
    for (int p = 0; p < SPW_DISK_PIPES; p++) {
      if (!d->pipes[p].busy) {
        d->pipes[p].busy = 1;
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
  pthread_cond_signal(&d->cv);
  pthread_mutex_unlock(&d->mu);
}

/* Reaps one completion; returns its slot through *slot and its status. */
static int reap_one(spw_io_t *io, unsigned *slot) {
  spw_io_completion_t c;
  int n = spw__io_reap(io, &c, 1, 1);
  if (n < 0) return n;
  *slot = (unsigned)c.tag;
  return c.status;
}

/* Enqueues one chunk's device -> staging copy, asking the guard first. */
static int copy_chunk(spw_disk_t *d, void *slot, const void *src, size_t len, spw_stream_t d2h,
                      spw_bevent_t *ev, const spw_copy_guard_t *guard) {
  if (guard) {
    pthread_mutex_lock(guard->gate);
    if (!guard->wanted(guard->ctx)) {
      pthread_mutex_unlock(guard->gate);
      return SPW_ERR_BUSY;
    }
  }
  int st = d->ops->memcpy_async(d->be, slot, src, len, d2h);
  if (st == SPW_OK) st = d->ops->event_record(d->be, ev, d2h);
  if (guard) pthread_mutex_unlock(guard->gate);
  return st;
}

int spw__disk_write_device(spw_disk_t *d, const void *dptr, size_t bytes, spw_stream_t d2h,
                           const spw_copy_guard_t *guard, spw_disk_extent_t *out) {
  spw_disk_extent_t e;
  int st = spw__spill_file_alloc(d->file, bytes, &e);
  if (st != SPW_OK) return st;
  size_t align = spw__spill_file_alignment(d->file);
  int pi;
  pipe_t *p = take_pipe(d, &pi);
  int in_flight[SPW_DISK_SLOTS] = {0};
  unsigned pending = 0;
  size_t nchunks = (bytes + d->chunk - 1) / d->chunk;
  for (size_t i = 0; i < nchunks && st == SPW_OK; i++) {
    unsigned k = (unsigned)(i % SPW_DISK_SLOTS);
    /* The slot's previous write must be done before the copy overwrites it. */
    while (in_flight[k] && st == SPW_OK) {
      unsigned done;
      int r = reap_one(d->io, &done);
      if (r != SPW_OK) st = r;
      in_flight[done % SPW_DISK_SLOTS] = 0;
      pending--;
    }
    if (st != SPW_OK) break;
    size_t off = i * d->chunk, len = bytes - off < d->chunk ? bytes - off : d->chunk;
    st = copy_chunk(d, p->slot[k], (const uint8_t *)dptr + off, len, d2h, p->ev[k], guard);
    if (st == SPW_OK) st = d->ops->event_sync(d->be, p->ev[k]);
    if (st == SPW_OK)
      st = spw__io_submit_write(d->io, p->slot[k], round_up(len, align), e.off + off,
                                pi * SPW_DISK_SLOTS + (int)k, k);
    if (st == SPW_OK) {
      in_flight[k] = 1;
      pending++;
    }
  }
  while (pending > 0) { /* drain, keeping the first error */
    unsigned done;
    int r = reap_one(d->io, &done);
    if (r != SPW_OK && st == SPW_OK) st = r;
    pending--;
  }
  /* After a failure a copy may have been enqueued without its event: none may still write a
   * slot when the next transfer takes the pipeline. */
  if (st != SPW_OK) d->ops->stream_sync(d->be, d2h);
  give_pipe(d, p);
  if (st != SPW_OK) {
    spw__spill_file_free(d->file, &e);
    return st;
  }
  *out = e;
  return SPW_OK;
}

int spw__disk_read_device(spw_disk_t *d, const spw_disk_extent_t *src, void *dptr,
                          size_t bytes, spw_stream_t h2d) {
  size_t align = spw__spill_file_alignment(d->file);
  int pi;
  pipe_t *p = take_pipe(d, &pi);
  size_t nchunks = (bytes + d->chunk - 1) / d->chunk;
  size_t next = 0;   /* next chunk to read */
  unsigned pending = 0;
  int st = SPW_OK;
  size_t chunk_of[SPW_DISK_SLOTS];
  /* Prime every slot with a read, then: a read lands -> its upload is enqueued -> once the
   * upload has left the slot, the slot reads the next chunk. */
  for (; next < nchunks && next < SPW_DISK_SLOTS && st == SPW_OK; next++) {
    size_t off = next * d->chunk, len = bytes - off < d->chunk ? bytes - off : d->chunk;
    chunk_of[next] = next;
    st = spw__io_submit_read(d->io, p->slot[next], round_up(len, align), src->off + off,
                             pi * SPW_DISK_SLOTS + (int)next, next);
    if (st == SPW_OK) pending++;
  }
  while (pending > 0) {
    unsigned k;
    int r = reap_one(d->io, &k);
    pending--;
    if (r != SPW_OK) {
      if (st == SPW_OK) st = r;
      continue;
    }
    if (st != SPW_OK) continue;
    size_t c = chunk_of[k];
    size_t off = c * d->chunk, len = bytes - off < d->chunk ? bytes - off : d->chunk;
    st = d->ops->memcpy_async(d->be, (uint8_t *)dptr + off, p->slot[k], len, h2d);
    if (st == SPW_OK) st = d->ops->event_record(d->be, p->ev[k], h2d);
    if (st == SPW_OK && next < nchunks) {
      st = d->ops->event_sync(d->be, p->ev[k]);
      size_t noff = next * d->chunk, nlen = bytes - noff < d->chunk ? bytes - noff : d->chunk;
      chunk_of[k] = next;
      if (st == SPW_OK)
        st = spw__io_submit_read(d->io, p->slot[k], round_up(nlen, align), src->off + noff,
                                 pi * SPW_DISK_SLOTS + (int)k, k);
      if (st == SPW_OK) {
        pending++;
        next++;
      }
    }
  }
  /* Every upload must have left the staging slots before they are reused, and the data must
   * be on the device when we return. After a failure an upload may have been enqueued
   * without its event: the stream itself is waited for then. */
  for (int k = 0; k < SPW_DISK_SLOTS; k++) {
    int r = d->ops->event_sync(d->be, p->ev[k]);
    if (r != SPW_OK && st == SPW_OK) st = r;
  }
  if (st != SPW_OK) d->ops->stream_sync(d->be, h2d);
  give_pipe(d, p);
  return st;
}
