/* SPDX-License-Identifier: Apache-2.0 */
/* common.c: the helpers every type file of the extension shares (binding.h): the status ->
 * exception table (filled by spillway/_errors.py at import) and raising, the checked
 * conversions of sizes, handles, tiers and streams, the adopt-and-retry call on a stream,
 * and heap-type creation. Nothing here knows a type file; the type files know this one. */
#include <limits.h>
#include <stdarg.h>
#include <string.h>

#include "binding.h"

PyTypeObject *spwpy_runtime_type, *spwpy_buffer_type, *spwpy_lock_type;
PyTypeObject *spwpy_launch_locks_type, *spwpy_launch_view_type, *spwpy_launch_ext_type;
PyTypeObject *spwpy_link_type;
int spwpy_finalizing;
_Thread_local int spwpy_in_callback;

/* ---- enumerations ------------------------------------------------------------------ */

/* The enumerations of spillway.h, by the names the package's enums and keywords use. The
 * values are the header's; the package checks at import that its enums match these. */
#define ENUM_END {NULL, 0}
const spwpy_named_t spwpy_tiers[] = {{"DEVICE", SPW_TIER_DEVICE},
                                     {"HOST", SPW_TIER_HOST},
                                     {"DISK", SPW_TIER_DISK},
                                     {"PEER", SPW_TIER_PEER},
                                     ENUM_END};
const spwpy_named_t spwpy_states[] = {
    {"RESIDENT", SPW_STATE_RESIDENT}, {"SPILLING", SPW_STATE_SPILLING},
    {"HOST", SPW_STATE_HOST},         {"DEMOTING", SPW_STATE_DEMOTING},
    {"DISK", SPW_STATE_DISK},         {"UNSPILLING", SPW_STATE_UNSPILLING},
    {"PEER", SPW_STATE_PEER},         ENUM_END};
const spwpy_named_t spwpy_backends[] = {
    {"auto", SPW_BACKEND_AUTO}, {"cuda", SPW_BACKEND_CUDA}, {"host", SPW_BACKEND_HOST}, ENUM_END};
const spwpy_named_t spwpy_io_kinds[] = {
    {"auto", SPW_IO_AUTO}, {"uring", SPW_IO_URING}, {"posix", SPW_IO_POSIX}, ENUM_END};
const spwpy_named_t spwpy_log_levels[] = {
    {"default", SPW_LOG_DEFAULT}, {"off", SPW_LOG_OFF},   {"error", SPW_LOG_ERROR},
    {"warn", SPW_LOG_WARN},       {"info", SPW_LOG_INFO}, {"debug", SPW_LOG_DEBUG}, ENUM_END};

/* ---- errors ---------------------------------------------------------------------------- */

/* Status codes run from 0 down to -20 (SPW_STATUS_MAP); index by -status. */
#define SPWPY_NSTATUS 32
static PyObject *error_classes[SPWPY_NSTATUS];
static PyObject *base_error; /* spillway.SpillwayError, for unknown codes */

static PyObject *class_of(int status) {
  PyObject *cls = (status <= 0 && -status < SPWPY_NSTATUS) ? error_classes[-status] : NULL;
  if (!cls) cls = base_error ? base_error : PyExc_RuntimeError;
  return cls;
}

static PyObject *raise_with(int status, const char *detail) {
  PyObject *cls = class_of(status), *msg;
  if (detail && detail[0])
    msg = PyUnicode_FromFormat("%s: %s (%s)", spw_err_name(status), spw_strerror(status), detail);
  else
    msg = PyUnicode_FromFormat("%s: %s", spw_err_name(status), spw_strerror(status));
  if (!msg) return NULL;
  PyObject *exc = PyObject_CallFunction(cls, "Ois", msg, status, detail ? detail : "");
  Py_DECREF(msg);
  if (!exc) return NULL;
  PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
  Py_DECREF(exc);
  return NULL;
}

PyObject *spwpy_raise(spw_runtime_t *rt, int status) {
  return raise_with(status, rt && spw_status_has_detail(status) ? spw_last_error(rt) : "");
}

PyObject *spwpy_raise_detail(int status, const char *detail) { return raise_with(status, detail); }

PyObject *spwpy_raise_format(int status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  PyObject *text = PyUnicode_FromFormatV(fmt, ap);
  va_end(ap);
  if (!text) return NULL;
  const char *detail = PyUnicode_AsUTF8AndSize(text, NULL);
  if (detail) raise_with(status, detail);
  Py_DECREF(text);
  return NULL;
}

