/* SPDX-License-Identifier: Apache-2.0 */
/* runtime.c: the Runtime type: one spw_runtime_t, its streams, batched calls, statistics,
 * copies. The entry points of the allocators that keep pointers (_expose_alloc, _expose_free,
 * _allocate, _usage) are in allocation.c.
 * The Pythonic surface (keyword configuration, typed statistics, context manager) is the
 * subclass spillway.Runtime, in Python; every method here is called by it or through it. */
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdlib.h>

#include "binding.h"

#ifdef SPWPY_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#define R(self) ((spwpy_runtime_t *)(self))
#define LIVE(r)                                                                              \
  do {                                                                                       \
    if (!(r)->rt) return spwpy_raise_closed();                                               \
  } while (0)

/* The configuration keywords, in spw_config_t's order: Runtime(...) takes exactly these
 * (CONFIG_FIELDS), each by keyword, and each None or left out is "unset" (SPILLWAY_* or the
 * default). `trace` and `trace_max` are trace_path and trace_max_bytes; `ignore_env` is
 * the flag SPW_CONFIG_IGNORE_ENV; `stable_addresses` and `ipc` are bools (OFF/ON) or None
 * (DEFAULT). */
#define SPWPY_CONFIG_FIELDS(X)                                                               \
  X(device) X(backend) X(device_limit) X(host_limit) X(disk_limit) X(spill_dir) X(io)        \
  X(high_watermark) X(low_watermark) X(log_level) X(host_device_bytes) X(ignore_env)         \
  X(trace) X(trace_max) X(stable_addresses) X(ipc)

enum {
#define SPWPY_CFG_INDEX(f) CFG_##f,
  SPWPY_CONFIG_FIELDS(SPWPY_CFG_INDEX)
#undef SPWPY_CFG_INDEX
  CFG_N
};

static const char *const config_names[CFG_N] = {
#define SPWPY_CFG_NAME(f) #f,
    SPWPY_CONFIG_FIELDS(SPWPY_CFG_NAME)
#undef SPWPY_CFG_NAME
};

/* A keyword of `table` (case-insensitive), or None for 0. */
static int keyword_from(PyObject *v, const char *field, const spwpy_named_t *table, int *out) {
  if (v == Py_None) {
    *out = 0;
    return 0;
  }
  if (!PyUnicode_Check(v)) {
    PyErr_Format(PyExc_TypeError, "%s must be a string or None, not %R", field,
                 (PyObject *)Py_TYPE(v));
    return -1;
  }
  const char *s = PyUnicode_AsUTF8AndSize(v, NULL);
  if (!s) return -1;
  for (const spwpy_named_t *e = table; e->name; e++) {
    if (PyOS_stricmp(s, e->name) == 0) {
      *out = (int)e->value;
      return 0;
    }
  }
  spwpy_raise_format(SPW_ERR_CONFIG, "%s=%R: not one of the keywords in docs/python.md", field, v);
  return -1;
}

/* A watermark: a real number, or None for 0 (unset); spw_config_validate judges its range
 * (0 < low < high <= 1) and names the field. */
static int fraction_from(PyObject *v, const char *field, double *out) {
  if (v == Py_None) {
    *out = 0.0;
    return 0;
  }
  if (PyBool_Check(v) || !(PyFloat_Check(v) || PyLong_Check(v))) {
    PyErr_Format(PyExc_TypeError, "%s must be a float or None, not %R", field,
                 (PyObject *)Py_TYPE(v));
    return -1;
  }
  double d = PyFloat_AsDouble(v);
  if ((d == -1.0 && PyErr_Occurred()) || !isfinite(d)) {
    PyErr_Clear(); /* an int too large for a double */
    spwpy_raise_format(SPW_ERR_CONFIG, "%s=%R: expected a fraction in (0, 1]", field, v);
    return -1;
  }
  *out = d;
  return 0;
}

/* A path (str or os.PathLike) or None; *keep holds the bytes until the runtime is made. */
static int path_from(PyObject *v, const char *field, PyObject **keep, const char **out) {
  *out = NULL;
  if (v == Py_None) return 0;
  if (!PyUnicode_FSConverter(v, keep)) return -1;
  *out = PyBytes_AsString(*keep);
  return *out ? 0 : -1;
}

/* A tri-state: None, True or False to `unset`, `on`, `off`. Only a bool is taken: a truthy
 * object such as "off" or 0.0 would otherwise flip the setting silently. */
static int tristate_from(PyObject *v, const char *field, int unset, int on, int off, int *out) {
  if (v == Py_None) {
    *out = unset;
    return 0;
  }
  if (!PyBool_Check(v)) {
    PyErr_Format(PyExc_TypeError, "%s must be a bool or None, not %R", field,
                 (PyObject *)Py_TYPE(v));
    return -1;
  }
  *out = v == Py_True ? on : off;
  return 0;
}

static int config_from(PyObject *const v[CFG_N], spw_config_t *cfg, PyObject **keep_dir,
                       PyObject **keep_trace) {
  int backend, io, log_level, stable, ipc;
  unsigned long long device = 0;
  if (v[CFG_device] != Py_None &&
      spwpy_u64_from(v[CFG_device], "device", 0, SPW_ERR_CONFIG, &device) < 0)
    return -1;
  if (device > INT_MAX) {
    spwpy_raise_format(SPW_ERR_CONFIG, "device=%R: not a device ordinal", v[CFG_device]);
    return -1;
  }
  cfg->device = (int)device;
  if (keyword_from(v[CFG_backend], "backend", spwpy_backends, &backend) < 0 ||
      spwpy_size_from(v[CFG_device_limit], "device_limit", &cfg->device_limit) < 0 ||
      spwpy_size_from(v[CFG_host_limit], "host_limit", &cfg->host_limit) < 0 ||
      spwpy_size_from(v[CFG_disk_limit], "disk_limit", &cfg->disk_limit) < 0 ||
      path_from(v[CFG_spill_dir], "spill_dir", keep_dir, &cfg->spill_dir) < 0 ||
      keyword_from(v[CFG_io], "io", spwpy_io_kinds, &io) < 0 ||
      fraction_from(v[CFG_high_watermark], "high_watermark", &cfg->high_watermark) < 0 ||
      fraction_from(v[CFG_low_watermark], "low_watermark", &cfg->low_watermark) < 0 ||
      keyword_from(v[CFG_log_level], "log_level", spwpy_log_levels, &log_level) < 0 ||
      spwpy_size_from(v[CFG_host_device_bytes], "host_device_bytes", &cfg->host_device_bytes) < 0 ||
      path_from(v[CFG_trace], "trace", keep_trace, &cfg->trace_path) < 0 ||
      spwpy_size_from(v[CFG_trace_max], "trace_max", &cfg->trace_max_bytes) < 0 ||
      tristate_from(v[CFG_stable_addresses], "stable_addresses", SPW_STABLE_DEFAULT,
                    SPW_STABLE_ON, SPW_STABLE_OFF, &stable) < 0 ||
      tristate_from(v[CFG_ipc], "ipc", SPW_IPC_DEFAULT, SPW_IPC_ON, SPW_IPC_OFF, &ipc) < 0)
    return -1;
  cfg->stable_addresses = (spw_stable_mode_t)stable;
  cfg->ipc = (spw_ipc_mode_t)ipc;
  cfg->backend = (spw_backend_kind_t)backend;
  cfg->io = (spw_io_kind_t)io;
  cfg->log_level = (spw_log_level_t)log_level;
  int ignore = PyObject_IsTrue(v[CFG_ignore_env]);
  if (ignore < 0) return -1;
  cfg->flags = ignore ? SPW_CONFIG_IGNORE_ENV : 0;
  return 0;
}

