/* SPDX-License-Identifier: Apache-2.0 */
/* Private header, never installed: the disk tier as the moves see it.
 *
 * Opened the first time it is needed (spill file + I/O path + staging slots), then used by
 * demotion (host -> disk, straight from the arena extent), direct spills (device -> disk)
 * and reads back (disk -> device). Device transfers are pipelined through a bounded set of
 * pinned staging slots: the device->staging copy of chunk i+1 overlaps the write of chunk i,
 * and the read of chunk i+1 overlaps the staging->device copy of chunk i. All calls block the
 * calling thread until the bytes are where they were asked to go; they are thread-safe.
 * A failure leaves the source untouched and the destination extent returned.
 */
#ifndef SPILLWAY_SPILL_DISK_TIER_H
#define SPILLWAY_SPILL_DISK_TIER_H

#include "../src/runtime.h"

/* Opens the tier if it is not open. SPW_OK, or the reason it cannot be used (remembered:
 * later calls fail fast with the same status). */
int spw__disk_open(spw_runtime_t *rt);
/* Closes it (runtime destruction); the file's contents vanish. */
void spw__disk_close(spw_runtime_t *rt);

/* host_src: arena memory (4096-aligned, readable up to the rounded length). */
int spw__disk_write_host(spw_runtime_t *rt, const void *host_src, size_t bytes,
                         spw_disk_extent_t *out);
/* Device memory straight to disk and back, through the staging slots; copies run on the
 * engine's streams. */
int spw__disk_write_device(spw_runtime_t *rt, const void *dptr, size_t bytes,
                           spw_disk_extent_t *out);
int spw__disk_read_device(spw_runtime_t *rt, const spw_disk_extent_t *src, void *dptr,
                          size_t bytes);
void spw__disk_free(spw_runtime_t *rt, spw_disk_extent_t *e);

/* Test hook: opens the tier if needed, then makes its next `count` transfers fail with
 * `status` (see spw__io_inject_fault). Does nothing if the tier cannot be opened. */
void spw__disk_inject_fault(spw_runtime_t *rt, int status, unsigned count);

#endif /* SPILLWAY_SPILL_DISK_TIER_H */
