/* SPDX-License-Identifier: Apache-2.0 */
/* spw_set_controller. */
#include "api.h"
#include "controller.h"

int spw_set_controller(spw_runtime_t *rt, const spw_controller_t *controller, void *user) {
  if (!rt) return SPW_ERR_INVALID_ARG;
  return spw__controller_set(rt, controller, user);
}
