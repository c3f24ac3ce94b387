/* SPDX-License-Identifier: Apache-2.0 */
/* Owner tags: the table of counters and names (see owners.h). */
#include "owners.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

spw_owners_t *spw__owners_create(void) {
  /* A multiple of the alignment, as aligned_alloc wants. */
  size_t size = (sizeof(spw_owners_t) + 63) & ~(size_t)63;
  spw_owners_t *o = aligned_alloc(64, size);
  if (!o) return NULL;
  memset(o, 0, size);
  if (pthread_mutex_init(&o->mu, NULL) != 0) {
    free(o);
    return NULL;
  }
  return o;
}

void spw__owners_destroy(spw_owners_t *o) {
  if (!o) return;
  pthread_mutex_destroy(&o->mu);
  free(o);
}

int spw__owner_name_valid(const char *name) {
  size_t n = 0;
  for (; name[n] && n <= SPW_OWNER_NAME_MAX; n++) {
    unsigned char c = (unsigned char)name[n];
    if (c < 0x20 || c > 0x7e || c == '"' || c == '\\') return 0;
  }
  return n > 0 && n <= SPW_OWNER_NAME_MAX;
}

void spw__owner_set_name(spw_owners_t *o, uint32_t id, const char *name) {
  pthread_mutex_lock(&o->mu);
  snprintf(o->names[id], sizeof o->names[id], "%s", name);
  atomic_fetch_add_explicit(&o->names_gen, 1, memory_order_release);
  pthread_mutex_unlock(&o->mu);
}

void spw__owner_get_name(spw_owners_t *o, uint32_t id, spw_owner_name_t out) {
  pthread_mutex_lock(&o->mu);
  memcpy(out, o->names[id], sizeof o->names[id]);
  pthread_mutex_unlock(&o->mu);
}

int spw__owner_names_copy(spw_owners_t *o, spw_owner_name_t out[SPW_OWNERS], uint32_t *gen) {
  if (atomic_load_explicit(&o->names_gen, memory_order_acquire) == *gen) return 0;
  pthread_mutex_lock(&o->mu);
  memcpy(out, o->names, sizeof o->names);
  *gen = atomic_load_explicit(&o->names_gen, memory_order_relaxed);
  pthread_mutex_unlock(&o->mu);
  return 1;
}

void spw__owner_label(const char *name, uint32_t id, char *out, size_t len) {
  if (name[0]) snprintf(out, len, "%s", name);
  else snprintf(out, len, "owner %u", id);
}
