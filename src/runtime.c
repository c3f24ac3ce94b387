/* SPDX-License-Identifier: Apache-2.0 */
/* Runtime lifecycle: settings, backend choice, limits, per-thread error text, the event pool,
 * and destruction. Everything a runtime creates is reachable from the spw_runtime struct and
 * torn down here in the reverse order of creation. */
#include "runtime.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../spill/disk_tier.h"
#include "../spill/engine.h"
#include "completions.h"

uint64_t spw__now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t spw__coarse_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---- per-thread state -------------------------------------------------------------- */

spw_tls_t *spw__tls(spw_runtime_t *rt) {
  spw_tls_t *t = pthread_getspecific(rt->tls_key);
  if (t) return t;
  t = calloc(1, sizeof *t);
  if (!t) return NULL;
  pthread_mutex_lock(&rt->tls_mu);
  t->next = rt->tls_list;
  rt->tls_list = t;
  pthread_mutex_unlock(&rt->tls_mu);
  pthread_setspecific(rt->tls_key, t);
  return t;
}

int spw__set_error(spw_runtime_t *rt, int status, const char *fmt, ...) {
  spw_tls_t *t = spw__tls(rt);
  char buf[sizeof t->last_error];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  if (t) memcpy(t->last_error, buf, sizeof buf);
  spw__log(&rt->log, SPW_LOG_DEBUG, "%s: %s", spw_err_name(status), buf);
  return status;
}

void spw__error_sink(void *ctx, const char *name, const char *text) {
  spw_runtime_t *rt = ctx;
  spw__set_error(rt, SPW_ERR_CUDA, "%s: %s", name ? name : "error", text ? text : "");
}

void spw__set_async_error(spw_runtime_t *rt, int status) {
  int expected = SPW_OK;
  atomic_compare_exchange_strong(&rt->async_error, &expected, status);
}

/* ---- event pool ---------------------------------------------------------------------- */

int spw__event_get(spw_runtime_t *rt, spw_bevent_t **out) {
  pthread_mutex_lock(&rt->event_mu);
  if (rt->event_pool_n > 0) {
    *out = rt->event_pool[--rt->event_pool_n];
    pthread_mutex_unlock(&rt->event_mu);
    return SPW_OK;
  }
  pthread_mutex_unlock(&rt->event_mu);
  return rt->ops->event_create(rt->be, out);
}

void spw__event_put(spw_runtime_t *rt, spw_bevent_t *e) {
  pthread_mutex_lock(&rt->event_mu);
  if (rt->event_pool_n == rt->event_pool_cap) {
    size_t cap = rt->event_pool_cap ? rt->event_pool_cap * 2 : 64;
    spw_bevent_t **n = realloc(rt->event_pool, cap * sizeof *n);
    if (!n) {
      pthread_mutex_unlock(&rt->event_mu);
      rt->ops->event_destroy(rt->be, e);
      return;
    }
    rt->event_pool = n;
    rt->event_pool_cap = cap;
  }
  rt->event_pool[rt->event_pool_n++] = e;
  pthread_mutex_unlock(&rt->event_mu);
}

/* ---- creation ------------------------------------------------------------------------ */

int spw_config_validate(const spw_config_t *config, char *msg, size_t len) {
  spw_settings_t s;
  char err[512] = "";
  int st = spw__config_resolve(config, &s, err, sizeof err);
  if (msg && len > 0) snprintf(msg, len, "%s", st == SPW_OK ? "" : err);
  return st;
}

static int open_backend(spw_runtime_t *rt) {
  spw_backend_params_t p = {.device = rt->settings.device,
                            .host_device_bytes = rt->settings.host_device_bytes,
                            .on_error = spw__error_sink,
                            .err_ctx = rt};
  const spw_backend_ops_t *ops = NULL;
  spw_backend_t *b = NULL;
  int st = SPW_ERR_NO_DEVICE;
  spw_backend_kind_t want = rt->settings.backend;
#ifdef SPW_HAVE_CUDA
  if (want == SPW_BACKEND_CUDA || want == SPW_BACKEND_AUTO) {
    ops = &spw__backend_cuda_ops;
    st = ops->create(&p, &b);
    if (st != SPW_OK && want == SPW_BACKEND_CUDA) return st;
    if (st != SPW_OK && st != SPW_ERR_NO_DEVICE) return st;
  }
#else
  if (want == SPW_BACKEND_CUDA) {
    spw__log(&rt->log, SPW_LOG_ERROR, "backend cuda asked for, but this build has no CUDA");
    return SPW_ERR_NO_DEVICE;
  }
#endif
  if (st != SPW_OK) {
    ops = &spw__backend_host_ops;
    st = ops->create(&p, &b);
    if (st != SPW_OK) return st;
  }
  rt->kind = ops->kind;
  return spw__faults_wrap(rt, ops, b, &rt->ops, &rt->be);
}