/* __init__(*, device=None, backend=None, ...): every field of CONFIG_FIELDS by keyword. */
static int runtime_init(PyObject *self, PyObject *args, PyObject *kwds) {
  spwpy_runtime_t *r = R(self);
  if (r->rt) {
    PyErr_SetString(PyExc_RuntimeError, "Runtime.__init__ called twice");
    return -1;
  }
  if (PyTuple_Size(args) != 0) {
    PyErr_SetString(PyExc_TypeError, "Runtime() takes keyword arguments only");
    return -1;
  }
  PyObject *v[CFG_N];
  for (int i = 0; i < CFG_N; i++) v[i] = Py_None;
  PyObject *key, *value;
  Py_ssize_t pos = 0;
  while (kwds && PyDict_Next(kwds, &pos, &key, &value)) {
    int i = 0;
    while (i < CFG_N && PyUnicode_CompareWithASCIIString(key, config_names[i]) != 0) i++;
    if (i == CFG_N) {
      PyErr_Format(PyExc_TypeError, "Runtime() got an unexpected keyword argument %R", key);
      return -1;
    }
    v[i] = value;
  }
  spw_config_t cfg = SPW_CONFIG_INIT;
  PyObject *keep_dir = NULL, *keep_trace = NULL;
  int rc = -1;
  if (config_from(v, &cfg, &keep_dir, &keep_trace) < 0) goto out;
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
    goto out;
  }
  spw_backend_kind_t b = SPW_BACKEND_HOST;
  (void)spw_runtime_backend(rt, &b);
  r->rt = rt;
  r->backend = (int)b;
  rc = 0;
out:
  Py_XDECREF(keep_dir);
  Py_XDECREF(keep_trace);
  return rc;
}

/* The peer tier's rule (spillway.h): a lender and its borrower must not be destroyed at
 * the same time from two threads, and no call may run on a runtime while it is destroyed.
 * Python makes both hold across objects: every spw_peer_lend and spw_peer_reclaim, and the
 * destroy of every runtime that ever took part in a lend (`peered`), run under peer_mu,
 * taken with the GIL released (its holder waits on Spillway, whose threads may need the
 * GIL). A lend marks both runtimes `peered` before it releases the GIL, and refuses a
 * runtime whose destroy is under way (`closing`, set before that one released the GIL), so
 * a destroy that started unserialized never overlaps a lend. Never taken on a controller
 * thread except by a deallocator, which only tries (see destroy). */
static pthread_mutex_t peer_mu = PTHREAD_MUTEX_INITIALIZER;

/* Destroys r's runtime with the GIL released. On a controller thread (a deallocator run
 * by a controller method) a peered runtime is destroyed only if peer_mu is free at once:
 * waiting there could wait on this very callback; else SPW_ERR_WOULD_DEADLOCK and the
 * runtime is left alive (the deallocator then leaks it). */
static int destroy(spwpy_runtime_t *r) {
  int st;
  spw_runtime_t *rt = r->rt;
  int serialize = r->peered, try_only = spwpy_in_callback;
  r->closing = 1;
  Py_BEGIN_ALLOW_THREADS
  if (!serialize) {
    st = spw_runtime_destroy(rt);
  } else if (try_only ? pthread_mutex_trylock(&peer_mu) == 0
                      : pthread_mutex_lock(&peer_mu) == 0) {
    st = spw_runtime_destroy(rt);
    /* Under peer_mu: a lend or reclaim waiting for it reads r->rt next (peer_pair). */
    if (st == SPW_OK) r->rt = NULL;
    pthread_mutex_unlock(&peer_mu);
  } else {
    st = SPW_ERR_WOULD_DEADLOCK;
  }
  Py_END_ALLOW_THREADS
  r->closing = 0;
  if (st == SPW_OK) {
    r->rt = NULL;
    spwpy_runtime_ctl_release(r); /* no callback can run any more */
    Py_CLEAR(r->lender);          /* the memory it borrowed went back: the lender may go */
  }
  return st;
}

static void runtime_dealloc(PyObject *self) {
  spwpy_runtime_t *r = R(self);
  PyObject_GC_UnTrack(self);
  /* At interpreter exit the process is about to end: leave the runtime to the OS rather
   * than join its threads. A runtime with locks still held is leaked the same way (its
   * memory cannot be released under running work), and so are its controller link, which
   * the C controller may still call, and its lender, which it still borrows from. */
  if (r->rt && !spwpy_finalizing) (void)destroy(r);
  if (!r->rt) {
    Py_CLEAR(r->link);
    Py_CLEAR(r->lender);
  }
  spwpy_free(self);
}

/* No tp_clear: the link must live as long as the C runtime that calls it; cycles through
 * it are broken at the ControllerLink, which drops its callable. The lender must outlive
 * the borrower's C runtime too: a ring of runtimes each lending to the next is kept alive
 * (not destroyed in a wrong order) until one of them is closed or reclaims. */
