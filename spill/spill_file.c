/* SPDX-License-Identifier: Apache-2.0 */
/* The runtime's private spill file and its extent allocator (contract: spill_file.h).
 *
 * The file is anonymous from birth (O_TMPFILE, or an O_EXCL name unlinked at once), mode
 * 0600, and O_DIRECT where the file system allows it, so no other user can open it and its
 * blocks go back to the file system when the process exits, however it exits.
 *
 * Invariants, all under `mu`:
 *  - `size` is the file size we manage; it is a multiple of `align` and never exceeds
 *    `limit` (when there is one: a limit below the alignment admits nothing);
 *  - the free list and the hole list are sorted by offset, their extents are aligned,
 *    non-empty, lie inside [0, size), never overlap and never touch (touching neighbours
 *    are merged at once);
 *  - every byte of [0, size) is either in exactly one free extent or handed out:
 *    in_use + sum(free) == size;
 *  - every hole lies inside the free list, and every free byte outside the holes has its
 *    blocks reserved: an extent handed out is reserved whole;
 *  - a failed allocation leaves size, the free list and in_use as they were.
 * Space is reserved with fallocate before an extent is handed out, so ENOSPC shows up here
 * and not in the middle of a write. Extents that come back stay reserved, and are reused
 * without a system call, until a grow step of them has come back: then a sweep is due, and
 * the owner's maintenance calls (spw__spill_file_sweep) punch out the free space that is not
 * a hole yet, a few punches per call (the file system gets the blocks back); punched space
 * is reserved again when handed out. Punching each extent as it came back cost a
 * synchronous discard per buffer read back from disk on file systems mounted with discard,
 * and a whole sweep run by the free that crossed the step stalled the reads behind this
 * mutex for as long as the free list was long (issue 17): so a free never punches. A full
 * file system still sweeps at once, before it reports ENOSPC.
 */
#include "spill_file.h"

#include "grow.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "spillway/spillway.h"

#define SPW_FILE_MIN_ALIGN 4096u
#define SPW_FILE_DEFAULT_STEP ((uint64_t)256 << 20)
/* off_t is signed: no extent may end past this. */
#define SPW_FILE_MAX_BYTES ((uint64_t)INT64_MAX)

/* A sorted list of disjoint, non-touching extents. */
typedef struct ranges {
  spw_disk_extent_t *v;
  size_t n, cap;
} ranges_t;

struct spw_spill_file {
  int fd;
  int direct;
  int no_fallocate; /* the file system has no fallocate: grow with ftruncate (sparse) */
  size_t align;
  int has_limit;
  uint64_t limit; /* rounded down to align (0 when it is smaller: nothing fits) */
  uint64_t grow_step;
  spw_file_log_fn log;
  void *log_ctx;

  pthread_mutex_t mu; /* guards everything below; leaf lock (no callback runs under it) */
  uint64_t size;
  ranges_t free;   /* free space */
  ranges_t holes;  /* free space punched out: handed out, it is reserved again */
  uint64_t slack;  /* bytes that came back since the last sweep (free, still reserved) */
  int sweeping;      /* a step-by-step sweep is under way (spw__spill_file_sweep) */
  uint64_t sweep_at; /* ... and has punched everything below this offset */
  int punch_failed_logged;
  /* Written under mu, read without it by spw__spill_file_bytes_in_use. */
  _Atomic uint64_t in_use;
};

