/* SPDX-License-Identifier: Apache-2.0 */
/* launch.c: Numba's per-launch hook (RMMEP-1's lockAndLaunchAsync) in C.
 *
 * numba-cuda calls ext.prepare_args(ty, val, stream=..., retr=...) for every argument of
 * every launch, launches, then calls every callable in `retr`. LaunchExtension.prepare_args
 * acquires each deferrable array on the launch stream and records the lock in one
 * LaunchLocks object per (runtime, stream) that it appends to `retr`: called after the
 * launch is queued, it releases exactly those locks once the stream passes that point
 * (spw_release_n_async: other locks on the stream are left alone). If a later argument or
 * the launch raises, numba never calls `retr`; the LaunchLocks is then released when the
 * list is dropped (its deallocator does the same release), so no lock leaks.
 *
 * The argument numba gets back is a LaunchView: pointer, shape, dtype, size and layout,
 * which numba-cuda 0.30's device-memory path reads directly when the package sets
 * LaunchView.__cuda_memory__ (it checks numba for that protocol), and which otherwise
 * offers __cuda_array_interface__. */
#include <stdlib.h>

#include "binding.h"

/* --- LaunchLocks ----------------------------------------------------------------------- */
typedef struct spwpy_launch_locks {
  PyObject_HEAD
  spwpy_runtime_t *owner; /* strong */
  spw_stream_t stream;
  size_t n, cap;
  spw_buf_t *bufs; /* points at inline while n <= 8 */
  spw_buf_t inline_bufs[8];
  int done;
} spwpy_launch_locks_t;

#define LL(self) ((spwpy_launch_locks_t *)(self))

static int locks_release(spwpy_launch_locks_t *l) {
  if (l->done || l->n == 0 || !l->owner->rt) {
    l->done = 1;
    return SPW_OK;
  }
  l->done = 1;
  return spw_release_n_async(l->owner->rt, l->bufs, l->n, l->stream);
}

static PyObject *locks_call(PyObject *self, PyObject *args, PyObject *kwds) {
  spwpy_launch_locks_t *l = LL(self);
  int st = locks_release(l);
  if (st != SPW_OK) return spwpy_raise(l->owner->rt, st);
  Py_RETURN_NONE;
}

static int locks_push(spwpy_launch_locks_t *l, spw_buf_t h) {
  if (l->n == l->cap) {
    size_t cap = l->cap * 2;
    spw_buf_t *nb = malloc(cap * sizeof *nb);
    if (!nb) {
      PyErr_NoMemory();
      return -1;
    }
    memcpy(nb, l->bufs, l->n * sizeof *nb);
    if (l->bufs != l->inline_bufs) free(l->bufs);
    l->bufs = nb;
    l->cap = cap;
  }
  l->bufs[l->n++] = h;
  return 0;
}

static void locks_dealloc(PyObject *self) {
  spwpy_launch_locks_t *l = LL(self);
  PyObject_GC_UnTrack(self);
  /* The launch raised before numba ran `retr`: release what was acquired for it, after
   * whatever reached the stream. Never waits, so it is safe from any deallocation. */
  if (l->owner) (void)locks_release(l);
  if (l->bufs != l->inline_bufs) free(l->bufs);
  Py_CLEAR(l->owner);
  spwpy_free(self);
}

static int locks_traverse(PyObject *self, visitproc visit, void *arg) {
  Py_VISIT(LL(self)->owner);
  Py_VISIT(Py_TYPE(self));
  return 0;
}

static PyObject *locks_get_count(PyObject *self, void *c) { return PyLong_FromSize_t(LL(self)->n); }
static PyObject *locks_get_done(PyObject *self, void *c) { return PyBool_FromLong(LL(self)->done); }
static PyObject *locks_get_stream(PyObject *self, void *c) {
  return PyLong_FromUnsignedLongLong((unsigned long long)(uintptr_t)LL(self)->stream);
}

