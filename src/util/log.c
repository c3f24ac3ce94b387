/* SPDX-License-Identifier: Apache-2.0 */
/* The per-runtime logger (see log.h). The whole line is formatted into a stack buffer and
 * handed to stdio in one fwrite: stdio locks the stream per call, so concurrent lines never
 * mix, and nothing here allocates (the logger must work when memory is short). */
#include "log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define SPW_LOG_LINE_MAX 1024

static const char *level_name(spw_log_level_t level) {
  switch (level) {
  case SPW_LOG_ERROR:
    return "error";
  case SPW_LOG_WARN:
    return "warn";
  case SPW_LOG_INFO:
    return "info";
  case SPW_LOG_DEBUG:
    return "debug";
  default:
    return NULL;
  }
}

int spw__log_enabled(const spw_log_t *lg, spw_log_level_t level) {
  spw_log_level_t max = lg ? lg->level : SPW_LOG_DEFAULT;
  if (max == SPW_LOG_DEFAULT) max = SPW_LOG_WARN;
  /* OFF and DEFAULT are settings of a logger, never levels of a message. */
  if (level < SPW_LOG_ERROR || level > SPW_LOG_DEBUG) return 0;
  return level <= max;
}

void spw__log(const spw_log_t *lg, spw_log_level_t level, const char *fmt, ...) {
  if (!fmt || !spw__log_enabled(lg, level)) return;
  int saved_errno = errno;

  char line[SPW_LOG_LINE_MAX];
  int n = snprintf(line, sizeof line, "spillway: %s: ", level_name(level));
  size_t len = (size_t)n;

  va_list ap;
  va_start(ap, fmt);
  int m = vsnprintf(line + len, sizeof line - len, fmt, ap);
  va_end(ap);
  if (m < 0) m = 0; /* an encoding error: print the prefix rather than nothing */
  if ((size_t)m >= sizeof line - len) {
    /* Cut: keep room for "...\n" at the end of the buffer. */
    len = sizeof line - 5;
    memcpy(line + len, "...", 3);
    len += 3;
  } else {
    len += (size_t)m;
    while (len > (size_t)n && line[len - 1] == '\n') len--;
  }
  line[len++] = '\n';
  fwrite(line, 1, len, stderr);
  errno = saved_errno;
}