static int runtime_traverse(PyObject *self, visitproc visit, void *arg) {
  Py_VISIT(R(self)->link);
  Py_VISIT(R(self)->lender);
  Py_VISIT(Py_TYPE(self));
  return 0;
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

typedef struct alloc_args {
  size_t n;
  unsigned flags;
  spw_buf_t h;
} alloc_args_t;

static int alloc_op(spwpy_runtime_t *r, spw_stream_t s, void *ctx) {
  alloc_args_t *a = ctx;
  return spw_alloc_ex(r->rt, a->n, s, a->flags, &a->h);
}

/* An owner id (SPW_ALLOC_OWNER): an int in [lo, SPW_OWNER_MAX]; None is 0 where lo is 0.
 * TypeError for another type, InvalidArgumentError out of range. */
static int owner_from(PyObject *obj, unsigned long long lo, unsigned *out) {
  unsigned long long v = 0;
  if (!(obj == Py_None && lo == 0) &&
      spwpy_u64_from(obj, "owner", lo, SPW_ERR_INVALID_ARG, &v) < 0)
    return -1;
  if (v > SPW_OWNER_MAX) {
    spwpy_raise_format(SPW_ERR_INVALID_ARG, "owner must be between %llu and %d, not %R", lo,
                       SPW_OWNER_MAX, obj);
    return -1;
  }
  *out = (unsigned)v;
  return 0;
}

/* alloc(nbytes, stream=None, stable=None, owner=None): `stable` None leaves the choice to the
 * runtime's stable_addresses (flags 0); True or False overrides it for this buffer. `owner`
 * (1..255) tags it for name_owner / owner_stats / the trace. */
static PyObject *runtime_alloc(PyObject *self, PyObject *args, PyObject *kwds) {
  static char *kwlist[] = {"nbytes", "stream", "stable", "owner", NULL};
  spwpy_runtime_t *r = R(self);
  PyObject *nobj, *sobj = Py_None, *stable_obj = Py_None, *owner_obj = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|OOO", kwlist, &nobj, &sobj, &stable_obj,
                                   &owner_obj))
    return NULL;
  alloc_args_t a = {0, 0, SPW_BUF_NULL};
  spw_stream_t s;
  int flags;
  unsigned owner;
  if (spwpy_nbytes_from(nobj, "nbytes", &a.n) < 0 || spwpy_stream_from(sobj, &s) < 0 ||
      tristate_from(stable_obj, "stable", 0, (int)SPW_ALLOC_STABLE, (int)SPW_ALLOC_MOVABLE,
                    &flags) < 0 ||
      owner_from(owner_obj, 0, &owner) < 0)
    return NULL;
  a.flags = (unsigned)flags | SPW_ALLOC_OWNER(owner);
  LIVE(r);
  int st = spwpy_on_stream(r, s, alloc_op, &a, 1);
  if (st != SPW_OK) return spwpy_raise(r->rt, st);
  return spwpy_buffer_new(r, a.h, a.n);
}

