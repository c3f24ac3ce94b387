/* SPDX-License-Identifier: Apache-2.0 */
/* Owners (SPW_ALLOC_OWNER): naming them and reading their counters (src/core/owners.h). The
 * tag itself is checked by spw_alloc_ex (buffer_api.c). */
#include <string.h>

#include "api.h"

#define LOAD(x) atomic_load_explicit(&(x), memory_order_relaxed)

int spw_owner_name(spw_runtime_t *rt, unsigned id, const char *name) {
  if (!rt || !name || id == 0 || id > SPW_OWNER_MAX || !spw__owner_name_valid(name))
    return SPW_ERR_INVALID_ARG;
  spw__owner_set_name(rt->owners, id, name);
  return SPW_OK;
}

int spw_owner_stats(spw_runtime_t *rt, unsigned id, spw_owner_stats_t *out) {
  if (!rt || !out || out->struct_size < sizeof(size_t) || id == 0 || id > SPW_OWNER_MAX)
    return SPW_ERR_INVALID_ARG;
  spw_owner_stats_t s;
  memset(&s, 0, sizeof s);
  s.struct_size = sizeof s;
  spw_owner_counters_t *c = &rt->owners->c[id];
  s.buffers = LOAD(c->live);
  s.bytes = LOAD(c->live_bytes);
  s.allocs = LOAD(c->allocs);
  s.alloc_bytes = LOAD(c->alloc_bytes);
  spw__owner_get_name(rt->owners, id, s.name);
  size_t n = out->struct_size < sizeof s ? out->struct_size : sizeof s;
  memcpy(out, &s, n);
  out->struct_size = n;
  return SPW_OK;
}
