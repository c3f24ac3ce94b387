/* SPDX-License-Identifier: Apache-2.0 */
/* Private header, never installed: the host backend's form of CUDA IPC (host_ipc.c).
 *
 * The host backend's device memory is this process's memory, so sharing it with another
 * process needs shared memory: an IPC region is a memfd mapped MAP_SHARED, and its handle
 * names the file by the exporter's process id and descriptor, with the file's inode to
 * recognise it. The importer opens /proc/<pid>/fd/<fd> (the same user may; no descriptor is
 * passed) and maps it. Like CUDA's handles, one is plain bytes that any channel can carry,
 * and it works only while the exporter lives and keeps the region. Thread-safe. */
#ifndef SPILLWAY_BACKEND_HOST_IPC_H
#define SPILLWAY_BACKEND_HOST_IPC_H

#include <stddef.h>

#include "spillway/spillway.h"

typedef struct spw_host_ipc spw_host_ipc_t;

int spw__host_ipc_create(spw_host_ipc_t **out);
/* Unmaps every region still mapped, exported or opened. NULL-safe. */
void spw__host_ipc_destroy(spw_host_ipc_t *x);

/* A shared region of `bytes` (page-rounded), zero-filled. SPW_ERR_OUT_OF_MEMORY when the
 * system refuses the memory, SPW_ERR_SYSTEM for other failures (errno set). */
int spw__host_ipc_alloc(spw_host_ipc_t *x, size_t bytes, void **out);
/* Unmaps a region spw__host_ipc_alloc returned; *bytes: its size as asked for.
 * SPW_ERR_INVALID_ARG if it is not one. */
int spw__host_ipc_free(spw_host_ipc_t *x, void *base, size_t *bytes);
/* The handle of a region this process allocated. SPW_ERR_INVALID_ARG if `base` is not one. */
int spw__host_ipc_export(spw_host_ipc_t *x, void *base, unsigned char handle[SPW_IPC_HANDLE_BYTES]);
/* Maps another process's region. SPW_ERR_INVALID_ARG: not a host-backend handle;
 * SPW_ERR_UNSUPPORTED: a handle of this process; SPW_ERR_CUDA (as CUDA's refusal of a handle
 * it cannot open): the exporter or its region is gone, or the descriptor now names another
 * file; SPW_ERR_SYSTEM: the mapping failed (errno set). */
int spw__host_ipc_open(spw_host_ipc_t *x, const unsigned char handle[SPW_IPC_HANDLE_BYTES],
                       void **base);
/* Unmaps what spw__host_ipc_open mapped. SPW_ERR_INVALID_ARG if `base` is not one. */
int spw__host_ipc_close(spw_host_ipc_t *x, void *base);

#endif /* SPILLWAY_BACKEND_HOST_IPC_H */
