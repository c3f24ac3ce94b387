/* SPDX-License-Identifier: Apache-2.0 */
/* The runtime's public calls: creation from a config, destruction, the queries, and the
 * host memory reserved ahead. */
#include "api.h"
#include "peer.h"
#include "completions.h"

int spw_runtime_create(const spw_config_t *config, spw_runtime_t **out) {
  if (!out) return SPW_ERR_INVALID_ARG;
  spw_settings_t settings;
  char err[512] = "";
  int st = spw__config_resolve(config, &settings, err, sizeof err);
  if (st != SPW_OK) {
    spw_log_t lg = {.level = SPW_LOG_ERROR};
    if (st == SPW_ERR_CONFIG) spw__log(&lg, SPW_LOG_ERROR, "%s", err);
    return st;
  }
  return spw__runtime_open(&settings, NULL, NULL, out);
}

static int any_locked(spw_runtime_t *rt) {
  uint32_t n = atomic_load(&rt->handles.nslots);
  for (uint32_t i = 0; i < n; i++) {
    uint64_t w = atomic_load(&spw__handles_slot_at(&rt->handles, i)->word);
    if (spw__w_state(w) != SPW_SLOT_UNUSED && spw__w_count(w) > 0) return 1;
  }
  return 0;
}

int spw_runtime_destroy(spw_runtime_t *rt) {
  if (!rt) return SPW_OK;
  if (spw__in_callback(rt)) return SPW_ERR_WOULD_DEADLOCK;
  /* Work that may still release locks (release_async) finishes first. */
  spw__completions_drain(rt->completions);
  if (any_locked(rt)) {
    spw__set_error(rt, SPW_ERR_BUSY, "buffers are still locked: synchronize their streams first");
    return SPW_ERR_BUSY;
  }
  /* What it lends first: the borrowers' buffers in that memory move on to their host tiers. */
  int st = spw__peer_take_back_all(rt);
  if (st != SPW_OK) return st;
  spw__peer_give_back_begin(rt);
  spw__runtime_close(rt);
  return SPW_OK;
}

int spw_runtime_backend(const spw_runtime_t *rt, spw_backend_kind_t *out) {
  if (!rt || !out) return SPW_ERR_INVALID_ARG;
  *out = rt->kind;
  return SPW_OK;
}

int spw_runtime_limits(const spw_runtime_t *rt, uint64_t *device_limit, uint64_t *host_limit,
                       uint64_t *disk_limit) {
  if (!rt) return SPW_ERR_INVALID_ARG;
  if (device_limit) *device_limit = rt->budget.limit;
  if (host_limit) *host_limit = rt->settings.host_limit;
  if (disk_limit) *disk_limit = rt->settings.disk_limit;
  return SPW_OK;
}

int spw_host_reserve(spw_runtime_t *rt, uint64_t bytes) {
  if (!rt) return SPW_ERR_INVALID_ARG;
  /* It blocks for as long as the pinning takes, which a callback must not do to the engine. */
  if (spw__in_callback(rt)) return SPW_ERR_WOULD_DEADLOCK;
  int st = spw__arena_reserve(rt->arena, bytes);
  if (st == SPW_OK) return SPW_OK;
  if (bytes > rt->settings.host_limit)
    return spw__set_error(rt, st, "%llu bytes of host memory asked for, more than the host "
                          "limit of %llu bytes", (unsigned long long)bytes,
                          (unsigned long long)rt->settings.host_limit);
  /* Under the limit: slabs of single big buffers hold the rest, or the pinning failed. */
  return spw__set_error(rt, st, "pinning %llu bytes of host memory failed: %s",
                        (unsigned long long)bytes, spw_strerror(st));
}

const char *spw_last_error(const spw_runtime_t *rt) {
  if (!rt) return "";
  spw_tls_t *t = pthread_getspecific(rt->tls_key);
  return t ? t->last_error : "";
}

int spw_async_error(spw_runtime_t *rt) {
  if (!rt) return SPW_ERR_INVALID_ARG;
  return atomic_exchange(&rt->async_error, SPW_OK);
}