static void file_log(spw_file_log_fn log, void *ctx, int level, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void file_log(spw_file_log_fn log, void *ctx, int level, const char *fmt, ...) {
  if (!log) return;
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  log(ctx, level, msg);
}

/* Messages composed under the mutex and sent after it is released: the sink is the
 * runtime's logger, and no callback runs while we hold a lock. */
typedef struct deferred_log {
  int n;
  int level[2];
  char text[2][384];
} deferred_log_t;

static void defer_log(deferred_log_t *d, int level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void defer_log(deferred_log_t *d, int level, const char *fmt, ...) {
  if (d->n >= 2) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(d->text[d->n], sizeof d->text[0], fmt, ap);
  va_end(ap);
  d->level[d->n++] = level;
}

static void flush_log(const spw_spill_file_t *f, const deferred_log_t *d) {
  for (int i = 0; i < d->n; i++)
    if (f->log) f->log(f->log_ctx, d->level[i], d->text[i]);
}


static const char *errno_name(int e) {
  const char *n = strerrorname_np(e);
  return n ? n : "errno";
}

static int is_disk_full_errno(int e) { return e == ENOSPC || e == EDQUOT || e == EFBIG; }

/* ---- opening ------------------------------------------------------------------------- */

static int tmpfile_refused(int e) { return e == EOPNOTSUPP || e == EISDIR || e == EINVAL; }

/* A name nobody can guess, for file systems without O_TMPFILE. The name only has to live
 * between open and unlink, O_EXCL guards against a collision, and the caller retries. */
static void random_name(char *out, size_t len, const char *dir) {
  uint64_t r[2] = {0, 0};
  if (getrandom(r, sizeof r, GRND_NONBLOCK) != (ssize_t)sizeof r) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    r[0] ^= ((uint64_t)ts.tv_sec << 32) ^ (uint64_t)ts.tv_nsec ^ (uint64_t)getpid() << 16;
    r[1] ^= (uint64_t)(uintptr_t)out * 0x9E3779B97F4A7C15ull ^ r[0] * 0xBF58476D1CE4E5B9ull;
  }
  snprintf(out, len, "%s/.spillway-%016" PRIx64 "%016" PRIx64, dir, r[0], r[1]);
}

/* Removes the names that processes killed between their create and their unlink left in
 * dir: no handler runs for SIGKILL, so the next runtime to open a file there cleans up. Such
 * a name is ours by its form (.spillway- and 32 hex digits), owner, mode 0600 and size 0
 * (nothing is written before the unlink); a live runtime holds its name for microseconds,
 * so one older than a minute belongs to nobody. */
static void sweep_stale_names(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return;
  time_t now = time(NULL);
  for (struct dirent *e; (e = readdir(d));) {
    static const char prefix[] = ".spillway-";
    if (strncmp(e->d_name, prefix, sizeof prefix - 1) != 0 ||
        strlen(e->d_name) != sizeof prefix - 1 + 32)
      continue;
    struct stat st;
    if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    if (!S_ISREG(st.st_mode) || st.st_uid != geteuid() || st.st_size != 0 ||
        (st.st_mode & 07777) != 0600 || st.st_mtime > now - 60)
      continue;
    (void)unlinkat(dirfd(d), e->d_name, 0);
  }
  closedir(d);
}

/* Turns O_DIRECT on for an open file; fcntl checks the same capability open does. */
static int enable_direct(int fd) {
  int fl = fcntl(fd, F_GETFL);
  if (fl < 0) return -errno;
  if (fcntl(fd, F_SETFL, fl | O_DIRECT) != 0) return -errno;
  return 0;
}

/* Opens the anonymous file; *direct tells whether O_DIRECT is on. Returns the fd or
 * -errno of the failure that matters. */
static int open_anonymous(const char *dir, int *direct, int *named, int *direct_errno) {
  *direct = 0;
  *named = 0;
  *direct_errno = 0;
  int fd = open(dir, O_TMPFILE | O_RDWR | O_DIRECT | O_CLOEXEC, 0600);
  if (fd >= 0) {
    *direct = 1;
    return fd;
  }
  int e = errno;
  if (!tmpfile_refused(e)) return -e;
  /* EINVAL is ambiguous: O_TMPFILE unsupported, or O_DIRECT refused (ramfs; tmpfs before
   * Linux 6.6). Trying O_TMPFILE alone tells them apart. */
  fd = open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd >= 0) {
    int d = enable_direct(fd);
    *direct = d == 0;
    *direct_errno = d == 0 ? 0 : -d;
    return fd;
  }
  e = errno;
  if (!tmpfile_refused(e)) return -e;
  /* No O_TMPFILE here: a fresh name, created 0600 with O_EXCL, unlinked at once. O_DIRECT
   * is switched on afterwards so a refusal cannot leave the name behind. */
  *named = 1;
  char path[4096 + 64];
  if (strlen(dir) > 4096) return -ENAMETOOLONG; /* a cut name could land outside dir */
  for (int tries = 0; tries < 16; tries++) {
    random_name(path, sizeof path, dir);
    fd = open(path, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    if (fd >= 0) break;
    if (errno != EEXIST) return -errno;
  }
  if (fd < 0) return -EEXIST;
  /* ENOENT: another runtime's sweep took the name while we were stopped in between. */
  if (unlink(path) != 0 && errno != ENOENT) {
    e = errno;
    close(fd);
    return -e;
  }
  sweep_stale_names(dir);
  int d = enable_direct(fd);
  *direct = d == 0;
  *direct_errno = d == 0 ? 0 : -d;
  return fd;
}

static size_t probe_alignment(int fd) {
  size_t align = SPW_FILE_MIN_ALIGN;
#ifdef STATX_DIOALIGN
  struct statx sx;
  if (statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) == 0 && (sx.stx_mask & STATX_DIOALIGN)) {
    /* Memory and offset alignment are both honoured: callers align buffers and offsets to
     * one value. Only powers of two up to 1 MiB are believed. */
    uint32_t m = sx.stx_dio_mem_align > sx.stx_dio_offset_align ? sx.stx_dio_mem_align
                                                               : sx.stx_dio_offset_align;
    if (m > align && m <= (1u << 20) && (m & (m - 1)) == 0) align = m;
  }
#endif
  return align;
}

