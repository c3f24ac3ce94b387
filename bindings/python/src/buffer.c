/* SPDX-License-Identifier: Apache-2.0 */
/* buffer.c: the Buffer type (one deferrable buffer, freed when closed or collected) and the
 * Lock type (acquire on __enter__, stream-ordered release on __exit__).
 *
 * Buffer.acquire / Buffer.release are the hot pair (one retrieve-and-lock from Python): they
 * parse their arguments by hand from a fastcall vector and take the resident fast path with
 * the GIL held (see binding.h). */
#include "binding.h"

#define B(self) ((spwpy_buffer_t *)(self))

typedef struct spwpy_lock {
  PyObject_HEAD
  spwpy_buffer_t *buf; /* strong */
  spw_stream_t stream;
  unsigned flags;
  int held;
} spwpy_lock_t;

int spwpy_buffer_handle(PyObject *obj, spwpy_runtime_t *r, spw_buf_t *out) {
  if (Py_TYPE(obj) != spwpy_buffer_type) {
    PyErr_Format(PyExc_TypeError, "expected a spillway Buffer, not %R", (PyObject *)Py_TYPE(obj));
    return -1;
  }
  spwpy_buffer_t *b = B(obj);
  if (b->owner != r) {
    /* As Spillway answers another runtime's handle (docs/api.md), whichever call names it. */
    spwpy_raise_detail(SPW_ERR_INVALID_HANDLE, "the buffer belongs to another runtime");
    return -1;
  }
  if (b->freed) {
    spwpy_raise(NULL, SPW_ERR_FREED);
    return -1;
  }
  *out = b->h;
  return 0;
}

PyObject *spwpy_buffer_new(spwpy_runtime_t *r, spw_buf_t h, size_t size) {
  spwpy_buffer_t *b = (spwpy_buffer_t *)spwpy_alloc(spwpy_buffer_type);
  if (!b) {
    (void)spw_free(r->rt, h);
    return NULL;
  }
  Py_INCREF(r);
  b->owner = r;
  b->h = h;
  b->size = size;
  b->freed = 0;
  return (PyObject *)b;
}

/* Checks that the buffer and its runtime are alive; sets the exception otherwise. */
static int usable(spwpy_buffer_t *b) {
  if (!b->owner->rt) {
    spwpy_raise_closed();
    return 0;
  }
  if (b->freed) {
    spwpy_raise(NULL, SPW_ERR_FREED);
    return 0;
  }
  return 1;
}

/* Parses (stream=None, read=False) from a fastcall vector; read may be NULL (not accepted). */
static int parse_stream_read(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                             const char *fname, spw_stream_t *stream, int *read) {
  PyObject *sobj = nargs > 0 ? args[0] : Py_None, *robj = nargs > 1 ? args[1] : NULL;
  Py_ssize_t maxpos = read ? 2 : 1;
  if (nargs > maxpos) {
    PyErr_Format(PyExc_TypeError, "%s() takes at most %zd positional arguments", fname, maxpos);
    return -1;
  }
  if (kwnames) {
    Py_ssize_t nk = PyTuple_Size(kwnames);
    for (Py_ssize_t i = 0; i < nk; i++) {
      PyObject *k = PyTuple_GetItem(kwnames, i), *v = args[nargs + i];
      if (nargs < 1 && PyUnicode_CompareWithASCIIString(k, "stream") == 0) {
        sobj = v;
      } else if (read && nargs < 2 && PyUnicode_CompareWithASCIIString(k, "read") == 0) {
        robj = v;
      } else {
        PyErr_Format(PyExc_TypeError, "%s() got an unexpected keyword argument %R", fname, k);
        return -1;
      }
    }
  }
  if (read) {
    *read = 0;
    if (robj && (*read = PyObject_IsTrue(robj)) < 0) return -1;
  }
  return spwpy_stream_from(sobj, stream);
}

