/* SPDX-License-Identifier: Apache-2.0 */
/* Private header, never installed: the streams a runtime knows and their lock maps.
 *
 * An entry per stream value, in an open-addressed table of fixed capacity whose slots are
 * filled once and never emptied, so probe chains never break and an entry pointer stays
 * valid for the runtime's life. Unregistering a stream only clears `live`; registering the
 * same value again (CUDA reuses stream addresses) revives that entry, and a new value may
 * take over a dead entry on its probe path (its key is rewritten before `live` is set, and a
 * lookup reads the key again after `live`, so it never mistakes one incarnation for
 * another). Lookups need no lock. The NULL stream has its own entry outside the table.
 *
 * A lock map is the list of buffer handles locked on that stream, one entry per lock (so
 * nested locks appear several times), guarded by the entry's spin lock. Lock order: a slot's
 * mutex may be held while taking a stream's spin lock, never the reverse.
 */
#ifndef SPILLWAY_CORE_STREAM_TABLE_H
#define SPILLWAY_CORE_STREAM_TABLE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>

#include "completions.h"
#include "spillway/spillway.h"
#include "spin.h"

#define SPW_STREAM_TABLE_CAP 4096u /* streams live at once, per runtime */

enum { SPW_CELL_RELEASE, SPW_CELL_FREES, SPW_STREAM_CELLS };

typedef struct spw_stream_entry {
  _Atomic(spw_stream_t) key; /* the application's value; rewritten only while dead */
  spw_stream_t bstream;  /* what the backend is given (host: NULL maps to its default) */
  atomic_int live;       /* 1 while created / registered */
  int owned;             /* created by spw_stream_create: destroyed with the runtime */
  spw_spin_t lock_mu;
  spw_buf_t *locks;
  size_t nlocks, cap;
  /* The completion items behind this stream that later work may still join: the release
   * of launches (locks.c) and the host copies single acquires free behind their copies
   * (host_extent.c). Under the completion poller's lock; kept across incarnations: an item
   * joins only its own stream. */
  spw_completion_cell_t cells[SPW_STREAM_CELLS];
} spw_stream_entry_t;

typedef struct spw_stream_table {
  _Atomic(spw_stream_entry_t *) slots[SPW_STREAM_TABLE_CAP];
  spw_stream_entry_t null_entry;
  pthread_mutex_t mu; /* serializes inserts */
} spw_stream_table_t;

int spw__streams_init(spw_stream_table_t *t, spw_stream_t null_bstream);
void spw__streams_destroy(spw_stream_table_t *t);

/* The live entry of `s`, or NULL. Lock-free. */
spw_stream_entry_t *spw__streams_find(spw_stream_table_t *t, spw_stream_t s);
/* Makes `s` live (reviving its entry if it had one). Errors: SPW_ERR_BUSY (table full),
 * SPW_ERR_SYSTEM. *existed is set when it was live already. */
int spw__streams_insert(spw_stream_table_t *t, spw_stream_t s, spw_stream_t bstream, int owned,
                        spw_stream_entry_t **out, int *existed);

/* Lock map operations. push: SPW_ERR_SYSTEM when memory runs out (nothing recorded). */
int spw__lockmap_push(spw_stream_entry_t *e, spw_buf_t b);
/* Records bufs[0..n), all or nothing, under one hold of the spin lock. */
int spw__lockmap_push_n(spw_stream_entry_t *e, const spw_buf_t *bufs, size_t n);
/* Removes one entry equal to b; returns 1 if found. */
int spw__lockmap_remove(spw_stream_entry_t *e, spw_buf_t b);
/* Removes one entry for each of bufs[0..n), all or nothing, under one hold of the spin
 * lock; returns 1 if every one was found (else the map keeps all its entries). */
int spw__lockmap_remove_n(spw_stream_entry_t *e, const spw_buf_t *bufs, size_t n);
/* Takes every entry out: *out (malloc'd, caller frees) and *n. */
void spw__lockmap_detach(spw_stream_entry_t *e, spw_buf_t **out, size_t *n);
/* Puts detached entries back (after a failed synchronize); returns how many, from the
 * first, went back before memory ran out. The list stays the caller's. */
size_t spw__lockmap_reattach(spw_stream_entry_t *e, const spw_buf_t *list, size_t n);

/* Calls fn for every entry (live or not) of the table, the NULL entry included. */
void spw__streams_foreach(spw_stream_table_t *t, void (*fn)(spw_stream_entry_t *, void *), void *arg);

#endif /* SPILLWAY_CORE_STREAM_TABLE_H */
