/* SPDX-License-Identifier: Apache-2.0 */
/* The stream table and the per-stream lock maps (see stream_table.h). */
#include "stream_table.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "grow.h"

static size_t hash_stream(spw_stream_t s) {
  uint64_t x = (uint64_t)(uintptr_t)s;
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return (size_t)(x & (SPW_STREAM_TABLE_CAP - 1));
}

static void entry_init(spw_stream_entry_t *e, spw_stream_t key, spw_stream_t bstream) {
  memset(e, 0, sizeof *e);
  atomic_init(&e->key, key);
  e->bstream = bstream;
  spw__spin_init(&e->lock_mu);
}

int spw__streams_init(spw_stream_table_t *t, spw_stream_t null_bstream) {
  memset(t, 0, sizeof *t);
  entry_init(&t->null_entry, NULL, null_bstream);
  atomic_store(&t->null_entry.live, 1);
  if (pthread_mutex_init(&t->mu, NULL) != 0) return SPW_ERR_SYSTEM;
  return SPW_OK;
}

void spw__streams_destroy(spw_stream_table_t *t) {
  for (size_t i = 0; i < SPW_STREAM_TABLE_CAP; i++) {
    spw_stream_entry_t *e = atomic_load(&t->slots[i]);
    if (!e) continue;
    free(e->locks);
    free(e);
  }
  free(t->null_entry.locks);
  pthread_mutex_destroy(&t->mu);
}

spw_stream_entry_t *spw__streams_find(spw_stream_table_t *t, spw_stream_t s) {
  if (s == NULL) return &t->null_entry;
  size_t h = hash_stream(s);
  for (size_t i = 0; i < SPW_STREAM_TABLE_CAP; i++) {
    spw_stream_entry_t *e = atomic_load_explicit(&t->slots[(h + i) & (SPW_STREAM_TABLE_CAP - 1)],
                                                 memory_order_acquire);
    if (!e) return NULL;
    if (atomic_load_explicit(&e->key, memory_order_acquire) != s) continue;
    /* live, then the key again: an entry taken over by another stream sets its new key
     * before live, so a live entry whose key is still s is s's own. */
    if (atomic_load_explicit(&e->live, memory_order_acquire) &&
        atomic_load_explicit(&e->key, memory_order_acquire) == s)
      return e;
    return NULL;
  }
  return NULL;
}

int spw__streams_insert(spw_stream_table_t *t, spw_stream_t s, spw_stream_t bstream, int owned,
                        spw_stream_entry_t **out, int *existed) {
  *existed = 0;
  if (s == NULL) {
    *existed = 1;
    *out = &t->null_entry;
    return SPW_OK;
  }
  pthread_mutex_lock(&t->mu);
  size_t h = hash_stream(s);
  int status = SPW_ERR_BUSY;
  spw_stream_entry_t *dead = NULL; /* the first dead entry on s's probe path */
  size_t i = 0;
  for (; i < SPW_STREAM_TABLE_CAP; i++) {
    size_t at = (h + i) & (SPW_STREAM_TABLE_CAP - 1);
    spw_stream_entry_t *e = atomic_load_explicit(&t->slots[at], memory_order_relaxed);
    if (!e) {
      /* s has no entry: take over a dead one on the way, else fill this empty slot. */
      if (dead) {
        atomic_store_explicit(&dead->key, s, memory_order_release);
        dead->bstream = bstream;
        dead->owned = owned;
        atomic_store_explicit(&dead->live, 1, memory_order_release);
        *out = dead;
        status = SPW_OK;
        break;
      }
      e = malloc(sizeof *e);
      if (!e) {
        status = SPW_ERR_SYSTEM;
        break;
      }
      entry_init(e, s, bstream);
      e->owned = owned;
      atomic_store(&e->live, 1);
      atomic_store_explicit(&t->slots[at], e, memory_order_release);
      *out = e;
      status = SPW_OK;
      break;
    }
    int live = atomic_load(&e->live);
    if (atomic_load_explicit(&e->key, memory_order_relaxed) != s) {
      if (!live && !dead) dead = e;
      continue;
    }
    if (live) {
      *existed = 1;
    } else {
      e->bstream = bstream;
      e->owned = owned;
      atomic_store_explicit(&e->live, 1, memory_order_release);
    }
    *out = e;
    status = SPW_OK;
    break;
  }
  if (status == SPW_ERR_BUSY && dead) { /* a full table of entries, some dead: reuse one */
    atomic_store_explicit(&dead->key, s, memory_order_release);
    dead->bstream = bstream;
    dead->owned = owned;
    atomic_store_explicit(&dead->live, 1, memory_order_release);
    *out = dead;
    status = SPW_OK;
  }
  pthread_mutex_unlock(&t->mu);
  return status;
}

