/* SPDX-License-Identifier: Apache-2.0 */
/* The test driver every test executable uses: a table of named test functions, run all in
 * order, or only those named on the command line (`test_locks acquire_n_is_all_or_nothing`),
 * or listed (`--list`). Each test's name is printed before it runs, so a failure's output
 * says which one.
 *
 * Hooks: `setup` runs before the first test that runs and `teardown` after the last (state
 * the whole file shares); `before` runs before every test and `after` after every test
 * whose `before` returned, skipped or not (a per-test fixture: the runtime, stream and
 * buffers most tests of a file start from). An `after` hook must therefore cope with a
 * test that skipped half-way.
 *
 * Skips: a test that cannot run here calls TEST_SKIP_IF (test_util.h) and skips itself
 * only: its reason is printed, it is counted, and the next test runs. The executable exits
 * 77, which CTest reports as skipped (SKIP_RETURN_CODE 77), only when every test that ran
 * skipped. A skip from `setup` skips every test; from `before`, that one test. In C a skip
 * leaves the test through longjmp (nothing of the test's frame is cleaned up: the `after`
 * hook is where fixtures are released); in C++ it is an exception that TEST()'s wrapper
 * catches, so destructors run. A skip from a thread other than the one running the tests,
 * or from a forked child, ends that process with 77, as before. */
#ifndef SPILLWAY_TESTS_TEST_MAIN_H
#define SPILLWAY_TESTS_TEST_MAIN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TEST_SKIP 77

typedef struct spw_test {
  const char *name;
  void (*fn)(void);
} spw_test_t;

typedef struct spw_suite {
  const spw_test_t *tests;
  size_t n;
  void (*setup)(void);    /* before the first test that runs (may skip them all); or NULL */
  void (*teardown)(void); /* after the last; or NULL */
  void (*each)(void);     /* before every test (may skip it); or NULL */
  void (*after)(void);    /* after every test whose `each` returned, skipped or not; or NULL */
} spw_suite_t;

int spw_test_main(const spw_suite_t *suite, int argc, char **argv);

/* Skips the current test (see above) with `why` printed. Does not return. */
#if defined(__cplusplus) || !defined(__STDC_VERSION__) || __STDC_VERSION__ < 201112L
void spw_test_skip(const char *why);
#else
_Noreturn void spw_test_skip(const char *why);
#endif

/* For C++'s TEST(): records a skip caught from the test (the driver then counts it). */
void spw_test_skipped(const char *why);

/* main() for a file whose tests are the array `tests`: TEST_MAIN_HOOKS with every hook;
 * TEST_MAIN_FULL without `after`, TEST_MAIN_WITH with setup and teardown only,
 * TEST_MAIN_FIXTURE with the per-test pair only, TEST_MAIN with none. */
#define TEST_MAIN_HOOKS(tests, setup_fn, teardown_fn, before_fn, after_fn)                   \
  int main(int argc, char **argv) {                                                          \
    spw_suite_t suite_ = {tests,       sizeof tests / sizeof tests[0],                       \
                          setup_fn,    teardown_fn,                                          \
                          before_fn,   after_fn};                                            \
    return spw_test_main(&suite_, argc, argv);                                               \
  }
#define TEST_MAIN_FULL(tests, setup_fn, teardown_fn, each_fn)                                 \
  TEST_MAIN_HOOKS(tests, setup_fn, teardown_fn, each_fn, NULL)
#define TEST_MAIN_WITH(tests, setup_fn, teardown_fn) TEST_MAIN_HOOKS(tests, setup_fn, teardown_fn, NULL, NULL)
#define TEST_MAIN_FIXTURE(tests, before_fn, after_fn) TEST_MAIN_HOOKS(tests, NULL, NULL, before_fn, after_fn)
#define TEST_MAIN(tests) TEST_MAIN_HOOKS(tests, NULL, NULL, NULL, NULL)

/* The run's random seed: SPW_TEST_SEED if set, else the clock; printed once, so that a
 * failing run can be replayed. */
uint64_t spw_test_seed(void);

#ifdef __cplusplus
}

/* In C++ a skip is this exception; TEST() wraps each test so that it is caught at the test's
 * edge (the driver is C: no exception may cross it). */
struct spw_test_skip_exception {
  const char *why;
};
#define TEST(fn)                                                                             \
  {                                                                                          \
#fn, [] {                                                                                \
      try {                                                                                  \
        fn();                                                                                \
      } catch (const spw_test_skip_exception &e_) {                                          \
        spw_test_skipped(e_.why);                                                            \
      }                                                                                      \
    }                                                                                        \
  }
#define TEST_SKIP_NOW_(why) throw spw_test_skip_exception{why}
#else
#define TEST(fn) {#fn, fn}
#define TEST_SKIP_NOW_(why) spw_test_skip(why)
#endif

/* Skips the current test when `cond` holds, printing `why`. */
#define TEST_SKIP_IF(cond, why)                                                              \
  do {                                                                                       \
    if (cond) TEST_SKIP_NOW_(why);                                                           \
  } while (0)

#endif /* SPILLWAY_TESTS_TEST_MAIN_H */
