/* SPDX-License-Identifier: Apache-2.0 */
/* Private header, never installed: what the public entry points share. The API layer
 * validates what the application hands in (runtime, handles, streams, sizes, flags) and
 * calls the core; nothing below it sees unchecked input. */
#ifndef SPILLWAY_API_API_H
#define SPILLWAY_API_API_H

#include "runtime.h"

/* The live entry of a stream the application passed, or SPW_ERR_INVALID_STREAM. */
static inline int spw__stream_entry(spw_runtime_t *rt, spw_stream_t s, spw_stream_entry_t **out) {
  spw_stream_entry_t *e = spw__streams_find(&rt->streams, s);
  if (!e) return SPW_ERR_INVALID_STREAM;
  *out = e;
  return SPW_OK;
}

#endif /* SPILLWAY_API_API_H */
