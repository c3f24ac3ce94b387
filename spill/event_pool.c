/* SPDX-License-Identifier: Apache-2.0 */
/* The event pool (see event_pool.h): a stack of idle events under one mutex. */
#include "event_pool.h"

#include <stdlib.h>

#include "grow.h"

void spw__event_pool_init(spw_event_pool_t *p, const spw_backend_ops_t *ops, spw_backend_t *be) {
  p->ops = ops;
  p->be = be;
  pthread_mutex_init(&p->mu, NULL);
  p->free = NULL;
  p->n = p->cap = 0;
}

void spw__event_pool_fini(spw_event_pool_t *p) {
  for (size_t i = 0; i < p->n; i++) p->ops->event_destroy(p->be, p->free[i]);
  free(p->free);
  p->free = NULL;
  p->n = p->cap = 0;
  pthread_mutex_destroy(&p->mu);
}

int spw__event_get(spw_event_pool_t *p, spw_bevent_t **out) {
  pthread_mutex_lock(&p->mu);
  if (p->n > 0) {
    *out = p->free[--p->n];
    pthread_mutex_unlock(&p->mu);
    return SPW_OK;
  }
  pthread_mutex_unlock(&p->mu);
  return p->ops->event_create(p->be, out);
}

void spw__event_put(spw_event_pool_t *p, spw_bevent_t *e) {
  pthread_mutex_lock(&p->mu);
  spw_bevent_t **grown = spw__grow(p->free, &p->cap, p->n + 1, sizeof *grown, 64);
  if (grown) {
    p->free = grown;
    p->free[p->n++] = e;
  }
  pthread_mutex_unlock(&p->mu);
  if (!grown) p->ops->event_destroy(p->be, e);
}
