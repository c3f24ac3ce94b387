/* SPDX-License-Identifier: Apache-2.0 */
/* module.c: the module spillway._spillway: its initialization, the status -> exception
 * table (filled by spillway/_errors.py at import), stream argument conversion, the
 * finalization flag, and small module functions (status names, constants). */
#include "binding.h"

PyTypeObject *spwpy_runtime_type, *spwpy_buffer_type, *spwpy_lock_type;
PyTypeObject *spwpy_launch_locks_type, *spwpy_launch_view_type, *spwpy_launch_ext_type;
int spwpy_finalizing;

/* Status codes run from 0 down to -19 (SPW_STATUS_MAP); index by -status. */
#define SPWPY_NSTATUS 32
static PyObject *error_classes[SPWPY_NSTATUS];
static PyObject *base_error; /* spillway.SpillwayError, for unknown codes */

static PyObject *raise_with(PyObject *cls, int status, const char *detail) {
  if (!cls) cls = base_error ? base_error : PyExc_RuntimeError;
  PyObject *msg;
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
  PyObject *cls = (status <= 0 && -status < SPWPY_NSTATUS) ? error_classes[-status] : NULL;
  return raise_with(cls, status, rt ? spw_last_error(rt) : "");
}

PyObject *spwpy_raise_detail(int status, const char *detail) {
  PyObject *cls = (status <= 0 && -status < SPWPY_NSTATUS) ? error_classes[-status] : NULL;
  return raise_with(cls, status, detail);
}

int spwpy_refuse_in_callback(void) {
  if (!spwpy_in_callback) return 0;
  raise_with(error_classes[-SPW_ERR_WOULD_DEADLOCK], SPW_ERR_WOULD_DEADLOCK,
             "called from a controller method: it would wait on the runtime");
  return 1;
}

PyObject *spwpy_raise_closed(void) {
  return raise_with(error_classes[-SPW_ERR_INVALID_ARG], SPW_ERR_INVALID_ARG,
                    "the runtime is closed");
}

static int stream_from_int(PyObject *v, spw_stream_t *out) {
  unsigned long long x = PyLong_AsUnsignedLongLong(v);
  if (x == (unsigned long long)-1 && PyErr_Occurred()) return -1;
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
  if (PyLong_Check(obj)) return stream_from_int(obj, out);
  if (PyIndex_Check(obj)) { /* spillway.Stream, NumPy integers */
    PyObject *n = PyNumber_Index(obj);
    if (!n) return -1;
    int rc = stream_from_int(n, out);
    Py_DECREF(n);
    return rc;
  }
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
  PyErr_Clear();
  static const char *const attrs[] = {"cuda_stream", "ptr", "handle"};
  for (size_t i = 0; i < sizeof attrs / sizeof attrs[0]; i++) {
    PyObject *v = PyObject_GetAttrString(obj, attrs[i]);
    if (!v) {
      PyErr_Clear();
      continue;
    }
    PyObject *n = PyNumber_Index(v);
    if (!n) { /* cuda.bindings handle objects convert with int() only */
      PyErr_Clear();
      n = PyNumber_Long(v);
    }
    Py_DECREF(v);
    if (!n) return -1;
    int rc = stream_from_int(n, out);
    Py_DECREF(n);
    return rc;
  }
  PyErr_Format(PyExc_TypeError,
               "expected a stream: None, an int handle, or an object with __cuda_stream__, "
               ".cuda_stream, .ptr or .handle, not %R", (PyObject *)Py_TYPE(obj));
  return -1;
}

int spwpy_stream_adopt(spwpy_runtime_t *r, spw_stream_t stream, int status) {
  if (status != SPW_ERR_INVALID_STREAM || !stream || r->backend != SPW_BACKEND_CUDA) return 0;
  return spw_stream_register(r->rt, stream) == SPW_OK;
}

