/* SPDX-License-Identifier: Apache-2.0 */
/* allocation.c: memory lent to libraries that keep raw pointers (Numba, CuPy, cuda.core):
 * the runtime's raw entry points _expose_alloc / _expose_free (the Numba EMM plugin calls
 * them _numba_alloc / _numba_free), the Allocation type (spillway.process.Allocation: one
 * such allocation, freed by free() or when collected), and the per-library counters behind
 * spillway.usage().
 *
 * Why in C: an allocation + free is the whole work of an allocator hook, and the libraries'
 * own pools do it in a few microseconds. Written in Python (an owner object, a lock around
 * the counters) it cost ~13 us more than these calls on the development machine.
 *
 * The memory: a Spillway buffer allocated stream-ordered on the library's stream and locked
 * on the device's exposure stream, which only these allocators use, so it stays resident
 * and in place while the library holds the pointer. A free moves the lock to a stream of the
 * library and releases it once that stream passes the free; nothing blocks.
 *
 * Counters: spwpy_runtime_t.usage[library], changed only with the GIL held (the allocation
 * counts after taking the GIL back), so they need no lock of their own.
 *
 * Owners: a library's memory is allocated with its owner tag (capi.h: SPWPY_OWNER_OF, in
 * spw_alloc_ex's flags), so the C runtime's trace, stats summary and spw_owner_stats name
 * the library too; the owner is named once per runtime, at the library's first allocation
 * there (a bit of spwpy_runtime_t.owners_named, under the GIL). */
#include <string.h>

#include "binding.h"
#include "capi.h"

const char *const spwpy_libraries[SPWPY_LIBRARIES] = {"numba", "cupy", "torch", "cuda.core"};

#define LIVE(r)                                                                              \
  do {                                                                                       \
    if (!(r)->rt) return spwpy_raise_closed();                                               \
  } while (0)

/* A library index, or -1 (not counted). */
static int library_from(PyObject *obj, int *out) {
  unsigned long long v;
  if (obj == Py_None) {
    *out = -1;
    return 0;
  }
  if (spwpy_u64_from(obj, "library", 0, SPW_ERR_INVALID_ARG, &v) < 0) return -1;
  if (v >= SPWPY_LIBRARIES) {
    spwpy_raise_format(SPW_ERR_INVALID_ARG, "library must be below %d, not %R", SPWPY_LIBRARIES,
                       obj);
    return -1;
  }
  *out = (int)v;
  return 0;
}

typedef struct expose_alloc_args {
  size_t n;
  unsigned flags; /* the owner tag */
  spw_stream_t expose;
  spw_buf_t h;
  void *p;
} expose_alloc_args_t;

static int expose_alloc_op(spwpy_runtime_t *r, spw_stream_t s, void *ctx) {
  expose_alloc_args_t *a = ctx;
  int st = spw_alloc_ex(r->rt, a->n, s, a->flags, &a->h);
  if (st != SPW_OK) return st;
  st = spw_acquire(r->rt, a->h, a->expose, 0, &a->p);
  if (st != SPW_OK) {
    (void)spw_free(r->rt, a->h);
    a->h = SPW_BUF_NULL;
  }
  return st;
}

/* Allocates and exposure-locks; counts it for `lib` (>= 0). GIL released while Spillway
 * works: the allocation may spill. Returns a status; the exception is not set. */
static int expose_alloc(spwpy_runtime_t *r, int lib, size_t n, spw_stream_t expose,
                        spw_stream_t s, spw_buf_t *h, void **p) {
  /* Plain memory, locked from allocation to free: from the runtime's arenas, a free-list
   * operation, where the stream-ordered pool costs two driver calls (docs/python.md). */
  unsigned flags = SPW_ALLOC_ARENA;
  if (lib >= 0) {
    flags |= SPW_ALLOC_OWNER(SPWPY_OWNER_OF(lib));
    if (!(r->owners_named & (1u << lib))) {
      /* Cannot fail: the id and the names are valid (checked at import). */
      (void)spw_owner_name(r->rt, SPWPY_OWNER_OF(lib), spwpy_libraries[lib]);
      r->owners_named |= 1u << lib;
    }
  }
  expose_alloc_args_t a = {n, flags, expose, SPW_BUF_NULL, NULL};
  int st = spwpy_on_stream(r, s, expose_alloc_op, &a, 1);
  if (lib >= 0) {
    spwpy_usage_t *u = &r->usage[lib];
    if (st == SPW_OK) {
      u->live++;
      u->live_bytes += n;
      u->allocs++;
      u->alloc_bytes += n;
    } else {
      u->failures++;
    }
  }
  *h = a.h;
  *p = a.p;
  return st;
}