int spw__spill_file_open(const char *dir, uint64_t limit, uint64_t grow_step,
                         spw_file_log_fn log, void *log_ctx, spw_spill_file_t **out) {
  if (!out) return SPW_ERR_INVALID_ARG;
  if (!dir || !*dir) {
    file_log(log, log_ctx, SPW_LOG_ERROR, "spill directory: not set");
    return SPW_ERR_CONFIG;
  }
  struct stat st;
  int not_dir = stat(dir, &st) != 0 ? errno : S_ISDIR(st.st_mode) ? 0 : ENOTDIR;
  if (not_dir) {
    int e = not_dir;
    file_log(log, log_ctx, SPW_LOG_ERROR, "spill directory '%s': %s", dir, strerror(e));
    return SPW_ERR_CONFIG;
  }
  if (access(dir, W_OK | X_OK) != 0) {
    int e = errno;
    file_log(log, log_ctx, SPW_LOG_ERROR, "spill directory '%s' is not writable: %s", dir,
             strerror(e));
    return SPW_ERR_CONFIG;
  }

  int direct, named, direct_errno;
  int fd = open_anonymous(dir, &direct, &named, &direct_errno);
  if (fd < 0) {
    int e = -fd;
    file_log(log, log_ctx, SPW_LOG_ERROR, "spill file in '%s': %s (%s)", dir, strerror(e),
             errno_name(e));
    return (e == EACCES || e == EPERM || e == EROFS || e == ENOENT || e == ENOTDIR)
               ? SPW_ERR_CONFIG
               : SPW_ERR_SYSTEM;
  }
  /* The umask may only have narrowed 0600; make it exact regardless. */
  (void)fchmod(fd, 0600);
  if (named)
    file_log(log, log_ctx, SPW_LOG_INFO,
             "spill file in '%s': O_TMPFILE unsupported, created and unlinked a private name",
             dir);
  if (!direct)
    file_log(log, log_ctx, SPW_LOG_WARN,
             "spill file in '%s': O_DIRECT refused (%s): using buffered I/O", dir,
             errno_name(direct_errno ? direct_errno : EINVAL));

  spw_spill_file_t *f = calloc(1, sizeof *f);
  if (!f) {
    close(fd);
    return SPW_ERR_SYSTEM;
  }
  if (pthread_mutex_init(&f->mu, NULL) != 0) {
    free(f);
    close(fd);
    return SPW_ERR_SYSTEM;
  }
  f->fd = fd;
  f->direct = direct;
  f->align = direct ? probe_alignment(fd) : SPW_FILE_MIN_ALIGN;
  f->log = log;
  f->log_ctx = log_ctx;
  f->has_limit = limit != 0;
  f->limit = limit / f->align * f->align;
  uint64_t step = grow_step ? grow_step : SPW_FILE_DEFAULT_STEP;
  if (step > SPW_FILE_MAX_BYTES / 2) step = SPW_FILE_MAX_BYTES / 2;
  f->grow_step = (step + f->align - 1) / f->align * f->align;
  atomic_init(&f->in_use, 0);
  *out = f;
  return SPW_OK;
}

