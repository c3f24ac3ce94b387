/* SPDX-License-Identifier: Apache-2.0 */
/* The pending-hint map (see hint_set.h), indexed by the handle's slot index: a lookup is one
 * load and a compare of its generation, so a request of 65536 buffers costs its
 * bookkeeping in microseconds. (An open-addressing hash map keyed by handle cost about
 * 0.5 µs per buffer on the H100 machine: 65536 x 4 KiB spills and prefetches fell from 18
 * to 6 GB/s.) A slot holds one buffer at a time, so one cell per slot is enough: a cell
 * still holding a freed generation's entry is taken over by the new one, and the old
 * handle, still in a lane's queue, then finds no entry and is skipped, as a freed buffer's
 * hint should be. The array grows to the highest slot index hinted, at most the table's. */
#include "hint_set.h"

#include <stdlib.h>
#include <string.h>

#include "handle_table.h"

static int grow(spw_hint_set_t *s, size_t index) {
  size_t cap = s->cap ? s->cap : 1024;
  while (cap <= index) cap *= 2;
  spw_hint_t *cells = realloc(s->cells, cap * sizeof *cells);
  if (!cells) return -1;
  memset(cells + s->cap, 0, (cap - s->cap) * sizeof *cells);
  s->cells = cells;
  s->cap = cap;
  return 0;
}

spw_hint_t *spw__hints_add(spw_hint_set_t *s, spw_buf_t buf) {
  size_t i = spw__handle_index(buf);
  if (i >= s->cap && grow(s, i) != 0) return NULL;
  spw_hint_t *c = &s->cells[i];
  const uint32_t gen = spw__handle_gen(buf);
  if (c->gen == gen) return c;
  if (c->gen == 0) spw__hints_count(s, 1);
  *c = (spw_hint_t){.gen = gen}; /* empty, or a freed generation's: taken over */
  return c;
}

void spw__hints_destroy(spw_hint_set_t *s) {
  free(s->cells);
  s->cells = NULL;
  s->cap = 0;
  atomic_store(&s->n, 0);
}
