/* SPDX-License-Identifier: Apache-2.0 */
/* controller.c: what lets a Python controller (spillway.Controller) hear Spillway's
 * controller callbacks without ever deadlocking on the GIL.
 *
 * A ControllerLink belongs to one Runtime and is the `user` pointer of its C controller
 * table. Its trampolines split the callbacks in two:
 *  - allocated, freed, state_changed only append an event to the link's queue (its own
 *    mutex, held for a few stores; never the GIL, never a Spillway call). A Python thread of
 *    the package (spillway/controller.py) takes them in order and calls the controller. So
 *    an engine thread never waits for the GIL, and a free from a deallocator or a garbage
 *    collection never re-enters the controller on the thread that happened to collect.
 *  - pressure must answer (the victims), so it takes the GIL on the thread that needs room,
 *    which holds no Spillway lock (spillway.h's contract) and no lock of this file.
 * No Spillway call of the binding blocks while holding the GIL (binding.h), so the thread
 * that waits for the GIL in `pressure` always gets it.
 *
 * Interpreter exit: the package's atexit hook calls _controller_shutdown() while Python is
 * still whole. From then on no trampoline enters Python (CPython >= 3.14 hangs a thread that
 * takes the GIL during finalization; older versions end it, which would kill an engine
 * thread). `active` counts the trampolines between their check of the flag and their
 * return, so the hook can wait, with the GIL released, for those already inside.
 *
 * Controller methods run as callbacks: on the pressure thread and on the delivery thread
 * (spwpy_in_callback) the binding's calls that would wait on the runtime raise
 * WouldDeadlockError, as Spillway's C calls do from a C callback. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#include "binding.h"

/* Set once by _controller_shutdown: no trampoline enters Python from then on. */
static atomic_int no_python;
/* Trampolines that may be inside Python (or about to check no_python). */
static atomic_int active;

#define QUEUE_MAX (1u << 20) /* events held for a controller that does not keep up */

enum { EV_ALLOCATED = 0, EV_FREED = 1, EV_STATE = 2, EV_MARK = 3 };

typedef struct event {
  uint64_t h, bytes, ns, gen;
  int kind, from, to, status;
} event_t;

typedef struct spwpy_link {
  PyObject_HEAD
  pthread_mutex_t mu; /* the queue; a leaf: nothing else is taken or called under it */
  pthread_cond_t cv;
  event_t *q;
  size_t head, n, cap;
  uint64_t dropped;
  int closed;
  PyObject *pressure; /* callable(bytes_needed, max) -> list of handles, or NULL; set and
                         read under the GIL */
} spwpy_link_t;

#define LINK(o) ((spwpy_link_t *)(o))

static void push(spwpy_link_t *l, const event_t *e) {
  pthread_mutex_lock(&l->mu);
  if (l->closed) {
    pthread_mutex_unlock(&l->mu);
    return;
  }
  if (l->n == l->cap) {
    size_t cap = l->cap ? l->cap * 2 : 256;
    event_t *q = cap <= QUEUE_MAX ? malloc(cap * sizeof *q) : NULL;
    if (!q) {
      l->dropped++;
      pthread_mutex_unlock(&l->mu);
      return;
    }
    for (size_t i = 0; i < l->n; i++) q[i] = l->q[(l->head + i) % l->cap];
    free(l->q);
    l->q = q;
    l->head = 0;
    l->cap = cap;
  }
  l->q[(l->head + l->n) % l->cap] = *e;
  if (l->n++ == 0) pthread_cond_signal(&l->cv);
  pthread_mutex_unlock(&l->mu);
}

/* ---- the trampolines (any thread, no Spillway lock held) ----------------------------- */

static void tr_allocated(void *u, spw_buf_t h, size_t bytes) {
  event_t e = {.kind = EV_ALLOCATED, .h = h, .bytes = bytes};
  push(u, &e);
}

static void tr_freed(void *u, spw_buf_t h, size_t bytes) {
  event_t e = {.kind = EV_FREED, .h = h, .bytes = bytes};
  push(u, &e);
}

static void tr_state(void *u, const spw_state_event_t *ev) {
  event_t e = {.kind = EV_STATE, .h = ev->buf, .bytes = ev->bytes, .ns = ev->duration_ns,
               .from = ev->from, .to = ev->to, .status = ev->status};
  push(u, &e);
}

