/* SPDX-License-Identifier: Apache-2.0 */
/* runtime.c: the Runtime type: one spw_runtime_t, its streams, batched calls, statistics,
 * copies, and the two raw entry points of the Numba EMM plugin (_numba_alloc, _numba_free).
 * The Pythonic surface (keyword configuration, typed statistics, context manager) is the
 * subclass spillway.Runtime, in Python; every method here is called by it or through it. */
#include <semaphore.h>
#include <stdlib.h>

#include "binding.h"

#define R(self) ((spwpy_runtime_t *)(self))
#define LIVE(r)                                                                              \
  do {                                                                                       \
    if (!(r)->rt) return spwpy_raise_closed();                                               \
  } while (0)

/* __init__(device, backend, device_limit, host_limit, disk_limit, spill_dir, io,
 *          high_watermark, low_watermark, log_level, host_device_bytes, ignore_env,
 *          trace, trace_max) */
static int runtime_init(PyObject *self, PyObject *args, PyObject *kwds) {
  spwpy_runtime_t *r = R(self);
  spw_config_t cfg = SPW_CONFIG_INIT;
  int backend = 0, io = 0, log_level = 0, ignore_env = 0;
  unsigned long long dl = 0, hl = 0, kl = 0, hdb = 0;
  const char *dir = NULL, *trace = NULL;
  unsigned long long trace_max = 0;
  if (r->rt) {
    PyErr_SetString(PyExc_RuntimeError, "Runtime.__init__ called twice");
    return -1;
  }
  if (!PyArg_ParseTuple(args, "iiKKKziddiKp|zK", &cfg.device, &backend, &dl, &hl, &kl, &dir,
                        &io, &cfg.high_watermark, &cfg.low_watermark, &log_level, &hdb,
                        &ignore_env, &trace, &trace_max))
    return -1;
  cfg.trace_path = trace;
  cfg.trace_max_bytes = trace_max;
  cfg.backend = (spw_backend_kind_t)backend;
  cfg.device_limit = dl;
  cfg.host_limit = hl;
  cfg.disk_limit = kl;
  cfg.spill_dir = dir;
  cfg.io = (spw_io_kind_t)io;
  cfg.log_level = (spw_log_level_t)log_level;
  cfg.host_device_bytes = hdb;
  cfg.flags = ignore_env ? SPW_CONFIG_IGNORE_ENV : 0;
  spw_runtime_t *rt = NULL;
  int st;
  Py_BEGIN_ALLOW_THREADS
  st = spw_runtime_create(&cfg, &rt);
  Py_END_ALLOW_THREADS
  if (st != SPW_OK) {
    /* A configuration error's reason is not in spw_last_error: spw_config_validate has it. */
    char msg[512] = "";
    (void)spw_config_validate(&cfg, msg, sizeof msg);
    spwpy_raise_detail(st, msg);
    return -1;
  }
  spw_backend_kind_t b = SPW_BACKEND_HOST;
  (void)spw_runtime_backend(rt, &b);
  r->rt = rt;
  r->backend = (int)b;
  return 0;
}

static int destroy(spwpy_runtime_t *r) {
  int st;
  Py_BEGIN_ALLOW_THREADS
  st = spw_runtime_destroy(r->rt);
  Py_END_ALLOW_THREADS
  if (st == SPW_OK) {
    r->rt = NULL;
    spwpy_runtime_ctl_release(r); /* no callback can run any more */
  }
  return st;
}

static void runtime_dealloc(PyObject *self) {
  spwpy_runtime_t *r = R(self);
  PyTypeObject *tp = Py_TYPE(self);
  /* At interpreter exit the process is about to end: leave the runtime to the OS rather
   * than join its threads. A runtime with locks still held is leaked the same way (its
   * memory cannot be released under running work). */
  if (r->rt && !spwpy_finalizing) (void)destroy(r);
  freefunc tp_free = (freefunc)PyType_GetSlot(tp, Py_tp_free);
  tp_free(self);
  Py_DECREF(tp);
}

static PyObject *runtime_close(PyObject *self, PyObject *noargs) {
  spwpy_runtime_t *r = R(self);
  if (!r->rt) Py_RETURN_NONE;
  if (spwpy_refuse_in_callback()) return NULL;
  spw_runtime_t *rt = r->rt;
  int st = destroy(r);
  if (st != SPW_OK) return spwpy_raise(rt, st);
  Py_RETURN_NONE;
}