void spw__spill_file_close(spw_spill_file_t *f) {
  if (!f) return;
  close(f->fd);
  pthread_mutex_destroy(&f->mu);
  free(f->free.v);
  free(f->holes.v);
  free(f);
}

int spw__spill_file_fd(const spw_spill_file_t *f) { return f ? f->fd : -1; }
size_t spw__spill_file_alignment(const spw_spill_file_t *f) {
  return f ? f->align : SPW_FILE_MIN_ALIGN;
}
int spw__spill_file_is_direct(const spw_spill_file_t *f) { return f ? f->direct : 0; }

uint64_t spw__spill_file_bytes_in_use(const spw_spill_file_t *f) {
  /* atomic_load takes a non-const pointer in C11; the read does not modify. */
  return f ? atomic_load(&((spw_spill_file_t *)f)->in_use) : 0;
}

/* ---- extent lists (all under mu) ------------------------------------------------------ */

/* Index of the first extent with off >= `off`. */
static size_t ranges_lower_bound(const ranges_t *l, uint64_t off) {
  size_t lo = 0, hi = l->n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (l->v[mid].off < off) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/* Space for `more` entries, so that a later insert or split cannot fail half way. */
static int ranges_reserve(ranges_t *l, size_t more) {
  spw_disk_extent_t *p = spw__grow(l->v, &l->cap, l->n + more, sizeof *p, 16);
  if (!p) return SPW_ERR_SYSTEM;
  l->v = p;
  return SPW_OK;
}

static void ranges_remove_at(ranges_t *l, size_t i) {
  memmove(&l->v[i], &l->v[i + 1], (l->n - i - 1) * sizeof l->v[0]);
  l->n--;
}

/* Inserts [off, off+bytes) and merges it with touching neighbours. Needs ranges_reserve(1)
 * first; the range must not overlap an extent of the list (checked by the caller). */
static void ranges_insert(ranges_t *l, uint64_t off, uint64_t bytes) {
  size_t i = ranges_lower_bound(l, off);
  int merge_prev = i > 0 && l->v[i - 1].off + l->v[i - 1].bytes == off;
  int merge_next = i < l->n && off + bytes == l->v[i].off;
  if (merge_prev && merge_next) {
    l->v[i - 1].bytes += bytes + l->v[i].bytes;
    ranges_remove_at(l, i);
  } else if (merge_prev) {
    l->v[i - 1].bytes += bytes;
  } else if (merge_next) {
    l->v[i].off = off;
    l->v[i].bytes += bytes;
  } else {
    memmove(&l->v[i + 1], &l->v[i], (l->n - i) * sizeof l->v[0]);
    l->v[i].off = off;
    l->v[i].bytes = bytes;
    l->n++;
  }
}

/* Does [off, off+bytes) overlap any extent of the list? */
static int ranges_overlap(const ranges_t *l, uint64_t off, uint64_t bytes) {
  size_t i = ranges_lower_bound(l, off);
  if (i > 0 && l->v[i - 1].off + l->v[i - 1].bytes > off) return 1;
  if (i < l->n && l->v[i].off < off + bytes) return 1;
  return 0;
}

/* Removes [off, off+bytes) from the list, wherever it overlaps. Needs ranges_reserve(1)
 * first (one extent may split in two). */
static void ranges_subtract(ranges_t *l, uint64_t off, uint64_t bytes) {
  uint64_t end = off + bytes;
  size_t i = ranges_lower_bound(l, off);
  if (i > 0 && l->v[i - 1].off + l->v[i - 1].bytes > off) i--;
  while (i < l->n && l->v[i].off < end) {
    spw_disk_extent_t *x = &l->v[i];
    uint64_t x_end = x->off + x->bytes;
    if (x->off < off && x_end > end) { /* splits: the head stays here, the tail after it */
      memmove(&l->v[i + 2], &l->v[i + 1], (l->n - i - 1) * sizeof l->v[0]);
      l->n++;
      l->v[i + 1] = (spw_disk_extent_t){end, x_end - end};
      x->bytes = off - x->off;
      return;
    }
    if (x->off < off) { /* keeps its head */
      x->bytes = off - x->off;
      i++;
    } else if (x_end > end) { /* keeps its tail */
      x->bytes = x_end - end;
      x->off = end;
      return;
    } else {
      ranges_remove_at(l, i);
    }
  }
}

/* Takes `bytes` from the front of free extent i. */
static uint64_t free_take(spw_spill_file_t *f, size_t i, uint64_t bytes) {
  uint64_t off = f->free.v[i].off;
  f->free.v[i].off += bytes;
  f->free.v[i].bytes -= bytes;
  if (f->free.v[i].bytes == 0) ranges_remove_at(&f->free, i);
  return off;
}

/* ---- space reservation ----------------------------------------------------------------- */

static int punch(spw_spill_file_t *f, uint64_t off, uint64_t len) {
  int r;
  do r = fallocate(f->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)off, (off_t)len);
  while (r != 0 && errno == EINTR);
  return r == 0 || errno == EOPNOTSUPP ? 0 : -errno;
}