static PyGetSetDef locks_getset[] = {
    {"count", locks_get_count, NULL, "Locks recorded for this launch.", NULL},
    {"done", locks_get_done, NULL, "True once the release was scheduled.", NULL},
    {"stream", locks_get_stream, NULL, "The launch stream's handle.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot locks_slots[] = {
    {Py_tp_dealloc, locks_dealloc},
    {Py_tp_traverse, locks_traverse},
    {Py_tp_call, locks_call},
    {Py_tp_getset, locks_getset},
    {Py_tp_doc, "The locks one launch took on one stream; calling it releases them once the "
                "stream passes this point."},
    {0, NULL},
};

static PyType_Spec locks_spec = {
    "spillway.LaunchLocks", sizeof(spwpy_launch_locks_t), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_DISALLOW_INSTANTIATION, locks_slots,
};

/* --- LaunchView ------------------------------------------------------------------------ */
typedef struct spwpy_launch_view {
  PyObject_HEAD
  PyObject *ptr, *shape, *dtype, *size, *layout, *strides;
  PyObject *keep; /* the buffer the view was made from */
  int readonly;
} spwpy_launch_view_t;

#define LV(self) ((spwpy_launch_view_t *)(self))

static void view_dealloc(PyObject *self) {
  spwpy_launch_view_t *v = LV(self);
  PyObject_GC_UnTrack(self);
  Py_CLEAR(v->ptr);
  Py_CLEAR(v->shape);
  Py_CLEAR(v->dtype);
  Py_CLEAR(v->size);
  Py_CLEAR(v->layout);
  Py_CLEAR(v->strides);
  Py_CLEAR(v->keep);
  spwpy_free(self);
}

static int view_traverse(PyObject *self, visitproc visit, void *arg) {
  spwpy_launch_view_t *v = LV(self);
  Py_VISIT(v->shape);
  Py_VISIT(v->dtype);
  Py_VISIT(v->size);
  Py_VISIT(v->layout);
  Py_VISIT(v->strides);
  Py_VISIT(v->keep);
  Py_VISIT(Py_TYPE(self));
  return 0;
}

#define VIEW_GETTER(name, field)                                                             \
  static PyObject *view_get_##name(PyObject *self, void *c) {                                \
    PyObject *o = LV(self)->field;                                                           \
    Py_INCREF(o);                                                                            \
    return o;                                                                                \
  }
VIEW_GETTER(ptr, ptr)
VIEW_GETTER(shape, shape)
VIEW_GETTER(dtype, dtype)
VIEW_GETTER(size, size)
VIEW_GETTER(layout, layout)
VIEW_GETTER(strides, strides)

static PyObject *view_get_self(PyObject *self, void *c) {
  Py_INCREF(self);
  return self;
}

static PyObject *view_get_cai(PyObject *self, void *c) {
  spwpy_launch_view_t *v = LV(self);
  PyObject *typestr = PyObject_GetAttrString(v->dtype, "str");
  if (!typestr) return NULL;
  PyObject *data = Py_BuildValue("(OO)", v->ptr, v->readonly ? Py_True : Py_False);
  PyObject *d = data ? Py_BuildValue("{s:O,s:O,s:O,s:O,s:i,s:O}", "shape", v->shape, "typestr",
                                     typestr, "data", data, "strides", v->strides, "version", 3,
                                     "stream", Py_None)
                     : NULL;
  Py_DECREF(typestr);
  Py_XDECREF(data);
  return d;
}

