/* SPDX-License-Identifier: Apache-2.0 */
/* The handle table: slot allocation, generations and growth (see handle_table.h).
 * Growth appends a chunk and publishes it before raising nslots, so a lock-free lookup that
 * sees an index below nslots always finds its chunk. Freed slots queue FIFO: a slot is reused
 * only after every other free slot was, which makes a stale handle's generation collide only
 * after 2^24 reuses of that very slot. */
#include "handle_table.h"

#include <stdlib.h>
#include <string.h>

int spw__handles_init(spw_handle_table_t *t, uint16_t tag) {
  memset(t, 0, sizeof *t);
  t->tag = tag;
  if (pthread_mutex_init(&t->mu, NULL) != 0) return SPW_ERR_SYSTEM;
  return SPW_OK;
}

void spw__handles_destroy(spw_handle_table_t *t) {
  uint32_t n = atomic_load(&t->nslots);
  for (uint32_t c = 0; c < SPW_MAX_CHUNKS && c * SPW_SLOT_CHUNK < n; c++) {
    spw_slot_t *chunk = atomic_load(&t->chunks[c]);
    if (!chunk) continue;
    for (uint32_t i = 0; i < SPW_SLOT_CHUNK; i++) pthread_mutex_destroy(&chunk[i].mu);
    free(chunk);
    free((void *)atomic_load(&t->live_gens[c]));
  }
  pthread_mutex_destroy(&t->mu);
}

/* Caller holds t->mu. */
static int grow(spw_handle_table_t *t) {
  uint32_t n = atomic_load_explicit(&t->nslots, memory_order_relaxed);
  if (n >= SPW_MAX_SLOTS) return SPW_ERR_OUT_OF_MEMORY;
  spw_slot_t *chunk = calloc(SPW_SLOT_CHUNK, sizeof *chunk);
  _Atomic uint32_t *live = calloc(SPW_SLOT_CHUNK, sizeof *live); /* 0: none live */
  if (!chunk || !live) {
    free(chunk);
    free((void *)live);
    return SPW_ERR_SYSTEM;
  }
  for (uint32_t i = 0; i < SPW_SLOT_CHUNK; i++) {
    pthread_mutex_init(&chunk[i].mu, NULL);
    atomic_init(&chunk[i].word, spw__w_make(1, SPW_SLOT_UNUSED, 0, 0));
    chunk[i].next_free = (i + 1 < SPW_SLOT_CHUNK) ? n + i + 2 : 0;
  }
  atomic_store_explicit(&t->chunks[n >> SPW_SLOT_CHUNK_BITS], chunk, memory_order_release);
  atomic_store_explicit(&t->live_gens[n >> SPW_SLOT_CHUNK_BITS], live, memory_order_release);
  atomic_store_explicit(&t->nslots, n + SPW_SLOT_CHUNK, memory_order_release);
  t->free_head = n + 1;
  t->free_tail = n + SPW_SLOT_CHUNK;
  return SPW_OK;
}

int spw__handles_alloc(spw_handle_table_t *t, spw_buf_t *out, spw_slot_t **slot_out) {
  pthread_mutex_lock(&t->mu);
  if (t->free_head == 0) {
    int s = grow(t);
    if (s != SPW_OK) {
      pthread_mutex_unlock(&t->mu);
      return s;
    }
  }
  uint32_t idx = t->free_head - 1;
  spw_slot_t *slot = spw__handles_slot_at(t, idx);
  t->free_head = slot->next_free;
  if (t->free_head == 0) t->free_tail = 0;
  pthread_mutex_unlock(&t->mu);

  uint32_t gen = spw__w_gen(atomic_load_explicit(&slot->word, memory_order_relaxed));
  slot->next_free = 0;
  slot->move_seq = 0;
  memset(&slot->host, 0, sizeof slot->host);
  memset(&slot->disk, 0, sizeof slot->disk);
  atomic_store_explicit(&slot->last_use, 0, memory_order_relaxed);
  atomic_store_explicit(&slot->prefetched, 0, memory_order_relaxed);
  atomic_fetch_add_explicit(&t->live, 1, memory_order_relaxed);
  *out = spw__handle_make(t, gen, idx);
  *slot_out = slot;
  return SPW_OK;
}

void spw__handles_release(spw_handle_table_t *t, spw_slot_t *slot, uint32_t index) {
  uint32_t gen = spw__w_gen(atomic_load_explicit(&slot->word, memory_order_relaxed));
  gen = (gen + 1) & SPW_GEN_MASK;
  if (gen == 0) gen = 1;
  slot->dptr = NULL;
  atomic_store_explicit(&slot->va, NULL, memory_order_relaxed);
  slot->size = 0;
  atomic_store_explicit(&slot->word, spw__w_make(gen, SPW_SLOT_UNUSED, 0, 0), memory_order_release);
  atomic_store_explicit(spw__handles_live_at(t, index), 0, memory_order_release);
  atomic_fetch_sub_explicit(&t->live, 1, memory_order_relaxed);
  pthread_mutex_lock(&t->mu);
  slot->next_free = 0;
  if (t->free_tail) spw__handles_slot_at(t, t->free_tail - 1)->next_free = index + 1;
  else t->free_head = index + 1;
  t->free_tail = index + 1;
  pthread_mutex_unlock(&t->mu);
}