static int try_acquire_op(spwpy_runtime_t *r, spw_stream_t s, void *ctx) {
  void *p;
  return spw_acquire(r->rt, *(spw_buf_t *)ctx, s, SPW_ACQUIRE_TRY, &p);
}

/* The free: moves the exposure lock to `s` and releases it once `s` passes this point.
 * Uncounted if lib < 0. Returns a status (errors that mean "already released" are not). */
static int expose_free(spwpy_runtime_t *r, int lib, size_t n, spw_buf_t b, spw_stream_t es,
                       spw_stream_t s) {
  if (lib >= 0) {
    r->usage[lib].live--;
    r->usage[lib].live_bytes -= n;
  }
  if (!r->rt) return SPW_OK; /* the runtime went first (context reset): nothing to free */
  int st = spwpy_on_stream(r, s, try_acquire_op, &b, 0);
  int rel = spw_release(r->rt, b, es);
  (void)spw_free(r->rt, b);
  if (st == SPW_OK) {
    int s2 = spw_release_n_async(r->rt, &b, 1, s);
    /* Another thread synchronizing that stream may have released it already. */
    if (s2 != SPW_OK && s2 != SPW_ERR_NOT_LOCKED && s2 != SPW_ERR_FREED) return s2;
  }
  if (rel != SPW_OK && rel != SPW_ERR_NOT_LOCKED) return rel;
  return SPW_OK;
}

/* _expose_alloc(nbytes, expose_stream, stream=None, library=None) -> (handle, pointer):
 * stream-ordered on `stream` (for Numba the default stream, which its blocking streams wait
 * on), locked on `expose_stream`; counted for `library` (an index of LIBRARIES). */
PyObject *spwpy_runtime_expose_alloc(PyObject *self, PyObject *args) {
  spwpy_runtime_t *r = (spwpy_runtime_t *)self;
  PyObject *nobj, *eobj, *sobj = Py_None, *lobj = Py_None;
  if (!PyArg_ParseTuple(args, "OO|OO", &nobj, &eobj, &sobj, &lobj)) return NULL;
  size_t n;
  spw_stream_t es, s;
  int lib;
  if (spwpy_nbytes_from(nobj, "nbytes", &n) < 0 || spwpy_stream_from(eobj, &es) < 0 ||
      spwpy_stream_from(sobj, &s) < 0 || library_from(lobj, &lib) < 0)
    return NULL;
  LIVE(r);
  spw_buf_t h;
  void *p;
  int st = expose_alloc(r, lib, n, es, s, &h, &p);
  if (st != SPW_OK) return spwpy_raise(r->rt, st);
  return Py_BuildValue("KK", (unsigned long long)h, (unsigned long long)(uintptr_t)p);
}

/* _expose_free(handle, expose_stream, stream=None, library=None, nbytes=0): the library
 * dropped its pointer (for Numba, `stream` is the legacy default stream, which waits for
 * every blocking stream); uncounts `nbytes` for `library`. */
PyObject *spwpy_runtime_expose_free(PyObject *self, PyObject *args) {
  spwpy_runtime_t *r = (spwpy_runtime_t *)self;
  PyObject *hobj, *eobj, *sobj = Py_None, *lobj = Py_None, *nobj = NULL;
  if (!PyArg_ParseTuple(args, "OO|OOO", &hobj, &eobj, &sobj, &lobj, &nobj)) return NULL;
  spw_buf_t b;
  spw_stream_t es, s;
  int lib;
  unsigned long long n = 0;
  if (spwpy_handle_from(hobj, &b) < 0 || spwpy_stream_from(eobj, &es) < 0 ||
      spwpy_stream_from(sobj, &s) < 0 || library_from(lobj, &lib) < 0 ||
      (nobj && spwpy_u64_from(nobj, "nbytes", 0, SPW_ERR_INVALID_ARG, &n) < 0))
    return NULL;
  int st = expose_free(r, lib, (size_t)n, b, es, s);
  if (st != SPW_OK) return spwpy_raise(r->rt, st);
  Py_RETURN_NONE;
}

/* _usage() -> ((live, live_bytes, allocs, alloc_bytes, failures), ...) per LIBRARIES. */
PyObject *spwpy_runtime_usage(PyObject *self, PyObject *noargs) {
  spwpy_runtime_t *r = (spwpy_runtime_t *)self;
  PyObject *t = PyTuple_New(SPWPY_LIBRARIES);
  for (int i = 0; t && i < SPWPY_LIBRARIES; i++) {
    const spwpy_usage_t *u = &r->usage[i];
    PyObject *row = Py_BuildValue("(LLLLL)", u->live, u->live_bytes, u->allocs, u->alloc_bytes,
                                  u->failures);
    if (!row || PyTuple_SetItem(t, i, row) < 0) Py_CLEAR(t);
  }
  return t;
}

