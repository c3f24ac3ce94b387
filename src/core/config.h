/* SPDX-License-Identifier: Apache-2.0 */
/* Private header, never installed: configuration resolution.
 *
 * spw__config_resolve turns a spw_config_t (or NULL) plus the SPILLWAY_* environment into
 * the settings a runtime is built from. Precedence, per field: a non-zero (non-NULL) struct
 * field, else its environment variable (unless SPW_CONFIG_IGNORE_ENV), else the built-in
 * default. An environment variable that is empty or only spaces counts as unset. Nothing
 * is allocated and nothing is changed but *out and err; it may run on any thread (getenv
 * races with a concurrent setenv, as everywhere).
 */
#ifndef SPILLWAY_CORE_CONFIG_H
#define SPILLWAY_CORE_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "spillway/spillway.h"

#define SPW_SPILL_DIR_MAX 4096

typedef struct spw_settings {
  int device;
  spw_backend_kind_t backend;    /* AUTO stays AUTO: the runtime decides */
  uint64_t device_limit;         /* bytes; 0 when given as a fraction */
  double device_limit_fraction;  /* of free device memory at creation; used when
                                    device_limit == 0 */
  uint64_t host_limit;           /* bytes, never 0 */
  uint64_t disk_limit;           /* bytes; 0 = no limit */
  char spill_dir[SPW_SPILL_DIR_MAX];
  spw_io_kind_t io;
  double high_watermark, low_watermark; /* 0 < low < high <= 1 */
  spw_log_level_t log_level;     /* never SPW_LOG_DEFAULT */
  uint64_t host_device_bytes;    /* never 0 */
  char trace_path[SPW_SPILL_DIR_MAX]; /* "" = no trace; "%p" already replaced */
  uint64_t trace_max;            /* bytes, never 0 */
  int stable_addresses;          /* spw_alloc gives address-stable buffers */
  int ipc;                       /* device memory exportable through CUDA IPC */
  int engine_helpers;            /* per engine worker: -1 = auto (by the cores), else 0..15 */
} spw_settings_t;

/* Resolves `cfg` (NULL = all defaults) and the environment into `out`. On failure `out` is
 * untouched and `err` (when errlen > 0; always NUL-terminated) names the variable or field
 * and what was expected: "SPILLWAY_DEVICE_LIMIT='abc': expected bytes (e.g. 4GiB) or a
 * percentage (e.g. 80%)"; on success err is "". Returns SPW_OK, SPW_ERR_CONFIG (a value
 * that cannot be parsed or makes no sense), SPW_ERR_INVALID_ARG (out NULL, struct_size too
 * small for the fields up to flags, unknown flag bits), SPW_ERR_SYSTEM (the physical memory
 * size, needed for a percentage host limit, is unavailable). */
int spw__config_resolve(const spw_config_t *cfg, spw_settings_t *out, char *err,
                        size_t errlen);

/* Parses a byte size: digits with an optional decimal fraction and an optional unit
 * B, K/KB/KiB, M/MB/MiB, G/GB/GiB, T/TB/TiB (case-insensitive, all binary: K = 1024),
 * spaces around the value and between number and unit allowed ("1.5 GiB", " 4096 ").
 * A fraction is allowed only with a unit and rounds down to whole bytes. Returns SPW_OK,
 * SPW_ERR_CONFIG (syntax, trailing garbage, more than 2^64-1 bytes), SPW_ERR_INVALID_ARG
 * (s or out NULL). *out is written only on success. */
int spw__parse_size(const char *s, uint64_t *out);

#endif /* SPILLWAY_CORE_CONFIG_H */