static PyObject *get_closed(PyObject *self, void *c) { return PyBool_FromLong(R(self)->rt == NULL); }
static PyObject *get_backend(PyObject *self, void *c) { return PyLong_FromLong(R(self)->backend); }

static PyObject *runtime_limits(PyObject *self, PyObject *noargs) {
  spwpy_runtime_t *r = R(self);
  LIVE(r);
  uint64_t d = 0, h = 0, k = 0;
  int st = spw_runtime_limits(r->rt, &d, &h, &k);
  if (st != SPW_OK) return spwpy_raise(r->rt, st);
  return Py_BuildValue("KKK", (unsigned long long)d, (unsigned long long)h, (unsigned long long)k);
}

static PyObject *runtime_last_error(PyObject *self, PyObject *noargs) {
  spwpy_runtime_t *r = R(self);
  return PyUnicode_FromString(r->rt ? spw_last_error(r->rt) : "");
}

static PyObject *runtime_async_error(PyObject *self, PyObject *noargs) {
  spwpy_runtime_t *r = R(self);
  LIVE(r);
  return PyLong_FromLong(spw_async_error(r->rt));
}

/* Parses (stream=None) from a fastcall argument vector. */
static int parse_stream_arg(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                            const char *fname, spw_stream_t *out) {
  PyObject *obj = Py_None;
  if (nargs > 1) {
    PyErr_Format(PyExc_TypeError, "%s() takes at most 1 positional argument", fname);
    return -1;
  }
  if (nargs == 1) obj = args[0];
  if (kwnames) {
    Py_ssize_t nk = PyTuple_Size(kwnames);
    for (Py_ssize_t i = 0; i < nk; i++) {
      PyObject *k = PyTuple_GetItem(kwnames, i);
      if (PyUnicode_CompareWithASCIIString(k, "stream") != 0 || nargs == 1) {
        PyErr_Format(PyExc_TypeError, "%s() got an unexpected keyword argument %R", fname, k);
        return -1;
      }
      obj = args[nargs + i];
    }
  }
  return spwpy_stream_from(obj, out);
}

static PyObject *runtime_alloc(PyObject *self, PyObject *args, PyObject *kwds) {
  static char *kwlist[] = {"nbytes", "stream", NULL};
  spwpy_runtime_t *r = R(self);
  Py_ssize_t nbytes;
  PyObject *sobj = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "n|O", kwlist, &nbytes, &sobj)) return NULL;
  LIVE(r);
  spw_stream_t s;
  if (spwpy_stream_from(sobj, &s) < 0) return NULL;
  if (nbytes <= 0) {
    PyErr_SetString(PyExc_ValueError, "nbytes must be positive");
    return NULL;
  }
  spw_buf_t h = SPW_BUF_NULL;
  int st;
  for (;;) {
    Py_BEGIN_ALLOW_THREADS
    st = spw_alloc(r->rt, (size_t)nbytes, s, &h);
    Py_END_ALLOW_THREADS
    if (!spwpy_stream_adopt(r, s, st)) break;
  }
  if (st != SPW_OK) return spwpy_raise(r->rt, st);
  spwpy_buffer_t *b = PyObject_New(spwpy_buffer_t, spwpy_buffer_type);
  if (!b) {
    (void)spw_free(r->rt, h);
    return NULL;
  }
  Py_INCREF(self);
  b->owner = r;
  b->h = h;
  b->size = (size_t)nbytes;
  b->freed = 0;
  return (PyObject *)b;
}

static PyObject *stream_to_py(spw_stream_t s) {
  return PyLong_FromUnsignedLongLong((unsigned long long)(uintptr_t)s);
}

static PyObject *runtime_create_stream(PyObject *self, PyObject *noargs) {
  spwpy_runtime_t *r = R(self);
  LIVE(r);
  spw_stream_t s;
  int st = spw_stream_create(r->rt, &s);
  if (st != SPW_OK) return spwpy_raise(r->rt, st);
  return stream_to_py(s);
}