/* ---- Allocation ---------------------------------------------------------------------- */
typedef struct spwpy_allocation {
  PyObject_HEAD
  spwpy_runtime_t *owner; /* strong */
  spw_buf_t h;
  uintptr_t ptr;
  size_t size;
  spw_stream_t expose, stream;
  int library, device, freed;
} spwpy_allocation_t;

#define A(self) ((spwpy_allocation_t *)(self))

PyTypeObject *spwpy_allocation_type;

/* _allocate(library, nbytes, expose_stream, stream, device) -> Allocation. */
PyObject *spwpy_runtime_allocate(PyObject *self, PyObject *args) {
  spwpy_runtime_t *r = (spwpy_runtime_t *)self;
  PyObject *lobj, *nobj, *eobj, *sobj;
  int device;
  if (!PyArg_ParseTuple(args, "OOOOi", &lobj, &nobj, &eobj, &sobj, &device)) return NULL;
  size_t n;
  spw_stream_t es, s;
  int lib;
  if (library_from(lobj, &lib) < 0 || spwpy_nbytes_from(nobj, "nbytes", &n) < 0 ||
      spwpy_stream_from(eobj, &es) < 0 || spwpy_stream_from(sobj, &s) < 0)
    return NULL;
  LIVE(r);
  spwpy_allocation_t *a = (spwpy_allocation_t *)spwpy_alloc(spwpy_allocation_type);
  if (!a) return NULL;
  void *p;
  int st = expose_alloc(r, lib, n, es, s, &a->h, &p);
  if (st != SPW_OK) {
    a->freed = 1; /* nothing to free in its deallocator */
    Py_DECREF(a);
    return spwpy_raise(r->rt, st);
  }
  Py_INCREF(r);
  a->owner = r;
  a->ptr = (uintptr_t)p;
  a->size = n;
  a->expose = es;
  a->stream = s;
  a->library = lib;
  a->device = device;
  return (PyObject *)a;
}

static int allocation_free_on(spwpy_allocation_t *a, spw_stream_t s) {
  if (a->freed || !a->owner) return SPW_OK;
  a->freed = 1; /* under the GIL, before any call: a second free finds it set */
  return expose_free(a->owner, a->library, a->size, a->h, a->expose, s);
}

static PyObject *allocation_free(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                                 PyObject *kwnames) {
  spwpy_allocation_t *a = A(self);
  PyObject *sobj = Py_None;
  if (nargs > 1 || (kwnames && PyTuple_Size(kwnames) > 1)) {
    PyErr_SetString(PyExc_TypeError, "free() takes one argument, stream");
    return NULL;
  }
  if (nargs == 1) sobj = args[0];
  if (kwnames && PyTuple_Size(kwnames) == 1) {
    if (nargs == 1 ||
        PyUnicode_CompareWithASCIIString(PyTuple_GetItem(kwnames, 0), "stream") != 0) {
      PyErr_SetString(PyExc_TypeError, "free() takes one argument, stream");
      return NULL;
    }
    sobj = args[nargs];
  }
  spw_stream_t s = a->stream;
  if (sobj != Py_None && spwpy_stream_from(sobj, &s) < 0) return NULL;
  int st = allocation_free_on(a, s);
  if (st != SPW_OK) return spwpy_raise(a->owner->rt, st);
  Py_RETURN_NONE;
}

static void allocation_dealloc(PyObject *self) {
  spwpy_allocation_t *a = A(self);
  PyObject_GC_UnTrack(self);
  /* Never waits (stream-ordered release): safe from any finalizer, at exit too. */
  if (a->owner && !a->freed) {
    PyObject *t, *v, *tb;
    PyErr_Fetch(&t, &v, &tb);
    (void)allocation_free_on(a, a->stream);
    PyErr_Restore(t, v, tb);
  }
  Py_CLEAR(a->owner);
  spwpy_free(self);
}

static int allocation_traverse(PyObject *self, visitproc visit, void *arg) {
  Py_VISIT(A(self)->owner);
  Py_VISIT(Py_TYPE(self));
  return 0;
}

