/* SPDX-License-Identifier: Apache-2.0 */
/* A reference model of configuration resolution, written from docs/config.md and not from
 * src/core/config.c, for the fuzz target to compare the library against.
 *
 * It is deliberately built differently from the library: sizes are computed on decimal
 * digit strings (the value doubled once per unit bit), ranges are decided on the digits
 * themselves, and the environment comes from the input struct, never from getenv. Where
 * the library works in doubles (percentages, fractions, watermark order) a value within
 * double precision of a bound may fairly go either way: the model says MODEL_EITHER there
 * instead of guessing how the library rounds.
 */
#ifndef SPILLWAY_TESTS_FUZZ_CONFIG_MODEL_H
#define SPILLWAY_TESTS_FUZZ_CONFIG_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "config.h"

typedef enum model_verdict {
  MODEL_OK = 0,
  MODEL_BAD = 1,
  MODEL_EITHER = 2, /* within double precision of a bound: accepting and refusing are fair */
} model_verdict_t;

/* The variables the model knows, in the order of model_vars[]. TMPDIR is last: it is not
 * a SPILLWAY_* variable and SPW_CONFIG_IGNORE_ENV does not hide it. */
enum {
  MV_DEVICE,
  MV_BACKEND,
  MV_DEVICE_LIMIT,
  MV_HOST_LIMIT,
  MV_DISK_LIMIT,
  MV_SPILL_DIR,
  MV_IO,
  MV_HIGH_WATERMARK,
  MV_LOW_WATERMARK,
  MV_LOG_LEVEL,
  MV_HOST_DEVICE_BYTES,
  MV_STABLE_ADDRESSES,
  MV_TMPDIR,
  MODEL_NVARS
};
extern const char *const model_vars[MODEL_NVARS];

/* The size syntax of docs/config.md. Returns 1 and *out when `s` is a valid size. */
int model_size(const char *s, uint64_t *out);

typedef struct model_input {
  const spw_config_t *cfg;         /* NULL: all defaults */
  const char *env[MODEL_NVARS];    /* NULL: unset */
  uint64_t physical_memory;        /* bytes, for percentage and default host limits */
} model_input_t;

/* One setting that can fail: the name the library's message must start with
 * ("SPILLWAY_IO", "config.io", "TMPDIR", "low watermark" for the order of the two
 * watermarks), the raw value it must quote after "NAME='" (NULL when it prints a number),
 * and whether the model accepts it. */
typedef struct model_check {
  const char *name;
  const char *quoted;
  model_verdict_t verdict;
} model_check_t;

#define MODEL_MAX_CHECKS 24

typedef struct model_result {
  /* SPW_ERR_INVALID_ARG from struct_size or flags; then nothing else was checked. */
  const char *invalid_arg; /* "config.struct_size" / "config.flags", or NULL */
  model_check_t checks[MODEL_MAX_CHECKS];
  int nchecks;
  /* Where each watermark came from, for the order message: a field, a variable or
   * "default". */
  const char *high_from, *low_from;
  /* What resolution yields when every check is MODEL_OK. Fractions are approximate
   * (double); bytes are exact, except a host limit derived from a fraction. */
  spw_settings_t expect;
  int host_from_fraction; /* expect.host_limit is phys * fraction: compare loosely */
} model_result_t;

void model_resolve(const model_input_t *in, model_result_t *out);

/* The worst verdict of all checks: MODEL_OK, MODEL_EITHER or MODEL_BAD. */
model_verdict_t model_overall(const model_result_t *r);

#endif /* SPILLWAY_TESTS_FUZZ_CONFIG_MODEL_H */