/* _stable_granularity() -> int: spw_stable_granularity (Runtime.stable_granularity). */
static PyObject *runtime_stable_granularity(PyObject *self, PyObject *noargs) {
  spwpy_runtime_t *r = R(self);
  LIVE(r);
  size_t g = 0;
  int st = spw_stable_granularity(r->rt, &g);
  if (st != SPW_OK) return spwpy_raise(r->rt, st);
  return PyLong_FromSize_t(g);
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

typedef struct stream_fn {
  int (*fn)(spw_runtime_t *, spw_stream_t);
} stream_fn_t;

static int stream_fn_op(spwpy_runtime_t *r, spw_stream_t s, void *ctx) {
  return ((stream_fn_t *)ctx)->fn(r->rt, s);
}

/* A stream call that may wait (synchronize, destroy, unregister): GIL released. Only a
 * call that may be the first to name an application's stream adopts it. */
static PyObject *stream_call_blocking(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                                      PyObject *kwnames, const char *name,
                                      int (*fn)(spw_runtime_t *, spw_stream_t), int adopt) {
  spwpy_runtime_t *r = R(self);
  spw_stream_t s;
  if (parse_stream_arg(args, nargs, kwnames, name, &s) < 0) return NULL;
  LIVE(r);
  if (spwpy_refuse_in_callback()) return NULL;
  stream_fn_t f = {fn};
  int st;
  if (adopt) {
    st = spwpy_on_stream(r, s, stream_fn_op, &f, 1);
  } else {
    Py_BEGIN_ALLOW_THREADS
    st = fn(r->rt, s);
    Py_END_ALLOW_THREADS
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
  if (st == SPW_ERR_INVALID_STREAM && spwpy_stream_adopt(r, s, &st)) st = SPW_OK; /* no locks */
  if (st != SPW_OK) return spwpy_raise(r->rt, st);
  Py_RETURN_NONE;
}

/* Collects the handles of a sequence of Buffer objects of this runtime. *out is malloc'd. */
static int collect(spwpy_runtime_t *r, PyObject *seq, spw_buf_t **out, size_t *n) {
  Py_ssize_t len = PySequence_Size(seq);
  if (len < 0) return -1;
  if (len == 0) {
    spwpy_raise_detail(SPW_ERR_INVALID_ARG, "expected at least one buffer");
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

typedef struct acquire_n_args {
  const spw_buf_t *bufs;
  size_t n;
  unsigned flags;
  void **ptrs;
} acquire_n_args_t;

static int acquire_n_op(spwpy_runtime_t *r, spw_stream_t s, void *ctx) {
  acquire_n_args_t *a = ctx;
  return spw_acquire_n(r->rt, a->bufs, a->n, s, a->flags, a->ptrs);
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
  acquire_n_args_t a = {bufs, n, flags | SPW_ACQUIRE_TRY, ptrs};
  int st = spwpy_on_stream(r, s, acquire_n_op, &a, 0);
  if (st == SPW_ERR_NOT_READY && spwpy_in_callback) st = SPW_ERR_WOULD_DEADLOCK;
  if (st == SPW_ERR_NOT_READY) {
    a.flags = flags;
    st = spwpy_on_stream(r, s, acquire_n_op, &a, 1);
  }
  PyObject *res = NULL;
  if (st != SPW_OK) {
    spwpy_raise(r->rt, st);
  } else if ((res = PyList_New((Py_ssize_t)n)) != NULL) {
    for (size_t i = 0; i < n; i++) {
      PyObject *p = PyLong_FromVoidPtr(ptrs[i]);
      if (!p || PyList_SetItem(res, (Py_ssize_t)i, p) < 0) {
        /* keep the all-or-nothing contract: drop the locks we took */
        for (size_t j = 0; j < n; j++) (void)spw_release(r->rt, bufs[j], s);
        Py_CLEAR(res);
        break;
      }
    }
  }
  free(ptrs);
  free(bufs);
  return res;
}

/* graph_launch(graph_exec, buffers, stream=None, read=False, block=False): spw_graph_launch.
 * graph_exec is an int (a cudaGraphExec_t's address: int() of a cuda.bindings handle; host
 * backend: a spw_host_graph_t's address), TypeError for anything else (bool included),
 * ValueError for 0, a negative one or one past a pointer. First under the GIL with
 * SPW_ACQUIRE_TRY (every buffer on the device: nothing waits), then, if one is not, without
 * the GIL; SPW_LAUNCH_BLOCK always without it. */
typedef struct graph_args {
  const void *exec;
  spw_buf_arg_t *args;
  size_t n;
  unsigned flags;
} graph_args_t;

static int graph_op(spwpy_runtime_t *r, spw_stream_t s, void *ctx) {
  graph_args_t *a = ctx;
  return spw_graph_launch(r->rt, a->exec, a->args, a->n, s, a->flags);
}

static PyObject *runtime_graph_launch(PyObject *self, PyObject *args, PyObject *kwds) {
  static char *kwlist[] = {"graph_exec", "buffers", "stream", "read", "block", NULL};
  spwpy_runtime_t *r = R(self);
  PyObject *gobj, *seq, *sobj = Py_None;
  int read = 0, block = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO|Opp", kwlist, &gobj, &seq, &sobj, &read,
                                   &block))
    return NULL;
  if (!PyLong_Check(gobj) || PyBool_Check(gobj))
    return PyErr_Format(PyExc_TypeError, "graph_exec must be an int (a cudaGraphExec_t "
                        "handle's address, e.g. int(handle)), not %R", (PyObject *)Py_TYPE(gobj));
  /* Negative or past 64 bits: OverflowError, reported as the ValueError below. */
  unsigned long long v = PyLong_AsUnsignedLongLong(gobj);
  int bad = v == (unsigned long long)-1 && PyErr_Occurred();
  if (bad) {
    if (!PyErr_ExceptionMatches(PyExc_OverflowError)) return NULL;
    PyErr_Clear();
  }
  if (bad || v == 0 || (uintmax_t)v != (uintmax_t)(uintptr_t)v)
    return PyErr_Format(PyExc_ValueError, "graph_exec must be a nonzero address (0 < "
                        "graph_exec < 2**%d), not %R", (int)(sizeof(void *) * 8), gobj);
  LIVE(r);
  spw_stream_t s;
  if (spwpy_stream_from(sobj, &s) < 0) return NULL;
  spw_buf_t *bufs;
  size_t n;
  if (collect(r, seq, &bufs, &n) < 0) return NULL;
  spw_buf_arg_t *a = malloc(n * sizeof *a);
  if (!a) {
    free(bufs);
    return PyErr_NoMemory();
  }
  unsigned flags = read ? SPW_ACQUIRE_READ : 0;
  for (size_t i = 0; i < n; i++) a[i] = spw_buf_arg(bufs[i], 0, flags | SPW_ACQUIRE_TRY);
  free(bufs);
  graph_args_t g = {(const void *)(uintptr_t)v, a, n, block ? SPW_LAUNCH_BLOCK : 0u};
  int st = SPW_ERR_NOT_READY;
  if (!block) st = spwpy_on_stream(r, s, graph_op, &g, 0);
  if (st == SPW_ERR_NOT_READY && spwpy_in_callback) st = SPW_ERR_WOULD_DEADLOCK;
  if (st == SPW_ERR_NOT_READY) {
    for (size_t i = 0; i < n; i++) a[i].flags = flags;
    st = spwpy_on_stream(r, s, graph_op, &g, 1);
  }
  free(a);
  /* The launch names the failing buffer in spw_last_error for every status it returns. */
  if (st != SPW_OK) return spwpy_raise_detail(st, spw_last_error(r->rt));
  Py_RETURN_NONE;
}

/* The calls that take a list of buffers and a stream: (buffers, stream=None). `adopt`: a
 * stream the runtime does not know yet (a Numba/CuPy/PyTorch stream) is adopted and the
 * call retried, for calls that may be the first to name it. */
typedef struct buffers_args {
  int (*op)(spw_runtime_t *, const spw_buf_t *, size_t, spw_stream_t);
  const spw_buf_t *bufs;
  size_t n;
} buffers_args_t;

static int buffers_op(spwpy_runtime_t *r, spw_stream_t s, void *ctx) {
  buffers_args_t *a = ctx;
  return a->op(r->rt, a->bufs, a->n, s);
}

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
  buffers_args_t a = {op, bufs, n};
  int st = adopt ? spwpy_on_stream(r, s, buffers_op, &a, 0) : op(r->rt, bufs, n, s);
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
  PyObject *seq, *tobj = NULL;
  spw_tier_t tier = SPW_TIER_HOST;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|O", kwlist, &seq, &tobj)) return NULL;
  if (tobj && spwpy_tier_from(tobj, &tier) < 0) return NULL;
  LIVE(r);
  spw_buf_t *bufs;
  size_t n;
  if (collect(r, seq, &bufs, &n) < 0) return NULL;
  int st = spw_spill_n(r->rt, bufs, n, tier);
  free(bufs);
  if (st != SPW_OK) return spwpy_raise(r->rt, st);
  Py_RETURN_NONE;
}

static PyObject *runtime_prefetch_n(PyObject *self, PyObject *args, PyObject *kwds) {
  return buffers_on_stream(self, args, kwds, spw_prefetch_n, 1);
}

/* host_reserve(nbytes): spw_host_reserve, the GIL released while it pins. */
static PyObject *runtime_host_reserve(PyObject *self, PyObject *args, PyObject *kwds) {
  static char *kwlist[] = {"nbytes", NULL};
  spwpy_runtime_t *r = R(self);
  PyObject *nobj;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "O", kwlist, &nobj)) return NULL;
  LIVE(r);
  unsigned long long n;
  if (spwpy_u64_from(nobj, "nbytes", 0, SPW_ERR_INVALID_ARG, &n) < 0) return NULL;
  if (spwpy_refuse_in_callback()) return NULL;
  int st;
  Py_BEGIN_ALLOW_THREADS
  st = spw_host_reserve(r->rt, (uint64_t)n);
  Py_END_ALLOW_THREADS
  if (st != SPW_OK) return spwpy_raise(r->rt, st);
  Py_RETURN_NONE;
}

