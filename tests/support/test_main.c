/* SPDX-License-Identifier: Apache-2.0 */
/* The test driver (see test_main.h). */
#include "test_main.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

uint64_t spw_test_seed(void) {
  static uint64_t seed;
  static int chosen;
  if (!chosen) {
    const char *env = getenv("SPW_TEST_SEED");
    seed = env ? strtoull(env, NULL, 0) : (uint64_t)time(NULL);
    chosen = 1;
    printf("SPW_TEST_SEED=%" PRIu64 "\n", seed);
  }
  return seed;
}

static int wanted(const spw_test_t *t, int argc, char **argv) {
  if (argc < 2) return 1;
  for (int i = 1; i < argc; i++)
    if (strcmp(argv[i], t->name) == 0) return 1;
  return 0;
}

int spw_test_main(const spw_suite_t *suite, int argc, char **argv) {
  if (argc == 2 && strcmp(argv[1], "--list") == 0) {
    for (size_t i = 0; i < suite->n; i++) printf("%s\n", suite->tests[i].name);
    return 0;
  }
  for (int i = 1; i < argc; i++) {
    size_t k = 0;
    while (k < suite->n && strcmp(argv[i], suite->tests[k].name) != 0) k++;
    if (k == suite->n) {
      fprintf(stderr, "no test named %s (--list names them)\n", argv[i]);
      return 1;
    }
  }
  int ran = 0;
  for (size_t i = 0; i < suite->n; i++) {
    if (!wanted(&suite->tests[i], argc, argv)) continue;
    if (ran++ == 0 && suite->setup) suite->setup();
    if (suite->each) suite->each();
    printf("%s\n", suite->tests[i].name);
    fflush(stdout);
    suite->tests[i].fn();
  }
  if (ran && suite->teardown) suite->teardown();
  printf("ok: %d test%s\n", ran, ran == 1 ? "" : "s");
  return 0;
}