/* The hot pair's fast path: an exact int handle in range. Anything else (and a failed
 * conversion, whose error is dropped) goes to the checked parser, which raises properly. */
static int fast_stream(PyObject *obj, spw_stream_t *s) {
  if (!PyLong_CheckExact(obj)) return 0;
  unsigned long long x = PyLong_AsUnsignedLongLong(obj);
  if (x == (unsigned long long)-1 && PyErr_Occurred()) {
    PyErr_Clear();
    return 0;
  }
  *s = x == 1 ? NULL : (spw_stream_t)(uintptr_t)x; /* 1: cudaStreamLegacy, as common.c */
  return 1;
}

static PyObject *buffer_acquire(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                                PyObject *kwnames) {
  spwpy_buffer_t *b = B(self);
  spw_stream_t s = NULL;
  int read = 0;
  if (nargs == 0 && !kwnames) {
    /* acquire(): the default stream */
  } else if (!(nargs == 1 && !kwnames && fast_stream(args[0], &s)) &&
             parse_stream_read(args, nargs, kwnames, "acquire", &s, &read) < 0) {
    return NULL;
  }
  if (!usable(b)) return NULL;
  void *p;
  int st = spwpy_acquire(b->owner, b->h, s, read ? SPW_ACQUIRE_READ : 0, &p);
  if (st != SPW_OK) return spwpy_raise(b->owner->rt, st);
  return PyLong_FromVoidPtr(p);
}

static PyObject *buffer_release(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                                PyObject *kwnames) {
  spwpy_buffer_t *b = B(self);
  spw_stream_t s = NULL;
  if ((nargs || kwnames) && !(nargs == 1 && !kwnames && fast_stream(args[0], &s)) &&
      parse_stream_read(args, nargs, kwnames, "release", &s, NULL) < 0)
    return NULL;
  if (!b->owner->rt) return spwpy_raise_closed();
  /* A freed buffer's holders may still release their locks (spw_free's contract). */
  int st = spw_release(b->owner->rt, b->h, s);
  if (st != SPW_OK) return spwpy_raise(b->owner->rt, st);
  Py_RETURN_NONE;
}

static PyObject *buffer_release_async(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                                      PyObject *kwnames) {
  spwpy_buffer_t *b = B(self);
  spw_stream_t s = NULL;
  if (parse_stream_read(args, nargs, kwnames, "release_async", &s, NULL) < 0) return NULL;
  if (!b->owner->rt) return spwpy_raise_closed();
  int st = spw_release_n_async(b->owner->rt, &b->h, 1, s);
  if (st != SPW_OK) return spwpy_raise(b->owner->rt, st);
  Py_RETURN_NONE;
}

static PyObject *buffer_lock(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                             PyObject *kwnames) {
  spwpy_buffer_t *b = B(self);
  spw_stream_t s = NULL;
  int read = 0;
  if (parse_stream_read(args, nargs, kwnames, "lock", &s, &read) < 0) return NULL;
  spwpy_lock_t *l = (spwpy_lock_t *)spwpy_alloc(spwpy_lock_type);
  if (!l) return NULL;
  Py_INCREF(self);
  l->buf = b;
  l->stream = s;
  l->flags = read ? SPW_ACQUIRE_READ : 0;
  l->held = 0;
  return (PyObject *)l;
}

static PyObject *buffer_spill(PyObject *self, PyObject *args, PyObject *kwds) {
  static char *kwlist[] = {"tier", NULL};
  spwpy_buffer_t *b = B(self);
  PyObject *tobj = NULL;
  spw_tier_t tier = SPW_TIER_HOST;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "|O", kwlist, &tobj)) return NULL;
  if (tobj && spwpy_tier_from(tobj, &tier) < 0) return NULL;
  if (!usable(b)) return NULL;
  int st = spw_spill(b->owner->rt, b->h, tier);
  if (st != SPW_OK) return spwpy_raise(b->owner->rt, st);
  Py_RETURN_NONE;
}