/* Reserves blocks for [off, off+len). keep_size: inside the file (a reused extent);
 * otherwise the file grows to off+len. Returns 0 or -errno; on failure the file is as it
 * was (a partial fallocate is cut back). */
static int reserve_blocks(spw_spill_file_t *f, uint64_t off, uint64_t len, int keep_size,
                          deferred_log_t *dl) {
  if (!f->no_fallocate) {
    int r;
    do r = fallocate(f->fd, keep_size ? FALLOC_FL_KEEP_SIZE : 0, (off_t)off, (off_t)len);
    while (r != 0 && errno == EINTR);
    if (r == 0) return 0;
    int e = errno;
    if (e != EOPNOTSUPP && e != EINVAL) {
      /* Some file systems (ext4) keep what a failed fallocate allocated, and move the size
       * along: give it back so that nothing changes. */
      if (keep_size) (void)punch(f, off, len);
      else if (ftruncate(f->fd, (off_t)f->size) != 0) { /* nothing more to undo it with */
      }
      return -e;
    }
    /* No fallocate here (ramfs answers EINVAL): grow sparsely. ENOSPC then surfaces at
     * write time, which the I/O layer reports as SPW_ERR_DISK_FULL. */
    f->no_fallocate = 1;
    defer_log(dl, SPW_LOG_INFO, "spill file: fallocate unsupported (%s): growing with ftruncate",
              errno_name(e));
  }
  if (keep_size) return 0;
  return ftruncate(f->fd, (off_t)(off + len)) == 0 ? 0 : -errno;
}