/* A stream call that may wait (synchronize, destroy, unregister): GIL released. */
static PyObject *stream_call_blocking(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                                      PyObject *kwnames, const char *name,
                                      int (*fn)(spw_runtime_t *, spw_stream_t), int adopt) {
  spwpy_runtime_t *r = R(self);
  spw_stream_t s;
  if (parse_stream_arg(args, nargs, kwnames, name, &s) < 0) return NULL;
  LIVE(r);
  if (spwpy_refuse_in_callback()) return NULL;
  int st;
  for (;;) {
    Py_BEGIN_ALLOW_THREADS
    st = fn(r->rt, s);
    Py_END_ALLOW_THREADS
    if (!adopt || !spwpy_stream_adopt(r, s, st)) break;
  }
  if (st != SPW_OK) return spwpy_raise(r->rt, st);
  Py_RETURN_NONE;
}

static PyObject *runtime_synchronize(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                                     PyObject *kwnames) {
  return stream_call_blocking(self, args, nargs, kwnames, "synchronize", spw_stream_synchronize, 1);
}
static PyObject *runtime_destroy_stream(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                                        PyObject *kwnames) {
  return stream_call_blocking(self, args, nargs, kwnames, "destroy_stream", spw_stream_destroy, 0);
}
static PyObject *runtime_unregister_stream(PyObject *self, PyObject *const *args,
                                           Py_ssize_t nargs, PyObject *kwnames) {
  return stream_call_blocking(self, args, nargs, kwnames, "unregister_stream",
                              spw_stream_unregister, 0);
}

static PyObject *runtime_register_stream(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                                         PyObject *kwnames) {
  spwpy_runtime_t *r = R(self);
  spw_stream_t s;
  if (parse_stream_arg(args, nargs, kwnames, "register_stream", &s) < 0) return NULL;
  LIVE(r);
  int st = spw_stream_register(r->rt, s);
  if (st != SPW_OK) return spwpy_raise(r->rt, st);
  Py_RETURN_NONE;
}

static PyObject *runtime_release_async(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                                       PyObject *kwnames) {
  spwpy_runtime_t *r = R(self);
  spw_stream_t s;
  if (parse_stream_arg(args, nargs, kwnames, "release_async", &s) < 0) return NULL;
  LIVE(r);
  int st = spw_stream_release_async(r->rt, s);
  if (st == SPW_ERR_INVALID_STREAM && spwpy_stream_adopt(r, s, st)) st = SPW_OK; /* no locks */
  if (st != SPW_OK) return spwpy_raise(r->rt, st);
  Py_RETURN_NONE;
}

/* Collects the handles of a sequence of Buffer objects of this runtime. *out is malloc'd. */
static int collect(spwpy_runtime_t *r, PyObject *seq, spw_buf_t **out, size_t *n) {
  Py_ssize_t len = PySequence_Size(seq);
  if (len < 0) return -1;
  if (len == 0) {
    PyErr_SetString(PyExc_ValueError, "expected at least one buffer");
    return -1;
  }
  spw_buf_t *bufs = malloc((size_t)len * sizeof *bufs);
  if (!bufs) {
    PyErr_NoMemory();
    return -1;
  }
  for (Py_ssize_t i = 0; i < len; i++) {
    PyObject *it = PySequence_GetItem(seq, i);
    if (!it) goto fail;
    int rc = spwpy_buffer_handle(it, r, &bufs[i]);
    Py_DECREF(it);
    if (rc < 0) goto fail;
  }
  *out = bufs;
  *n = (size_t)len;
  return 0;
fail:
  free(bufs);
  return -1;
}

