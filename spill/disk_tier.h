/* SPDX-License-Identifier: Apache-2.0 */
/* Private header, never installed: the disk tier as the moves see it.
 *
 * A spill file, an I/O path and pinned staging slots, used by demotion (host -> disk,
 * straight from the arena extent), direct spills (device -> disk) and reads back
 * (disk -> device). Device transfers move batches of buffers through a bounded set of
 * pinned staging slots, small buffers sharing a slot and a disk request, up to every slot
 * in flight at once: the device copy of one slot overlaps the disk transfers of the
 * others. Every call blocks the calling thread until the bytes are where they were asked
 * to go; all are thread-safe. A failure leaves the source untouched and returns the
 * destination extent.
 */
#ifndef SPILLWAY_SPILL_DISK_TIER_H
#define SPILLWAY_SPILL_DISK_TIER_H

#include <pthread.h>

#include "backend.h"
#include "disk_io.h"
#include "spill_file.h"

typedef struct spw_disk spw_disk_t;

typedef struct spw_disk_params {
  const spw_backend_ops_t *ops;
  spw_backend_t *be;
  const char *dir;           /* where the spill file goes */
  uint64_t limit;            /* file bytes; 0 = none */
  spw_io_kind_t io;          /* AUTO, URING or POSIX */
  spw_file_log_fn log;       /* the tier's log lines (level, text) */
  spw_error_sink_fn on_error; /* errno / CUDA name and text of a failure */
  _Atomic uint64_t *requests; /* where the tier counts the requests it issues (may be NULL) */
  uint64_t grow_step;  /* the spill file's (0: its default) */
  uint64_t quiet_ns;   /* how long the tier must have moved nothing before a sweep step
                          runs (0: the default, 50 ms) */
  /* Tests only (NULL otherwise): called with test_ctx by a sweep step once transfers wait
   * for it, before it punches, so that a test can hold a step while a transfer begins. */
  void (*test_in_sweep)(void *test_ctx);
  void *test_ctx;
  void *ctx;
} spw_disk_params_t;

/* Lets the owner of a device buffer stop a write of it, and order the write's device copies
 * against its own stream-ordered work: before an item's copy into staging is enqueued,
 * `gate` is locked and `wanted(item->guard_ctx)` asked; the copy is enqueued only if it says
 * yes, and the gate is unlocked after the enqueue. */
typedef struct spw_copy_guard {
  pthread_mutex_t *gate;
  int (*wanted)(void *ctx);
} spw_copy_guard_t;

/* One buffer of a batched device transfer. */
typedef struct spw_disk_item {
  void *dptr;            /* device memory: a write's source, a read's destination */
  size_t bytes;
  spw_disk_extent_t ext; /* a write's result (empty unless it succeeded); a read's source */
  void *guard_ctx;       /* a write's argument to the guard */
  int status;            /* in: SPW_OK to move it (else skipped); out: its result */
} spw_disk_item_t;

/* Opens a spill file in p->dir, the I/O path and the staging slots. Errors: those of
 * spw__spill_file_open, spw__io_open (SPW_ERR_UNSUPPORTED when io_uring is required and
 * refused), and the backend's host_register. */
int spw__disk_create(const spw_disk_params_t *p, spw_disk_t **out);
/* Closes everything; the file's contents vanish. NULL-safe. */
void spw__disk_destroy(spw_disk_t *d);

/* host_src: arena memory (4096-aligned, readable up to the rounded length). */
int spw__disk_write_host(spw_disk_t *d, const void *host_src, size_t bytes,
                         spw_disk_extent_t *out);
/* Device memory to disk, a batch of items at once: each item gets an extent of its own,
 * small items share a staging slot (their copies one batch, their contiguous extents one
 * write), and up to every slot's writes are in flight together; copies on `d2h`. Items whose
 * status is not SPW_OK on entry are skipped. On return each item's status says what became
 * of it: SPW_OK (ext holds it), SPW_ERR_BUSY (the guard, may be NULL, stopped it: nothing is
 * kept), or the failure (nothing is kept). Returns SPW_OK, or the first failure that stopped
 * the whole batch (a backend or submission error; its items carry it too). */
int spw__disk_write_device_n(spw_disk_t *d, spw_disk_item_t *items, size_t n, spw_stream_t d2h,
                             const spw_copy_guard_t *guard);
/* Disk to device memory, a batch of items at once (packed into staging slots as for a
 * write, one copy batch per slot), copies on `h2d`; the bytes of every item whose status
 * is SPW_OK on return are on the device. Items whose status is not SPW_OK on entry are
 * skipped. Returns as spw__disk_write_device_n. */
int spw__disk_read_device_n(spw_disk_t *d, spw_disk_item_t *items, size_t n, spw_stream_t h2d);
/* Returns an extent; an empty one is ignored. Returns 1 when a sweep of freed space is
 * due: the caller arranges for spw__disk_sweep to run elsewhere. */
int spw__disk_free(spw_disk_t *d, spw_disk_extent_t *e);
/* One step of giving freed space back to the file system (spw__spill_file_sweep), if one is
 * due and the tier has moved nothing for `quiet_ns`: a punch beside a transfer would stall
 * it. Transfers that start meanwhile wait for the step. Never call it on a path that brings
 * buffers back. Returns 1 if more steps are due now; 0 otherwise, with *later_ns the time
 * after which to try again when the step waited for quiet (else 0; later_ns may be NULL).
 * A NULL tier has nothing due. */
int spw__disk_sweep(spw_disk_t *d, unsigned max_punches, uint64_t *later_ns);

/* Bytes of the spill file in use, and its limit (0: none). */
uint64_t spw__disk_in_use(const spw_disk_t *d);

/* Test hook: the next `count` transfers fail with `status` (see spw__io_inject_fault). */
void spw__disk_inject_fault(spw_disk_t *d, int status, unsigned count);

#endif /* SPILLWAY_SPILL_DISK_TIER_H */
