/* SPDX-License-Identifier: Apache-2.0 */
/* module.c: assembles the module spillway._spillway: each type file's types, the module
 * functions, and what C knows that Python must not re-type: the status codes, the
 * enumerations of spillway.h as (name, value) pairs, and the version. The helpers all of
 * them share are in common.c. */
#include "binding.h"

static PyMethodDef module_methods[] = {
    {"_set_errors", spwpy_set_errors, METH_VARARGS, "Registers the exception class of each status."},
    {"_set_finalizing", spwpy_set_finalizing, METH_NOARGS,
     "Called at interpreter exit: deallocators stop waiting on Spillway from then on."},
    {"err_name", spwpy_err_name, METH_O, "Symbolic name of a status code (spw_err_name)."},
    {"strerror", spwpy_strerror, METH_O, "Text of a status code (spw_strerror)."},
    {"stream_handle", spwpy_stream_handle, METH_O,
     "The integer handle of a stream argument (None, int, or a stream object)."},
    {"parse_size", spwpy_parse_size, METH_O,
     "parse_size(value) -> int: bytes from None (0, unset), an int in [0, 2**64-1], or a "
     "string in the SPILLWAY_* size syntax (spw_parse_size: \"1.5GiB\", \"512 k\"). "
     "ConfigError for a value out of range or a bad string, TypeError for another type."},
    {"_dlpack_capsule", spwpy_dlpack_capsule, METH_VARARGS,
     "A DLPack capsule describing locked memory (spillway.DeviceView.__dlpack__)."},
    {"_dlpack_live", spwpy_dlpack_live, METH_NOARGS,
     "DLPack tensors made here whose deleter has not run yet."},
    {"_c_api_address", spwpy_c_api_address, METH_NOARGS,
     "Address of the call table given to the PyTorch allocator library (capi.h)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "_spillway",
    "Spillway's C API for CPython (internal: use the spillway package).", -1, module_methods,
    NULL, NULL, NULL, NULL,
};

/* Adds `name` = ((name, value), ...). */
static int add_enum(PyObject *m, const char *name, const spwpy_named_t *e) {
  Py_ssize_t n = 0;
  while (e[n].name) n++;
  PyObject *t = PyTuple_New(n);
  if (!t) return -1;
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject *pair = Py_BuildValue("(sl)", e[i].name, e[i].value);
    if (!pair || PyTuple_SetItem(t, i, pair) < 0) {
      Py_DECREF(t);
      return -1;
    }
  }
  int rc = PyModule_AddObjectRef(m, name, t);
  Py_DECREF(t);
  return rc;
}

PyMODINIT_FUNC PyInit__spillway(void) {
  PyObject *m = PyModule_Create(&module_def);
  if (!m) return NULL;
  if (spwpy_runtime_init_type(m) < 0 || spwpy_buffer_init_type(m) < 0 ||
      spwpy_launch_init_types(m) < 0 || spwpy_controller_init(m) < 0 ||
      spwpy_allocation_init(m) < 0)
    goto fail;
#define SPWPY_STATUS_CONST(name, value, text) \
  if (PyModule_AddIntConstant(m, "SPW_" #name, value) < 0) goto fail;
  SPW_STATUS_MAP(SPWPY_STATUS_CONST)
#undef SPWPY_STATUS_CONST
  if (PyModule_AddIntConstant(m, "ACQUIRE_READ", SPW_ACQUIRE_READ) < 0 ||
      PyModule_AddIntConstant(m, "VERSION_MAJOR", SPW_VERSION_MAJOR) < 0 ||
      PyModule_AddIntConstant(m, "VERSION_MINOR", SPW_VERSION_MINOR) < 0 ||
      PyModule_AddIntConstant(m, "VERSION_PATCH", SPW_VERSION_PATCH) < 0 ||
      add_enum(m, "TIERS", spwpy_tiers) < 0 || add_enum(m, "STATES", spwpy_states) < 0 ||
      add_enum(m, "BACKENDS", spwpy_backends) < 0 ||
      add_enum(m, "IO_KINDS", spwpy_io_kinds) < 0 ||
      add_enum(m, "LOG_LEVELS", spwpy_log_levels) < 0)
    goto fail;
  return m;
fail:
  Py_DECREF(m);
  return NULL;
}