static PyGetSetDef view_getset[] = {
    {"ptr", view_get_ptr, NULL, NULL, NULL},
    {"shape", view_get_shape, NULL, NULL, NULL},
    {"dtype", view_get_dtype, NULL, NULL, NULL},
    {"size", view_get_size, NULL, NULL, NULL},
    {"strides", view_get_strides, NULL, NULL, NULL},
    {"_layout", view_get_layout, NULL, NULL, NULL},
    {"_strided_memory_view_shim", view_get_self, NULL, NULL, NULL},
    {"__cuda_array_interface__", view_get_cai, NULL, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot view_slots[] = {
    {Py_tp_dealloc, view_dealloc},
    {Py_tp_traverse, view_traverse},
    {Py_tp_getset, view_getset},
    {Py_tp_doc, "A locked deferrable array as one kernel launch sees it."},
    {0, NULL},
};

static PyType_Spec view_spec = {
    "spillway.LaunchView", sizeof(spwpy_launch_view_t), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_DISALLOW_INSTANTIATION, view_slots,
};

/* --- LaunchExtension ------------------------------------------------------------------- */
typedef struct spwpy_launch_ext {
  PyObject_HEAD
  PyObject *array_type;    /* spillway.numba.DeferrableArray */
  PyObject *readonly_type; /* spillway.numba.ReadOnly */
  PyObject *launch_name;   /* interned "_launch" */
} spwpy_launch_ext_t;

#define LE(self) ((spwpy_launch_ext_t *)(self))

static int ext_init(PyObject *self, PyObject *args, PyObject *kwds) {
  spwpy_launch_ext_t *e = LE(self);
  PyObject *a, *r;
  if (!PyArg_ParseTuple(args, "O!O!", &PyType_Type, &a, &PyType_Type, &r)) return -1;
  Py_INCREF(a);
  Py_INCREF(r);
  Py_XDECREF(e->array_type);
  Py_XDECREF(e->readonly_type);
  e->array_type = a;
  e->readonly_type = r;
  if (!e->launch_name && !(e->launch_name = PyUnicode_InternFromString("_launch"))) return -1;
  return 0;
}

static void ext_dealloc(PyObject *self) {
  spwpy_launch_ext_t *e = LE(self);
  PyObject_GC_UnTrack(self);
  Py_CLEAR(e->array_type);
  Py_CLEAR(e->readonly_type);
  Py_CLEAR(e->launch_name);
  spwpy_free(self);
}

static int ext_traverse(PyObject *self, visitproc visit, void *arg) {
  Py_VISIT(LE(self)->array_type);
  Py_VISIT(LE(self)->readonly_type);
  Py_VISIT(Py_TYPE(self));
  return 0;
}

static int ext_clear(PyObject *self) {
  Py_CLEAR(LE(self)->array_type);
  Py_CLEAR(LE(self)->readonly_type);
  return 0;
}

/* The LaunchLocks of (runtime, stream) already in retr, or a new one appended to it. */
static spwpy_launch_locks_t *locks_for(PyObject *retr, spwpy_runtime_t *owner, spw_stream_t s) {
  Py_ssize_t n = PyList_Size(retr);
  if (n < 0) return NULL;
  for (Py_ssize_t i = n - 1; i >= 0; i--) {
    PyObject *it = PyList_GetItem(retr, i);
    if (Py_TYPE(it) == spwpy_launch_locks_type && LL(it)->owner == owner && LL(it)->stream == s &&
        !LL(it)->done)
      return LL(it);
  }
  spwpy_launch_locks_t *l = (spwpy_launch_locks_t *)spwpy_alloc(spwpy_launch_locks_type);
  if (!l) return NULL;
  Py_INCREF(owner);
  l->owner = owner;
  l->stream = s;
  l->n = 0;
  l->cap = sizeof l->inline_bufs / sizeof l->inline_bufs[0];
  l->bufs = l->inline_bufs;
  l->done = 0;
  int rc = PyList_Append(retr, (PyObject *)l);
  Py_DECREF(l); /* retr holds it */
  return rc < 0 ? NULL : l;
}

/* prepare_args(ty, val, *, stream, retr) -> (ty, val) */
static PyObject *ext_prepare_args(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                                  PyObject *kwnames) {
  spwpy_launch_ext_t *e = LE(self);
  if (nargs != 2) {
    PyErr_SetString(PyExc_TypeError, "prepare_args(ty, val, *, stream, retr)");
    return NULL;
  }
  PyObject *ty = args[0], *val = args[1], *sobj = Py_None, *retr = NULL;
  if (kwnames) {
    Py_ssize_t nk = PyTuple_Size(kwnames);
    for (Py_ssize_t i = 0; i < nk; i++) {
      PyObject *k = PyTuple_GetItem(kwnames, i);
      if (PyUnicode_CompareWithASCIIString(k, "stream") == 0) sobj = args[nargs + i];
      else if (PyUnicode_CompareWithASCIIString(k, "retr") == 0) retr = args[nargs + i];
    }
  }
  if (!e->array_type || !e->readonly_type) { /* made by __new__ without __init__ */
    PyErr_SetString(PyExc_TypeError, "LaunchExtensionBase.__init__ was not called");
    return NULL;
  }
  PyTypeObject *vt = Py_TYPE(val);
  int read;
  if (vt == (PyTypeObject *)e->array_type) read = 0;
  else if (vt == (PyTypeObject *)e->readonly_type) read = 1;
  else if (PyType_IsSubtype(vt, (PyTypeObject *)e->array_type)) read = 0;
  else if (PyType_IsSubtype(vt, (PyTypeObject *)e->readonly_type)) read = 1;
  else return PyTuple_Pack(2, ty, val); /* not ours: unchanged */
  if (!retr || !PyList_Check(retr)) {
    PyErr_SetString(PyExc_TypeError, "prepare_args needs retr= (a list)");
    return NULL;
  }
  /* _launch = (buffer, shape, dtype, size, layout, strides, base array) */
  PyObject *meta = PyObject_GetAttr(val, e->launch_name);
  if (!meta) return NULL;
  PyObject *res = NULL;
  if (!PyTuple_Check(meta) || PyTuple_Size(meta) != 7 ||
      Py_TYPE(PyTuple_GetItem(meta, 0)) != spwpy_buffer_type) {
    PyErr_SetString(PyExc_TypeError, "malformed _launch metadata");
    goto out;
  }
  spwpy_buffer_t *b = (spwpy_buffer_t *)PyTuple_GetItem(meta, 0);
  spw_stream_t s;
  if (spwpy_stream_from(sobj, &s) < 0) goto out;
  if (!b->owner->rt) {
    spwpy_raise_closed();
    goto out;
  }
  if (b->freed) {
    spwpy_raise(NULL, SPW_ERR_FREED);
    goto out;
  }
  spwpy_launch_locks_t *l = locks_for(retr, b->owner, s);
  if (!l) goto out;
  void *p;
  int st = spwpy_acquire(b->owner, b->h, s, read ? SPW_ACQUIRE_READ : 0, &p);
  if (st != SPW_OK) {
    spwpy_raise(b->owner->rt, st);
    goto out;
  }
  if (locks_push(l, b->h) < 0) {
    (void)spw_release(b->owner->rt, b->h, s); /* nothing was enqueued with it yet */
    goto out;
  }
  spwpy_launch_view_t *v = (spwpy_launch_view_t *)spwpy_alloc(spwpy_launch_view_type);
  if (!v) goto out;
  v->readonly = read;
  PyObject **fields[] = {&v->shape, &v->dtype, &v->size, &v->layout, &v->strides, &v->keep};
  for (Py_ssize_t i = 0; i < 6; i++) {
    *fields[i] = PyTuple_GetItem(meta, i + 1);
    Py_XINCREF(*fields[i]);
  }
  if (!(v->ptr = PyLong_FromVoidPtr(p))) {
    Py_DECREF(v);
    goto out;
  }
  res = PyTuple_Pack(2, ty, (PyObject *)v);
  Py_DECREF(v);
out:
  Py_DECREF(meta);
  return res;
}

static PyMethodDef ext_methods[] = {
    {"prepare_args", (PyCFunction)(void (*)(void))ext_prepare_args, METH_FASTCALL | METH_KEYWORDS,
     "numba-cuda's launch hook: acquires deferrable arrays on the launch stream."},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot ext_slots[] = {
    {Py_tp_init, ext_init},
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_dealloc, ext_dealloc},
    {Py_tp_traverse, ext_traverse},
    {Py_tp_clear, ext_clear},
    {Py_tp_methods, ext_methods},
    {Py_tp_doc, "Base of spillway.numba.SpillwayExtension."},
    {0, NULL},
};

static PyType_Spec ext_spec = {
    "spillway._spillway.LaunchExtensionBase", sizeof(spwpy_launch_ext_t), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC, ext_slots,
};

int spwpy_launch_init_types(PyObject *m) {
  if (spwpy_add_type(m, &locks_spec, NULL, "LaunchLocks", &spwpy_launch_locks_type) < 0 ||
      spwpy_add_type(m, &view_spec, NULL, "LaunchView", &spwpy_launch_view_type) < 0)
    return -1;
  return spwpy_add_type(m, &ext_spec, NULL, "LaunchExtensionBase", &spwpy_launch_ext_type);
}