static int status_of_errno(int e) { return is_disk_full_errno(e) ? SPW_ERR_DISK_FULL : SPW_ERR_IO; }

/* Grows the file so that a free extent of `need` bytes exists at its end (the free tail, if
 * any, counts). Grows by whole grow_steps where room allows, else by exactly what is
 * missing. */
static int grow_for(spw_spill_file_t *f, uint64_t need, deferred_log_t *dl) {
  uint64_t tail = 0;
  if (f->free.n > 0) {
    const spw_disk_extent_t *last = &f->free.v[f->free.n - 1];
    if (last->off + last->bytes == f->size) tail = last->bytes;
  }
  uint64_t missing = need - tail; /* need > tail, or the first fit would have found it */
  uint64_t cap = f->has_limit ? f->limit : SPW_FILE_MAX_BYTES / f->align * f->align;
  if (f->size > cap || missing > cap - f->size) return SPW_ERR_DISK_FULL;
  uint64_t want = (missing + f->grow_step - 1) / f->grow_step * f->grow_step;
  if (want > cap - f->size) want = cap - f->size;
  int st = ranges_reserve(&f->free, 1);
  if (st != SPW_OK) return st;
  int r = reserve_blocks(f, f->size, want, 0, dl);
  if (r != 0 && is_disk_full_errno(-r) && want > missing) {
    /* A whole step does not fit: the file system may still hold what is missing. */
    want = missing;
    r = reserve_blocks(f, f->size, want, 0, dl);
  }
  if (r != 0) {
    if (!is_disk_full_errno(-r))
      defer_log(dl, SPW_LOG_ERROR, "spill file: growing to %" PRIu64 " B: %s", f->size + want,
                strerror(-r));
    return status_of_errno(-r);
  }
  ranges_insert(&f->free, f->size, want);
  f->size += want;
  return SPW_OK;
}

static void punch_logged(spw_spill_file_t *f, uint64_t off, uint64_t len, deferred_log_t *dl) {
  int r = punch(f, off, len);
  if (r != 0 && !f->punch_failed_logged) {
    f->punch_failed_logged = 1;
    defer_log(dl, SPW_LOG_WARN,
              "spill file: punching freed space failed (%s): disk space returns at close",
              strerror(-r));
  }
}

/* Punches out the free space that is not a hole yet, so that the file system gets the
 * blocks back; all free space is then a hole. Holes lie inside free extents (invariant), so
 * one walk over both sorted lists finds the gaps. Without memory for the hole list nothing
 * is punched (safe: the space stays reserved). */
static void sweep(spw_spill_file_t *f, deferred_log_t *dl) {
  f->slack = 0;
  if (f->no_fallocate || ranges_reserve(&f->holes, f->free.n) != SPW_OK) return;
  size_t h = 0;
  for (size_t i = 0; i < f->free.n; i++) {
    uint64_t at = f->free.v[i].off, end = at + f->free.v[i].bytes;
    for (; h < f->holes.n && f->holes.v[h].off < end; h++) {
      if (f->holes.v[h].off > at) punch_logged(f, at, f->holes.v[h].off - at, dl);
      at = f->holes.v[h].off + f->holes.v[h].bytes;
    }
    if (at < end) punch_logged(f, at, end - at, dl);
  }
  memcpy(f->holes.v, f->free.v, f->free.n * sizeof f->free.v[0]);
  f->holes.n = f->free.n;
  f->sweeping = 0;
}

/* A step's punches are at most this long: a punch holds the file's inode lock (and, on a
 * file system mounted with discard, discards the range), so a transfer that comes during a
 * step waits for a bounded one, not for a whole file's worth of freed space. */
#define PUNCH_MAX ((uint64_t)64 << 20)

/* Under f->mu. A step is due while a sweep is under way, or once a grow step of freed space
 * has come back since the last one. */