/* Reads up to `max` handles from the controller's answer (a list of ints). */
static size_t victims_from(PyObject *res, spw_buf_t *victims, size_t max) {
  size_t n = 0;
  if (!res || !PyList_Check(res)) return 0;
  Py_ssize_t len = PyList_Size(res);
  for (Py_ssize_t i = 0; i < len && n < max; i++) {
    unsigned long long h = PyLong_AsUnsignedLongLong(PyList_GetItem(res, i));
    if (h == (unsigned long long)-1 && PyErr_Occurred()) {
      PyErr_Clear();
      continue;
    }
    victims[n++] = (spw_buf_t)h;
  }
  return n;
}

static size_t tr_pressure(void *u, uint64_t needed, spw_buf_t *victims, size_t max) {
  spwpy_link_t *l = u;
  size_t n = 0;
  atomic_fetch_add(&active, 1);
  /* Not after interpreter exit began, and not again on a thread already in a controller
   * method (an allocation made inside one): least-recently-used victims serve then. */
  if (!atomic_load(&no_python) && !spwpy_in_callback) {
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *fn = l->pressure;
    if (fn) {
      Py_INCREF(fn); /* a controller replaced meanwhile finishes this call */
      spwpy_in_callback++;
      PyObject *res = PyObject_CallFunction(fn, "Kn", (unsigned long long)needed, (Py_ssize_t)max);
      spwpy_in_callback--;
      /* The Python side catches and logs what the controller raises; anything left here is
       * the wrapper's own failure (memory), which must not leak into the thread. */
      if (!res) PyErr_Clear();
      n = victims_from(res, victims, max);
      Py_XDECREF(res);
      Py_DECREF(fn);
    }
    PyGILState_Release(g);
  }
  atomic_fetch_sub(&active, 1);
  return n;
}

/* ---- the link object ------------------------------------------------------------------- */

static PyObject *link_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
  spwpy_link_t *l = (spwpy_link_t *)PyType_GenericAlloc(type, 0);
  if (!l) return NULL;
  pthread_mutex_init(&l->mu, NULL);
  pthread_cond_init(&l->cv, NULL);
  return (PyObject *)l;
}

static void link_dealloc(PyObject *self) {
  spwpy_link_t *l = LINK(self);
  PyObject_GC_UnTrack(self);
  /* Only reached once no runtime refers to the link: its runtime was destroyed (no callback
   * can run) or never used it. */
  Py_CLEAR(l->pressure);
  free(l->q);
  pthread_cond_destroy(&l->cv);
  pthread_mutex_destroy(&l->mu);
  spwpy_free(self);
}

/* The pressure callable is a bound method of the package's _Link, which holds this link:
 * a cycle, broken here. A pressure call in flight holds its own reference (tr_pressure). */
static int link_traverse(PyObject *self, visitproc visit, void *arg) {
  Py_VISIT(LINK(self)->pressure);
  Py_VISIT(Py_TYPE(self));
  return 0;
}

static int link_clear(PyObject *self) {
  Py_CLEAR(LINK(self)->pressure);
  return 0;
}

static PyObject *event_tuple(const event_t *e) {
  switch (e->kind) {
  case EV_ALLOCATED:
  case EV_FREED:
    return Py_BuildValue("iKK", e->kind, (unsigned long long)e->h, (unsigned long long)e->bytes);
  case EV_STATE:
    return Py_BuildValue("iKiiKKi", e->kind, (unsigned long long)e->h, e->from, e->to,
                         (unsigned long long)e->bytes, (unsigned long long)e->ns, e->status);
  default:
    return Py_BuildValue("iK", e->kind, (unsigned long long)e->gen);
  }
}

/* take(max, timeout) -> list of event tuples (possibly empty after the timeout), or None
 * once the link is closed and empty. Waits with the GIL released. */
