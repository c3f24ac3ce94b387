/* SPDX-License-Identifier: Apache-2.0 */
/* A main() for fuzz targets built without libFuzzer (gcc, the plain and sanitizer builds):
 * runs LLVMFuzzerTestOneInput once on every file named on the command line, or in a
 * directory named there, and fails the way the target does (abort) on a violated property.
 * This keeps the corpus, crash regressions included, in every CTest run. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int run_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    perror(path);
    return 0;
  }
  uint8_t *buf = NULL;
  size_t n = 0, cap = 0;
  for (;;) {
    if (n == cap) {
      cap = cap ? cap * 2 : 4096;
      uint8_t *p = realloc(buf, cap);
      if (!p) abort();
      buf = p;
    }
    size_t got = fread(buf + n, 1, cap - n, f);
    if (got == 0) break;
    n += got;
  }
  fclose(f);
  printf("%s\n", path);
  fflush(stdout);
  LLVMFuzzerTestOneInput(buf, n);
  free(buf);
  return 1;
}

static int by_name(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The files of a directory, in name order, so that runs are reproducible. */
static int run_dir(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) {
    perror(dir);
    return -1;
  }
  char **names = NULL;
  size_t n = 0;
  for (struct dirent *e; (e = readdir(d));) {
    if (e->d_name[0] == '.') continue;
    char **p = realloc(names, (n + 1) * sizeof *names);
    if (!p) abort();
    names = p;
    size_t len = strlen(dir) + strlen(e->d_name) + 2;
    names[n] = malloc(len);
    if (!names[n]) abort();
    snprintf(names[n++], len, "%s/%s", dir, e->d_name);
  }
  closedir(d);
  qsort(names, n, sizeof *names, by_name);
  int ran = 0;
  for (size_t k = 0; k < n; k++) {
    ran += run_file(names[k]);
    free(names[k]);
  }
  free(names);
  return ran;
}

int main(int argc, char **argv) {
  LLVMFuzzerInitialize(&argc, &argv);
  int ran = 0;
  for (int k = 1; k < argc; k++) {
    struct stat st;
    if (stat(argv[k], &st) != 0) {
      perror(argv[k]);
      return 1;
    }
    int r = S_ISDIR(st.st_mode) ? run_dir(argv[k]) : run_file(argv[k]);
    if (r < 0) return 1;
    ran += r;
  }
  printf("%d inputs, every property held\n", ran);
  return ran > 0 ? 0 : 1;
}