static PyObject *get_ptr(PyObject *self, void *c) { return PyLong_FromSize_t(A(self)->ptr); }
static PyObject *get_size(PyObject *self, void *c) { return PyLong_FromSize_t(A(self)->size); }
static PyObject *get_stream(PyObject *self, void *c) {
  return PyLong_FromUnsignedLongLong((unsigned long long)(uintptr_t)A(self)->stream);
}
static PyObject *get_device(PyObject *self, void *c) { return PyLong_FromLong(A(self)->device); }
static PyObject *get_freed(PyObject *self, void *c) { return PyBool_FromLong(A(self)->freed); }
static PyObject *get_library(PyObject *self, void *c) {
  int lib = A(self)->library;
  if (lib < 0) Py_RETURN_NONE;
  return PyUnicode_FromString(spwpy_libraries[lib]);
}
static PyObject *get_runtime(PyObject *self, void *c) {
  PyObject *o = (PyObject *)A(self)->owner;
  if (!o) Py_RETURN_NONE;
  Py_INCREF(o);
  return o;
}

static PyObject *allocation_repr(PyObject *self) {
  spwpy_allocation_t *a = A(self);
  const char *lib = a->library >= 0 ? spwpy_libraries[a->library] : "uncounted";
  if (a->freed)
    return PyUnicode_FromFormat("<spillway.process.Allocation %s %zu bytes freed>", lib, a->size);
  return PyUnicode_FromFormat("<spillway.process.Allocation %s %zu bytes at %p>", lib, a->size,
                              (void *)a->ptr);
}

static PyMethodDef allocation_methods[] = {
    {"free", (PyCFunction)(void (*)(void))allocation_free, METH_FASTCALL | METH_KEYWORDS,
     "free(stream=None): gives the memory back once `stream` (default: the stream it was "
     "allocated on) passes this point; never blocks; idempotent."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef allocation_getset[] = {
    {"ptr", get_ptr, NULL, "The device pointer (valid until freed).", NULL},
    {"size", get_size, NULL, "Bytes.", NULL},
    {"stream", get_stream, NULL, "The handle of the stream it was allocated on.", NULL},
    {"device", get_device, NULL, "The device ordinal.", NULL},
    {"library", get_library, NULL, "The library it is counted for (spillway.usage()).", NULL},
    {"freed", get_freed, NULL, "True once freed.", NULL},
    {"runtime", get_runtime, NULL, "The Runtime it belongs to.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot allocation_slots[] = {
    {Py_tp_dealloc, allocation_dealloc},
    {Py_tp_traverse, allocation_traverse},
    {Py_tp_methods, allocation_methods},
    {Py_tp_getset, allocation_getset},
    {Py_tp_repr, allocation_repr},
    {Py_tp_doc,
     "Device memory lent to a library that keeps its raw pointer (spillway.process.allocate): "
     "resident and locked until free() or garbage collection."},
    {0, NULL},
};

static PyType_Spec allocation_spec = {
    "spillway.process.Allocation", sizeof(spwpy_allocation_t), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    allocation_slots,
};

int spwpy_allocation_init(PyObject *m) {
  /* The PyTorch allocator library allocates as SPWPY_OWNER_TORCH without the table. */
  if (strcmp(spwpy_libraries[SPWPY_OWNER_TORCH - 1], "torch") != 0) {
    PyErr_SetString(PyExc_ImportError, "spillway: SPWPY_OWNER_TORCH is not torch's owner");
    return -1;
  }
  if (spwpy_add_type(m, &allocation_spec, NULL, "Allocation", &spwpy_allocation_type) < 0)
    return -1;
  PyObject *t = PyTuple_New(SPWPY_LIBRARIES);
  for (int i = 0; t && i < SPWPY_LIBRARIES; i++) {
    PyObject *s = PyUnicode_FromString(spwpy_libraries[i]);
    if (!s || PyTuple_SetItem(t, i, s) < 0) Py_CLEAR(t);
  }
  if (!t) return -1;
  int rc = PyModule_AddObjectRef(m, "LIBRARIES", t);
  Py_DECREF(t);
  if (rc < 0) return -1;
  /* LIBRARY_OWNERS[i]: the owner id library i allocates as (SPW_ALLOC_OWNER). */
  t = PyTuple_New(SPWPY_LIBRARIES);
  for (int i = 0; t && i < SPWPY_LIBRARIES; i++) {
    PyObject *v = PyLong_FromUnsignedLong(SPWPY_OWNER_OF(i));
    if (!v || PyTuple_SetItem(t, i, v) < 0) Py_CLEAR(t);
  }
  if (!t) return -1;
  rc = PyModule_AddObjectRef(m, "LIBRARY_OWNERS", t);
  Py_DECREF(t);
  return rc;
}
