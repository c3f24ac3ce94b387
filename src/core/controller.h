/* SPDX-License-Identifier: Apache-2.0 */
/* Private header, never installed: delivery of the controller's callbacks (spillway.h's
 * spw_controller_t). The table is copied under ctl_mu and called after the mutex is
 * dropped, so a callback never runs while Spillway holds a lock, and a callback that
 * replaces the controller does not deadlock. While a callback runs, the thread's callback
 * depth is raised so that calls which would wait on the runtime refuse with
 * SPW_ERR_WOULD_DEADLOCK. Call these with no Spillway lock held. */
#ifndef SPILLWAY_CORE_CONTROLLER_H
#define SPILLWAY_CORE_CONTROLLER_H

#include "runtime.h"

/* Installs (or removes, with NULL) the table; checks struct_size. */
int spw__controller_set(spw_runtime_t *rt, const spw_controller_t *controller, void *user);
void spw__controller_allocated(spw_runtime_t *rt, spw_buf_t h, size_t bytes);
void spw__controller_freed(spw_runtime_t *rt, spw_buf_t h, size_t bytes);
void spw__controller_state(spw_runtime_t *rt, const spw_state_event_t *ev);
/* Asks for victims; returns how many the controller named (0 without a controller). */
size_t spw__controller_pressure(spw_runtime_t *rt, uint64_t bytes_needed, spw_buf_t *victims,
                                size_t max);

#endif /* SPILLWAY_CORE_CONTROLLER_H */
