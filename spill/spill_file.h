/* SPDX-License-Identifier: Apache-2.0 */
/* Private header, never installed: the runtime's private spill file and its extents.
 *
 * One file per runtime in the spill directory, opened O_TMPFILE (or created 0600 with
 * O_EXCL and unlinked at once where O_TMPFILE is unsupported) and O_DIRECT where the file
 * system allows it (tmpfs does not: then buffered, and the log says so), so its contents
 * vanish when the process exits or crashes and no other user can open it. Space is handed
 * out as extents aligned to the direct-I/O alignment, preallocated with fallocate in large
 * steps (ENOSPC surfaces at preallocation, before any data is written), and reclaimed (with
 * hole punching) when extents come back. A disk byte limit caps the file.
 * Thread-safe: one mutex guards the extent allocator.
 */
#ifndef SPILLWAY_SPILL_SPILL_FILE_H
#define SPILLWAY_SPILL_SPILL_FILE_H

#include <stddef.h>
#include <stdint.h>

typedef struct spw_spill_file spw_spill_file_t;

typedef struct spw_disk_extent {
  uint64_t off;   /* byte offset in the file */
  uint64_t bytes; /* rounded up to the alignment; 0 when empty */
} spw_disk_extent_t;

typedef void (*spw_file_log_fn)(void *ctx, int level, const char *msg);

/* dir: directory for the file; limit: bytes (0 = none); grow_step: fallocate step (0 =
 * 256 MiB). Errors: SPW_ERR_CONFIG (dir missing or not writable; the text names it),
 * SPW_ERR_SYSTEM. */
int spw__spill_file_open(const char *dir, uint64_t limit, uint64_t grow_step,
                         spw_file_log_fn log, void *log_ctx, spw_spill_file_t **out);
/* Closes the file; its blocks are freed by the file system. */
void spw__spill_file_close(spw_spill_file_t *f);

int spw__spill_file_fd(const spw_spill_file_t *f);
size_t spw__spill_file_alignment(const spw_spill_file_t *f); /* 4096 unless probed larger */
int spw__spill_file_is_direct(const spw_spill_file_t *f);     /* opened with O_DIRECT */

/* Errors: SPW_ERR_DISK_FULL (limit reached, or fallocate said ENOSPC/EDQUOT; nothing
 * changes), SPW_ERR_IO. */
int spw__spill_file_alloc(spw_spill_file_t *f, uint64_t bytes, spw_disk_extent_t *out);
/* Gives the extent back; it stays reserved and is reused first. Never punches (a free sits
 * on the path that reads buffers back): returns 1 when a sweep is due, that is when a grow
 * step of space came back since the last one, and the owner should call
 * spw__spill_file_sweep from somewhere that can afford it. */
int spw__spill_file_free(spw_spill_file_t *f, spw_disk_extent_t *e);
/* One step of a sweep, if one is due or under way: punches out at most `max_punches`
 * stretches of free space that is not a hole yet, holding the mutex only for those. Returns
 * 1 if the sweep has more to do (call again), 0 when none is due. */
int spw__spill_file_sweep(spw_spill_file_t *f, unsigned max_punches);
/* Whether a sweep is due or under way (what spw__spill_file_sweep would act on). */
int spw__spill_file_sweep_due(spw_spill_file_t *f);

uint64_t spw__spill_file_bytes_in_use(const spw_spill_file_t *f);

#endif /* SPILLWAY_SPILL_SPILL_FILE_H */