static PyObject *runtime_acquire_n(PyObject *self, PyObject *args, PyObject *kwds) {
  static char *kwlist[] = {"buffers", "stream", "read", NULL};
  spwpy_runtime_t *r = R(self);
  PyObject *seq, *sobj = Py_None;
  int read = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|Op", kwlist, &seq, &sobj, &read)) return NULL;
  LIVE(r);
  spw_stream_t s;
  if (spwpy_stream_from(sobj, &s) < 0) return NULL;
  spw_buf_t *bufs;
  size_t n;
  if (collect(r, seq, &bufs, &n) < 0) return NULL;
  void **ptrs = malloc(n * sizeof *ptrs);
  if (!ptrs) {
    free(bufs);
    return PyErr_NoMemory();
  }
  unsigned flags = read ? SPW_ACQUIRE_READ : 0;
  int st = spw_acquire_n(r->rt, bufs, n, s, flags | SPW_ACQUIRE_TRY, ptrs);
  if (st == SPW_ERR_INVALID_STREAM && spwpy_stream_adopt(r, s, st))
    st = spw_acquire_n(r->rt, bufs, n, s, flags | SPW_ACQUIRE_TRY, ptrs);
  if (st == SPW_ERR_NOT_READY && spwpy_in_callback) st = SPW_ERR_WOULD_DEADLOCK;
  if (st == SPW_ERR_NOT_READY) {
    Py_BEGIN_ALLOW_THREADS
    st = spw_acquire_n(r->rt, bufs, n, s, flags, ptrs);
    Py_END_ALLOW_THREADS
  }
  PyObject *res = NULL;
  if (st != SPW_OK) {
    spwpy_raise(r->rt, st);
  } else if ((res = PyList_New((Py_ssize_t)n)) != NULL) {
    for (size_t i = 0; i < n; i++) {
      PyObject *p = PyLong_FromVoidPtr(ptrs[i]);
      if (!p) { /* keep the all-or-nothing contract: drop the locks we took */
        for (size_t j = 0; j < n; j++) (void)spw_release(r->rt, bufs[j], s);
        Py_CLEAR(res);
        break;
      }
      PyList_SetItem(res, (Py_ssize_t)i, p);
    }
  }
  free(ptrs);
  free(bufs);
  return res;
}

/* The calls that take a list of buffers and a stream: (buffers, stream=None). `adopt`: a
 * stream the runtime does not know yet (a Numba/CuPy/PyTorch stream) is adopted and the
 * call retried, for calls that may be the first to name it. */
static PyObject *buffers_on_stream(PyObject *self, PyObject *args, PyObject *kwds,
                                   int (*op)(spw_runtime_t *, const spw_buf_t *, size_t,
                                             spw_stream_t),
                                   int adopt) {
  static char *kwlist[] = {"buffers", "stream", NULL};
  spwpy_runtime_t *r = R(self);
  PyObject *seq, *sobj = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|O", kwlist, &seq, &sobj)) return NULL;
  LIVE(r);
  spw_stream_t s;
  if (spwpy_stream_from(sobj, &s) < 0) return NULL;
  spw_buf_t *bufs;
  size_t n;
  if (collect(r, seq, &bufs, &n) < 0) return NULL;
  int st = op(r->rt, bufs, n, s);
  if (adopt && st == SPW_ERR_INVALID_STREAM && spwpy_stream_adopt(r, s, st))
    st = op(r->rt, bufs, n, s);
  free(bufs);
  if (st != SPW_OK) return spwpy_raise(r->rt, st);
  Py_RETURN_NONE;
}

static PyObject *runtime_release_n_async(PyObject *self, PyObject *args, PyObject *kwds) {
  return buffers_on_stream(self, args, kwds, spw_release_n_async, 0);
}

static PyObject *runtime_spill_n(PyObject *self, PyObject *args, PyObject *kwds) {
  static char *kwlist[] = {"buffers", "tier", NULL};
  spwpy_runtime_t *r = R(self);
  PyObject *seq;
  int tier = SPW_TIER_HOST;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|i", kwlist, &seq, &tier)) return NULL;
  LIVE(r);
  spw_buf_t *bufs;
  size_t n;
  if (collect(r, seq, &bufs, &n) < 0) return NULL;
  int st = spw_spill_n(r->rt, bufs, n, (spw_tier_t)tier);
  free(bufs);
  if (st != SPW_OK) return spwpy_raise(r->rt, st);
  Py_RETURN_NONE;
}

static PyObject *runtime_prefetch_n(PyObject *self, PyObject *args, PyObject *kwds) {
  return buffers_on_stream(self, args, kwds, spw_prefetch_n, 1);
}

static PyObject *runtime_wait_idle(PyObject *self, PyObject *noargs) {
  spwpy_runtime_t *r = R(self);
  LIVE(r);
  if (spwpy_refuse_in_callback()) return NULL;
  int st;
  Py_BEGIN_ALLOW_THREADS
  st = spw_wait_idle(r->rt);
  Py_END_ALLOW_THREADS
  if (st != SPW_OK) return spwpy_raise(r->rt, st);
  Py_RETURN_NONE;
}