static int compute_limits(spw_runtime_t *rt) {
  size_t free_b = 0, total_b = 0;
  int st = rt->ops->mem_info(rt->be, &free_b, &total_b);
  if (st != SPW_OK) return st;
  uint64_t limit = rt->settings.device_limit;
  if (limit == 0) limit = (uint64_t)((double)free_b * rt->settings.device_limit_fraction);
  if (limit > total_b)
    spw__log(&rt->log, SPW_LOG_WARN,
             "device limit %llu bytes exceeds the device's %zu bytes; the device will refuse first",
             (unsigned long long)limit, total_b);
  rt->device_limit = limit;
  rt->high_bytes = (uint64_t)((double)limit * rt->settings.high_watermark);
  rt->low_bytes = (uint64_t)((double)limit * rt->settings.low_watermark);
  return SPW_OK;
}

static void free_runtime_shell(spw_runtime_t *rt) {
  for (spw_tls_t *t = rt->tls_list, *n; t; t = n) {
    n = t->next;
    free(t);
  }
  pthread_key_delete(rt->tls_key);
  pthread_mutex_destroy(&rt->tls_mu);
  pthread_mutex_destroy(&rt->ctl_mu);
  pthread_mutex_destroy(&rt->event_mu);
  pthread_mutex_destroy(&rt->disk_mu);
  pthread_cond_destroy(&rt->budget_cv);
  pthread_mutex_destroy(&rt->budget_mu);
  free(rt);
}

static void drop_event_pool(spw_runtime_t *rt) {
  for (size_t i = 0; i < rt->event_pool_n; i++) rt->ops->event_destroy(rt->be, rt->event_pool[i]);
  free(rt->event_pool);
  rt->event_pool = NULL;
  rt->event_pool_n = rt->event_pool_cap = 0;
}

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
  spw_runtime_t *rt = calloc(1, sizeof *rt);
  if (!rt) return SPW_ERR_SYSTEM;
  rt->settings = settings;
  rt->log.level = settings.log_level;
  pthread_mutex_init(&rt->budget_mu, NULL);
  pthread_cond_init(&rt->budget_cv, NULL);
  pthread_mutex_init(&rt->disk_mu, NULL);
  pthread_mutex_init(&rt->event_mu, NULL);
  pthread_mutex_init(&rt->ctl_mu, NULL);
  pthread_mutex_init(&rt->tls_mu, NULL);
  if (pthread_key_create(&rt->tls_key, NULL) != 0) {
    free(rt);
    return SPW_ERR_SYSTEM;
  }

  st = open_backend(rt);
  if (st != SPW_OK) {
    free_runtime_shell(rt);
    return st;
  }
  st = compute_limits(rt);
  /* The tag tells this runtime's handles from another's: the address and the clock mixed. */
  uint64_t mix = ((uint64_t)(uintptr_t)rt * 0x9E3779B97F4A7C15ull) ^ spw__now_ns();
  uint16_t tag = (uint16_t)(mix ^ (mix >> 16) ^ (mix >> 32) ^ (mix >> 48));
  if (st == SPW_OK) st = spw__handles_init(&rt->handles, tag);
  if (st == SPW_OK) {
    rt->null_bstream = rt->ops->default_stream(rt->be);
    st = spw__streams_init(&rt->streams, rt->null_bstream);
  }
  if (st == SPW_OK) {
    /* Slabs as large as the largest common buffers (a larger one gets a slab of its own,
     * mapped and pinned for each spill). */
    size_t slab = rt->kind == SPW_BACKEND_HOST ? (size_t)64 << 20 : (size_t)1 << 30;
    st = spw__arena_create(rt->ops, rt->be, rt->settings.host_limit, slab, &rt->arena);
  }
  if (st == SPW_OK) st = spw__dpool_create(rt, &rt->dpool);
  if (st == SPW_OK) st = spw__completions_start(rt);
  if (st == SPW_OK) st = spw__engine_start(rt);
  if (st != SPW_OK) {
    spw__log(&rt->log, SPW_LOG_ERROR, "runtime creation failed: %s", spw_err_name(st));
    spw__engine_stop(rt);
    spw__completions_stop(rt);
    if (rt->arena) spw__arena_destroy(rt->arena);
    spw__dpool_destroy(rt, rt->dpool);
    drop_event_pool(rt);
    rt->ops->destroy(rt->be);
    free_runtime_shell(rt);
    return st;
  }
  spw__log(&rt->log, SPW_LOG_INFO,
           "runtime on backend %s: device limit %llu B (high %llu, low %llu), host limit %llu B",
           rt->kind == SPW_BACKEND_CUDA ? "cuda" : "host", (unsigned long long)rt->device_limit,
           (unsigned long long)rt->high_bytes, (unsigned long long)rt->low_bytes,
           (unsigned long long)rt->settings.host_limit);
  *out = rt;
  return SPW_OK;
}

