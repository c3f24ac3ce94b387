/* SPDX-License-Identifier: Apache-2.0 */
/* Temporary directories that a failing test does not leave behind. test_tmpdir makes
 * $TMPDIR/spw-test-<tag>-XXXXXX (TMPDIR defaults to /tmp) and remembers it; if the process
 * then ends on a failed assertion (SIGABRT), a crash, SIGTERM from CTest's timeout, SIGINT,
 * or exit() (a skip), everything still remembered is removed, with what it holds (a mount
 * on it is detached first). A test that removes its directory itself, to check that the
 * library left it empty, says so with test_tmpdir_forget. */
#ifndef SPILLWAY_TESTS_TMPDIR_H
#define SPILLWAY_TESTS_TMPDIR_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Makes and remembers the directory; its path goes to out (len bytes). Aborts on failure. */
void test_tmpdir(char *out, size_t len, const char *tag);
/* Forgets a directory the test has removed (or will remove) itself. */
void test_tmpdir_forget(const char *path);
/* Removes the directory with what it holds, and forgets it. */
void test_tmpdir_remove(const char *path);
/* How many names `dir` holds besides . and ..; each is printed (to stderr), since a test
 * that counts them expects none. -1 if it cannot be read. */
int test_dir_entries(const char *dir);

#ifdef __cplusplus
}
#endif

#endif /* SPILLWAY_TESTS_TMPDIR_H */
