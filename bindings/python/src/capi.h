/* SPDX-License-Identifier: Apache-2.0 */
/* capi.h: private to the Python package (never installed). The table of Spillway calls that
 * the extension spillway._spillway hands to libspillway_torch.so, the PyTorch allocator
 * library shipped beside it.
 *
 * Why a table: the extension links the library statically and exports nothing but
 * PyInit__spillway (docs/python.md, "Linking"). A second copy of the library inside the
 * allocator library would have its own globals (the per-thread error text, the log state),
 * while the runtimes it is given belong to the extension's copy. So the allocator library
 * contains no Spillway code: it calls the extension's copy through these pointers, on the
 * runtime that Python registered with it (spillway/torch.py).
 *
 * Compatibility: `struct_size` is the size of the table the extension filled; a reader
 * built against a larger table refuses a smaller one (fields are only ever appended). */
#ifndef SPILLWAY_PY_CAPI_H
#define SPILLWAY_PY_CAPI_H

#include <stddef.h>

#include "spillway/spillway.h"

typedef struct spwpy_capi {
  size_t struct_size;
  int (*alloc)(spw_runtime_t *rt, size_t bytes, spw_stream_t stream, spw_buf_t *out);
  int (*free)(spw_runtime_t *rt, spw_buf_t buf);
  int (*acquire)(spw_runtime_t *rt, spw_buf_t buf, spw_stream_t stream, unsigned flags,
                 void **dptr);
  int (*release)(spw_runtime_t *rt, spw_buf_t buf, spw_stream_t stream);
  int (*release_n_async)(spw_runtime_t *rt, const spw_buf_t *bufs, size_t n,
                         spw_stream_t stream);
  int (*stream_register)(spw_runtime_t *rt, spw_stream_t stream);
  /* For the text of a failure: the status's name, and this thread's last error of `rt`
   * (the out-of-memory numbers: limit, bytes in use, bytes locked). */
  const char *(*err_name)(int status);
  const char *(*last_error)(const spw_runtime_t *rt);
  /* Appended for owner tags: the allocator allocates as its owner (SPWPY_OWNER_TORCH) and
   * names it once per runtime it is given. */
  int (*alloc_ex)(spw_runtime_t *rt, size_t bytes, spw_stream_t stream, unsigned flags,
                  spw_buf_t *out);
  int (*owner_name)(spw_runtime_t *rt, unsigned id, const char *name);
} spwpy_capi_t;

/* The owner ids (spillway.h's SPW_ALLOC_OWNER) under which the package's allocators allocate
 * in a runtime: library i of spillway.process.LIBRARIES ("numba", "cupy", "torch",
 * "cuda.core") is owner i + 1, named after it, so the trace and the stats summary say which
 * library allocated what. The extension checks at import that the torch one is right. */
#define SPWPY_OWNER_OF(library) ((unsigned)(library) + 1u)
#define SPWPY_OWNER_TORCH SPWPY_OWNER_OF(2)

#endif /* SPILLWAY_PY_CAPI_H */