#define SPWPY_STATS_FIELDS(X)                                                                \
  X(buffers) X(device_bytes) X(host_bytes) X(disk_bytes) X(locked_bytes) X(device_limit)     \
  X(host_pinned_bytes) X(spills) X(spill_bytes) X(unspills) X(unspill_bytes) X(demotions)    \
  X(demote_bytes) X(disk_reads) X(disk_read_bytes) X(disk_writes) X(disk_write_bytes)        \
  X(spills_on_demand) X(spills_background) X(spills_abandoned) X(clean_respills) X(failures) \
  X(spill_ns) X(unspill_ns) X(demote_ns) X(disk_read_ns) X(disk_requests)

static PyObject *runtime_stats(PyObject *self, PyObject *noargs) {
  spwpy_runtime_t *r = R(self);
  LIVE(r);
  spw_stats_t s;
  memset(&s, 0, sizeof s);
  s.struct_size = sizeof s;
  int st = spw_get_stats(r->rt, &s);
  if (st != SPW_OK) return spwpy_raise(r->rt, st);
  PyObject *t = PyTuple_New(0
#define SPWPY_COUNT(f) +1
                            SPWPY_STATS_FIELDS(SPWPY_COUNT)
#undef SPWPY_COUNT
  );
  if (!t) return NULL;
  Py_ssize_t i = 0;
#define SPWPY_SET(f)                                                                         \
  {                                                                                          \
    PyObject *v = PyLong_FromUnsignedLongLong((unsigned long long)s.f);                      \
    if (!v) {                                                                                \
      Py_DECREF(t);                                                                          \
      return NULL;                                                                           \
    }                                                                                        \
    PyTuple_SetItem(t, i++, v);                                                              \
  }
  SPWPY_STATS_FIELDS(SPWPY_SET)
#undef SPWPY_SET
  return t;
}

static PyObject *runtime_summary(PyObject *self, PyObject *noargs) {
  spwpy_runtime_t *r = R(self);
  LIVE(r);
  char buf[1024];
  int st = spw_stats_summary(r->rt, buf, sizeof buf);
  if (st != SPW_OK) return spwpy_raise(r->rt, st);
  return PyUnicode_FromString(buf);
}

static void post_sem(void *arg) { sem_post((sem_t *)arg); }

/* Waits, with the GIL released, until the work enqueued on `s` so far has completed,
 * without touching its locks (spw_stream_synchronize would release them). */
static int wait_stream(spwpy_runtime_t *r, spw_stream_t s) {
  sem_t sem;
  if (sem_init(&sem, 0, 0) != 0) return SPW_ERR_SYSTEM;
  int st = spw_launch_host_func(r->rt, s, post_sem, &sem);
  if (st == SPW_ERR_INVALID_STREAM && spwpy_stream_adopt(r, s, st))
    st = spw_launch_host_func(r->rt, s, post_sem, &sem);
  if (st == SPW_OK) {
    Py_BEGIN_ALLOW_THREADS
    while (sem_wait(&sem) != 0) {
    }
    Py_END_ALLOW_THREADS
  }
  sem_destroy(&sem);
  return st;
}

static PyObject *runtime_wait_stream(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                                     PyObject *kwnames) {
  spwpy_runtime_t *r = R(self);
  spw_stream_t s;
  if (parse_stream_arg(args, nargs, kwnames, "wait_stream", &s) < 0) return NULL;
  LIVE(r);
  if (spwpy_refuse_in_callback()) return NULL;
  int st = wait_stream(r, s);
  if (st != SPW_OK) return spwpy_raise(r->rt, st);
  Py_RETURN_NONE;
}

/* memcpy(dst, src, nbytes, stream=None, wait=True): spw_memcpy_async between device
 * pointers (from an acquire) and host addresses; with wait, returns once it completed. */