PyObject *spwpy_raise_closed(void) {
  return raise_with(SPW_ERR_INVALID_ARG, "the runtime is closed");
}

int spwpy_refuse_in_callback(void) {
  if (!spwpy_in_callback) return 0;
  raise_with(SPW_ERR_WOULD_DEADLOCK, "called from a controller method: it would wait on the runtime");
  return 1;
}

PyObject *spwpy_set_errors(PyObject *self, PyObject *args) {
  PyObject *base, *table;
  if (!PyArg_ParseTuple(args, "OO!", &base, &PyDict_Type, &table)) return NULL;
  PyObject *key, *value;
  Py_ssize_t pos = 0;
  while (PyDict_Next(table, &pos, &key, &value)) {
    long st = PyLong_AsLong(key);
    if (st == -1 && PyErr_Occurred()) return NULL;
    if (st > 0 || -st >= SPWPY_NSTATUS) continue;
    PyObject *old = error_classes[-st];
    Py_INCREF(value);
    error_classes[-st] = value;
    Py_XDECREF(old);
  }
  PyObject *old = base_error;
  Py_INCREF(base);
  base_error = base;
  Py_XDECREF(old);
  Py_RETURN_NONE;
}

/* ---- module functions ------------------------------------------------------------ */

PyObject *spwpy_set_finalizing(PyObject *self, PyObject *noargs) {
  spwpy_finalizing = 1;
  Py_RETURN_NONE;
}

/* A status argument; a value no status can have gives SPW_ERR_INTERNAL's neighbour,
 * an unknown code, which spw_err_name and spw_strerror name as unknown. */
static int status_arg(PyObject *arg, int *out) {
  if (PyBool_Check(arg) || !PyLong_Check(arg)) {
    PyErr_Format(PyExc_TypeError, "a status must be an int, not %R", (PyObject *)Py_TYPE(arg));
    return -1;
  }
  int overflow = 0;
  long v = PyLong_AsLongAndOverflow(arg, &overflow);
  if (v == -1 && PyErr_Occurred()) return -1;
  *out = (overflow || v < INT_MIN || v > INT_MAX) ? INT_MIN : (int)v;
  return 0;
}

PyObject *spwpy_err_name(PyObject *self, PyObject *arg) {
  int st;
  if (status_arg(arg, &st) < 0) return NULL;
  return PyUnicode_FromString(spw_err_name(st));
}

PyObject *spwpy_strerror(PyObject *self, PyObject *arg) {
  int st;
  if (status_arg(arg, &st) < 0) return NULL;
  return PyUnicode_FromString(spw_strerror(st));
}

PyObject *spwpy_stream_handle(PyObject *self, PyObject *arg) {
  spw_stream_t s;
  if (spwpy_stream_from(arg, &s) < 0) return NULL;
  return PyLong_FromUnsignedLongLong((unsigned long long)(uintptr_t)s);
}

/* ---- checked conversions ------------------------------------------------------------- */

int spwpy_u64_from(PyObject *obj, const char *what, unsigned long long lo, int range_status,
                   unsigned long long *out) {
  if (PyBool_Check(obj) || !PyIndex_Check(obj)) {
    PyErr_Format(PyExc_TypeError, "%s must be an int, not %R", what, (PyObject *)Py_TYPE(obj));
    return -1;
  }
  PyObject *n = PyNumber_Index(obj);
  if (!n) return -1;
  unsigned long long v = PyLong_AsUnsignedLongLong(n);
  Py_DECREF(n);
  if (v == (unsigned long long)-1 && PyErr_Occurred()) {
    /* Negative or above 2^64-1: out of range, which is the caller's documented error. */
    if (!PyErr_ExceptionMatches(PyExc_OverflowError)) return -1;
    PyErr_Clear();
  } else if (v >= lo) {
    *out = v;
    return 0;
  }
  spwpy_raise_format(range_status, "%s must be between %llu and 2**64-1, not %R", what, lo, obj);
  return -1;
}

