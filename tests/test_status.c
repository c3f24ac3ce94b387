/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests of the status strings: every code of SPW_STATUS_MAP has its own symbolic name
 * ("SPW_" + the table's name) and a non-empty text, and a code outside the table gives
 * "unknown status" from both functions, never NULL. */
#include <limits.h>

#include "test_util.h"

typedef struct entry {
  int code;
  const char *name; /* as the table spells it, with the SPW_ prefix */
} entry_t;

static const entry_t entries[] = {
#define ENTRY(name, value, text) {SPW_##name, "SPW_" #name},
    SPW_STATUS_MAP(ENTRY)
#undef ENTRY
};
#define NENTRIES (sizeof entries / sizeof entries[0])

static void every_code_has_its_table_name(void) {
  for (size_t i = 0; i < NENTRIES; i++) {
    const char *n = spw_err_name(entries[i].code);
    ASSERT_TRUE(n != NULL);
    if (strcmp(n, entries[i].name) != 0) {
      fprintf(stderr, "code %d: name '%s', expected '%s'\n", entries[i].code, n,
              entries[i].name);
      abort();
    }
  }
}

static void names_are_distinct(void) {
  for (size_t i = 0; i < NENTRIES; i++)
    for (size_t j = i + 1; j < NENTRIES; j++)
      ASSERT_TRUE(strcmp(spw_err_name(entries[i].code), spw_err_name(entries[j].code)) != 0);
}

static void codes_are_distinct(void) {
  /* Two names with one value would make the switch in status.c fail to compile, but a
   * value collision is also what would make names collide: check it directly. */
  for (size_t i = 0; i < NENTRIES; i++)
    for (size_t j = i + 1; j < NENTRIES; j++) ASSERT_NE(entries[i].code, entries[j].code);
}

static void every_code_has_text(void) {
  for (size_t i = 0; i < NENTRIES; i++) {
    const char *t = spw_strerror(entries[i].code);
    ASSERT_TRUE(t != NULL);
    ASSERT_GT(strlen(t), 0);
    ASSERT_TRUE(strcmp(t, "unknown status") != 0);
  }
}

static void ok_is_zero_and_errors_are_negative(void) {
  ASSERT_EQ(SPW_OK, 0);
  ASSERT_TRUE(strcmp(spw_err_name(0), "SPW_OK") == 0);
  for (size_t i = 0; i < NENTRIES; i++)
    if (entries[i].code != SPW_OK) ASSERT_LT(entries[i].code, 0);
}

static int in_table(int code) {
  for (size_t i = 0; i < NENTRIES; i++)
    if (entries[i].code == code) return 1;
  return 0;
}

static void unknown_code_gives_unknown_status(void) {
  const int unknown[] = {1, 42, -1000, INT_MIN, INT_MAX, -(int)NENTRIES - 1};
  for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
    ASSERT_TRUE(!in_table(unknown[i]));
    ASSERT_TRUE(strcmp(spw_strerror(unknown[i]), "unknown status") == 0);
    ASSERT_TRUE(strcmp(spw_err_name(unknown[i]), "unknown status") == 0);
  }
}

int main(void) {
  RUN(every_code_has_its_table_name);
  RUN(names_are_distinct);
  RUN(codes_are_distinct);
  RUN(every_code_has_text);
  RUN(ok_is_zero_and_errors_are_negative);
  RUN(unknown_code_gives_unknown_status);
  return 0;
}
