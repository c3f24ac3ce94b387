/* SPDX-License-Identifier: Apache-2.0 */
/* Private header, never installed: sharing address-stable buffers with other processes
 * (ipc_share.c): a buffer's chunk descriptor over a Unix socket, answered by a server thread
 * of the exporting runtime. */
#ifndef SPILLWAY_CORE_IPC_SHARE_H
#define SPILLWAY_CORE_IPC_SHARE_H

#include "runtime.h"

/* Fills *out for a stable buffer of `bytes` that the caller found resident and locked:
 * a handle that names this runtime's server (started now if it is not) and the buffer's
 * export record. Errors: SPW_ERR_UNSUPPORTED (config.ipc off), SPW_ERR_SYSTEM. */
int spw__ipc_export_stable(spw_runtime_t *rt, spw_buf_t buf, size_t bytes,
                           spw_ipc_handle_t *out);
/* Opens a SPW_IPC_KIND_CHUNKS handle: asks its exporter for the buffer's chunk and maps it
 * in a range reserved here; *out is what spw__ipc_unmap_chunks undoes. */
int spw__ipc_open_chunks(spw_runtime_t *rt, const spw_ipc_handle_t *h, spw_ipc_opened_t *out);
/* Unmaps and releases the chunk spw__ipc_open_chunks mapped, and frees its range. */
void spw__ipc_unmap_chunks(spw_runtime_t *rt, const spw_ipc_opened_t *o);
/* Stops the server, if one was started (the runtime's close). */
void spw__ipc_server_stop(spw_runtime_t *rt);

#endif /* SPILLWAY_CORE_IPC_SHARE_H */