int spwpy_nbytes_from(PyObject *obj, const char *what, size_t *out) {
  unsigned long long v;
  if (spwpy_u64_from(obj, what, 1, SPW_ERR_INVALID_ARG, &v) < 0) return -1;
  if (v > (unsigned long long)SIZE_MAX) {
    spwpy_raise_format(SPW_ERR_INVALID_ARG, "%s is larger than this machine's size_t", what);
    return -1;
  }
  *out = (size_t)v;
  return 0;
}

int spwpy_handle_from(PyObject *obj, spw_buf_t *out) {
  unsigned long long v;
  if (spwpy_u64_from(obj, "a buffer handle", 0, SPW_ERR_INVALID_HANDLE, &v) < 0) return -1;
  *out = (spw_buf_t)v;
  return 0;
}

int spwpy_tier_from(PyObject *obj, spw_tier_t *out) {
  unsigned long long v;
  if (spwpy_u64_from(obj, "tier", 0, SPW_ERR_INVALID_ARG, &v) < 0) return -1;
  if (v == SPW_TIER_PEER) {
    /* Nothing spills to the peer tier by name: a spill to HOST goes there first. */
    spwpy_raise_format(SPW_ERR_INVALID_ARG, "tier=%R: a spill goes to Tier.HOST (lent peer "
                       "memory first, where there is some) or Tier.DISK", obj);
    return -1;
  }
  if (v != SPW_TIER_DEVICE && v != SPW_TIER_HOST && v != SPW_TIER_DISK) {
    spwpy_raise_format(SPW_ERR_INVALID_ARG, "tier must be a spillway.Tier, not %R", obj);
    return -1;
  }
  *out = (spw_tier_t)v;
  return 0;
}

int spwpy_size_from(PyObject *obj, const char *what, uint64_t *out) {
  if (obj == Py_None) {
    *out = 0;
    return 0;
  }
  if (PyUnicode_Check(obj)) {
    Py_ssize_t len;
    const char *text = PyUnicode_AsUTF8AndSize(obj, &len);
    if (!text) return -1;
    uint64_t v;
    if ((size_t)len != strlen(text) || spw_parse_size(text, &v) != SPW_OK) {
      spwpy_raise_format(SPW_ERR_CONFIG, "%s=%R: expected bytes (e.g. 4GiB, 512MiB or "
                         "1048576), at most 2**64-1", what, obj);
      return -1;
    }
    *out = v;
    return 0;
  }
  if (PyBool_Check(obj) || !PyIndex_Check(obj)) {
    PyErr_Format(PyExc_TypeError, "%s must be an int, a size string or None, not %R", what,
                 (PyObject *)Py_TYPE(obj));
    return -1;
  }
  unsigned long long v;
  if (spwpy_u64_from(obj, what, 0, SPW_ERR_CONFIG, &v) < 0) return -1;
  *out = v;
  return 0;
}

PyObject *spwpy_parse_size(PyObject *self, PyObject *arg) {
  uint64_t v;
  if (spwpy_size_from(arg, "size", &v) < 0) return NULL;
  return PyLong_FromUnsignedLongLong((unsigned long long)v);
}

/* ---- streams ------------------------------------------------------------------------- */

static int stream_from_int(PyObject *v, spw_stream_t *out) {
  unsigned long long x;
  if (spwpy_u64_from(v, "a stream handle", 0, SPW_ERR_INVALID_STREAM, &x) < 0) return -1;
  /* cudaStreamLegacy (1) is the legacy default stream that NULL names: one stream, one lock
   * map (cuda.core hands Numba's launches the legacy stream as 1). */
  *out = x == 1 ? NULL : (spw_stream_t)(uintptr_t)x;
  return 0;
}