static int sweep_is_due(const spw_spill_file_t *f) {
  return !f->no_fallocate && (f->sweeping || f->slack >= f->grow_step);
}

/* One step of a sweep: punches at most `max` gaps (free space that is not a hole; each cut
 * to PUNCH_MAX) at or above sweep_at, each becoming a hole at once. Returns 1 if gaps are
 * left. */
static int sweep_step(spw_spill_file_t *f, unsigned max, deferred_log_t *dl) {
  unsigned punched = 0;
  size_t i = ranges_lower_bound(&f->free, f->sweep_at);
  if (i > 0 && f->free.v[i - 1].off + f->free.v[i - 1].bytes > f->sweep_at) i--;
  for (; i < f->free.n; i++) {
    uint64_t end = f->free.v[i].off + f->free.v[i].bytes;
    uint64_t at = f->free.v[i].off > f->sweep_at ? f->free.v[i].off : f->sweep_at;
    while (at < end) {
      size_t h = ranges_lower_bound(&f->holes, at);
      if (h > 0 && f->holes.v[h - 1].off + f->holes.v[h - 1].bytes > at) h--;
      if (h < f->holes.n && f->holes.v[h].off <= at) { /* inside a hole: skip it */
        at = f->holes.v[h].off + f->holes.v[h].bytes;
        continue;
      }
      uint64_t gap_end = h < f->holes.n && f->holes.v[h].off < end ? f->holes.v[h].off : end;
      if (gap_end - at > PUNCH_MAX) gap_end = at + PUNCH_MAX; /* aligned: so is PUNCH_MAX */
      if (punched == max) {
        f->sweep_at = at;
        return 1;
      }
      if (ranges_reserve(&f->holes, 1) != SPW_OK) { /* no memory: the space stays reserved */
        f->sweeping = 0;
        return 0;
      }
      punch_logged(f, at, gap_end - at, dl);
      ranges_insert(&f->holes, at, gap_end - at);
      punched++;
      at = gap_end;
    }
  }
  f->sweeping = 0;
  return 0;
}

/* First fit for `need` bytes, growing the file when nothing fits. */
static int find_fit(spw_spill_file_t *f, uint64_t need, size_t *index, deferred_log_t *dl) {
  size_t i = 0;
  for (;;) {
    while (i < f->free.n && f->free.v[i].bytes < need) i++;
    if (i < f->free.n) break;
    int st = grow_for(f, need, dl);
    if (st != SPW_OK) return st;
    /* Growth extended or appended the last extent; earlier ones are still too small. */
    i = f->free.n - 1;
  }
  *index = i;
  return SPW_OK;
}