int spwpy_acquire(spwpy_runtime_t *r, spw_buf_t h, spw_stream_t stream, unsigned flags,
                  void **dptr) {
  int st = spw_acquire(r->rt, h, stream, flags | SPW_ACQUIRE_TRY, dptr);
  if (st == SPW_ERR_INVALID_STREAM && spwpy_stream_adopt(r, stream, st))
    st = spw_acquire(r->rt, h, stream, flags | SPW_ACQUIRE_TRY, dptr);
  if (st != SPW_ERR_NOT_READY) return st;
  if (spwpy_in_callback) return SPW_ERR_WOULD_DEADLOCK; /* it would wait on the engine */
  Py_BEGIN_ALLOW_THREADS
  st = spw_acquire(r->rt, h, stream, flags, dptr);
  Py_END_ALLOW_THREADS
  return st;
}

/* _set_errors(base, {status: class}) */
static PyObject *set_errors(PyObject *self, PyObject *args) {
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

static PyObject *set_finalizing(PyObject *self, PyObject *noargs) {
  spwpy_finalizing = 1;
  Py_RETURN_NONE;
}

static PyObject *err_name(PyObject *self, PyObject *arg) {
  long st = PyLong_AsLong(arg);
  if (st == -1 && PyErr_Occurred()) return NULL;
  return PyUnicode_FromString(spw_err_name((int)st));
}

static PyObject *strerror_(PyObject *self, PyObject *arg) {
  long st = PyLong_AsLong(arg);
  if (st == -1 && PyErr_Occurred()) return NULL;
  return PyUnicode_FromString(spw_strerror((int)st));
}

static PyObject *stream_handle(PyObject *self, PyObject *arg) {
  spw_stream_t s;
  if (spwpy_stream_from(arg, &s) < 0) return NULL;
  return PyLong_FromUnsignedLongLong((unsigned long long)(uintptr_t)s);
}

static PyMethodDef module_methods[] = {
    {"_set_errors", set_errors, METH_VARARGS, "Registers the exception class of each status."},
    {"_set_finalizing", set_finalizing, METH_NOARGS,
     "Called at interpreter exit: deallocators stop waiting on Spillway from then on."},
    {"err_name", err_name, METH_O, "Symbolic name of a status code (spw_err_name)."},
    {"strerror", strerror_, METH_O, "Text of a status code (spw_strerror)."},
    {"stream_handle", stream_handle, METH_O,
     "The integer handle of a stream argument (None, int, or a stream object)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_spillway",
    "Spillway's C API for CPython (internal: use the spillway package).", -1, module_methods,
    NULL, NULL, NULL, NULL,
};

static int add_int(PyObject *m, const char *name, long v) {
  return PyModule_AddIntConstant(m, name, v);
}

PyMODINIT_FUNC PyInit__spillway(void) {
  PyObject *m = PyModule_Create(&module_def);
  if (!m) return NULL;
  if (spwpy_runtime_init_type(m) < 0 || spwpy_buffer_init_type(m) < 0 ||
      spwpy_launch_init_types(m) < 0 || spwpy_controller_init(m) < 0)
    goto fail;
#define SPWPY_STATUS_CONST(name, value, text) \
  if (add_int(m, "SPW_" #name, value) < 0) goto fail;
  SPW_STATUS_MAP(SPWPY_STATUS_CONST)
#undef SPWPY_STATUS_CONST
  if (add_int(m, "ACQUIRE_READ", SPW_ACQUIRE_READ) < 0 ||
      add_int(m, "BACKEND_CUDA", SPW_BACKEND_CUDA) < 0 ||
      add_int(m, "BACKEND_HOST", SPW_BACKEND_HOST) < 0 ||
      add_int(m, "VERSION_MAJOR", SPW_VERSION_MAJOR) < 0 ||
      add_int(m, "VERSION_MINOR", SPW_VERSION_MINOR) < 0 ||
      add_int(m, "VERSION_PATCH", SPW_VERSION_PATCH) < 0)
    goto fail;
  return m;
fail:
  Py_DECREF(m);
  return NULL;
}
