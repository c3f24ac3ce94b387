/* SPDX-License-Identifier: Apache-2.0 */
/* Status strings: spw_strerror and spw_err_name, both generated from SPW_STATUS_MAP in
 * spillway.h so that a code added to the table gets its name and text with no edit here;
 * and spw_status_has_detail, the one list of statuses whose failing call records a detail
 * (the launch wrappers and the Python binding both ask it).
 * The returned strings are static literals: never NULL, safe from any thread. */
#include "spillway/spillway.h"

static const char spw_unknown_status[] = "unknown status";

SPW_API const char *spw_strerror(int status) {
  switch (status) {
#define SPW__STATUS_TEXT(name, value, text) \
  case SPW_##name:                          \
    return text;
    SPW_STATUS_MAP(SPW__STATUS_TEXT)
#undef SPW__STATUS_TEXT
  default:
    return spw_unknown_status;
  }
}

SPW_API const char *spw_err_name(int status) {
  switch (status) {
#define SPW__STATUS_NAME(name, value, text) \
  case SPW_##name:                          \
    return "SPW_" #name;
    SPW_STATUS_MAP(SPW__STATUS_NAME)
#undef SPW__STATUS_NAME
  default:
    return spw_unknown_status;
  }
}

SPW_API int spw_status_has_detail(int status) {
  switch (status) {
  case SPW_ERR_CUDA:
  case SPW_ERR_IO:
  case SPW_ERR_SYSTEM:
  case SPW_ERR_OUT_OF_MEMORY:
  case SPW_ERR_HOST_OUT_OF_MEMORY:
  case SPW_ERR_DISK_FULL:
  case SPW_ERR_WRONG_DEVICE:
    return 1;
  default:
    return 0;
  }
}
