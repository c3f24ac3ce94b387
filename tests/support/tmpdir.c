/* SPDX-License-Identifier: Apache-2.0 */
/* Temporary directories removed however the test ends (tmpdir.h). The table is a fixed
 * array: the signal handler reads it and must not meet a half-grown one. */
#include "tmpdir.h"

#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_DIRS 64
#define PATH_LEN 4096

static char dirs[MAX_DIRS][PATH_LEN];
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int installed;

/* Removes what `fd` (a directory) holds, depth first. */
static void empty_dir(int fd) {
  DIR *d = fdopendir(fd);
  if (!d) {
    close(fd);
    return;
  }
  for (struct dirent *e; (e = readdir(d));) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    if (unlinkat(dirfd(d), e->d_name, 0) == 0) continue;
    int sub = openat(dirfd(d), e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW);
    if (sub >= 0) empty_dir(sub);
    (void)unlinkat(dirfd(d), e->d_name, AT_REMOVEDIR);
  }
  closedir(d);
}

static void remove_tree(const char *path) {
  (void)umount2(path, MNT_DETACH); /* a tmpfs a test mounted there */
  int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW);
  if (fd >= 0) empty_dir(fd);
  (void)rmdir(path);
}

static void remove_all(void) {
  for (int i = 0; i < MAX_DIRS; i++)
    if (dirs[i][0]) {
      remove_tree(dirs[i]);
      dirs[i][0] = 0;
    }
}

static void on_signal(int sig) {
  remove_all();
  signal(sig, SIG_DFL);
  raise(sig);
}

static void install(void) {
  static const int sigs[] = {SIGABRT, SIGTERM, SIGINT, SIGSEGV, SIGBUS};
  for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(sigs[i], &sa, NULL);
  }
  atexit(remove_all);
}

void test_tmpdir(char *out, size_t len, const char *tag) {
  const char *base = getenv("TMPDIR");
  if (!base || !*base) base = "/tmp";
  int n = snprintf(out, len, "%s/spw-test-%s-XXXXXX", base, tag);
  if (n < 0 || (size_t)n >= len || (size_t)n >= PATH_LEN || !mkdtemp(out)) {
    perror("test_tmpdir");
    abort();
  }
  pthread_mutex_lock(&mu);
  if (!installed) install();
  installed = 1;
  int slot = -1;
  for (int i = 0; i < MAX_DIRS && slot < 0; i++)
    if (!dirs[i][0]) slot = i;
  if (slot >= 0) memcpy(dirs[slot], out, (size_t)n + 1);
  pthread_mutex_unlock(&mu);
  if (slot < 0) {
    fprintf(stderr, "test_tmpdir: more than %d directories at once\n", MAX_DIRS);
    abort();
  }
}

void test_tmpdir_forget(const char *path) {
  pthread_mutex_lock(&mu);
  for (int i = 0; i < MAX_DIRS; i++)
    if (dirs[i][0] && !strcmp(dirs[i], path)) dirs[i][0] = 0;
  pthread_mutex_unlock(&mu);
}

void test_tmpdir_remove(const char *path) {
  remove_tree(path);
  test_tmpdir_forget(path);
}

int test_dir_entries(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return -1;
  int n = 0;
  for (struct dirent *e; (e = readdir(d));)
    if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) {
      fprintf(stderr, "  left in %s: %s\n", dir, e->d_name);
      n++;
    }
  closedir(d);
  return n;
}
