/* SPDX-License-Identifier: Apache-2.0 */
/* Private header, never installed: sharing device memory with other processes (ipc.c); the
 * public calls' argument checks are in api/ipc_api.c. */
#ifndef SPILLWAY_CORE_IPC_H
#define SPILLWAY_CORE_IPC_H

#include "runtime.h"

/* Exports [dptr, dptr + bytes), which must lie in one region of the runtime's exportable
 * device memory. */
int spw__ipc_export_range(spw_runtime_t *rt, const void *dptr, size_t bytes,
                          spw_ipc_handle_t *out);
int spw__ipc_open(spw_runtime_t *rt, const spw_ipc_handle_t *h, void **dptr);
int spw__ipc_close(spw_runtime_t *rt, void *dptr);
/* Closes whatever is still open (the runtime's close). */
void spw__ipc_close_all(spw_runtime_t *rt);

#endif /* SPILLWAY_CORE_IPC_H */