static PyObject *link_take(PyObject *self, PyObject *args) {
  spwpy_link_t *l = LINK(self);
  PyObject *mobj;
  unsigned long long want;
  double timeout;
  if (!PyArg_ParseTuple(args, "Od", &mobj, &timeout) ||
      spwpy_u64_from(mobj, "max", 1, SPW_ERR_INVALID_ARG, &want) < 0)
    return NULL;
  Py_ssize_t max = want > QUEUE_MAX ? (Py_ssize_t)QUEUE_MAX : (Py_ssize_t)want;
  event_t *got = malloc((size_t)max * sizeof *got);
  if (!got) return PyErr_NoMemory();
  size_t n = 0;
  int closed;
  Py_BEGIN_ALLOW_THREADS
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  double secs = timeout > 0 ? timeout : 0;
  ts.tv_sec += (time_t)secs;
  ts.tv_nsec += (long)((secs - (double)(time_t)secs) * 1e9);
  if (ts.tv_nsec >= 1000000000L) {
    ts.tv_sec++;
    ts.tv_nsec -= 1000000000L;
  }
  pthread_mutex_lock(&l->mu);
  while (l->n == 0 && !l->closed && timeout > 0)
    if (pthread_cond_timedwait(&l->cv, &l->mu, &ts) != 0) break;
  while (n < (size_t)max && l->n > 0) {
    got[n++] = l->q[l->head];
    l->head = (l->head + 1) % l->cap;
    l->n--;
  }
  closed = l->closed && n == 0;
  pthread_mutex_unlock(&l->mu);
  Py_END_ALLOW_THREADS
  if (closed) {
    free(got);
    Py_RETURN_NONE;
  }
  PyObject *list = PyList_New((Py_ssize_t)n);
  for (size_t i = 0; list && i < n; i++) {
    PyObject *t = event_tuple(&got[i]);
    if (!t || PyList_SetItem(list, (Py_ssize_t)i, t) < 0) {
      Py_CLEAR(list);
      break;
    }
  }
  free(got);
  return list;
}

/* mark(gen): an event in the queue's order, for the delivery thread (a controller switch,
 * a flush). */
static PyObject *link_mark(PyObject *self, PyObject *arg) {
  unsigned long long gen;
  if (spwpy_u64_from(arg, "gen", 0, SPW_ERR_INVALID_ARG, &gen) < 0) return NULL;
  event_t e = {.kind = EV_MARK, .gen = gen};
  push(LINK(self), &e);
  Py_RETURN_NONE;
}

/* close(): takers get what is queued, then None; later events are dropped. */
static PyObject *link_close(PyObject *self, PyObject *noargs) {
  spwpy_link_t *l = LINK(self);
  pthread_mutex_lock(&l->mu);
  l->closed = 1;
  pthread_cond_broadcast(&l->cv);
  pthread_mutex_unlock(&l->mu);
  Py_CLEAR(l->pressure);
  Py_RETURN_NONE;
}

static PyObject *link_get_dropped(PyObject *self, void *c) {
  spwpy_link_t *l = LINK(self);
  pthread_mutex_lock(&l->mu);
  unsigned long long d = l->dropped;
  pthread_mutex_unlock(&l->mu);
  return PyLong_FromUnsignedLongLong(d);
}

static PyObject *link_get_pending(PyObject *self, void *c) {
  spwpy_link_t *l = LINK(self);
  pthread_mutex_lock(&l->mu);
  size_t n = l->n;
  pthread_mutex_unlock(&l->mu);
  return PyLong_FromSize_t(n);
}

