/* SPDX-License-Identifier: Apache-2.0 */
/* dlpack.c: DLPack capsules of lent deferrable arrays (spillway.DeviceView.__dlpack__), and
 * the table of Spillway calls handed to the PyTorch allocator library (capi.h).
 *
 * The DLPack structures are declared here as the DLPack specification (v1.0, dlpack.h)
 * fixes them; nothing in the package includes dlpack.h itself.
 *
 * Ownership: one block from malloc holds the managed tensor, its shape and its
 * strides; the tensor's manager_ctx is that block and its deleter frees it. The deleter
 * touches no Python object, so a consumer may call it on any thread, with or without the
 * GIL (free needs neither). The block holds no lock and no reference on the array:
 * the memory is valid while the lend that made the capsule lasts (docs/python.md). A capsule
 * that no consumer renamed ("used_dltensor...") calls the deleter itself when it is
 * destroyed, so an unconsumed capsule leaks nothing. `_dlpack_live()` counts the blocks not
 * yet deleted, for tests and for the lend's check that consumers let go. */
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "binding.h"
#include "capi.h"

typedef struct {
  uint32_t major, minor;
} DLPackVersion;
typedef struct {
  int32_t device_type; /* DLDeviceType: kDLCPU 1, kDLCUDA 2 */
  int32_t device_id;
} DLDevice;
typedef struct {
  uint8_t code; /* DLDataTypeCode: kDLInt 0, kDLUInt 1, kDLFloat 2, kDLComplex 5, kDLBool 6 */
  uint8_t bits;
  uint16_t lanes;
} DLDataType;
typedef struct {
  void *data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t *shape;
  int64_t *strides; /* in elements, not bytes */
  uint64_t byte_offset;
} DLTensor;
typedef struct DLManagedTensor {
  DLTensor dl_tensor;
  void *manager_ctx;
  void (*deleter)(struct DLManagedTensor *self);
} DLManagedTensor;
typedef struct DLManagedTensorVersioned {
  DLPackVersion version;
  void *manager_ctx;
  void (*deleter)(struct DLManagedTensorVersioned *self);
  uint64_t flags;
  DLTensor dl_tensor;
} DLManagedTensorVersioned;

#define DLPACK_FLAG_BITMASK_READ_ONLY (1ULL << 0)
#define DLPACK_MAX_DIMS 64 /* more than NumPy's 64 is not an array anyone can consume */

static _Atomic long long live_tensors;

static void delete_legacy(DLManagedTensor *self) {
  if (!self) return;
  free(self->manager_ctx);
  atomic_fetch_sub(&live_tensors, 1);
}

static void delete_versioned(DLManagedTensorVersioned *self) {
  if (!self) return;
  free(self->manager_ctx);
  atomic_fetch_sub(&live_tensors, 1);
}

/* The capsule's destructor, as the specification writes it: a consumer renames a capsule it
 * took; one still under its first name was never consumed and owns its tensor. */
static void capsule_legacy(PyObject *cap) {
  if (PyCapsule_IsValid(cap, "used_dltensor")) return;
  PyObject *t, *v, *tb;
  PyErr_Fetch(&t, &v, &tb);
  DLManagedTensor *m = PyCapsule_GetPointer(cap, "dltensor");
  if (m) {
    if (m->deleter) m->deleter(m);
  } else {
    PyErr_WriteUnraisable(cap);
  }
  PyErr_Restore(t, v, tb);
}

static void capsule_versioned(PyObject *cap) {
  if (PyCapsule_IsValid(cap, "used_dltensor_versioned")) return;
  PyObject *t, *v, *tb;
  PyErr_Fetch(&t, &v, &tb);
  DLManagedTensorVersioned *m = PyCapsule_GetPointer(cap, "dltensor_versioned");
  if (m) {
    if (m->deleter) m->deleter(m);
  } else {
    PyErr_WriteUnraisable(cap);
  }
  PyErr_Restore(t, v, tb);
}