static int prefetch_op(spwpy_runtime_t *r, spw_stream_t s, void *h) {
  return spw_prefetch(r->rt, *(spw_buf_t *)h, s);
}

static PyObject *buffer_prefetch(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                                 PyObject *kwnames) {
  spwpy_buffer_t *b = B(self);
  spw_stream_t s = NULL;
  if (parse_stream_read(args, nargs, kwnames, "prefetch", &s, NULL) < 0) return NULL;
  if (!usable(b)) return NULL;
  int st = spwpy_on_stream(b->owner, s, prefetch_op, &b->h, 0);
  if (st != SPW_OK) return spwpy_raise(b->owner->rt, st);
  Py_RETURN_NONE;
}

/* ipc_export() -> bytes: spw_ipc_export of this buffer (the bytes are the spw_ipc_handle_t).
 * An address-stable buffer's export may start the runtime's IPC thread: no Python lock is
 * needed, and none is held across it. */
static PyObject *buffer_ipc_export(PyObject *self, PyObject *noargs) {
  spwpy_buffer_t *b = B(self);
  if (!usable(b)) return NULL;
  spw_ipc_handle_t h;
  int st;
  spw_runtime_t *rt = b->owner->rt;
  Py_BEGIN_ALLOW_THREADS
  st = spw_ipc_export(rt, b->h, &h);
  Py_END_ALLOW_THREADS
  if (st == SPW_ERR_UNSUPPORTED || st == SPW_ERR_NOT_LOCKED)
    return spwpy_raise_detail(st, spw_last_error(rt));
  if (st != SPW_OK) return spwpy_raise(rt, st);
  return PyBytes_FromStringAndSize((const char *)&h, sizeof h);
}

static PyObject *buffer_free(PyObject *self, PyObject *noargs) {
  spwpy_buffer_t *b = B(self);
  if (b->freed || !b->owner->rt) {
    b->freed = 1;
    Py_RETURN_NONE;
  }
  b->freed = 1;
  int st = spw_free(b->owner->rt, b->h);
  if (st != SPW_OK && st != SPW_ERR_FREED) return spwpy_raise(b->owner->rt, st);
  Py_RETURN_NONE;
}

static PyObject *buffer_enter(PyObject *self, PyObject *noargs) {
  Py_INCREF(self);
  return self;
}

static PyObject *buffer_exit(PyObject *self, PyObject *args) { return buffer_free(self, NULL); }

static PyObject *get_state(PyObject *self, void *c) {
  spwpy_buffer_t *b = B(self);
  if (!usable(b)) return NULL;
  spw_state_t v;
  int st = spw_buf_state(b->owner->rt, b->h, &v);
  if (st != SPW_OK) return spwpy_raise(b->owner->rt, st);
  return PyLong_FromLong((long)v);
}

static PyObject *get_tier(PyObject *self, void *c) {
  spwpy_buffer_t *b = B(self);
  if (!usable(b)) return NULL;
  spw_tier_t v;
  int st = spw_buf_tier(b->owner->rt, b->h, &v);
  if (st != SPW_OK) return spwpy_raise(b->owner->rt, st);
  return PyLong_FromLong((long)v);
}

static PyObject *get_is_stable(PyObject *self, void *c) {
  spwpy_buffer_t *b = B(self);
  if (!usable(b)) return NULL;
  int v;
  int st = spw_buf_is_stable(b->owner->rt, b->h, &v);
  if (st != SPW_OK) return spwpy_raise(b->owner->rt, st);
  return PyBool_FromLong(v);
}

static PyObject *get_lock_count(PyObject *self, void *c) {
  spwpy_buffer_t *b = B(self);
  if (!usable(b)) return NULL;
  uint32_t v;
  int st = spw_buf_lock_count(b->owner->rt, b->h, &v);
  if (st != SPW_OK) return spwpy_raise(b->owner->rt, st);
  return PyLong_FromUnsignedLong(v);
}

