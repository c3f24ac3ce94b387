/* SPDX-License-Identifier: Apache-2.0 */
/* Private header, never installed: owner tags (SPW_ALLOC_OWNER), their counters and names.
 *
 * A buffer's owner id (0 = none, else 1..SPW_OWNER_MAX) is a byte of its slot, written
 * before the slot is published and constant until the slot is released
 * (handle_table.h). Per owner, four relaxed atomics (live buffers and bytes, allocations and
 * bytes allocated) change at two points only: spw__buffer_create, before the buffer is
 * published, and spw__slot_finish_free, before its slot goes back; an untagged buffer
 * touches none of them. Each owner's counters have a cache line of their own, so owners
 * allocated from different threads do not share one. Nothing else counts per owner: the
 * bytes an owner has on the device are found by scanning the slots (the trace does it on its
 * writer thread), so moves, acquires and releases pay nothing for owners.
 *
 * Names live beside the counters under `mu`, a leaf lock that no allocation, free or move
 * takes; `names_gen` changes with every name set, so that the trace's writer copies the names
 * again only when one changed.
 */
#ifndef SPILLWAY_CORE_OWNERS_H
#define SPILLWAY_CORE_OWNERS_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "spillway/spillway.h"

#define SPW_OWNERS (SPW_OWNER_MAX + 1) /* ids 0..255; 0 (no owner) is never counted */

typedef struct spw_owner_counters {
  _Atomic uint64_t live, live_bytes, allocs, alloc_bytes;
  char pad_[64 - 4 * sizeof(uint64_t)]; /* one cache line per owner */
} spw_owner_counters_t;

typedef char spw_owner_name_t[SPW_OWNER_NAME_MAX + 1];

typedef struct spw_owners {
  spw_owner_counters_t c[SPW_OWNERS]; /* first: the table is allocated 64-byte aligned */
  pthread_mutex_t mu;                 /* names; a leaf */
  spw_owner_name_t names[SPW_OWNERS];
  _Atomic uint32_t names_gen;
} spw_owners_t;

/* The table, zeroed; NULL without memory. */
spw_owners_t *spw__owners_create(void);
void spw__owners_destroy(spw_owners_t *o);

/* A buffer of `bytes` for owner `id` (non-zero) is created / released. */
static inline void spw__owner_created(spw_owners_t *o, uint32_t id, uint64_t bytes) {
  spw_owner_counters_t *c = &o->c[id];
  atomic_fetch_add_explicit(&c->live, 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&c->live_bytes, bytes, memory_order_relaxed);
  atomic_fetch_add_explicit(&c->allocs, 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&c->alloc_bytes, bytes, memory_order_relaxed);
}
static inline void spw__owner_released(spw_owners_t *o, uint32_t id, uint64_t bytes) {
  spw_owner_counters_t *c = &o->c[id];
  atomic_fetch_sub_explicit(&c->live, 1, memory_order_relaxed);
  atomic_fetch_sub_explicit(&c->live_bytes, bytes, memory_order_relaxed);
}

/* Whether `name` may name an owner: 1..SPW_OWNER_NAME_MAX printable ASCII characters other
 * than '"' and '\\'. */
int spw__owner_name_valid(const char *name);
/* Sets owner id's name (checked by the caller). */
void spw__owner_set_name(spw_owners_t *o, uint32_t id, const char *name);
/* Copies owner id's name into out ("" when it has none). */
void spw__owner_get_name(spw_owners_t *o, uint32_t id, spw_owner_name_t out);
/* Copies every name into out when names_gen differs from *gen, and updates *gen. Returns
 * whether it copied. */
int spw__owner_names_copy(spw_owners_t *o, spw_owner_name_t out[SPW_OWNERS], uint32_t *gen);
/* Writes owner id's label into out: `name` (its name, as copied), or "owner <id>" when that
 * is empty. */
void spw__owner_label(const char *name, uint32_t id, char *out, size_t len);

#endif /* SPILLWAY_CORE_OWNERS_H */