static PyObject *runtime_wait_idle(PyObject *self, PyObject *noargs) {
  spwpy_runtime_t *r = R(self);
  LIVE(r);
  if (spwpy_refuse_in_callback()) return NULL;
  int st;
  Py_BEGIN_ALLOW_THREADS
  st = spw_wait_idle(r->rt);
  Py_END_ALLOW_THREADS
  /* The status is the first failed move since the last check, run on whichever thread;
   * this thread's error text belongs to something else. */
  if (st == SPW_ERR_WOULD_DEADLOCK) return spwpy_raise(r->rt, st);
  if (st != SPW_OK) return spwpy_raise_detail(st, "background work");
  Py_RETURN_NONE;
}

/* ---- the peer tier: lend and reclaim ------------------------------------------------- */

/* The checks that peer_lend and peer_reclaim share, with the GIL held: `self` (the lender)
 * and `other` (the borrower, a RuntimeBase) are two live runtimes of the same backend,
 * neither being destroyed, and the caller is no controller method (both calls wait). Marks
 * both `peered`, so that a destroy starting from now on waits for the call (peer_mu).
 * Returns the borrower, or NULL with an exception set. */
static spwpy_runtime_t *peer_pair(spwpy_runtime_t *r, PyObject *other) {
  if (!PyType_IsSubtype(Py_TYPE(other), spwpy_runtime_type)) {
    PyErr_Format(PyExc_TypeError, "borrower must be a spillway.Runtime, not %R",
                 (PyObject *)Py_TYPE(other));
    return NULL;
  }
  spwpy_runtime_t *b = R(other);
  if (!r->rt || r->closing) {
    spwpy_raise_closed();
    return NULL;
  }
  if (!b->rt || b->closing) {
    spwpy_raise_detail(SPW_ERR_INVALID_ARG, "the borrower is closed");
    return NULL;
  }
  if (b == r) {
    spwpy_raise_detail(SPW_ERR_INVALID_ARG, "a runtime cannot lend to itself");
    return NULL;
  }
  if (b->backend != r->backend) {
    spwpy_raise_detail(SPW_ERR_INVALID_ARG,
                       "lender and borrower run on different backends (cuda and host)");
    return NULL;
  }
  if (spwpy_refuse_in_callback()) return NULL;
  r->peered = b->peered = 1;
  return b;
}

/* Runs lend (bytes > 0) or reclaim (bytes == 0) under peer_mu with the GIL released. The
 * runtimes are read again under the lock: a destroy that held it may have ended them. */
static int peer_call(spwpy_runtime_t *r, spwpy_runtime_t *b, uint64_t bytes) {
  int st;
  Py_BEGIN_ALLOW_THREADS
  pthread_mutex_lock(&peer_mu);
  if (!r->rt || !b->rt)
    st = SPW_ERR_INVALID_ARG;
  else
    st = bytes ? spw_peer_lend(r->rt, b->rt, bytes) : spw_peer_reclaim(r->rt, b->rt);
  pthread_mutex_unlock(&peer_mu);
  Py_END_ALLOW_THREADS
  return st;
}

/* Raises a peer call's error with the detail of the runtime whose failing path records it
 * (spillway.h and core/peer.c): the borrower's for BUSY, UNSUPPORTED and the errors of
 * buffers that could not move on; the lender's for the rest. */
static PyObject *peer_raise(spwpy_runtime_t *r, spwpy_runtime_t *b, int st) {
  if (!r->rt || !b->rt)
    return spwpy_raise_detail(SPW_ERR_INVALID_ARG, "a runtime was closed meanwhile");
  spw_runtime_t *from = r->rt;
  if (st == SPW_ERR_BUSY || st == SPW_ERR_UNSUPPORTED || st == SPW_ERR_HOST_OUT_OF_MEMORY ||
      st == SPW_ERR_DISK_FULL || st == SPW_ERR_IO)
    from = b->rt;
  /* These paths always record their text (unlike most statuses, whose text may be stale). */
  if (st == SPW_ERR_INVALID_ARG || st == SPW_ERR_BUSY || st == SPW_ERR_UNSUPPORTED)
    return spwpy_raise_detail(st, spw_last_error(from));
  return spwpy_raise(from, st);
}

/* ipc_export(ptr, nbytes) -> bytes: spw_ipc_export_ptr; the bytes are the spw_ipc_handle_t. */
static PyObject *runtime_ipc_export(PyObject *self, PyObject *args, PyObject *kwds) {
  static char *kwlist[] = {"ptr", "nbytes", NULL};
  spwpy_runtime_t *r = R(self);
  LIVE(r);
  PyObject *pobj, *nobj;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO", kwlist, &pobj, &nobj)) return NULL;
  unsigned long long ptr, n;
  if (spwpy_u64_from(pobj, "ptr", 1, SPW_ERR_INVALID_ARG, &ptr) < 0 ||
      spwpy_u64_from(nobj, "nbytes", 1, SPW_ERR_INVALID_ARG, &n) < 0)
    return NULL;
  if (ptr > UINTPTR_MAX || n > SIZE_MAX) return spwpy_raise(r->rt, SPW_ERR_INVALID_ARG);
  spw_ipc_handle_t h;
  int st = spw_ipc_export_ptr(r->rt, (const void *)(uintptr_t)ptr, (size_t)n, &h);
  if (st != SPW_OK) return spwpy_raise(r->rt, st);
  return PyBytes_FromStringAndSize((const char *)&h, sizeof h);
}

/* ipc_open(handle) -> int: spw_ipc_open over the bytes ipc_export gave in another process. */
static PyObject *runtime_ipc_open(PyObject *self, PyObject *args, PyObject *kwds) {
  static char *kwlist[] = {"handle", NULL};
  spwpy_runtime_t *r = R(self);
  LIVE(r);
  PyObject *hobj;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "O", kwlist, &hobj)) return NULL;
  if (!PyBytes_Check(hobj))
    return PyErr_Format(PyExc_TypeError, "handle must be bytes, not %R",
                        (PyObject *)Py_TYPE(hobj));
  spw_ipc_handle_t h;
  char *raw;
  Py_ssize_t len;
  if (PyBytes_AsStringAndSize(hobj, &raw, &len) < 0) return NULL;
  if (len != (Py_ssize_t)sizeof h)
    return PyErr_Format(PyExc_ValueError, "an IPC handle is %zu bytes (Runtime.ipc_export)",
                        sizeof h);
  memcpy(&h, raw, sizeof h);
  void *d = NULL;
  int st;
  Py_BEGIN_ALLOW_THREADS
  st = spw_ipc_open(r->rt, &h, &d);
  Py_END_ALLOW_THREADS
  if (st != SPW_OK) return spwpy_raise(r->rt, st);
  return PyLong_FromUnsignedLongLong((unsigned long long)(uintptr_t)d);
}

