/* SPDX-License-Identifier: Apache-2.0 */
/* Private header, never installed: a pool of backend events for one-shot uses (a release
 * behind a stream, a batch's completion). Creating a CUDA event costs about a microsecond;
 * reusing one costs a mutex. Thread-safe; the pool owns every event it hands back. */
#ifndef SPILLWAY_SPILL_EVENT_POOL_H
#define SPILLWAY_SPILL_EVENT_POOL_H

#include <pthread.h>
#include <stddef.h>

#include "backend.h"

typedef struct spw_event_pool {
  const spw_backend_ops_t *ops;
  spw_backend_t *be;
  pthread_mutex_t mu;
  spw_bevent_t **free;
  size_t n, cap;
} spw_event_pool_t;

void spw__event_pool_init(spw_event_pool_t *p, const spw_backend_ops_t *ops, spw_backend_t *be);
/* Destroys the pooled events (none may be out). */
void spw__event_pool_fini(spw_event_pool_t *p);
/* An event, pooled or new: the backend's event_create errors. */
int spw__event_get(spw_event_pool_t *p, spw_bevent_t **out);
/* Back to the pool; destroyed instead if the pool cannot grow. The event may still be
 * pending: it is recorded again before its next use. */
void spw__event_put(spw_event_pool_t *p, spw_bevent_t *e);

#endif /* SPILLWAY_SPILL_EVENT_POOL_H */
