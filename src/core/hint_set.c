/* SPDX-License-Identifier: Apache-2.0 */
/* The pending-hint map (see hint_set.h): open addressing with linear probing, kept at most
 * half full, and deletion by backward shift so that no tombstone lengthens a probe. */
#include "hint_set.h"

#include <stdlib.h>

/* Handles are slot index + generation + runtime tag: mix them so that neighbouring slots
 * do not cluster (a 64-bit finalizer, as in splitmix64). */
static size_t home(const spw_hint_set_t *s, spw_buf_t b) {
  uint64_t x = b;
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return (size_t)x & (s->cap - 1);
}

spw_hint_t *spw__hints_find(spw_hint_set_t *s, spw_buf_t buf) {
  if (s->cap == 0) return NULL;
  for (size_t i = home(s, buf);; i = (i + 1) & (s->cap - 1)) {
    if (s->cells[i].buf == buf) return &s->cells[i];
    if (s->cells[i].buf == 0) return NULL;
  }
}

static int grow(spw_hint_set_t *s) {
  size_t cap = s->cap ? s->cap * 2 : 64;
  spw_hint_t *old = s->cells, *cells = calloc(cap, sizeof *cells);
  if (!cells) return -1;
  size_t old_cap = s->cap;
  s->cells = cells;
  s->cap = cap;
  for (size_t i = 0; i < old_cap; i++) {
    if (old[i].buf == 0) continue;
    size_t j = home(s, old[i].buf);
    while (cells[j].buf) j = (j + 1) & (cap - 1);
    cells[j] = old[i];
  }
  free(old);
  return 0;
}

spw_hint_t *spw__hints_add(spw_hint_set_t *s, spw_buf_t buf) {
  spw_hint_t *h = spw__hints_find(s, buf);
  if (h) return h;
  if ((s->n + 1) * 2 > s->cap && grow(s) != 0) return NULL;
  size_t i = home(s, buf);
  while (s->cells[i].buf) i = (i + 1) & (s->cap - 1);
  s->cells[i] = (spw_hint_t){.buf = buf};
  s->n++;
  return &s->cells[i];
}

void spw__hints_remove(spw_hint_set_t *s, spw_buf_t buf) {
  spw_hint_t *h = spw__hints_find(s, buf);
  if (!h) return;
  size_t mask = s->cap - 1, hole = (size_t)(h - s->cells);
  /* Pull later members of the probe run back into the hole when their home allows it. */
  for (size_t j = (hole + 1) & mask; s->cells[j].buf; j = (j + 1) & mask) {
    size_t k = home(s, s->cells[j].buf);
    /* k cyclically in (hole, j]: the entry may not move before its home. */
    int stays = hole <= j ? (k > hole && k <= j) : (k > hole || k <= j);
    if (stays) continue;
    s->cells[hole] = s->cells[j];
    hole = j;
  }
  s->cells[hole] = (spw_hint_t){0};
  s->n--;
}

void spw__hints_destroy(spw_hint_set_t *s) {
  free(s->cells);
  *s = (spw_hint_set_t){0};
}