int spwpy_stream_from(PyObject *obj, spw_stream_t *out) {
  if (obj == Py_None) {
    *out = NULL;
    return 0;
  }
  if (PyIndex_Check(obj) && !PyBool_Check(obj)) /* ints, spillway.Stream, NumPy integers */
    return stream_from_int(obj, out);
  /* The CUDA stream protocol: __cuda_stream__() -> (version, handle). */
  PyObject *f = PyObject_GetAttrString(obj, "__cuda_stream__");
  if (f) {
    PyObject *t = PyObject_CallNoArgs(f);
    Py_DECREF(f);
    if (!t) return -1;
    int rc = -1;
    if (PyTuple_Check(t) && PyTuple_Size(t) == 2) {
      rc = stream_from_int(PyTuple_GetItem(t, 1), out);
    } else {
      PyErr_SetString(PyExc_TypeError, "__cuda_stream__() must return (version, handle)");
    }
    Py_DECREF(t);
    return rc;
  }
  if (!PyErr_ExceptionMatches(PyExc_AttributeError)) return -1;
  PyErr_Clear();
  static const char *const attrs[] = {"cuda_stream", "ptr", "handle"};
  for (size_t i = 0; i < sizeof attrs / sizeof attrs[0]; i++) {
    PyObject *v = PyObject_GetAttrString(obj, attrs[i]);
    if (!v) {
      if (!PyErr_ExceptionMatches(PyExc_AttributeError)) return -1;
      PyErr_Clear();
      continue;
    }
    PyObject *n = PyIndex_Check(v) ? PyNumber_Index(v) : NULL;
    if (!n) { /* cuda.bindings handle objects convert with int() only */
      PyErr_Clear();
      n = PyNumber_Long(v);
    }
    Py_DECREF(v);
    if (!n) {
      PyErr_Clear();
      break;
    }
    int rc = stream_from_int(n, out);
    Py_DECREF(n);
    return rc;
  }
  PyErr_Format(PyExc_TypeError,
               "expected a stream: None, an int handle, or an object with __cuda_stream__, "
               ".cuda_stream, .ptr or .handle, not %R", (PyObject *)Py_TYPE(obj));
  return -1;
}

int spwpy_stream_adopt(spwpy_runtime_t *r, spw_stream_t stream, int *status) {
  if (*status != SPW_ERR_INVALID_STREAM || !stream || r->backend != SPW_BACKEND_CUDA) return 0;
  int st = spw_stream_register(r->rt, stream);
  if (st == SPW_ERR_WRONG_DEVICE) *status = st;
  return st == SPW_OK;
}

static int call_once(spwpy_runtime_t *r, spw_stream_t stream, spwpy_stream_op_t op, void *ctx,
                     int nogil) {
  int st;
  if (!nogil) return op(r, stream, ctx);
  Py_BEGIN_ALLOW_THREADS
  st = op(r, stream, ctx);
  Py_END_ALLOW_THREADS
  return st;
}

int spwpy_on_stream(spwpy_runtime_t *r, spw_stream_t stream, spwpy_stream_op_t op, void *ctx,
                    int nogil) {
  int st = call_once(r, stream, op, ctx, nogil);
  if (spwpy_stream_adopt(r, stream, &st)) st = call_once(r, stream, op, ctx, nogil);
  return st;
}

typedef struct acquire_args {
  spw_buf_t h;
  unsigned flags;
  void **dptr;
} acquire_args_t;

static int acquire_op(spwpy_runtime_t *r, spw_stream_t s, void *ctx) {
  acquire_args_t *a = ctx;
  return spw_acquire(r->rt, a->h, s, a->flags, a->dptr);
}

int spwpy_acquire(spwpy_runtime_t *r, spw_buf_t h, spw_stream_t stream, unsigned flags,
                  void **dptr) {
  acquire_args_t a = {h, flags | SPW_ACQUIRE_TRY, dptr};
  int st = spwpy_on_stream(r, stream, acquire_op, &a, 0);
  if (st != SPW_ERR_NOT_READY) return st;
  if (spwpy_in_callback) return SPW_ERR_WOULD_DEADLOCK; /* it would wait on the engine */
  a.flags = flags;
  return call_once(r, stream, acquire_op, &a, 1);
}

/* ---- types ---------------------------------------------------------------------------- */

int spwpy_add_type(PyObject *m, PyType_Spec *spec, PyObject *base, const char *name,
                   PyTypeObject **out) {
  PyTypeObject *tp = (PyTypeObject *)PyType_FromSpecWithBases(spec, base);
  if (!tp) return -1;
  *out = tp; /* the module's static keeps this reference for the life of the process */
  return PyModule_AddObjectRef(m, name, (PyObject *)tp);
}

PyObject *spwpy_alloc(PyTypeObject *tp) {
  allocfunc alloc = (allocfunc)PyType_GetSlot(tp, Py_tp_alloc);
  return alloc(tp, 0);
}

void spwpy_free(PyObject *self) {
  PyTypeObject *tp = Py_TYPE(self);
  freefunc tp_free = (freefunc)PyType_GetSlot(tp, Py_tp_free);
  tp_free(self);
  Py_DECREF(tp);
}