/* ---- destruction --------------------------------------------------------------------- */

static int any_locked(spw_runtime_t *rt) {
  uint32_t n = atomic_load(&rt->handles.nslots);
  for (uint32_t i = 0; i < n; i++) {
    uint64_t w = atomic_load(&spw__handles_slot_at(&rt->handles, i)->word);
    if (spw__w_state(w) != SPW_SLOT_UNUSED && spw__w_count(w) > 0) return 1;
  }
  return 0;
}

static void destroy_owned_stream(spw_stream_entry_t *e, void *arg) {
  spw_runtime_t *rt = arg;
  if (e->owned && atomic_load(&e->live)) {
    rt->ops->stream_destroy(rt->be, e->bstream);
    atomic_store(&e->live, 0);
  }
}

int spw_runtime_destroy(spw_runtime_t *rt) {
  if (!rt) return SPW_OK;
  if (spw__in_callback(rt)) return SPW_ERR_WOULD_DEADLOCK;
  /* Work that may still release locks (release_async) finishes first. */
  spw__completions_drain(rt);
  if (any_locked(rt)) {
    spw__set_error(rt, SPW_ERR_BUSY, "buffers are still locked: synchronize their streams first");
    return SPW_ERR_BUSY;
  }
  spw__engine_stop(rt);
  spw__completions_stop(rt);

  /* Free every buffer that is left, whatever its tier. */
  uint32_t n = atomic_load(&rt->handles.nslots);
  for (uint32_t i = 0; i < n; i++) {
    spw_slot_t *s = spw__handles_slot_at(&rt->handles, i);
    uint64_t w = atomic_load(&s->word);
    if (spw__w_state(w) == SPW_SLOT_UNUSED) continue;
    spw__dpool_free(rt, s->dptr, s->size, rt->null_bstream);
    spw__arena_free(rt->arena, &s->host);
    spw__disk_free(rt, &s->disk);
    s->dptr = NULL;
  }
  spw__streams_foreach(&rt->streams, destroy_owned_stream, rt);
  rt->ops->stream_sync(rt->be, rt->null_bstream);
  spw__dpool_destroy(rt, rt->dpool);
  rt->ops->stream_sync(rt->be, rt->null_bstream);
  drop_event_pool(rt);
  for (uint32_t i = 0; i < n; i++) {
    spw_slot_t *s = spw__handles_slot_at(&rt->handles, i);
    if (s->ready) rt->ops->event_destroy(rt->be, s->ready);
    s->ready = NULL;
  }
  spw__disk_close(rt);
  spw__arena_destroy(rt->arena);
  rt->ops->destroy(rt->be);
  spw__handles_destroy(&rt->handles);
  spw__streams_destroy(&rt->streams);
  free_runtime_shell(rt);
  return SPW_OK;
}

/* ---- queries --------------------------------------------------------------------------- */

int spw_runtime_backend(const spw_runtime_t *rt, spw_backend_kind_t *out) {
  if (!rt || !out) return SPW_ERR_INVALID_ARG;
  *out = rt->kind;
  return SPW_OK;
}

int spw_runtime_limits(const spw_runtime_t *rt, uint64_t *device_limit, uint64_t *host_limit,
                       uint64_t *disk_limit) {
  if (!rt) return SPW_ERR_INVALID_ARG;
  if (device_limit) *device_limit = rt->device_limit;
  if (host_limit) *host_limit = rt->settings.host_limit;
  if (disk_limit) *disk_limit = rt->settings.disk_limit;
  return SPW_OK;
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
