/* SPDX-License-Identifier: Apache-2.0 */
/* The test driver every test executable uses: a table of named test functions, run all in
 * order, or only those named on the command line (`test_locks acquire_n_is_all_or_nothing`),
 * or listed (`--list`). Each test's name is printed before it runs, so a failure's output
 * says which one. A test that cannot run here exits 77 (TEST_SKIP_IF), which CTest reports
 * as skipped. */
#ifndef SPILLWAY_TESTS_TEST_MAIN_H
#define SPILLWAY_TESTS_TEST_MAIN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct spw_test {
  const char *name;
  void (*fn)(void);
} spw_test_t;

#define TEST(fn) {#fn, fn}

typedef struct spw_suite {
  const spw_test_t *tests;
  size_t n;
  void (*setup)(void);    /* before the first test that runs (may skip them all); or NULL */
  void (*teardown)(void); /* after the last; or NULL */
  void (*each)(void);     /* before every test; or NULL */
} spw_suite_t;

int spw_test_main(const spw_suite_t *suite, int argc, char **argv);

/* main() for a file whose tests are the array `tests`, with optional setup and teardown. */
#define TEST_MAIN_FULL(tests, setup_fn, teardown_fn, each_fn)                                 \
  int main(int argc, char **argv) {                                                          \
    spw_suite_t suite_ = {tests, sizeof tests / sizeof tests[0], setup_fn, teardown_fn,      \
                          each_fn};                                                          \
    return spw_test_main(&suite_, argc, argv);                                               \
  }
#define TEST_MAIN_WITH(tests, setup_fn, teardown_fn) TEST_MAIN_FULL(tests, setup_fn, teardown_fn, NULL)
#define TEST_MAIN(tests) TEST_MAIN_FULL(tests, NULL, NULL, NULL)

/* The run's random seed: SPW_TEST_SEED if set, else the clock; printed once, so that a
 * failing run can be replayed. */
uint64_t spw_test_seed(void);

#ifdef __cplusplus
}
#endif

#endif /* SPILLWAY_TESTS_TEST_MAIN_H */