static PyMethodDef link_methods[] = {
    {"take", link_take, METH_VARARGS,
     "take(max, timeout) -> list of events, or None once closed and empty (GIL released)."},
    {"mark", link_mark, METH_O, "mark(gen): queues a marker event after those queued so far."},
    {"close", link_close, METH_NOARGS, "Stops the link: no more events, no more pressure calls."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef link_getset[] = {
    {"dropped", link_get_dropped, NULL, "Events dropped (queue full or out of memory).", NULL},
    {"pending", link_get_pending, NULL, "Events queued and not yet taken.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot link_slots[] = {
    {Py_tp_new, link_new},
    {Py_tp_dealloc, link_dealloc},
    {Py_tp_traverse, link_traverse},
    {Py_tp_clear, link_clear},
    {Py_tp_methods, link_methods},
    {Py_tp_getset, link_getset},
    {Py_tp_doc, "The queue and trampolines between a Runtime's C controller and Python."},
    {0, NULL},
};

static PyType_Spec link_spec = {
    "spillway._spillway.ControllerLink", sizeof(spwpy_link_t), 0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC, link_slots,
};

/* ---- Runtime methods and module functions --------------------------------------------- */

/* Runtime._ctl_install(link, pressure, allocated, freed, state_changed): installs the
 * trampolines with the given callbacks on (pressure: a callable or None; the others: flags),
 * or removes the controller when link is None. */
PyObject *spwpy_runtime_ctl_install(PyObject *self, PyObject *args) {
  spwpy_runtime_t *r = (spwpy_runtime_t *)self;
  PyObject *link, *pressure;
  int want_a, want_f, want_s;
  if (!PyArg_ParseTuple(args, "OOppp", &link, &pressure, &want_a, &want_f, &want_s)) return NULL;
  if (!r->rt) return spwpy_raise_closed();
  if (link == Py_None) {
    int st = spw_set_controller(r->rt, NULL, NULL);
    if (st != SPW_OK) return spwpy_raise(r->rt, st);
    Py_RETURN_NONE;
  }
  if (Py_TYPE(link) != spwpy_link_type) {
    PyErr_SetString(PyExc_TypeError, "expected a ControllerLink");
    return NULL;
  }
  if (r->link && r->link != link) {
    PyErr_SetString(PyExc_ValueError, "the runtime already has another ControllerLink");
    return NULL;
  }
  spwpy_link_t *l = LINK(link);
  PyObject *fn = pressure == Py_None ? NULL : pressure;
  Py_XINCREF(fn);
  PyObject *old = l->pressure;
  l->pressure = fn;
  Py_XDECREF(old); /* a pressure call running with it holds its own reference */
  spw_controller_t c = {sizeof c, want_a ? tr_allocated : NULL, want_f ? tr_freed : NULL,
                        want_s ? tr_state : NULL, fn ? tr_pressure : NULL};
  if (!r->link) {
    Py_INCREF(link);
    r->link = link; /* kept until the runtime is destroyed: callbacks may still use it */
  }
  int st = spw_set_controller(r->rt, &c, l);
  if (st != SPW_OK) return spwpy_raise(r->rt, st);
  Py_RETURN_NONE;
}

/* After spw_runtime_destroy: no callback can run any more. */
void spwpy_runtime_ctl_release(spwpy_runtime_t *r) {
  if (!r->link) return;
  PyObject *l = r->link;
  r->link = NULL;
  PyObject *res = link_close(l, NULL);
  Py_XDECREF(res);
  Py_DECREF(l);
}

static int handles_from(PyObject *seq, spw_buf_t **out, size_t *n) {
  Py_ssize_t len = PySequence_Size(seq);
  if (len < 0) return -1;
  spw_buf_t *h = malloc(((size_t)len + 1) * sizeof *h);
  if (!h) {
    PyErr_NoMemory();
    return -1;
  }
  for (Py_ssize_t i = 0; i < len; i++) {
    PyObject *it = PySequence_GetItem(seq, i);
    int rc = it ? spwpy_handle_from(it, &h[i]) : -1;
    Py_XDECREF(it);
    if (rc < 0) {
      free(h);
      return -1;
    }
  }
  *out = h;
  *n = (size_t)len;
  return 0;
}

/* Runtime._spill_handles(handles, tier), _prefetch_handles(handles, stream): spw_spill_n /
 * spw_prefetch_n on raw handles (a controller knows buffers by handle). Never wait. */
PyObject *spwpy_runtime_spill_handles(PyObject *self, PyObject *args) {
  spwpy_runtime_t *r = (spwpy_runtime_t *)self;
  PyObject *seq, *tobj;
  spw_tier_t tier;
  if (!PyArg_ParseTuple(args, "OO", &seq, &tobj)) return NULL;
  if (spwpy_tier_from(tobj, &tier) < 0) return NULL;
  if (!r->rt) return spwpy_raise_closed();
  spw_buf_t *h;
  size_t n;
  if (handles_from(seq, &h, &n) < 0) return NULL;
  int st = n ? spw_spill_n(r->rt, h, n, tier) : SPW_OK;
  free(h);
  if (st != SPW_OK) return spwpy_raise(r->rt, st);
  Py_RETURN_NONE;
}

typedef struct handles {
  const spw_buf_t *h;
  size_t n;
} handles_t;

static int prefetch_n_op(spwpy_runtime_t *r, spw_stream_t s, void *ctx) {
  handles_t *a = ctx;
  return spw_prefetch_n(r->rt, a->h, a->n, s);
}

PyObject *spwpy_runtime_prefetch_handles(PyObject *self, PyObject *args) {
  spwpy_runtime_t *r = (spwpy_runtime_t *)self;
  PyObject *seq, *sobj = Py_None;
  if (!PyArg_ParseTuple(args, "O|O", &seq, &sobj)) return NULL;
  if (!r->rt) return spwpy_raise_closed();
  spw_stream_t s;
  if (spwpy_stream_from(sobj, &s) < 0) return NULL;
  spw_buf_t *h;
  size_t n;
  if (handles_from(seq, &h, &n) < 0) return NULL;
  handles_t a = {h, n};
  int st = n ? spwpy_on_stream(r, s, prefetch_n_op, &a, 0) : SPW_OK;
  free(h);
  if (st != SPW_OK) return spwpy_raise(r->rt, st);
  Py_RETURN_NONE;
}

/* Runtime._handle_info(handle) -> (state, tier, lock_count, size). */
PyObject *spwpy_runtime_handle_info(PyObject *self, PyObject *arg) {
  spwpy_runtime_t *r = (spwpy_runtime_t *)self;
  spw_buf_t h;
  if (spwpy_handle_from(arg, &h) < 0) return NULL;
  if (!r->rt) return spwpy_raise_closed();
  spw_state_t state;
  spw_tier_t tier;
  uint32_t locks;
  size_t size;
  int st = spw_buf_state(r->rt, h, &state);
  if (st == SPW_OK) st = spw_buf_tier(r->rt, h, &tier);
  if (st == SPW_OK) st = spw_buf_lock_count(r->rt, h, &locks);
  if (st == SPW_OK) st = spw_buf_size(r->rt, h, &size);
  if (st != SPW_OK) return spwpy_raise(r->rt, st);
  return Py_BuildValue("iiIn", (int)state, (int)tier, (unsigned)locks, (Py_ssize_t)size);
}

/* _enter_callback_thread(): the calling thread (the delivery thread) runs controller
 * methods from now on: calls that would wait on a runtime raise WouldDeadlockError. */
static PyObject *enter_callback_thread(PyObject *self, PyObject *noargs) {
  spwpy_in_callback = 1;
  Py_RETURN_NONE;
}

static PyObject *in_callback(PyObject *self, PyObject *noargs) {
  return PyBool_FromLong(spwpy_in_callback > 0);
}

/* _controller_shutdown(timeout): from interpreter exit on, no trampoline enters Python;
 * waits (GIL released) up to `timeout` s for those inside. Returns how many are left. */
static PyObject *controller_shutdown(PyObject *self, PyObject *arg) {
  double timeout = PyFloat_AsDouble(arg);
  if (timeout == -1.0 && PyErr_Occurred()) return NULL;
  atomic_store(&no_python, 1);
  /* A pressure call waiting for the GIL we hold gets it while we sleep. */
  int left = atomic_load(&active);
  for (double waited = 0; left > 0 && waited < timeout; waited += 0.001) {
    Py_BEGIN_ALLOW_THREADS
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
    Py_END_ALLOW_THREADS
    left = atomic_load(&active);
  }
  return PyLong_FromLong(left);
}

static PyMethodDef controller_functions[] = {
    {"_enter_callback_thread", enter_callback_thread, METH_NOARGS, NULL},
    {"_in_callback", in_callback, METH_NOARGS,
     "True on a thread that is running a controller method."},
    {"_controller_shutdown", controller_shutdown, METH_O, NULL},
    {NULL, NULL, 0, NULL},
};

int spwpy_controller_init(PyObject *m) {
  if (spwpy_add_type(m, &link_spec, NULL, "ControllerLink", &spwpy_link_type) < 0) return -1;
  return PyModule_AddFunctions(m, controller_functions);
}