static PyObject *get_size(PyObject *self, void *c) { return PyLong_FromSize_t(B(self)->size); }
static PyObject *get_handle(PyObject *self, void *c) {
  return PyLong_FromUnsignedLongLong((unsigned long long)B(self)->h);
}
static PyObject *get_closed(PyObject *self, void *c) {
  return PyBool_FromLong(B(self)->freed || !B(self)->owner->rt);
}
static PyObject *get_runtime(PyObject *self, void *c) {
  Py_INCREF(B(self)->owner);
  return (PyObject *)B(self)->owner;
}

static PyObject *buffer_repr(PyObject *self) {
  spwpy_buffer_t *b = B(self);
  if (b->freed || !b->owner->rt)
    return PyUnicode_FromFormat("<spillway.Buffer freed, %zu bytes>", b->size);
  char hex[32]; /* PyUnicode_FromFormat has no %llx */
  snprintf(hex, sizeof hex, "%llx", (unsigned long long)b->h);
  return PyUnicode_FromFormat("<spillway.Buffer 0x%s, %zu bytes>", hex, b->size);
}

static void buffer_dealloc(PyObject *self) {
  spwpy_buffer_t *b = B(self);
  PyObject_GC_UnTrack(self);
  /* spw_free never waits: safe from any finalizer, at exit too. */
  if (b->owner && !b->freed && b->owner->rt) (void)spw_free(b->owner->rt, b->h);
  Py_CLEAR(b->owner);
  spwpy_free(self);
}

static int buffer_traverse(PyObject *self, visitproc visit, void *arg) {
  Py_VISIT(B(self)->owner);
  Py_VISIT(Py_TYPE(self));
  return 0;
}

