/* SPDX-License-Identifier: Apache-2.0 */
/* binding.h: private to the CPython extension spillway._spillway (never installed).
 *
 * The extension is written against the limited API of CPython 3.10 (one abi3 wheel for
 * every later Python). Its files, each depending on common.c only:
 *   common.c     the shared helpers below: errors, checked conversions, streams, the
 *                adopt-and-retry call, type creation; module state (the error classes)
 *   runtime.c    RuntimeBase (one spw_runtime_t), configuration by keyword
 *   buffer.c     Buffer (one handle, freed when collected) and Lock (a context manager)
 *   launch.c     Numba's launch pieces (LaunchLocks, LaunchView, LaunchExtensionBase)
 *   controller.c ControllerLink and the controller trampolines
 *   dlpack.c     DLPack capsules of lent arrays; the call table of the PyTorch allocator
 *   allocation.c memory lent to Numba, CuPy, cuda.core (Allocation) and its counters
 *   module.c     assembles the module: types, functions, constants, enumerations
 *
 * GIL rule: a call that can wait on Spillway (an acquire of a buffer that is not on the
 * device, an allocation that must spill, synchronize, wait_idle, destroy) runs with the GIL
 * released, because Spillway threads may later call Python (controller callbacks) and would
 * then wait for the GIL this thread holds. Acquires first try SPW_ACQUIRE_TRY with the GIL
 * held (the common, resident case costs no GIL round trip) and release it only to wait.
 *
 * References: the types that hold references are GC-aware (tp_traverse). Those whose
 * references never change after construction (Buffer, Lock, LaunchLocks, LaunchView) have
 * no tp_clear, as tuples have none: they cannot form a cycle on their own, and a cycle
 * through them is broken at a member that can be cleared.
 *
 * Module state lives in the statics of common.c: the extension uses single-phase
 * initialization and is imported once per process. */
#ifndef SPILLWAY_BINDING_H
#define SPILLWAY_BINDING_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "spillway/spillway.h"

/* The libraries whose allocations are counted (spillway.usage()), in LIBRARIES' order. */
#define SPWPY_LIBRARIES 4
extern const char *const spwpy_libraries[SPWPY_LIBRARIES];
typedef struct spwpy_usage {
  long long live, live_bytes, allocs, alloc_bytes, failures;
} spwpy_usage_t;

typedef struct spwpy_runtime {
  PyObject_HEAD
  spw_runtime_t *rt; /* NULL once closed (or never created) */
  int backend;       /* SPW_BACKEND_CUDA or SPW_BACKEND_HOST */
  PyObject *link;    /* the ControllerLink of a Python controller (controller.c), kept
                        until the runtime is destroyed: it is the C controller's `user` */
  spwpy_usage_t usage[SPWPY_LIBRARIES]; /* allocation.c; changed with the GIL held */
  unsigned owners_named; /* bit i: library i's owner (capi.h, SPWPY_OWNER_OF) is named in
                            this runtime; set with the GIL held, at its first allocation */
  PyObject *lender;  /* the Runtime that lent this one its peer tier (peer_lend), strong:
                        destroying a borrower gives the memory back to its lender, which
                        must still exist then. Set by a lend, dropped by a reclaim or once
                        this runtime is destroyed; never by tp_clear (runtime.c) */
  int peered;        /* set (with the GIL) once it took part in a lend: from then on its
                        destroy is serialized with every lend and reclaim (runtime.c) */
  int closing;       /* a destroy is under way (the GIL released): lend and reclaim refuse
                        it, since no call may run on it concurrently */
} spwpy_runtime_t;  /* the Python subclass spillway.Runtime adds __dict__ and __weakref__ */

typedef struct spwpy_buffer {
  PyObject_HEAD
  spwpy_runtime_t *owner; /* strong: the runtime outlives its buffers; never NULL in an
                             object made by Runtime.alloc (Python cannot make one) */
  spw_buf_t h;            /* kept after free: lock holders may still release */
  size_t size;
  int freed;
} spwpy_buffer_t;

/* The types, created at module init. */
extern PyTypeObject *spwpy_runtime_type, *spwpy_buffer_type, *spwpy_lock_type;
extern PyTypeObject *spwpy_launch_locks_type, *spwpy_launch_view_type, *spwpy_launch_ext_type;
extern PyTypeObject *spwpy_link_type;