int spw__lockmap_push(spw_stream_entry_t *e, spw_buf_t b) {
  spw__spin_lock(&e->lock_mu);
  spw_buf_t *grown = spw__grow(e->locks, &e->cap, e->nlocks + 1, sizeof *grown, 16);
  if (!grown) {
    spw__spin_unlock(&e->lock_mu);
    return SPW_ERR_SYSTEM;
  }
  e->locks = grown;
  e->locks[e->nlocks++] = b;
  spw__spin_unlock(&e->lock_mu);
  return SPW_OK;
}

int spw__lockmap_push_n(spw_stream_entry_t *e, const spw_buf_t *bufs, size_t n) {
  spw__spin_lock(&e->lock_mu);
  spw_buf_t *grown = spw__grow(e->locks, &e->cap, e->nlocks + n, sizeof *grown, 16);
  if (grown) {
    e->locks = grown;
    memcpy(e->locks + e->nlocks, bufs, n * sizeof *bufs);
    e->nlocks += n;
  }
  spw__spin_unlock(&e->lock_mu);
  return grown ? SPW_OK : SPW_ERR_SYSTEM;
}

int spw__lockmap_remove(spw_stream_entry_t *e, spw_buf_t b) {
  int found = 0;
  spw__spin_lock(&e->lock_mu);
  /* Newest first: a synchronous acquire/release pair finds its entry at once. */
  for (size_t i = e->nlocks; i-- > 0;) {
    if (e->locks[i] == b) {
      e->locks[i] = e->locks[--e->nlocks];
      found = 1;
      break;
    }
  }
  spw__spin_unlock(&e->lock_mu);
  return found;
}

int spw__lockmap_remove_n(spw_stream_entry_t *e, const spw_buf_t *bufs, size_t n) {
  spw__spin_lock(&e->lock_mu);
  size_t k = 0;
  for (; k < n; k++) {
    size_t i = e->nlocks;
    while (i-- > 0 && e->locks[i] != bufs[k]) {
    }
    if (i == SIZE_MAX) break;
    e->locks[i] = e->locks[--e->nlocks];
  }
  /* A missing one: the removed ones go back at the end, in the room they left. */
  if (k < n)
    for (size_t j = 0; j < k; j++) e->locks[e->nlocks++] = bufs[j];
  spw__spin_unlock(&e->lock_mu);
  return k == n;
}

void spw__lockmap_detach(spw_stream_entry_t *e, spw_buf_t **out, size_t *n) {
  spw__spin_lock(&e->lock_mu);
  *out = e->locks;
  *n = e->nlocks;
  e->locks = NULL;
  e->nlocks = e->cap = 0;
  spw__spin_unlock(&e->lock_mu);
}

size_t spw__lockmap_reattach(spw_stream_entry_t *e, const spw_buf_t *list, size_t n) {
  size_t i = 0;
  while (i < n && spw__lockmap_push(e, list[i]) == SPW_OK) i++;
  return i;
}

void spw__streams_foreach(spw_stream_table_t *t, void (*fn)(spw_stream_entry_t *, void *), void *arg) {
  fn(&t->null_entry, arg);
  for (size_t i = 0; i < SPW_STREAM_TABLE_CAP; i++) {
    spw_stream_entry_t *e = atomic_load(&t->slots[i]);
    if (e) fn(e, arg);
  }
}