static PyMethodDef buffer_methods[] = {
    {"acquire", (PyCFunction)(void (*)(void))buffer_acquire, METH_FASTCALL | METH_KEYWORDS,
     "acquire(stream=None, read=False) -> int: retrieve-and-lock on `stream`; the device "
     "pointer stays valid until the lock is released."},
    {"release", (PyCFunction)(void (*)(void))buffer_release, METH_FASTCALL | METH_KEYWORDS,
     "release(stream=None): releases one lock of `stream` now (the work using it is done)."},
    {"release_async", (PyCFunction)(void (*)(void))buffer_release_async,
     METH_FASTCALL | METH_KEYWORDS,
     "release_async(stream=None): releases one lock of `stream` once its work so far completes."},
    {"lock", (PyCFunction)(void (*)(void))buffer_lock, METH_FASTCALL | METH_KEYWORDS,
     "lock(stream=None, read=False): context manager: acquire on enter (gives the pointer), "
     "stream-ordered release on exit."},
    {"spill", (PyCFunction)(void (*)(void))buffer_spill, METH_VARARGS | METH_KEYWORDS,
     "spill(tier=Tier.HOST): asks the engine to move the unlocked buffer down."},
    {"prefetch", (PyCFunction)(void (*)(void))buffer_prefetch, METH_FASTCALL | METH_KEYWORDS,
     "prefetch(stream=None): starts bringing the buffer back to the device."},
    {"ipc_export", buffer_ipc_export, METH_NOARGS,
     "ipc_export() -> bytes: a handle another process opens with Runtime.ipc_open; the "
     "buffer must be acquired and stay so while it is open there."},
    {"free", buffer_free, METH_NOARGS, "Frees the buffer (idempotent)."},
    {"close", buffer_free, METH_NOARGS, "Same as free()."},
    {"__enter__", buffer_enter, METH_NOARGS, NULL},
    {"__exit__", buffer_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef buffer_getset[] = {
    {"size", get_size, NULL, "Size in bytes.", NULL},
    {"handle", get_handle, NULL, "The spw_buf_t handle.", NULL},
    {"state", get_state, NULL, "spw_state_t as an int (spillway.State).", NULL},
    {"tier", get_tier, NULL, "spw_tier_t as an int (spillway.Tier).", NULL},
    {"is_stable", get_is_stable, NULL,
     "True if every acquire gives the same device pointer for the buffer's life.", NULL},
    {"lock_count", get_lock_count, NULL, "Locks held on the buffer, all streams together.", NULL},
    {"closed", get_closed, NULL, "True once freed (or its runtime closed).", NULL},
    {"runtime", get_runtime, NULL, "The Runtime the buffer belongs to.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot buffer_slots[] = {
    {Py_tp_dealloc, buffer_dealloc},
    {Py_tp_traverse, buffer_traverse},
    {Py_tp_methods, buffer_methods},
    {Py_tp_getset, buffer_getset},
    {Py_tp_repr, buffer_repr},
    {Py_tp_doc, "A deferrable device buffer (made by Runtime.alloc)."},
    {0, NULL},
};

static PyType_Spec buffer_spec = {
    "spillway.Buffer", sizeof(spwpy_buffer_t), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_DISALLOW_INSTANTIATION, buffer_slots,
};

/* --- Lock ---------------------------------------------------------------------------- */
#define L(self) ((spwpy_lock_t *)(self))

static PyObject *lock_enter(PyObject *self, PyObject *noargs) {
  spwpy_lock_t *l = L(self);
  if (l->held) {
    PyErr_SetString(PyExc_RuntimeError, "this lock is already held (locks are not reentrant)");
    return NULL;
  }
  if (!usable(l->buf)) return NULL;
  void *p;
  int st = spwpy_acquire(l->buf->owner, l->buf->h, l->stream, l->flags, &p);
  if (st != SPW_OK) return spwpy_raise(l->buf->owner->rt, st);
  l->held = 1;
  return PyLong_FromVoidPtr(p);
}

static PyObject *lock_exit(PyObject *self, PyObject *args) {
  spwpy_lock_t *l = L(self);
  if (!l->held) Py_RETURN_FALSE;
  l->held = 0;
  if (!l->buf->owner->rt) Py_RETURN_FALSE;
  int st = spw_release_n_async(l->buf->owner->rt, &l->buf->h, 1, l->stream);
  if (st != SPW_OK) return spwpy_raise(l->buf->owner->rt, st);
  Py_RETURN_FALSE;
}

static void lock_dealloc(PyObject *self) {
  spwpy_lock_t *l = L(self);
  PyObject_GC_UnTrack(self);
  if (l->buf && l->held && l->buf->owner->rt)
    (void)spw_release_n_async(l->buf->owner->rt, &l->buf->h, 1, l->stream);
  Py_CLEAR(l->buf);
  spwpy_free(self);
}

static int lock_traverse(PyObject *self, visitproc visit, void *arg) {
  Py_VISIT(L(self)->buf);
  Py_VISIT(Py_TYPE(self));
  return 0;
}

static PyMethodDef lock_methods[] = {
    {"__enter__", lock_enter, METH_NOARGS, NULL},
    {"__exit__", lock_exit, METH_VARARGS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot lock_slots[] = {
    {Py_tp_dealloc, lock_dealloc},
    {Py_tp_traverse, lock_traverse},
    {Py_tp_methods, lock_methods},
    {Py_tp_doc, "Retrieve-and-lock as a context manager (Buffer.lock)."},
    {0, NULL},
};

static PyType_Spec lock_spec = {
    "spillway.Lock", sizeof(spwpy_lock_t), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_DISALLOW_INSTANTIATION, lock_slots,
};

int spwpy_buffer_init_type(PyObject *m) {
  if (spwpy_add_type(m, &buffer_spec, NULL, "Buffer", &spwpy_buffer_type) < 0) return -1;
  return spwpy_add_type(m, &lock_spec, NULL, "Lock", &spwpy_lock_type);
}
