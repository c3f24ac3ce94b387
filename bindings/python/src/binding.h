/* SPDX-License-Identifier: Apache-2.0 */
/* binding.h: private to the CPython extension spillway._spillway (never installed).
 *
 * The extension is written against the limited API of CPython 3.10 (one abi3 wheel for
 * every later Python). It owns four types: Runtime (one spw_runtime_t), Buffer (one handle,
 * freed when collected), Lock (acquire/release as a context manager) and the Numba launch
 * pieces (LaunchLocks, LaunchView, LaunchExtension, in launch.c).
 *
 * GIL rule: a call that can wait on Spillway (an acquire of a buffer that is not on the
 * device, an allocation that must spill, synchronize, wait_idle, destroy) runs with the GIL
 * released, because Spillway threads may later call Python (controller callbacks) and would
 * then wait for the GIL this thread holds. Acquires first try SPW_ACQUIRE_TRY with the GIL
 * held (the common, resident case costs no GIL round trip) and release it only to wait.
 *
 * Module state lives in the statics of module.c: the extension uses single-phase
 * initialization and is imported once per process. */
#ifndef SPILLWAY_BINDING_H
#define SPILLWAY_BINDING_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "spillway/spillway.h"

typedef struct spwpy_runtime {
  PyObject_HEAD
  spw_runtime_t *rt; /* NULL once closed (or never created) */
  int backend;       /* SPW_BACKEND_CUDA or SPW_BACKEND_HOST */
  PyObject *link;    /* the ControllerLink of a Python controller (controller.c), kept
                        until the runtime is destroyed */
} spwpy_runtime_t;  /* the Python subclass spillway.Runtime adds __dict__ and __weakref__ */

typedef struct spwpy_buffer {
  PyObject_HEAD
  spwpy_runtime_t *owner; /* strong: the runtime outlives its buffers */
  spw_buf_t h;            /* kept after free: lock holders may still release */
  size_t size;
  int freed;
} spwpy_buffer_t;

/* The types, created at module init. */
extern PyTypeObject *spwpy_runtime_type, *spwpy_buffer_type, *spwpy_lock_type;
extern PyTypeObject *spwpy_launch_locks_type, *spwpy_launch_view_type, *spwpy_launch_ext_type;

/* Set by the atexit hook of the package: from then on no Spillway call that could wait runs
 * from a finalizer, and nothing waits at all in a deallocator. */
extern int spwpy_finalizing;

/* Raises the exception class registered for `status` with a message that carries
 * spw_last_error(rt) (rt may be NULL). Returns NULL. */
PyObject *spwpy_raise(spw_runtime_t *rt, int status);
/* The same with an explicit detail text. */
PyObject *spwpy_raise_detail(int status, const char *detail);
/* Raises the error of a call on a closed runtime. Returns NULL. */
PyObject *spwpy_raise_closed(void);

/* Converts a stream argument: None -> NULL (the default stream), an int, or any object with
 * __cuda_stream__ (the CUDA stream protocol), .cuda_stream (PyTorch), .ptr (CuPy) or
 * .handle (Numba). Returns 0, or -1 with an exception set. */
int spwpy_stream_from(PyObject *obj, spw_stream_t *out);

/* Makes `stream` known to the runtime if it is not yet (CUDA backend: streams the
 * application created are registered on first use). Returns the status of the retry
 * decision: 1 if a retry makes sense, 0 if not. */
int spwpy_stream_adopt(spwpy_runtime_t *r, spw_stream_t stream, int status);

/* Acquires with the GIL held if the buffer is on the device, else releases the GIL and
 * waits. Adopts unknown application streams. Returns a status. */
int spwpy_acquire(spwpy_runtime_t *r, spw_buf_t h, spw_stream_t stream, unsigned flags,
                  void **dptr);

/* The handle of a Buffer object argument, or an exception (TypeError, closed buffer). */
int spwpy_buffer_handle(PyObject *obj, spwpy_runtime_t *r, spw_buf_t *out);

/* > 0 on a thread running a controller method (controller.c): there, calls that would wait
 * on a runtime raise WouldDeadlockError instead of waiting. */
extern _Thread_local int spwpy_in_callback;
/* Raises WouldDeadlockError and returns 1 on such a thread; else returns 0. */
int spwpy_refuse_in_callback(void);

/* Runtime methods of controller.c, and what destroying a runtime must do for it. */
PyObject *spwpy_runtime_ctl_install(PyObject *self, PyObject *args);
PyObject *spwpy_runtime_spill_handles(PyObject *self, PyObject *args);
PyObject *spwpy_runtime_prefetch_handles(PyObject *self, PyObject *args);
PyObject *spwpy_runtime_handle_info(PyObject *self, PyObject *arg);
void spwpy_runtime_ctl_release(spwpy_runtime_t *r);
int spwpy_controller_init(PyObject *m);

int spwpy_runtime_init_type(PyObject *m);
int spwpy_buffer_init_type(PyObject *m);
int spwpy_launch_init_types(PyObject *m);

#endif /* SPILLWAY_BINDING_H */
