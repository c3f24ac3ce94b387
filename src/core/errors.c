/* SPDX-License-Identifier: Apache-2.0 */
/* Errors: the per-thread error text behind spw_last_error, the sinks that the lower layers
 * report through, and the first error of background work behind spw_async_error. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime.h"

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

void spw__log_sink(void *ctx, int level, const char *msg) {
  spw_runtime_t *rt = ctx;
  spw__log(&rt->log, (spw_log_level_t)level, "%s", msg);
}

void spw__set_async_error(spw_runtime_t *rt, int status) {
  switch (status) {
  case SPW_ERR_INVALID_ARG:
  case SPW_ERR_INVALID_HANDLE:
  case SPW_ERR_FREED:
  case SPW_ERR_NOT_LOCKED:
  case SPW_ERR_INVALID_STREAM:
  case SPW_ERR_WRONG_DEVICE:
    /* Background work validates nothing the caller gave it: such a status from below is a
     * fault of Spillway's, and must not look like the application's mistake. */
    spw__log(&rt->log, SPW_LOG_ERROR, "background work failed with %s: internal error",
             spw_err_name(status));
    status = SPW_ERR_INTERNAL;
    break;
  default:
    break;
  }
  int expected = SPW_OK;
  atomic_compare_exchange_strong(&rt->async_error, &expected, status);
}
