/* SPDX-License-Identifier: Apache-2.0 */
/* Sharing device memory with other processes. Export finds the region (a slab or an arena
 * of the exportable device pool) that holds the memory and hands out the backend's handle
 * of the whole region with the memory's offset in it: CUDA exports whole allocations only.
 * An address-stable buffer goes another way (ipc_share.c). What was opened from other
 * processes is remembered by the pointer handed out, so that a close finds what to unmap
 * and a forged pointer is refused. */
#include "ipc.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "device_pool.h"
#include "grow.h"
#include "ipc_share.h"

int spw__ipc_export_range(spw_runtime_t *rt, const void *dptr, size_t bytes,
                          spw_ipc_handle_t *out) {
  void *base = NULL;
  int st = spw__dpool_region_of(rt->dpool, dptr, bytes, &base);
  if (st == SPW_ERR_UNSUPPORTED)
    return spw__set_error(rt, st, "this runtime's device memory cannot be exported: create it "
                                  "with config.ipc = SPW_IPC_ON (SPILLWAY_IPC=1)");
  if (st != SPW_OK)
    return spw__set_error(rt, SPW_ERR_INVALID_ARG,
                          "[%p, %p + %zu) is not in one region of this runtime's IPC memory",
                          dptr, dptr, bytes);
  spw_ipc_handle_t h;
  memset(&h, 0, sizeof h);
  st = rt->ops->ipc_export(rt->be, base, h.handle);
  if (st != SPW_OK) return st;
  h.offset = (uint64_t)((const char *)dptr - (const char *)base);
  h.bytes = bytes;
  h.backend = (int32_t)rt->kind;
  h.device = (int32_t)rt->settings.device;
  h.pid = (uint32_t)getpid();
  *out = h;
  return SPW_OK;
}

/* Keeps what an open mapped, so that a close finds it. */
static int remember(spw_runtime_t *rt, const spw_ipc_opened_t *o) {
  pthread_mutex_lock(&rt->ipc_mu);
  spw_ipc_opened_t *grown = spw__grow(rt->ipc_opened, &rt->ipc_cap, rt->ipc_nopened + 1,
                                      sizeof *grown, 8);
  if (grown) {
    rt->ipc_opened = grown;
    rt->ipc_opened[rt->ipc_nopened++] = *o;
  }
  pthread_mutex_unlock(&rt->ipc_mu);
  return grown ? SPW_OK : SPW_ERR_SYSTEM;
}

static int unmap(spw_runtime_t *rt, const spw_ipc_opened_t *o) {
  if (!o->chunk_bytes) return rt->ops->ipc_close(rt->be, o->base);
  spw__ipc_unmap_chunks(rt, o);
  return SPW_OK;
}

int spw__ipc_open(spw_runtime_t *rt, const spw_ipc_handle_t *h, void **dptr) {
  if (h->backend != (int32_t)rt->kind)
    return spw__set_error(rt, SPW_ERR_INVALID_ARG,
                          "a handle of the %s backend, opened on a runtime of the %s backend",
                          h->backend == SPW_BACKEND_CUDA ? "cuda" : "host",
                          rt->kind == SPW_BACKEND_CUDA ? "cuda" : "host");
  if (h->kind != SPW_IPC_KIND_REGION && h->kind != SPW_IPC_KIND_CHUNKS)
    return spw__set_error(rt, SPW_ERR_INVALID_ARG, "handle of unknown kind %u", h->kind);
  if (h->bytes == 0 || h->offset > UINT64_MAX - h->bytes || h->offset + h->bytes > SIZE_MAX / 2)
    return spw__set_error(rt, SPW_ERR_INVALID_ARG, "handle with offset %llu and %llu bytes",
                          (unsigned long long)h->offset, (unsigned long long)h->bytes);
  if (h->pid == (uint32_t)getpid())
    return spw__set_error(rt, SPW_ERR_UNSUPPORTED,
                          "a handle exported by this process: use the buffer itself");
  spw_ipc_opened_t o = {0};
  int st;
  if (h->kind == SPW_IPC_KIND_CHUNKS) {
    st = spw__ipc_open_chunks(rt, h, &o);
  } else {
    st = rt->ops->ipc_open(rt->be, h->handle, &o.base);
    o.dptr = (char *)o.base + h->offset;
  }
  if (st != SPW_OK) return st;
  if ((st = remember(rt, &o)) != SPW_OK) {
    (void)unmap(rt, &o);
    return st;
  }
  *dptr = o.dptr;
  return SPW_OK;
}

int spw__ipc_close(spw_runtime_t *rt, void *dptr) {
  spw_ipc_opened_t o = {0};
  pthread_mutex_lock(&rt->ipc_mu);
  for (size_t i = 0; i < rt->ipc_nopened; i++) {
    if (rt->ipc_opened[i].dptr != dptr) continue;
    o = rt->ipc_opened[i];
    rt->ipc_opened[i] = rt->ipc_opened[--rt->ipc_nopened];
    break;
  }
  pthread_mutex_unlock(&rt->ipc_mu);
  if (!o.base)
    return spw__set_error(rt, SPW_ERR_INVALID_ARG,
                          "%p: not a pointer spw_ipc_open returned on this runtime, or closed",
                          dptr);
  return unmap(rt, &o);
}

void spw__ipc_close_all(spw_runtime_t *rt) {
  for (size_t i = 0; i < rt->ipc_nopened; i++) (void)unmap(rt, &rt->ipc_opened[i]);
  rt->ipc_nopened = 0;
}
