/* SPDX-License-Identifier: Apache-2.0 */
/* The test driver (see test_main.h): runs the hooks and the tests, and turns a skip into a
 * jump back to here (C) or a flag set by TEST()'s wrapper (C++). */
#include "test_main.h"

#include <inttypes.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

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

/* Where a skip lands: set while the driver runs a hook or a test, on the driver's thread
 * and in the driver's process only. */
static jmp_buf skip_to;
static int skip_armed;
static pthread_t driver_thread;
static pid_t driver_pid;
static const char *skip_why; /* the current test's skip reason, or NULL */

static int on_driver(void) {
  return skip_armed && getpid() == driver_pid && pthread_equal(pthread_self(), driver_thread);
}

void spw_test_skipped(const char *why) { skip_why = why ? why : "(no reason given)"; }

void spw_test_skip(const char *why) {
  if (!on_driver()) { /* a worker thread or a forked child: that process ends skipped */
    printf("SKIP: %s\n", why);
    fflush(stdout);
    exit(TEST_SKIP);
  }
  spw_test_skipped(why);
  longjmp(skip_to, 1);
}

/* Runs fn with skips armed; returns 1 if it skipped (skip_why says why). */
static int run_armed(void (*fn)(void)) {
  skip_why = NULL;
  if (setjmp(skip_to) == 0) {
    skip_armed = 1;
    fn();
  }
  skip_armed = 0;
  return skip_why != NULL;
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
  driver_thread = pthread_self();
  driver_pid = getpid();
  int ran = 0, skipped = 0;
  const char *all_why = NULL; /* set when `setup` skipped: every test skips with it */
  for (size_t i = 0; i < suite->n; i++) {
    const spw_test_t *t = &suite->tests[i];
    if (!wanted(t, argc, argv)) continue;
    if (ran++ == 0 && suite->setup && run_armed(suite->setup)) all_why = skip_why;
    printf("%s\n", t->name);
    fflush(stdout);
    const char *why = all_why;
    if (!why && suite->each && run_armed(suite->each)) {
      why = skip_why;
    } else if (!why) {
      if (run_armed(t->fn)) why = skip_why;
      if (suite->after && run_armed(suite->after) && !why) why = skip_why;
    }
    if (why) {
      skipped++;
      printf("SKIP: %s: %s\n", t->name, why);
      fflush(stdout);
    }
  }
  if (ran && !all_why && suite->teardown) run_armed(suite->teardown);
  printf("ok: %d test%s", ran, ran == 1 ? "" : "s");
  if (skipped) printf(", %d skipped", skipped);
  printf("\n");
  return (ran > 0 && skipped == ran) ? TEST_SKIP : 0;
}