/* ipc_close(ptr): spw_ipc_close. */
static PyObject *runtime_ipc_close(PyObject *self, PyObject *args, PyObject *kwds) {
  static char *kwlist[] = {"ptr", NULL};
  spwpy_runtime_t *r = R(self);
  LIVE(r);
  PyObject *pobj;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "O", kwlist, &pobj)) return NULL;
  unsigned long long ptr;
  if (spwpy_u64_from(pobj, "ptr", 1, SPW_ERR_INVALID_ARG, &ptr) < 0) return NULL;
  if (ptr > UINTPTR_MAX) return spwpy_raise(r->rt, SPW_ERR_INVALID_ARG);
  int st;
  Py_BEGIN_ALLOW_THREADS
  st = spw_ipc_close(r->rt, (void *)(uintptr_t)ptr);
  Py_END_ALLOW_THREADS
  if (st != SPW_OK) return spwpy_raise(r->rt, st);
  Py_RETURN_NONE;
}

/* peer_lend(borrower, nbytes): spw_peer_lend(self, borrower, nbytes). On success the
 * borrower keeps a strong reference to self until the memory is reclaimed or the borrower
 * is destroyed. */
static PyObject *runtime_peer_lend(PyObject *self, PyObject *args, PyObject *kwds) {
  static char *kwlist[] = {"borrower", "nbytes", NULL};
  spwpy_runtime_t *r = R(self);
  PyObject *bobj, *nobj;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO", kwlist, &bobj, &nobj)) return NULL;
  unsigned long long n;
  if (spwpy_u64_from(nobj, "nbytes", 1, SPW_ERR_INVALID_ARG, &n) < 0) return NULL;
  spwpy_runtime_t *b = peer_pair(r, bobj);
  if (!b) return NULL;
  int st = peer_call(r, b, (uint64_t)n);
  if (st != SPW_OK) return peer_raise(r, b, st);
  /* One lender at a time: any earlier one already took its memory back. */
  PyObject *old = b->lender;
  Py_INCREF(self);
  b->lender = self;
  Py_XDECREF(old);
  Py_RETURN_NONE;
}

/* peer_reclaim(borrower): spw_peer_reclaim(self, borrower); drops the borrower's reference
 * to self. */
static PyObject *runtime_peer_reclaim(PyObject *self, PyObject *args, PyObject *kwds) {
  static char *kwlist[] = {"borrower", NULL};
  spwpy_runtime_t *r = R(self);
  PyObject *bobj;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "O", kwlist, &bobj)) return NULL;
  spwpy_runtime_t *b = peer_pair(r, bobj);
  if (!b) return NULL;
  int st = peer_call(r, b, 0);
  if (st != SPW_OK) return peer_raise(r, b, st);
  if (b->lender == self) Py_CLEAR(b->lender);
  Py_RETURN_NONE;
}

#define SPWPY_STATS_FIELDS(X)                                                                \
  X(buffers) X(device_bytes) X(host_bytes) X(disk_bytes) X(locked_bytes) X(device_limit)     \
  X(host_pinned_bytes) X(spills) X(spill_bytes) X(unspills) X(unspill_bytes) X(demotions)    \
  X(demote_bytes) X(disk_reads) X(disk_read_bytes) X(disk_writes) X(disk_write_bytes)        \
  X(spills_on_demand) X(spills_background) X(spills_abandoned) X(clean_respills) X(failures) \
  X(spill_ns) X(unspill_ns) X(demote_ns) X(disk_read_ns) X(disk_requests) X(hints_merged)   \
  X(hints_replaced) X(hints_pending) X(prefetch_dropped) X(peer_bytes) X(peer_limit)         \
  X(peer_spills) X(peer_spill_bytes) X(peer_unspills) X(peer_unspill_bytes) X(peer_returns) \
  X(peer_return_bytes) X(lent_bytes)

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
    if (!v || PyTuple_SetItem(t, i++, v) < 0) {                                              \
      Py_DECREF(t);                                                                          \
      return NULL;                                                                           \
    }                                                                                        \
  }
  SPWPY_STATS_FIELDS(SPWPY_SET)
#undef SPWPY_SET
  return t;
}

/* name_owner(owner, name): spw_owner_name. */
static PyObject *runtime_name_owner(PyObject *self, PyObject *args, PyObject *kwds) {
  static char *kwlist[] = {"owner", "name", NULL};
  spwpy_runtime_t *r = R(self);
  PyObject *oobj, *nobj;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO", kwlist, &oobj, &nobj)) return NULL;
  unsigned owner;
  if (owner_from(oobj, 1, &owner) < 0) return NULL;
  if (!PyUnicode_Check(nobj)) {
    PyErr_Format(PyExc_TypeError, "name must be a str, not %R", (PyObject *)Py_TYPE(nobj));
    return NULL;
  }
  Py_ssize_t len;
  const char *name = PyUnicode_AsUTF8AndSize(nobj, &len);
  if (!name) return NULL;
  LIVE(r);
  /* An embedded NUL would cut the name short: refused like any other bad character. */
  int st = (size_t)len != strlen(name) ? SPW_ERR_INVALID_ARG : spw_owner_name(r->rt, owner, name);
  if (st != SPW_OK)
    return spwpy_raise_format(st, "an owner's name is 1 to %d printable ASCII characters "
                              "other than '\"' and '\\', not %R", SPW_OWNER_NAME_MAX, nobj);
  Py_RETURN_NONE;
}

/* owner_stats(owner) -> dict: spw_owner_stats, its field names as keys. */
static PyObject *runtime_owner_stats(PyObject *self, PyObject *args, PyObject *kwds) {
  static char *kwlist[] = {"owner", NULL};
  spwpy_runtime_t *r = R(self);
  PyObject *oobj;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "O", kwlist, &oobj)) return NULL;
  unsigned owner;
  if (owner_from(oobj, 1, &owner) < 0) return NULL;
  LIVE(r);
  spw_owner_stats_t o;
  memset(&o, 0, sizeof o);
  o.struct_size = sizeof o;
  int st = spw_owner_stats(r->rt, owner, &o);
  if (st != SPW_OK) return spwpy_raise(r->rt, st);
  return Py_BuildValue("{s:K,s:K,s:K,s:K,s:s}", "buffers", (unsigned long long)o.buffers,
                       "bytes", (unsigned long long)o.bytes, "allocs",
                       (unsigned long long)o.allocs, "alloc_bytes",
                       (unsigned long long)o.alloc_bytes, "name", o.name);
}