static PyObject *runtime_memcpy(PyObject *self, PyObject *args, PyObject *kwds) {
  static char *kwlist[] = {"dst", "src", "nbytes", "stream", "wait", NULL};
  spwpy_runtime_t *r = R(self);
  unsigned long long dst, src;
  Py_ssize_t n;
  PyObject *sobj = Py_None;
  int wait = 1;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "KKn|Op", kwlist, &dst, &src, &n, &sobj, &wait))
    return NULL;
  LIVE(r);
  spw_stream_t s;
  if (spwpy_stream_from(sobj, &s) < 0) return NULL;
  if (n <= 0) Py_RETURN_NONE;
  if (wait && spwpy_refuse_in_callback()) return NULL;
  int st = spw_memcpy_async(r->rt, (void *)(uintptr_t)dst, (const void *)(uintptr_t)src,
                            (size_t)n, s);
  if (st == SPW_ERR_INVALID_STREAM && spwpy_stream_adopt(r, s, st))
    st = spw_memcpy_async(r->rt, (void *)(uintptr_t)dst, (const void *)(uintptr_t)src,
                          (size_t)n, s);
  if (st == SPW_OK && wait) st = wait_stream(r, s);
  if (st != SPW_OK) return spwpy_raise(r->rt, st);
  Py_RETURN_NONE;
}

/* _numba_alloc(nbytes, expose_stream) -> (handle, pointer): allocates on the default stream
 * (which Numba's blocking streams wait on) and locks the buffer on the plugin's own stream,
 * so that it stays resident and in place while Numba holds the pointer. */
static PyObject *runtime_numba_alloc(PyObject *self, PyObject *args) {
  spwpy_runtime_t *r = R(self);
  Py_ssize_t n;
  unsigned long long es;
  if (!PyArg_ParseTuple(args, "nK", &n, &es)) return NULL;
  LIVE(r);
  if (n <= 0) {
    PyErr_SetString(PyExc_ValueError, "nbytes must be positive");
    return NULL;
  }
  spw_buf_t h = SPW_BUF_NULL;
  void *p = NULL;
  int st;
  Py_BEGIN_ALLOW_THREADS
  st = spw_alloc(r->rt, (size_t)n, NULL, &h);
  if (st == SPW_OK) {
    st = spw_acquire(r->rt, h, (spw_stream_t)(uintptr_t)es, 0, &p);
    if (st != SPW_OK) (void)spw_free(r->rt, h);
  }
  Py_END_ALLOW_THREADS
  if (st != SPW_OK) return spwpy_raise(r->rt, st);
  return Py_BuildValue("KK", (unsigned long long)h, (unsigned long long)(uintptr_t)p);
}

/* _numba_free(handle, expose_stream): Numba dropped its pointer, but work it enqueued may
 * still use the memory. The exposure lock moves to the default stream and is released once
 * that stream passes this point (the legacy default stream waits for every blocking
 * stream), then the memory goes back; nothing blocks. */
static PyObject *runtime_numba_free(PyObject *self, PyObject *args) {
  spwpy_runtime_t *r = R(self);
  unsigned long long h, es;
  if (!PyArg_ParseTuple(args, "KK", &h, &es)) return NULL;
  if (!r->rt) Py_RETURN_NONE; /* the runtime went first (context reset): nothing to free */
  spw_buf_t b = (spw_buf_t)h;
  void *p;
  int st = spw_acquire(r->rt, b, NULL, SPW_ACQUIRE_TRY, &p);
  int rel = spw_release(r->rt, b, (spw_stream_t)(uintptr_t)es);
  (void)spw_free(r->rt, b);
  if (st == SPW_OK) {
    int s2 = spw_release_n_async(r->rt, &b, 1, NULL);
    /* Another thread synchronizing the default stream may have released it already. */
    if (s2 != SPW_OK && s2 != SPW_ERR_NOT_LOCKED && s2 != SPW_ERR_FREED) return spwpy_raise(r->rt, s2);
  }
  if (rel != SPW_OK && rel != SPW_ERR_NOT_LOCKED) return spwpy_raise(r->rt, rel);
  Py_RETURN_NONE;
}

