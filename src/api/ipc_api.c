/* SPDX-License-Identifier: Apache-2.0 */
/* Sharing buffers between processes: argument and state checks, then core/ipc.c. */
#include "api.h"
#include "ipc.h"
#include "ipc_share.h"

int spw_ipc_export(spw_runtime_t *rt, spw_buf_t buf, spw_ipc_handle_t *out) {
  if (!rt || !out) return SPW_ERR_INVALID_ARG;
  spw_slot_t *s;
  uint64_t w;
  int st = spw__handles_lookup(&rt->handles, buf, &s, &w);
  if (st != SPW_OK) return st;
  if (w & SPW_W_FREE_PENDING) return SPW_ERR_FREED;
  /* A lock keeps a resident buffer where it is: no mover takes it while one is held, so
   * the pointer read under the slot mutex stays true after it. */
  pthread_mutex_lock(&s->mu);
  w = atomic_load_explicit(&s->word, memory_order_acquire);
  int held = spw__w_count(w) > 0 && spw__w_state(w) == SPW_STATE_RESIDENT && s->dptr;
  void *dptr = s->dptr;
  size_t size = atomic_load_explicit(&s->size, memory_order_relaxed);
  /* The copy that brought it back may still be landing; `ready` is not replaced while the
   * lock holds the buffer, so it can be waited for outside the mutex. */
  spw_bevent_t *landing = (w & SPW_W_WAIT) ? s->ready : NULL;
  pthread_mutex_unlock(&s->mu);
  if (!held)
    return spw__set_error(rt, SPW_ERR_NOT_LOCKED,
                          "only a resident buffer that a stream holds locked can be exported "
                          "(spw_acquire it first)");
  if (landing && (st = rt->ops->event_sync(rt->be, landing)) != SPW_OK) return st;
  /* Virtual memory management's chunks are shared another way than CUDA IPC's regions. */
  if (spw__slot_va(s)) return spw__ipc_export_stable(rt, buf, size, out);
  return spw__ipc_export_range(rt, dptr, size, out);
}

int spw_ipc_export_ptr(spw_runtime_t *rt, const void *dptr, size_t bytes,
                       spw_ipc_handle_t *out) {
  if (!rt || !dptr || bytes == 0 || !out) return SPW_ERR_INVALID_ARG;
  return spw__ipc_export_range(rt, dptr, bytes, out);
}

int spw_ipc_open(spw_runtime_t *rt, const spw_ipc_handle_t *handle, void **dptr) {
  if (!rt || !handle || !dptr) return SPW_ERR_INVALID_ARG;
  return spw__ipc_open(rt, handle, dptr);
}

int spw_ipc_close(spw_runtime_t *rt, void *dptr) {
  if (!rt || !dptr) return SPW_ERR_INVALID_ARG;
  return spw__ipc_close(rt, dptr);
}