static PyObject *runtime_summary(PyObject *self, PyObject *noargs) {
  spwpy_runtime_t *r = R(self);
  LIVE(r);
  char buf[4096]; /* room for the owners' part too */
  int st = spw_stats_summary(r->rt, buf, sizeof buf);
  if (st != SPW_OK) return spwpy_raise(r->rt, st);
  return PyUnicode_FromString(buf);
}

static void post_sem(void *arg) { sem_post((sem_t *)arg); }

static int host_func_op(spwpy_runtime_t *r, spw_stream_t s, void *sem) {
  return spw_launch_host_func(r->rt, s, post_sem, sem);
}

/* Waits, with the GIL released, until the work enqueued on `s` so far has completed,
 * without touching its locks (spw_stream_synchronize would release them). */
static int wait_stream(spwpy_runtime_t *r, spw_stream_t s) {
  sem_t sem;
  if (sem_init(&sem, 0, 0) != 0) return SPW_ERR_SYSTEM;
  int st = spwpy_on_stream(r, s, host_func_op, &sem, 0);
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

#ifdef SPWPY_HAVE_CUDA
/* Makes `consumer` wait for the work queued on `producer` so far, without blocking the host:
 * an event recorded on one and waited on by the other, on `device` (the thread's current
 * device is put back afterwards, so the caller's CUDA state is untouched). */
static int order_on_device(int device, spw_stream_t consumer, spw_stream_t producer,
                           char *why, size_t whylen) {
  int prev = -1;
  cudaEvent_t ev = NULL;
  cudaError_t e = cudaGetDevice(&prev);
  if (e == cudaSuccess && prev != device) e = cudaSetDevice(device);
  if (e == cudaSuccess) e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
  if (e == cudaSuccess) e = cudaEventRecord(ev, (cudaStream_t)producer);
  if (e == cudaSuccess) e = cudaStreamWaitEvent((cudaStream_t)consumer, ev, 0);
  if (ev) {
    cudaError_t e2 = cudaEventDestroy(ev); /* released once the wait no longer needs it */
    if (e == cudaSuccess) e = e2;
  }
  if (prev >= 0 && prev != device) (void)cudaSetDevice(prev);
  if (e != cudaSuccess) {
    snprintf(why, whylen, "%s: %s", cudaGetErrorName(e), cudaGetErrorString(e));
    return SPW_ERR_CUDA;
  }
  return SPW_OK;
}
#endif

/* _order_streams(consumer, producer, device): makes the data written by work queued on
 * `producer` so far ready for work queued on `consumer` from now on (DLPack's rule for
 * __dlpack__(stream=...)). On the CUDA backend an event orders the two streams and nothing
 * waits; on the host backend, whose streams are threads, the call waits for `producer`
 * (GIL released). Errors: InvalidStreamError, CudaError (the detail names the call). */
static PyObject *runtime_order_streams(PyObject *self, PyObject *args) {
  spwpy_runtime_t *r = R(self);
  PyObject *cobj, *pobj;
  int device;
  if (!PyArg_ParseTuple(args, "OOi", &cobj, &pobj, &device)) return NULL;
  spw_stream_t consumer, producer;
  if (spwpy_stream_from(cobj, &consumer) < 0 || spwpy_stream_from(pobj, &producer) < 0)
    return NULL;
  LIVE(r);
#ifdef SPWPY_HAVE_CUDA
  if (r->backend == SPW_BACKEND_CUDA) {
    char why[256] = "";
    int st;
    Py_BEGIN_ALLOW_THREADS
    st = order_on_device(device, consumer, producer, why, sizeof why);
    Py_END_ALLOW_THREADS
    if (st != SPW_OK) return spwpy_raise_detail(st, why);
    Py_RETURN_NONE;
  }
#endif
  (void)device;
  (void)consumer;
  if (spwpy_refuse_in_callback()) return NULL;
  int st = wait_stream(r, producer);
  if (st != SPW_OK) return spwpy_raise(r->rt, st);
  Py_RETURN_NONE;
}

typedef struct memcpy_args {
  void *dst;
  const void *src;
  size_t n;
} memcpy_args_t;

static int memcpy_op(spwpy_runtime_t *r, spw_stream_t s, void *ctx) {
  memcpy_args_t *a = ctx;
  return spw_memcpy_async(r->rt, a->dst, a->src, a->n, s);
}

/* memcpy(dst, src, nbytes, stream=None, wait=True): spw_memcpy_async between device
 * pointers (from an acquire) and host addresses; with wait, returns once it completed. */
static PyObject *runtime_memcpy(PyObject *self, PyObject *args, PyObject *kwds) {
  static char *kwlist[] = {"dst", "src", "nbytes", "stream", "wait", NULL};
  spwpy_runtime_t *r = R(self);
  PyObject *dobj, *srcobj, *nobj, *sobj = Py_None;
  int wait = 1;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOO|Op", kwlist, &dobj, &srcobj, &nobj, &sobj,
                                   &wait))
    return NULL;
  unsigned long long dst, src;
  memcpy_args_t a;
  spw_stream_t s;
  if (spwpy_u64_from(dobj, "dst", 0, SPW_ERR_INVALID_ARG, &dst) < 0 ||
      spwpy_u64_from(srcobj, "src", 0, SPW_ERR_INVALID_ARG, &src) < 0 ||
      spwpy_nbytes_from(nobj, "nbytes", &a.n) < 0 || spwpy_stream_from(sobj, &s) < 0)
    return NULL;
  LIVE(r);
  if (wait && spwpy_refuse_in_callback()) return NULL;
  a.dst = (void *)(uintptr_t)dst;
  a.src = (const void *)(uintptr_t)src;
  int st = spwpy_on_stream(r, s, memcpy_op, &a, 0);
  if (st == SPW_OK && wait) st = wait_stream(r, s);
  if (st != SPW_OK) return spwpy_raise(r->rt, st);
  Py_RETURN_NONE;
}

/* _address() -> int: the spw_runtime_t pointer, for the PyTorch allocator library
 * (spillway/torch.py registers it there together with _c_api_address()). */