int spw__spill_file_alloc(spw_spill_file_t *f, uint64_t bytes, spw_disk_extent_t *out) {
  if (!f || !out || bytes == 0) return SPW_ERR_INVALID_ARG;
  if (bytes > SPW_FILE_MAX_BYTES - f->align) return SPW_ERR_DISK_FULL;
  uint64_t need = (bytes + f->align - 1) / f->align * f->align;
  deferred_log_t dl = {0};

  pthread_mutex_lock(&f->mu);
  size_t i = 0;
  int st = find_fit(f, need, &i, &dl);
  /* The file system is full, but space that came back is still reserved: give it back and
   * try again. A sweep under way counts: it zeroed the slack when it began, and the free
   * space it has not reached yet is still reserved. */
  if (st == SPW_ERR_DISK_FULL && (f->slack > 0 || f->sweeping)) {
    sweep(f, &dl);
    st = find_fit(f, need, &i, &dl);
  }
  if (st != SPW_OK) goto out;
  uint64_t off = f->free.v[i].off;
  if (ranges_reserve(&f->holes, 1) != SPW_OK) {
    st = SPW_ERR_SYSTEM;
    goto out;
  }
  if (!ranges_overlap(&f->holes, off, need)) {
    /* Reserved: space that came back and is handed out again leaves the slack. */
    f->slack = f->slack > need ? f->slack - need : 0;
  } else {
    /* Punched when it came back: reserve its blocks again, so that a full disk is reported
     * now rather than by the write (on blocks already reserved, a cheap walk). */
    int r = reserve_blocks(f, off, need, 1, &dl);
    if (r != 0 && is_disk_full_errno(-r) && (f->slack > 0 || f->sweeping)) {
      sweep(f, &dl); /* the extent stays first fit: only holes were added */
      if (ranges_reserve(&f->holes, 1) != SPW_OK) {
        st = SPW_ERR_SYSTEM;
        goto out;
      }
      r = reserve_blocks(f, off, need, 1, &dl);
    }
    if (r != 0) {
      if (!is_disk_full_errno(-r))
        defer_log(&dl, SPW_LOG_ERROR, "spill file: reserving %" PRIu64 " B at %" PRIu64 ": %s",
                  need, off, strerror(-r));
      /* A failed reservation is undone by punching the whole range: all of it is a hole. */
      ranges_subtract(&f->holes, off, need);
      ranges_insert(&f->holes, off, need);
      st = status_of_errno(-r);
      goto out;
    }
    ranges_subtract(&f->holes, off, need);
  }
  free_take(f, i, need);
  atomic_fetch_add(&f->in_use, need);
  out->off = off;
  out->bytes = need;
out:
  pthread_mutex_unlock(&f->mu);
  flush_log(f, &dl);
  return st;
}

int spw__spill_file_free(spw_spill_file_t *f, spw_disk_extent_t *e) {
  if (!f || !e || e->bytes == 0) return 0;
  deferred_log_t dl = {0};
  pthread_mutex_lock(&f->mu);
  if (e->off % f->align || e->bytes % f->align || e->off > f->size ||
      e->bytes > f->size - e->off || ranges_overlap(&f->free, e->off, e->bytes)) {
    /* A double free or a forged extent: refusing it keeps the allocator consistent. */
    defer_log(&dl, SPW_LOG_ERROR,
              "spill file: ignoring free of [%" PRIu64 ", +%" PRIu64 "): not in use (double free?)",
              e->off, e->bytes);
  } else if (ranges_reserve(&f->free, 1) != SPW_OK) {
    /* No memory for the free list: the range stays allocated until close, which is safe,
     * unlike losing track of it. */
    defer_log(&dl, SPW_LOG_ERROR, "spill file: out of memory freeing an extent (space leaked)");
  } else {
    /* Still reserved: the next allocation reuses it without a system call. Punching happens
     * under this mutex, so it can never hit data written by the range's next owner. */
    ranges_insert(&f->free, e->off, e->bytes);
    atomic_fetch_sub(&f->in_use, e->bytes);
    f->slack += e->bytes;
    e->off = 0;
    e->bytes = 0;
  }
  int due = sweep_is_due(f);
  pthread_mutex_unlock(&f->mu);
  flush_log(f, &dl);
  return due;
}

int spw__spill_file_sweep_due(spw_spill_file_t *f) {
  if (!f) return 0;
  pthread_mutex_lock(&f->mu);
  int due = sweep_is_due(f);
  pthread_mutex_unlock(&f->mu);
  return due;
}

int spw__spill_file_sweep(spw_spill_file_t *f, unsigned max_punches) {
  if (!f) return 0;
  deferred_log_t dl = {0};
  pthread_mutex_lock(&f->mu);
  if (!f->sweeping && !f->no_fallocate && f->slack >= f->grow_step) {
    f->sweeping = 1;
    f->sweep_at = 0;
    f->slack = 0; /* what comes back from now on counts towards the next sweep */
  }
  int more = f->sweeping && sweep_step(f, max_punches, &dl);
  pthread_mutex_unlock(&f->mu);
  flush_log(f, &dl);
  return more;
}

