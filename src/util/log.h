/* SPDX-License-Identifier: Apache-2.0 */
/* Private header, never installed: the per-runtime logger.
 *
 * A logger is a level, owned by the runtime that created it (no process-wide state). A
 * message is printed when its level is ERROR..DEBUG and not above the logger's level; a
 * logger at SPW_LOG_OFF prints nothing, and SPW_LOG_DEFAULT counts as SPW_LOG_WARN. Each
 * message is one line on stderr, "spillway: warn: text", written with a single call so
 * that lines from concurrent threads never interleave. Thread-safe; errno is preserved.
 */
#ifndef SPILLWAY_UTIL_LOG_H
#define SPILLWAY_UTIL_LOG_H

#include "spillway/spillway.h"

typedef struct spw_log {
  spw_log_level_t level;
} spw_log_t;

#if defined(__GNUC__)
#define SPW__PRINTF_LIKE(fmt_index, first_arg) \
  __attribute__((format(printf, fmt_index, first_arg)))
#else
#define SPW__PRINTF_LIKE(fmt_index, first_arg)
#endif

/* Prints one line at `level` if `lg` lets it through. `lg` NULL logs at the default level
 * (WARN). A trailing newline in `fmt` is dropped; a line longer than 1 KiB is cut and ends
 * in "...". */
void spw__log(const spw_log_t *lg, spw_log_level_t level, const char *fmt, ...)
    SPW__PRINTF_LIKE(3, 4);

/* Whether a message at `level` would be printed: lets callers skip building costly text. */
int spw__log_enabled(const spw_log_t *lg, spw_log_level_t level);

#endif /* SPILLWAY_UTIL_LOG_H */