static PyObject *runtime_address(PyObject *self, PyObject *noargs) {
  spwpy_runtime_t *r = R(self);
  LIVE(r);
  return PyLong_FromVoidPtr(r->rt);
}

static PyMethodDef runtime_methods[] = {
    {"close", runtime_close, METH_NOARGS, NULL},
    {"limits", runtime_limits, METH_NOARGS, NULL},
    {"last_error", runtime_last_error, METH_NOARGS, NULL},
    {"_async_error", runtime_async_error, METH_NOARGS, NULL},
    {"alloc", (PyCFunction)(void (*)(void))runtime_alloc, METH_VARARGS | METH_KEYWORDS, NULL},
    {"_stable_granularity", runtime_stable_granularity, METH_NOARGS, NULL},
    {"_create_stream", runtime_create_stream, METH_NOARGS, NULL},
    {"_destroy_stream", (PyCFunction)(void (*)(void))runtime_destroy_stream, METH_FASTCALL | METH_KEYWORDS, NULL},
    {"register_stream", (PyCFunction)(void (*)(void))runtime_register_stream, METH_FASTCALL | METH_KEYWORDS, NULL},
    {"unregister_stream", (PyCFunction)(void (*)(void))runtime_unregister_stream, METH_FASTCALL | METH_KEYWORDS, NULL},
    {"synchronize", (PyCFunction)(void (*)(void))runtime_synchronize, METH_FASTCALL | METH_KEYWORDS, NULL},
    {"release_async", (PyCFunction)(void (*)(void))runtime_release_async, METH_FASTCALL | METH_KEYWORDS, NULL},
    {"wait_stream", (PyCFunction)(void (*)(void))runtime_wait_stream, METH_FASTCALL | METH_KEYWORDS, NULL},
    {"acquire_n", (PyCFunction)(void (*)(void))runtime_acquire_n, METH_VARARGS | METH_KEYWORDS, NULL},
    {"graph_launch", (PyCFunction)(void (*)(void))runtime_graph_launch, METH_VARARGS | METH_KEYWORDS, NULL},
    {"release_n_async", (PyCFunction)(void (*)(void))runtime_release_n_async, METH_VARARGS | METH_KEYWORDS, NULL},
    {"spill_n", (PyCFunction)(void (*)(void))runtime_spill_n, METH_VARARGS | METH_KEYWORDS, NULL},
    {"prefetch_n", (PyCFunction)(void (*)(void))runtime_prefetch_n, METH_VARARGS | METH_KEYWORDS, NULL},
    {"wait_idle", runtime_wait_idle, METH_NOARGS, NULL},
    {"host_reserve", (PyCFunction)(void (*)(void))runtime_host_reserve, METH_VARARGS | METH_KEYWORDS, NULL},
    {"peer_lend", (PyCFunction)(void (*)(void))runtime_peer_lend, METH_VARARGS | METH_KEYWORDS, NULL},
    {"ipc_export", (PyCFunction)(void (*)(void))runtime_ipc_export, METH_VARARGS | METH_KEYWORDS, NULL},
    {"ipc_open", (PyCFunction)(void (*)(void))runtime_ipc_open, METH_VARARGS | METH_KEYWORDS, NULL},
    {"ipc_close", (PyCFunction)(void (*)(void))runtime_ipc_close, METH_VARARGS | METH_KEYWORDS, NULL},
    {"peer_reclaim", (PyCFunction)(void (*)(void))runtime_peer_reclaim, METH_VARARGS | METH_KEYWORDS, NULL},
    {"_stats", runtime_stats, METH_NOARGS, NULL},
    {"summary", runtime_summary, METH_NOARGS, NULL},
    {"name_owner", (PyCFunction)(void (*)(void))runtime_name_owner, METH_VARARGS | METH_KEYWORDS, NULL},
    {"owner_stats", (PyCFunction)(void (*)(void))runtime_owner_stats, METH_VARARGS | METH_KEYWORDS, NULL},
    {"memcpy", (PyCFunction)(void (*)(void))runtime_memcpy, METH_VARARGS | METH_KEYWORDS, NULL},
    {"_numba_alloc", spwpy_runtime_expose_alloc, METH_VARARGS, NULL},
    {"_numba_free", spwpy_runtime_expose_free, METH_VARARGS, NULL},
    {"_expose_alloc", spwpy_runtime_expose_alloc, METH_VARARGS, NULL},
    {"_expose_free", spwpy_runtime_expose_free, METH_VARARGS, NULL},
    {"_allocate", spwpy_runtime_allocate, METH_VARARGS, NULL},
    {"_usage", spwpy_runtime_usage, METH_NOARGS, NULL},
    {"_address", runtime_address, METH_NOARGS, NULL},
    {"_order_streams", runtime_order_streams, METH_VARARGS, NULL},
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
    {Py_tp_traverse, runtime_traverse},
    {Py_tp_methods, runtime_methods},
    {Py_tp_getset, runtime_getset},
    {Py_tp_doc, "Base of spillway.Runtime (one spw_runtime_t)."},
    {0, NULL},
};

static PyType_Spec runtime_spec = {
    "spillway._spillway.RuntimeBase", sizeof(spwpy_runtime_t), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC, runtime_slots,
};

/* A tuple of the names in `names` (n of them). */
static PyObject *names_tuple(const char *const *names, Py_ssize_t n) {
  PyObject *t = PyTuple_New(n);
  for (Py_ssize_t i = 0; t && i < n; i++) {
    PyObject *s = PyUnicode_FromString(names[i]);
    if (!s || PyTuple_SetItem(t, i, s) < 0) Py_CLEAR(t);
  }
  return t;
}

static const char *const stats_names[] = {
#define SPWPY_NAME(f) #f,
    SPWPY_STATS_FIELDS(SPWPY_NAME)
#undef SPWPY_NAME
};

static int add_names(PyObject *m, const char *name, const char *const *names, Py_ssize_t n) {
  PyObject *t = names_tuple(names, n);
  if (!t) return -1;
  int rc = PyModule_AddObjectRef(m, name, t);
  Py_DECREF(t);
  return rc;
}

int spwpy_runtime_init_type(PyObject *m) {
  if (spwpy_add_type(m, &runtime_spec, NULL, "RuntimeBase", &spwpy_runtime_type) < 0) return -1;
  if (add_names(m, "STATS_FIELDS", stats_names,
                (Py_ssize_t)(sizeof stats_names / sizeof stats_names[0])) < 0)
    return -1;
  return add_names(m, "CONFIG_FIELDS", config_names, CFG_N);
}