static PyMethodDef runtime_methods[] = {
    {"close", runtime_close, METH_NOARGS, NULL},
    {"limits", runtime_limits, METH_NOARGS, NULL},
    {"last_error", runtime_last_error, METH_NOARGS, NULL},
    {"_async_error", runtime_async_error, METH_NOARGS, NULL},
    {"alloc", (PyCFunction)(void (*)(void))runtime_alloc, METH_VARARGS | METH_KEYWORDS, NULL},
    {"_create_stream", runtime_create_stream, METH_NOARGS, NULL},
    {"_destroy_stream", (PyCFunction)(void (*)(void))runtime_destroy_stream, METH_FASTCALL | METH_KEYWORDS, NULL},
    {"register_stream", (PyCFunction)(void (*)(void))runtime_register_stream, METH_FASTCALL | METH_KEYWORDS, NULL},
    {"unregister_stream", (PyCFunction)(void (*)(void))runtime_unregister_stream, METH_FASTCALL | METH_KEYWORDS, NULL},
    {"synchronize", (PyCFunction)(void (*)(void))runtime_synchronize, METH_FASTCALL | METH_KEYWORDS, NULL},
    {"release_async", (PyCFunction)(void (*)(void))runtime_release_async, METH_FASTCALL | METH_KEYWORDS, NULL},
    {"wait_stream", (PyCFunction)(void (*)(void))runtime_wait_stream, METH_FASTCALL | METH_KEYWORDS, NULL},
    {"acquire_n", (PyCFunction)(void (*)(void))runtime_acquire_n, METH_VARARGS | METH_KEYWORDS, NULL},
    {"release_n_async", (PyCFunction)(void (*)(void))runtime_release_n_async, METH_VARARGS | METH_KEYWORDS, NULL},
    {"spill_n", (PyCFunction)(void (*)(void))runtime_spill_n, METH_VARARGS | METH_KEYWORDS, NULL},
    {"prefetch_n", (PyCFunction)(void (*)(void))runtime_prefetch_n, METH_VARARGS | METH_KEYWORDS, NULL},
    {"wait_idle", runtime_wait_idle, METH_NOARGS, NULL},
    {"_stats", runtime_stats, METH_NOARGS, NULL},
    {"summary", runtime_summary, METH_NOARGS, NULL},
    {"memcpy", (PyCFunction)(void (*)(void))runtime_memcpy, METH_VARARGS | METH_KEYWORDS, NULL},
    {"_numba_alloc", runtime_numba_alloc, METH_VARARGS, NULL},
    {"_numba_free", runtime_numba_free, METH_VARARGS, NULL},
    {"_ctl_install", spwpy_runtime_ctl_install, METH_VARARGS, NULL},
    {"_spill_handles", spwpy_runtime_spill_handles, METH_VARARGS, NULL},
    {"_prefetch_handles", spwpy_runtime_prefetch_handles, METH_VARARGS, NULL},
    {"_handle_info", spwpy_runtime_handle_info, METH_O, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef runtime_getset[] = {
    {"closed", get_closed, NULL, "True once close() succeeded.", NULL},
    {"_backend", get_backend, NULL, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot runtime_slots[] = {
    {Py_tp_init, runtime_init},
    {Py_tp_new, PyType_GenericNew},
    {Py_tp_dealloc, runtime_dealloc},
    {Py_tp_methods, runtime_methods},
    {Py_tp_getset, runtime_getset},
    {Py_tp_doc, "Base of spillway.Runtime (one spw_runtime_t)."},
    {0, NULL},
};

static PyType_Spec runtime_spec = {
    "spillway._spillway.RuntimeBase", sizeof(spwpy_runtime_t), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE, runtime_slots,
};

int spwpy_runtime_init_type(PyObject *m) {
  spwpy_runtime_type = (PyTypeObject *)PyType_FromSpec(&runtime_spec);
  if (!spwpy_runtime_type) return -1;
  Py_INCREF(spwpy_runtime_type);
  if (PyModule_AddObject(m, "RuntimeBase", (PyObject *)spwpy_runtime_type) < 0) return -1;
  PyObject *names = PyTuple_New(0
#define SPWPY_COUNT(f) +1
                                SPWPY_STATS_FIELDS(SPWPY_COUNT)
#undef SPWPY_COUNT
  );
  if (!names) return -1;
  Py_ssize_t i = 0;
#define SPWPY_NAME(f) PyTuple_SetItem(names, i++, PyUnicode_FromString(#f));
  SPWPY_STATS_FIELDS(SPWPY_NAME)
#undef SPWPY_NAME
  return PyModule_AddObject(m, "STATS_FIELDS", names);
}
