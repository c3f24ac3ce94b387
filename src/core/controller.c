/* SPDX-License-Identifier: Apache-2.0 */
/* Controller callbacks (see controller.h), and the report of every move's outcome. */
#include "controller.h"

#include <string.h>

#include "moves.h"

int spw__controller_set(spw_runtime_t *rt, const spw_controller_t *controller, void *user) {
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

void spw__controller_allocated(spw_runtime_t *rt, spw_buf_t h, size_t bytes) {
  spw_controller_t c;
  void *u;
  if (!snapshot(rt, &c, &u) || !c.allocated) return;
  enter(rt);
  c.allocated(u, h, bytes);
  leave(rt);
}

void spw__controller_freed(spw_runtime_t *rt, spw_buf_t h, size_t bytes) {
  spw_controller_t c;
  void *u;
  if (!snapshot(rt, &c, &u) || !c.freed) return;
  enter(rt);
  c.freed(u, h, bytes);
  leave(rt);
}

void spw__controller_state(spw_runtime_t *rt, const spw_state_event_t *ev) {
  spw_controller_t c;
  void *u;
  if (!snapshot(rt, &c, &u) || !c.state_changed) return;
  enter(rt);
  c.state_changed(u, ev);
  leave(rt);
}

size_t spw__controller_pressure(spw_runtime_t *rt, uint64_t bytes_needed, spw_buf_t *victims,
                                size_t max) {
  spw_controller_t c;
  void *u;
  if (!snapshot(rt, &c, &u) || !c.pressure || max == 0) return 0;
  enter(rt);
  size_t n = c.pressure(u, bytes_needed, victims, max);
  leave(rt);
  return n < max ? n : max;
}

int spw__reporting(spw_runtime_t *rt) {
  return rt->trace != NULL || atomic_load_explicit(&rt->has_ctl, memory_order_acquire);
}

static void report(spw_runtime_t *rt, spw_buf_t h, uint32_t owner, spw_state_t from,
                   spw_state_t to, uint64_t bytes, uint64_t ns, int status, int own) {
  if (status != SPW_OK && status != SPW_ERR_LOCKED) {
    atomic_fetch_add_explicit(&rt->c.failures, 1, memory_order_relaxed);
    /* A failure its caller receives is not one of background work: recording it too made
     * the next spw_wait_idle raise the acquire's own error a second time (issue 18). */
    if (!own) spw__set_async_error(rt, status);
  }
  if (rt->trace) spw__trace_move(rt->trace, h, owner, from, to, bytes, ns, status);
  spw_state_event_t ev = {h, from, to, bytes, ns, status};
  spw__controller_state(rt, &ev);
}

void spw__report_move(spw_runtime_t *rt, spw_buf_t h, uint32_t owner, spw_state_t from,
                      spw_state_t to, uint64_t bytes, uint64_t ns, int status) {
  report(rt, h, owner, from, to, bytes, ns, status, 0);
}

void spw__report_own_move(spw_runtime_t *rt, spw_buf_t h, uint32_t owner, spw_state_t from,
                          spw_state_t to, uint64_t bytes, uint64_t ns, int status) {
  report(rt, h, owner, from, to, bytes, ns, status, 1);
}