/* Set by the atexit hook of the package: from then on no Spillway call that could wait runs
 * from a finalizer, and nothing waits at all in a deallocator. */
extern int spwpy_finalizing;

/* ---- enumerations: (name, value) lists ending in {NULL, 0} ---------------------------- */
typedef struct spwpy_named {
  const char *name;
  long value;
} spwpy_named_t;
/* Tier and State by their enum member names; backend, I/O and log level by the keywords
 * that Runtime(...) and the SPILLWAY_* variables take. */
extern const spwpy_named_t spwpy_tiers[], spwpy_states[], spwpy_backends[], spwpy_io_kinds[],
    spwpy_log_levels[];

/* ---- errors ---------------------------------------------------------------------------- */

/* Raises the exception class registered for `status`. Its detail is spw_last_error(rt)
 * only for the statuses whose failing call records one (spw_status_has_detail):
 * the thread's text is never cleared, so for any other status it would be an earlier
 * error's. rt may be NULL. Returns NULL. */
PyObject *spwpy_raise(spw_runtime_t *rt, int status);
/* The same with an explicit detail text. */
PyObject *spwpy_raise_detail(int status, const char *detail);
/* The same with a printf-style detail (PyUnicode_FromFormat's syntax). */
PyObject *spwpy_raise_format(int status, const char *fmt, ...);
/* Raises the error of a call on a closed runtime. Returns NULL. */
PyObject *spwpy_raise_closed(void);
/* The module's functions (module.c lists them): _set_errors(base, {status: class}) (the
 * package registers its exception classes), _set_finalizing() (atexit), err_name(status),
 * strerror(status), stream_handle(stream). */
PyObject *spwpy_set_errors(PyObject *self, PyObject *args);
PyObject *spwpy_set_finalizing(PyObject *self, PyObject *noargs);
PyObject *spwpy_err_name(PyObject *self, PyObject *arg);
PyObject *spwpy_strerror(PyObject *self, PyObject *arg);
PyObject *spwpy_stream_handle(PyObject *self, PyObject *arg);
/* dlpack.c: _dlpack_capsule(...), _dlpack_live(), _c_api_address(). */
PyObject *spwpy_dlpack_capsule(PyObject *self, PyObject *args);
PyObject *spwpy_dlpack_live(PyObject *self, PyObject *noargs);
PyObject *spwpy_c_api_address(PyObject *self, PyObject *noargs);

/* > 0 on a thread running a controller method (controller.c): there, calls that would wait
 * on a runtime raise WouldDeadlockError instead of waiting. */
extern _Thread_local int spwpy_in_callback;
/* Raises WouldDeadlockError and returns 1 on such a thread; else returns 0. */
int spwpy_refuse_in_callback(void);

/* ---- checked conversions: TypeError for a wrong type, the error class of `range_status`
 * for a value out of range; never OverflowError, never a silent wrap. ------------------- */

/* An int (not bool) in [lo, 2^64-1]. `what` names the argument in the message. */
int spwpy_u64_from(PyObject *obj, const char *what, unsigned long long lo, int range_status,
                   unsigned long long *out);
/* A byte count for an allocation or copy: an int in [1, 2^63-1] (InvalidArgumentError). */
int spwpy_nbytes_from(PyObject *obj, const char *what, size_t *out);
/* A handle (InvalidHandleError for one that cannot be a handle). */
int spwpy_handle_from(PyObject *obj, spw_buf_t *out);
/* A spill's tier: an int (Tier) naming HOST or DISK, or DEVICE, which Spillway refuses
 * itself; PEER is refused here (InvalidArgumentError: a spill to HOST goes there first). */
int spwpy_tier_from(PyObject *obj, spw_tier_t *out);
/* A size as the SPILLWAY_* variables are read: None (0, unset), an int in [0, 2^64-1], or
 * a string for spw_parse_size. ConfigError for a bad value, TypeError for a bad type. */
int spwpy_size_from(PyObject *obj, const char *what, uint64_t *out);
/* parse_size(value) -> int: the module function over spwpy_size_from. */
PyObject *spwpy_parse_size(PyObject *self, PyObject *arg);

