/* SPDX-License-Identifier: Apache-2.0 */
/* Private header, never installed: the disk tier as the moves see it.
 *
 * A spill file, an I/O path and pinned staging slots, used by demotion (host -> disk,
 * straight from the arena extent), direct spills (device -> disk) and reads back
 * (disk -> device). Device transfers are pipelined through a bounded set of pinned staging
 * slots: the device->staging copy of chunk i+1 overlaps the write of chunk i, and the read
 * of chunk i+1 overlaps the staging->device copy of chunk i. Every call blocks the calling
 * thread until the bytes are where they were asked to go; all are thread-safe. A failure
 * leaves the source untouched and returns the destination extent.
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
  void *ctx;
} spw_disk_params_t;

/* Lets the owner of a device buffer stop a write of it between chunks, and order the
 * chunks' device copies against its own stream-ordered work: before each chunk's copy is
 * enqueued, `gate` is locked and `wanted(ctx)` asked; the copy is enqueued only if it says
 * yes, and the gate is unlocked after the enqueue. */
typedef struct spw_copy_guard {
  pthread_mutex_t *gate;
  int (*wanted)(void *ctx);
  void *ctx;
} spw_copy_guard_t;

/* Opens a spill file in p->dir, the I/O path and the staging slots. Errors: those of
 * spw__spill_file_open, spw__io_open (SPW_ERR_UNSUPPORTED when io_uring is required and
 * refused), and the backend's host_register. */
int spw__disk_create(const spw_disk_params_t *p, spw_disk_t **out);
/* Closes everything; the file's contents vanish. NULL-safe. */
void spw__disk_destroy(spw_disk_t *d);

/* host_src: arena memory (4096-aligned, readable up to the rounded length). */
int spw__disk_write_host(spw_disk_t *d, const void *host_src, size_t bytes,
                         spw_disk_extent_t *out);
/* Device memory to disk through the staging slots, copies on `d2h`. With a guard (may be
 * NULL), SPW_ERR_BUSY when it stopped the write (nothing is kept). */
int spw__disk_write_device(spw_disk_t *d, const void *dptr, size_t bytes, spw_stream_t d2h,
                           const spw_copy_guard_t *guard, spw_disk_extent_t *out);
/* Disk to device memory through the staging slots, copies on `h2d`; the bytes are on the
 * device when it returns. */
int spw__disk_read_device(spw_disk_t *d, const spw_disk_extent_t *src, void *dptr,
                          size_t bytes, spw_stream_t h2d);
/* Returns an extent; an empty one is ignored. */
void spw__disk_free(spw_disk_t *d, spw_disk_extent_t *e);

/* Bytes of the spill file in use, and its limit (0: none). */
uint64_t spw__disk_in_use(const spw_disk_t *d);

/* Test hook: the next `count` transfers fail with `status` (see spw__io_inject_fault). */
void spw__disk_inject_fault(spw_disk_t *d, int status, unsigned count);

#endif /* SPILLWAY_SPILL_DISK_TIER_H */