/* A tuple of ints, each in [0, 2^63-1], of length `ndim` (or reading ndim when -1). */
static int dims_from(PyObject *obj, const char *what, Py_ssize_t *ndim, int64_t *out) {
  if (!PyTuple_Check(obj)) {
    PyErr_Format(PyExc_TypeError, "%s must be a tuple of ints", what);
    return -1;
  }
  Py_ssize_t n = PyTuple_Size(obj);
  if (*ndim >= 0 && n != *ndim) {
    spwpy_raise_format(SPW_ERR_INVALID_ARG, "%s has %zd dimensions, not %zd", what, n, *ndim);
    return -1;
  }
  if (n > DLPACK_MAX_DIMS) {
    spwpy_raise_format(SPW_ERR_INVALID_ARG, "%s has more than %d dimensions", what,
                       DLPACK_MAX_DIMS);
    return -1;
  }
  for (Py_ssize_t i = 0; i < n; i++) {
    unsigned long long v;
    if (spwpy_u64_from(PyTuple_GetItem(obj, i), what, 0, SPW_ERR_INVALID_ARG, &v) < 0) return -1;
    if (v > (unsigned long long)INT64_MAX) {
      spwpy_raise_format(SPW_ERR_INVALID_ARG, "%s: %llu does not fit DLPack's int64", what, v);
      return -1;
    }
    out[i] = (int64_t)v;
  }
  *ndim = n;
  return 0;
}

/* _dlpack_capsule(ptr, shape, strides, code, bits, device_type, device_id, readonly,
 * versioned) -> capsule. `strides` are in elements. The caller (DeviceView.__dlpack__)
 * holds the lock that keeps `ptr` valid; this only describes it. */
PyObject *spwpy_dlpack_capsule(PyObject *self, PyObject *args) {
  PyObject *pobj, *shape_obj, *strides_obj;
  int code, bits, dev_type, dev_id, readonly, versioned;
  if (!PyArg_ParseTuple(args, "OOOiiiipp", &pobj, &shape_obj, &strides_obj, &code, &bits,
                        &dev_type, &dev_id, &readonly, &versioned))
    return NULL;
  unsigned long long ptr;
  if (spwpy_u64_from(pobj, "ptr", 0, SPW_ERR_INVALID_ARG, &ptr) < 0) return NULL;
  if (code < 0 || code > 255 || bits <= 0 || bits > 255 || (dev_type != 1 && dev_type != 2) ||
      dev_id < 0)
    return spwpy_raise_detail(SPW_ERR_INVALID_ARG, "not a DLPack dtype or device");
  int64_t shape[DLPACK_MAX_DIMS], strides[DLPACK_MAX_DIMS];
  Py_ssize_t ndim = -1;
  if (dims_from(shape_obj, "shape", &ndim, shape) < 0 ||
      dims_from(strides_obj, "strides", &ndim, strides) < 0)
    return NULL;
  size_t head = versioned ? sizeof(DLManagedTensorVersioned) : sizeof(DLManagedTensor);
  size_t dims = 2 * (size_t)(ndim ? ndim : 1) * sizeof(int64_t);
  char *block = malloc(head + dims);
  if (!block) return PyErr_NoMemory();
  memset(block, 0, head + dims);
  int64_t *sh = (int64_t *)(block + head), *st = sh + (ndim ? ndim : 1);
  memcpy(sh, shape, (size_t)ndim * sizeof(int64_t));
  memcpy(st, strides, (size_t)ndim * sizeof(int64_t));
  DLTensor t = {(void *)(uintptr_t)ptr, {dev_type, dev_id}, (int32_t)ndim,
                {(uint8_t)code, (uint8_t)bits, 1}, sh, st, 0};
  PyObject *cap;
  if (versioned) {
    DLManagedTensorVersioned *m = (DLManagedTensorVersioned *)block;
    m->version = (DLPackVersion){1, 0};
    m->manager_ctx = block;
    m->deleter = delete_versioned;
    m->flags = readonly ? DLPACK_FLAG_BITMASK_READ_ONLY : 0;
    m->dl_tensor = t;
    cap = PyCapsule_New(m, "dltensor_versioned", capsule_versioned);
  } else {
    DLManagedTensor *m = (DLManagedTensor *)block;
    m->dl_tensor = t;
    m->manager_ctx = block;
    m->deleter = delete_legacy;
    cap = PyCapsule_New(m, "dltensor", capsule_legacy);
  }
  if (!cap) {
    free(block);
    return NULL;
  }
  atomic_fetch_add(&live_tensors, 1);
  return cap;
}

/* _dlpack_live() -> int: tensors made by _dlpack_capsule whose deleter has not run. */
PyObject *spwpy_dlpack_live(PyObject *self, PyObject *noargs) {
  return PyLong_FromLongLong(atomic_load(&live_tensors));
}

static const spwpy_capi_t capi = {
    sizeof(spwpy_capi_t), spw_alloc,           spw_free,      spw_acquire,    spw_release,
    spw_release_n_async,  spw_stream_register, spw_err_name, spw_last_error, spw_alloc_ex,
    spw_owner_name,
};

/* _c_api_address() -> int: the address of the table above (process lifetime). */
PyObject *spwpy_c_api_address(PyObject *self, PyObject *noargs) {
  return PyLong_FromVoidPtr((void *)&capi);
}