/* ---- streams ---------------------------------------------------------------------------- */

/* Converts a stream argument: None -> NULL (the default stream), an int, or any object with
 * __cuda_stream__ (the CUDA stream protocol), .cuda_stream (PyTorch), .ptr (CuPy) or
 * .handle (Numba). An int outside [0, 2^64-1] is InvalidStreamError. Returns 0, or -1 with
 * an exception set. */
int spwpy_stream_from(PyObject *obj, spw_stream_t *out);

/* One call on a stream with the adopt-and-retry idiom: if Spillway does not know `stream`
 * (SPW_ERR_INVALID_STREAM) and it is an application's stream on the CUDA backend, it is
 * registered (spw_stream_register) and the call made once more. With `nogil` the call runs
 * with the GIL released. Returns the call's status. */
typedef int (*spwpy_stream_op_t)(spwpy_runtime_t *r, spw_stream_t stream, void *ctx);
int spwpy_on_stream(spwpy_runtime_t *r, spw_stream_t stream, spwpy_stream_op_t op, void *ctx,
                    int nogil);
/* Registers `stream` after *status said it is unknown; 1 if a retry makes sense. When the
 * registration is refused because the stream belongs to another device, *status becomes
 * SPW_ERR_WRONG_DEVICE, the clearer reason. */
int spwpy_stream_adopt(spwpy_runtime_t *r, spw_stream_t stream, int *status);

/* Acquires with the GIL held if the buffer is on the device, else releases the GIL and
 * waits. Adopts unknown application streams. Returns a status. */
int spwpy_acquire(spwpy_runtime_t *r, spw_buf_t h, spw_stream_t stream, unsigned flags,
                  void **dptr);

/* ---- buffers ---------------------------------------------------------------------------- */

/* The handle of a Buffer object argument of runtime `r`: TypeError for anything else,
 * InvalidHandleError for a buffer of another runtime, FreedError for a freed one. */
int spwpy_buffer_handle(PyObject *obj, spwpy_runtime_t *r, spw_buf_t *out);
/* A new Buffer object for a handle just allocated in `r` (freed again on failure). */
PyObject *spwpy_buffer_new(spwpy_runtime_t *r, spw_buf_t h, size_t size);

/* ---- types ------------------------------------------------------------------------------ */

/* Creates a heap type from `spec` (on `base`, may be NULL), adds it to the module as
 * `name` (PyModule_AddObjectRef) and keeps a strong reference in *out. */
int spwpy_add_type(PyObject *m, PyType_Spec *spec, PyObject *base, const char *name,
                   PyTypeObject **out);
/* tp_alloc of a type (PyType_GenericAlloc for ours: zero-filled, tracked if GC-aware). */
PyObject *spwpy_alloc(PyTypeObject *tp);
/* The end of every tp_dealloc: tp_free, then the reference a heap type's instance holds. */
void spwpy_free(PyObject *self);

/* Runtime methods of controller.c, and what destroying a runtime must do for it. */
PyObject *spwpy_runtime_ctl_install(PyObject *self, PyObject *args);
PyObject *spwpy_runtime_spill_handles(PyObject *self, PyObject *args);
PyObject *spwpy_runtime_prefetch_handles(PyObject *self, PyObject *args);
PyObject *spwpy_runtime_handle_info(PyObject *self, PyObject *arg);
void spwpy_runtime_ctl_release(spwpy_runtime_t *r);

/* Each type file's part of module initialization. */
int spwpy_runtime_init_type(PyObject *m);
int spwpy_buffer_init_type(PyObject *m);
int spwpy_launch_init_types(PyObject *m);
int spwpy_controller_init(PyObject *m);
int spwpy_allocation_init(PyObject *m);

/* allocation.c's Runtime methods. */
PyObject *spwpy_runtime_expose_alloc(PyObject *self, PyObject *args);
PyObject *spwpy_runtime_expose_free(PyObject *self, PyObject *args);
PyObject *spwpy_runtime_allocate(PyObject *self, PyObject *args);
PyObject *spwpy_runtime_usage(PyObject *self, PyObject *noargs);

#endif /* SPILLWAY_BINDING_H */
