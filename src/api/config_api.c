/* SPDX-License-Identifier: Apache-2.0 */
/* Configuration calls that need no runtime: validation and the size syntax. */
#include <stdio.h>

#include "config.h"

int spw_config_validate(const spw_config_t *config, char *msg, size_t len) {
  spw_settings_t s;
  char err[512] = "";
  int st = spw__config_resolve(config, &s, err, sizeof err);
  if (msg && len > 0) snprintf(msg, len, "%s", st == SPW_OK ? "" : err);
  return st;
}

int spw_parse_size(const char *text, uint64_t *bytes) {
  if (!text || !bytes) return SPW_ERR_INVALID_ARG;
  return spw__parse_size(text, bytes);
}
