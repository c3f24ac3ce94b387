/* SPDX-License-Identifier: Apache-2.0 */
/* Controller callbacks. The table is copied under ctl_mu and called after the mutex is
 * dropped, so a callback never runs while Spillway holds a lock, and a callback that
 * replaces the controller does not deadlock. While a callback runs, this thread's
 * callback_depth is raised so that calls which would wait on the runtime refuse with
 * SPW_ERR_WOULD_DEADLOCK. */
#include <string.h>

#include "runtime.h"

int spw_set_controller(spw_runtime_t *rt, const spw_controller_t *controller, void *user) {
  if (!rt) return SPW_ERR_INVALID_ARG;
  if (controller && controller->struct_size < sizeof(size_t)) return SPW_ERR_INVALID_ARG;
  pthread_mutex_lock(&rt->ctl_mu);
  memset(&rt->ctl, 0, sizeof rt->ctl);
  if (controller) {
    size_t n = controller->struct_size < sizeof rt->ctl ? controller->struct_size : sizeof rt->ctl;
    memcpy(&rt->ctl, controller, n);
    rt->ctl.struct_size = sizeof rt->ctl;
  }
  rt->ctl_user = user;
  atomic_store_explicit(&rt->has_ctl, controller != NULL, memory_order_release);
  pthread_mutex_unlock(&rt->ctl_mu);
  return SPW_OK;
}

static int snapshot(spw_runtime_t *rt, spw_controller_t *c, void **user) {
  if (!atomic_load_explicit(&rt->has_ctl, memory_order_acquire)) return 0;
  pthread_mutex_lock(&rt->ctl_mu);
  int has = rt->has_ctl;
  if (has) {
    *c = rt->ctl;
    *user = rt->ctl_user;
  }
  pthread_mutex_unlock(&rt->ctl_mu);
  return has;
}

static void enter(spw_runtime_t *rt) {
  spw_tls_t *t = spw__tls(rt);
  if (t) t->callback_depth++;
}
static void leave(spw_runtime_t *rt) {
  spw_tls_t *t = spw__tls(rt);
  if (t) t->callback_depth--;
}

void spw__notify_allocated(spw_runtime_t *rt, spw_buf_t h, size_t bytes) {
  spw_controller_t c;
  void *u;
  if (!snapshot(rt, &c, &u) || !c.allocated) return;
  enter(rt);
  c.allocated(u, h, bytes);
  leave(rt);
}

void spw__notify_freed(spw_runtime_t *rt, spw_buf_t h, size_t bytes) {
  spw_controller_t c;
  void *u;
  if (!snapshot(rt, &c, &u) || !c.freed) return;
  enter(rt);
  c.freed(u, h, bytes);
  leave(rt);
}

void spw__notify_state(spw_runtime_t *rt, const spw_state_event_t *ev) {
  spw_controller_t c;
  void *u;
  if (!snapshot(rt, &c, &u) || !c.state_changed) return;
  enter(rt);
  c.state_changed(u, ev);
  leave(rt);
}

size_t spw__ask_pressure(spw_runtime_t *rt, uint64_t bytes_needed, spw_buf_t *victims, size_t max) {
  spw_controller_t c;
  void *u;
  if (!snapshot(rt, &c, &u) || !c.pressure || max == 0) return 0;
  enter(rt);
  size_t n = c.pressure(u, bytes_needed, victims, max);
  leave(rt);
  return n < max ? n : max;
}
