/* SPDX-License-Identifier: Apache-2.0 */
/* CUDA IPC on the host backend: memfd regions, opened by other processes through /proc
 * (host_ipc.h says why). */
#include "host_ipc.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static const char MAGIC[8] = "spwipc1";

/* What a handle's bytes hold. */
typedef struct wire {
  char magic[8];
  uint64_t pid;
  int64_t fd;
  uint64_t bytes; /* mapped length (page-rounded) */
  uint64_t dev, ino;
} wire_t;
_Static_assert(sizeof(wire_t) <= SPW_IPC_HANDLE_BYTES, "a host handle fits CUDA's 64 bytes");

typedef struct region {
  struct region *next;
  void *base;
  size_t bytes, asked;
  int fd;      /* -1 for an opened region: its descriptor is closed once mapped */
  int opened;  /* mapped from another process's handle */
  dev_t dev;
  ino_t ino;
} region_t;

struct spw_host_ipc {
  pthread_mutex_t mu;
  region_t *regions;
};

int spw__host_ipc_create(spw_host_ipc_t **out) {
  spw_host_ipc_t *x = calloc(1, sizeof *x);
  if (!x) return SPW_ERR_SYSTEM;
  pthread_mutex_init(&x->mu, NULL);
  *out = x;
  return SPW_OK;
}

static void region_drop(region_t *r) {
  munmap(r->base, r->bytes);
  if (r->fd >= 0) close(r->fd);
  free(r);
}

void spw__host_ipc_destroy(spw_host_ipc_t *x) {
  if (!x) return;
  for (region_t *r = x->regions, *next; r; r = next) {
    next = r->next;
    region_drop(r);
  }
  pthread_mutex_destroy(&x->mu);
  free(x);
}

static void add(spw_host_ipc_t *x, region_t *r) {
  pthread_mutex_lock(&x->mu);
  r->next = x->regions;
  x->regions = r;
  pthread_mutex_unlock(&x->mu);
}

/* Unlinks and returns the region at `base` of the given kind, or NULL. */
static region_t *take(spw_host_ipc_t *x, const void *base, int opened) {
  pthread_mutex_lock(&x->mu);
  region_t **at = &x->regions;
  while (*at && ((*at)->base != base || (*at)->opened != opened)) at = &(*at)->next;
  region_t *r = *at;
  if (r) *at = r->next;
  pthread_mutex_unlock(&x->mu);
  return r;
}

int spw__host_ipc_alloc(spw_host_ipc_t *x, size_t bytes, void **out) {
  long page = sysconf(_SC_PAGESIZE);
  size_t pg = page > 0 ? (size_t)page : 4096, len = (bytes + pg - 1) / pg * pg;
  region_t *r = calloc(1, sizeof *r);
  if (!r) return SPW_ERR_SYSTEM;
  struct stat st;
  r->fd = memfd_create("spillway-ipc", MFD_CLOEXEC);
  if (r->fd < 0 || ftruncate(r->fd, (off_t)len) != 0 || fstat(r->fd, &st) != 0) goto failed;
  r->base = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, r->fd, 0);
  if (r->base == MAP_FAILED) goto failed;
  r->bytes = len;
  r->asked = bytes;
  r->dev = st.st_dev;
  r->ino = st.st_ino;
  add(x, r);
  *out = r->base;
  return SPW_OK;
failed:;
  int err = errno;
  if (r->fd >= 0) close(r->fd);
  free(r);
  errno = err;
  return err == ENOMEM || err == ENOSPC || err == EFBIG ? SPW_ERR_OUT_OF_MEMORY : SPW_ERR_SYSTEM;
}

int spw__host_ipc_free(spw_host_ipc_t *x, void *base, size_t *bytes) {
  region_t *r = take(x, base, 0);
  if (!r) return SPW_ERR_INVALID_ARG;
  *bytes = r->asked;
  region_drop(r);
  return SPW_OK;
}

int spw__host_ipc_export(spw_host_ipc_t *x, void *base, unsigned char handle[SPW_IPC_HANDLE_BYTES]) {
  wire_t w;
  memset(&w, 0, sizeof w);
  int st = SPW_ERR_INVALID_ARG;
  pthread_mutex_lock(&x->mu);
  for (region_t *r = x->regions; r; r = r->next) {
    if (r->base != base || r->opened) continue;
    memcpy(w.magic, MAGIC, sizeof MAGIC);
    w.pid = (uint64_t)getpid();
    w.fd = r->fd;
    w.bytes = r->bytes;
    w.dev = (uint64_t)r->dev;
    w.ino = (uint64_t)r->ino;
    st = SPW_OK;
    break;
  }
  pthread_mutex_unlock(&x->mu);
  if (st == SPW_OK) {
    memset(handle, 0, SPW_IPC_HANDLE_BYTES);
    memcpy(handle, &w, sizeof w);
  }
  return st;
}

int spw__host_ipc_open(spw_host_ipc_t *x, const unsigned char handle[SPW_IPC_HANDLE_BYTES],
                       void **base) {
  wire_t w;
  memcpy(&w, handle, sizeof w);
  if (memcmp(w.magic, MAGIC, sizeof MAGIC) != 0 || w.fd < 0 || w.fd > INT32_MAX ||
      w.bytes == 0 || w.bytes > (uint64_t)SIZE_MAX / 2 || w.pid == 0 || w.pid > INT32_MAX)
    return SPW_ERR_INVALID_ARG;
  if (w.pid == (uint64_t)getpid()) return SPW_ERR_UNSUPPORTED;
  char path[64];
  snprintf(path, sizeof path, "/proc/%llu/fd/%lld", (unsigned long long)w.pid, (long long)w.fd);
  int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) return SPW_ERR_CUDA; /* the exporter, or its region, is gone */
  struct stat st;
  /* The descriptor may since name another file: the inode says whether it is the region. */
  if (fstat(fd, &st) != 0 || (uint64_t)st.st_dev != w.dev || (uint64_t)st.st_ino != w.ino ||
      (uint64_t)st.st_size < w.bytes) {
    close(fd);
    return SPW_ERR_CUDA;
  }
  region_t *r = calloc(1, sizeof *r);
  void *p = r ? mmap(NULL, (size_t)w.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : NULL;
  int err = errno;
  close(fd);
  if (!r || p == MAP_FAILED) {
    free(r);
    errno = err;
    return SPW_ERR_SYSTEM;
  }
  *r = (region_t){.base = p, .bytes = (size_t)w.bytes, .asked = (size_t)w.bytes, .fd = -1,
                  .opened = 1};
  add(x, r);
  *base = p;
  return SPW_OK;
}

int spw__host_ipc_close(spw_host_ipc_t *x, void *base) {
  region_t *r = take(x, base, 1);
  if (!r) return SPW_ERR_INVALID_ARG;
  region_drop(r);
  return SPW_OK;
}
