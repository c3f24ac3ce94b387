/* SPDX-License-Identifier: Apache-2.0 */
/* Sharing address-stable buffers with other processes (config.ipc).
 *
 * CUDA's legacy IPC refuses memory of virtual memory management: a stable buffer's chunks
 * are shared as POSIX file descriptors (cuMemExportToShareableHandle), and a descriptor is
 * not bytes: it travels over a Unix socket (SCM_RIGHTS). So an export is a capability, not
 * the descriptors themselves: the handle names this runtime's socket (an abstract name made
 * of the pid and a random nonce, so a reused pid cannot answer) and an export record (an
 * id and a random 128-bit token). A server thread, started by the first such export,
 * answers an importer's request with the descriptors of the buffer's chunks, made at that
 * moment and only while the buffer is resident and locked, which is what keeps it in place
 * (the same contract as a legacy export). The importer reserves a range, imports and maps
 * each chunk there, and closes the descriptors; spw_ipc_close unmaps and releases them.
 *
 * The server answers one request at a time, each bounded by a receive timeout, so a stuck
 * importer delays others by at most that. Records live until their buffer is freed (pruned
 * when the table is full) or the runtime is destroyed. */
#include "ipc_share.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "grow.h"
#include "stable_pool.h"

#define SHARE_MAGIC 0x56575053u /* "SPWV" */
#define SHARE_FDS_PER_MSG 64    /* well under the kernel's SCM_MAX_FD (253) */
#define SHARE_TIMEOUT_S 10      /* a peer that stops talking is dropped after this */

/* What a chunk handle carries in spw_ipc_handle_t.handle. */
typedef struct share_ref {
  uint32_t magic, version;
  uint64_t nonce, id;
  uint8_t token[16];
} share_ref_t;
_Static_assert(sizeof(share_ref_t) <= SPW_IPC_HANDLE_BYTES, "a share ref fits a handle");

typedef struct share_request {
  uint64_t id;
  uint8_t token[16];
} share_request_t;

typedef struct share_reply {
  int32_t status;
  uint32_t total, count; /* chunks in all, and descriptors with this message */
  uint32_t reserved;
  uint64_t chunk, offset; /* each chunk's bytes; the buffer's offset in the first */
  uint64_t fd_offsets[SHARE_FDS_PER_MSG];
} share_reply_t;

typedef struct share_export {
  uint64_t id;
  uint8_t token[16];
  spw_buf_t buf;
} share_export_t;

struct spw_ipc_server {
  spw_runtime_t *rt;
  int listen_fd, stop_fd;
  pthread_t thread;
  uint64_t nonce;
  pthread_mutex_t mu; /* the records */
  share_export_t *ex;
  size_t n, cap;
  uint64_t next_id;
};

/* ---- both sides ---------------------------------------------------------------------- */

static void random_bytes(void *p, size_t n) {
  uint8_t *b = p;
  size_t got = 0;
  while (got < n) {
    ssize_t r = getrandom(b + got, n - got, 0);
    if (r > 0) {
      got += (size_t)r;
    } else if (r < 0 && errno != EINTR) {
      /* No entropy source: a weaker mix still keeps names and tokens apart. */
      struct timespec t;
      clock_gettime(CLOCK_MONOTONIC, &t);
      uint64_t x = (uint64_t)t.tv_nsec ^ ((uint64_t)t.tv_sec << 30) ^ ((uint64_t)getpid() << 17);
      for (; got < n; got++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        b[got] = (uint8_t)x;
      }
    }
  }
}

/* The socket's abstract name (no file; gone with the process). */
static socklen_t share_addr(uint32_t pid, uint64_t nonce, struct sockaddr_un *a) {
  memset(a, 0, sizeof *a);
  a->sun_family = AF_UNIX;
  int len = snprintf(a->sun_path + 1, sizeof a->sun_path - 1, "spillway-ipc.%u.%016llx", pid,
                     (unsigned long long)nonce);
  return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)len);
}

static void set_timeout(int fd) {
  struct timeval tv = {.tv_sec = SHARE_TIMEOUT_S};
  (void)setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  (void)setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

/* ---- the exporter's server ------------------------------------------------------------- */

static int send_reply(int conn, const share_reply_t *r, const int *fds) {
  struct iovec iov = {(void *)r, sizeof *r};
  union {
    char buf[CMSG_SPACE(sizeof(int) * SHARE_FDS_PER_MSG)];
    struct cmsghdr align;
  } c;
  struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
  if (r->count > 0) {
    m.msg_control = c.buf;
    m.msg_controllen = CMSG_SPACE(sizeof(int) * r->count);
    struct cmsghdr *h = CMSG_FIRSTHDR(&m);
    h->cmsg_level = SOL_SOCKET;
    h->cmsg_type = SCM_RIGHTS;
    h->cmsg_len = CMSG_LEN(sizeof(int) * r->count);
    memcpy(CMSG_DATA(h), fds, sizeof(int) * r->count);
  }
  return sendmsg(conn, &m, MSG_NOSIGNAL) == (ssize_t)sizeof *r ? 0 : -1;
}

/* Whether the record `req` names exists, and its buffer if so. */
static int find_export(spw_ipc_server_t *sv, const share_request_t *req, spw_buf_t *buf) {
  int found = 0;
  pthread_mutex_lock(&sv->mu);
  for (size_t i = 0; i < sv->n && !found; i++)
    if (sv->ex[i].id == req->id && memcmp(sv->ex[i].token, req->token, 16) == 0) {
      *buf = sv->ex[i].buf;
      found = 1;
    }
  pthread_mutex_unlock(&sv->mu);
  return found;
}

/* The descriptors of the buffer's chunks, if it is still resident and locked. */
static int share_buffer(spw_runtime_t *rt, spw_buf_t buf, int **fds, uint64_t **offs,
                        size_t *n, size_t *chunk, size_t *offset) {
  spw_slot_t *s;
  uint64_t w;
  int st = spw__handles_lookup(&rt->handles, buf, &s, &w);
  if (st != SPW_OK) return st;
  if (w & SPW_W_FREE_PENDING) return SPW_ERR_FREED;
  void *va = spw__slot_va(s);
  if (!va || spw__w_count(w) == 0 || spw__w_state(w) != SPW_STATE_RESIDENT)
    return SPW_ERR_NOT_LOCKED;
  /* The pool checks again, under its own lock, that the memory is mapped. */
  return spw__stable_share(rt->stable, va, fds, offs, n, chunk, offset);
}

static void serve(spw_ipc_server_t *sv, int conn) {
  share_request_t req;
  if (recv(conn, &req, sizeof req, 0) != (ssize_t)sizeof req) return;
  share_reply_t r = {.status = SPW_ERR_INVALID_ARG};
  int *fds = NULL;
  uint64_t *offs = NULL;
  size_t n = 0, chunk = 0, offset = 0;
  spw_buf_t buf;
  if (find_export(sv, &req, &buf))
    r.status = share_buffer(sv->rt, buf, &fds, &offs, &n, &chunk, &offset);
  if (r.status != SPW_OK) {
    (void)send_reply(conn, &r, NULL);
    return;
  }
  r.total = (uint32_t)n;
  r.chunk = chunk;
  r.offset = offset;
  for (size_t at = 0; at < n;) {
    r.count = (uint32_t)(n - at < SHARE_FDS_PER_MSG ? n - at : SHARE_FDS_PER_MSG);
    memcpy(r.fd_offsets, offs + at, r.count * sizeof *offs);
    if (send_reply(conn, &r, fds + at) != 0) break;
    at += r.count;
  }
  for (size_t i = 0; i < n; i++) close(fds[i]); /* the importer holds its own copies */
  free(fds);
  free(offs);
}

static void *server_main(void *arg) {
  spw_ipc_server_t *sv = arg;
  struct pollfd p[2] = {{sv->listen_fd, POLLIN, 0}, {sv->stop_fd, POLLIN, 0}};
  for (;;) {
    if (poll(p, 2, -1) < 0 && errno != EINTR) break;
    if (p[1].revents) break;
    if (!(p[0].revents & POLLIN)) continue;
    int conn = accept4(sv->listen_fd, NULL, NULL, SOCK_CLOEXEC);
    if (conn < 0) continue;
    set_timeout(conn);
    serve(sv, conn);
    close(conn);
  }
  return NULL;
}

static int server_start(spw_runtime_t *rt, spw_ipc_server_t **out) {
  spw_ipc_server_t *sv = calloc(1, sizeof *sv);
  if (!sv) return SPW_ERR_SYSTEM;
  sv->rt = rt;
  sv->next_id = 1;
  random_bytes(&sv->nonce, sizeof sv->nonce);
  pthread_mutex_init(&sv->mu, NULL);
  sv->listen_fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  sv->stop_fd = eventfd(0, EFD_CLOEXEC);
  struct sockaddr_un a;
  socklen_t len = share_addr((uint32_t)getpid(), sv->nonce, &a);
  const char *failed = sv->listen_fd < 0 ? "socket" : sv->stop_fd < 0 ? "eventfd" : NULL;
  if (!failed && bind(sv->listen_fd, (struct sockaddr *)&a, len) != 0) failed = "bind";
  if (!failed && listen(sv->listen_fd, 16) != 0) failed = "listen";
  int err = failed ? errno : 0;
  if (!failed && (err = pthread_create(&sv->thread, NULL, server_main, sv)) != 0)
    failed = "pthread_create";
  if (failed) {
    if (sv->listen_fd >= 0) close(sv->listen_fd);
    if (sv->stop_fd >= 0) close(sv->stop_fd);
    pthread_mutex_destroy(&sv->mu);
    free(sv);
    return spw__set_error(rt, SPW_ERR_SYSTEM, "cannot start the IPC server: %s: %s", failed,
                          strerror(err));
  }
  *out = sv;
  return SPW_OK;
}

void spw__ipc_server_stop(spw_runtime_t *rt) {
  spw_ipc_server_t *sv = rt->ipc_server;
  if (!sv) return;
  uint64_t one = 1;
  while (write(sv->stop_fd, &one, sizeof one) < 0 && errno == EINTR) {
  }
  pthread_join(sv->thread, NULL);
  close(sv->listen_fd);
  close(sv->stop_fd);
  pthread_mutex_destroy(&sv->mu);
  free(sv->ex);
  free(sv);
  rt->ipc_server = NULL;
}

/* The record of `buf` (the same one every time the buffer is exported), made if needed;
 * records of freed buffers make room first. */
static int record(spw_runtime_t *rt, spw_ipc_server_t *sv, spw_buf_t buf, share_export_t *out) {
  pthread_mutex_lock(&sv->mu);
  for (size_t i = 0; i < sv->n; i++)
    if (sv->ex[i].buf == buf) {
      *out = sv->ex[i];
      pthread_mutex_unlock(&sv->mu);
      return SPW_OK;
    }
  if (sv->n == sv->cap) {
    size_t kept = 0;
    for (size_t i = 0; i < sv->n; i++) {
      spw_slot_t *s;
      uint64_t w;
      if (spw__handles_lookup(&rt->handles, sv->ex[i].buf, &s, &w) == SPW_OK)
        sv->ex[kept++] = sv->ex[i];
    }
    sv->n = kept;
  }
  share_export_t *g = spw__grow(sv->ex, &sv->cap, sv->n + 1, sizeof *g, 16);
  if (!g) {
    pthread_mutex_unlock(&sv->mu);
    return SPW_ERR_SYSTEM;
  }
  sv->ex = g;
  share_export_t e = {.id = sv->next_id++, .buf = buf};
  random_bytes(e.token, sizeof e.token);
  sv->ex[sv->n++] = e;
  pthread_mutex_unlock(&sv->mu);
  *out = e;
  return SPW_OK;
}

int spw__ipc_export_stable(spw_runtime_t *rt, spw_buf_t buf, size_t bytes,
                           spw_ipc_handle_t *out) {
  if (!rt->settings.ipc)
    return spw__set_error(rt, SPW_ERR_UNSUPPORTED,
                          "this runtime's address-stable buffers cannot be exported: create "
                          "it with config.ipc = SPW_IPC_ON (SPILLWAY_IPC=1)");
  int st = SPW_OK;
  pthread_mutex_lock(&rt->ipc_mu);
  if (!rt->ipc_server) st = server_start(rt, &rt->ipc_server);
  spw_ipc_server_t *sv = rt->ipc_server;
  pthread_mutex_unlock(&rt->ipc_mu);
  if (st != SPW_OK) return st;
  share_export_t e;
  if ((st = record(rt, sv, buf, &e)) != SPW_OK) return st;
  spw_ipc_handle_t h;
  memset(&h, 0, sizeof h);
  share_ref_t ref = {.magic = SHARE_MAGIC, .version = 1, .nonce = sv->nonce, .id = e.id};
  memcpy(ref.token, e.token, sizeof ref.token);
  memcpy(h.handle, &ref, sizeof ref);
  h.bytes = bytes;
  h.backend = (int32_t)rt->kind;
  h.device = (int32_t)rt->settings.device;
  h.pid = (uint32_t)getpid();
  h.kind = SPW_IPC_KIND_CHUNKS;
  *out = h;
  return SPW_OK;
}

/* ---- the importer -------------------------------------------------------------------- */

/* Receives one reply, its descriptors into fds[0..r->count). Any other shape is an error,
 * and then no descriptor is left open. */
static int recv_reply(int conn, share_reply_t *r, int fds[SHARE_FDS_PER_MSG]) {
  struct iovec iov = {r, sizeof *r};
  union {
    char buf[CMSG_SPACE(sizeof(int) * SHARE_FDS_PER_MSG)];
    struct cmsghdr align;
  } c;
  struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = c.buf,
                     .msg_controllen = sizeof c.buf};
  ssize_t got = recvmsg(conn, &m, MSG_CMSG_CLOEXEC);
  size_t nfd = 0;
  for (struct cmsghdr *h = got >= 0 ? CMSG_FIRSTHDR(&m) : NULL; h; h = CMSG_NXTHDR(&m, h)) {
    if (h->cmsg_level != SOL_SOCKET || h->cmsg_type != SCM_RIGHTS) continue;
    size_t k = (h->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < k; i++) {
      int fd;
      memcpy(&fd, CMSG_DATA(h) + i * sizeof fd, sizeof fd);
      if (nfd < SHARE_FDS_PER_MSG) fds[nfd++] = fd;
      else close(fd);
    }
  }
  if (got == (ssize_t)sizeof *r && !(m.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) &&
      r->count <= SHARE_FDS_PER_MSG && nfd == r->count)
    return 0;
  for (size_t i = 0; i < nfd; i++) close(fds[i]);
  return -1;
}

typedef struct shared {
  int *fds;
  uint64_t *offs;
  size_t n, chunk, offset; /* descriptors; each chunk's bytes; the buffer's offset */
} shared_t;

static void shared_drop(shared_t *sh) {
  for (size_t i = 0; i < sh->n; i++) close(sh->fds[i]);
  free(sh->fds);
  free(sh->offs);
  *sh = (shared_t){0};
}

static int refused(spw_runtime_t *rt, uint32_t pid, int status) {
  const char *why = status == SPW_ERR_NOT_LOCKED    ? "the buffer is not resident and locked"
                    : status == SPW_ERR_FREED       ? "the buffer was freed"
                    : status == SPW_ERR_INVALID_ARG ? "no such export"
                                                    : spw_err_name(status);
  return spw__set_error(rt, status, "the exporter (pid %u) refused the handle: %s", pid, why);
}

/* Asks the exporter for the buffer's chunks. */
static int ask(spw_runtime_t *rt, const spw_ipc_handle_t *h, const share_ref_t *ref,
               shared_t *out) {
  int conn = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (conn < 0) return spw__set_error(rt, SPW_ERR_SYSTEM, "socket: %s", strerror(errno));
  set_timeout(conn);
  struct sockaddr_un a;
  socklen_t len = share_addr(h->pid, ref->nonce, &a);
  share_request_t req = {.id = ref->id};
  memcpy(req.token, ref->token, sizeof req.token);
  if (connect(conn, (struct sockaddr *)&a, len) != 0 ||
      send(conn, &req, sizeof req, MSG_NOSIGNAL) != (ssize_t)sizeof req) {
    int err = errno;
    close(conn);
    return spw__set_error(rt, SPW_ERR_CUDA,
                          "the exporter (pid %u) does not answer: it has exited or destroyed "
                          "its runtime (%s)", h->pid, strerror(err));
  }
  shared_t sh = {0};
  size_t total = 0;
  int st = SPW_OK;
  for (;;) {
    share_reply_t r;
    int got[SHARE_FDS_PER_MSG];
    if (recv_reply(conn, &r, got) != 0) {
      st = spw__set_error(rt, SPW_ERR_CUDA, "the exporter (pid %u) broke off its answer", h->pid);
      break;
    }
    if (r.status != SPW_OK) {
      st = refused(rt, h->pid, r.status);
      break;
    }
    if (!sh.fds) { /* the first answer says how many, and where the buffer lies */
      total = r.total;
      sh.chunk = r.chunk;
      sh.offset = r.offset;
      /* Exactly the chunks that hold the handle's bytes (their size against this device's
       * granule is checked by the caller): an answer cannot make this process allocate or
       * wait for more than the handle says. */
      int sane = r.chunk > 0 && r.chunk <= SIZE_MAX / 4 && r.offset < r.chunk &&
                 h->bytes <= SIZE_MAX / 4 &&
                 total == (r.offset + h->bytes + r.chunk - 1) / r.chunk;
      sh.fds = sane ? malloc(total * sizeof *sh.fds) : NULL;
      sh.offs = sane ? malloc(total * sizeof *sh.offs) : NULL;
      if (!sh.fds || !sh.offs) {
        for (size_t i = 0; i < r.count; i++) close(got[i]);
        st = sane ? SPW_ERR_SYSTEM
                  : spw__set_error(rt, SPW_ERR_INVALID_ARG,
                                   "the exporter's answer does not fit the handle's %llu bytes",
                                   (unsigned long long)h->bytes);
        break;
      }
    }
    if (r.count > total - sh.n) {
      for (size_t i = 0; i < r.count; i++) close(got[i]);
      st = spw__set_error(rt, SPW_ERR_CUDA, "the exporter (pid %u) sent too many chunks", h->pid);
      break;
    }
    memcpy(sh.fds + sh.n, got, r.count * sizeof *got);
    memcpy(sh.offs + sh.n, r.fd_offsets, r.count * sizeof *sh.offs);
    sh.n += r.count;
    if (sh.n == total) break;
  }
  close(conn);
  if (st != SPW_OK) {
    shared_drop(&sh);
    return st;
  }
  *out = sh;
  return SPW_OK;
}

void spw__ipc_unmap_chunks(spw_runtime_t *rt, const spw_ipc_opened_t *o) {
  /* Whole chunks, one at a time: the imported ones may not share one mapping. */
  for (size_t i = 0; i < o->nchunks; i++) {
    (void)rt->ops->chunk_unmap(rt->be, (char *)o->base + i * o->chunk_bytes, o->chunk_bytes);
    rt->ops->chunk_release(rt->be, o->chunks[i], o->chunk_bytes);
  }
  (void)rt->ops->vm_free(rt->be, o->base, o->nchunks * o->chunk_bytes);
  free(o->chunks);
}

int spw__ipc_open_chunks(spw_runtime_t *rt, const spw_ipc_handle_t *h, spw_ipc_opened_t *out) {
  share_ref_t ref;
  memcpy(&ref, h->handle, sizeof ref);
  if (ref.magic != SHARE_MAGIC || ref.version != 1)
    return spw__set_error(rt, SPW_ERR_INVALID_ARG, "not a handle of an address-stable buffer");
  size_t gran = 0;
  int st = spw__stable_granularity(rt->stable, &gran);
  if (st != SPW_OK)
    return spw__set_error(rt, st, "this device has no virtual memory management, which an "
                                  "address-stable buffer's handle needs");
  shared_t sh;
  if ((st = ask(rt, h, &ref, &sh)) != SPW_OK) return st;
  /* Whole granules of this device, and no more of them than the buffer's bytes need. */
  size_t need = (sh.offset + h->bytes + gran - 1) / gran * gran;
  if (sh.chunk % gran || sh.n * sh.chunk > need) {
    size_t chunk = sh.chunk;
    shared_drop(&sh);
    return spw__set_error(rt, SPW_ERR_INVALID_ARG,
                          "the exporter's chunks of %zu bytes do not fit this device's granule "
                          "of %zu for a buffer of %llu bytes", chunk, gran,
                          (unsigned long long)h->bytes);
  }
  const size_t chunk = sh.chunk;
  spw_ipc_opened_t o = {.chunk_bytes = chunk, .chunks = calloc(sh.n, sizeof *o.chunks)};
  st = o.chunks ? rt->ops->vm_reserve(rt->be, sh.n * chunk, &o.base) : SPW_ERR_SYSTEM;
  for (; st == SPW_OK && o.nchunks < sh.n; o.nchunks++) {
    size_t i = o.nchunks;
    st = rt->ops->chunk_import(rt->be, sh.fds[i], sh.offs[i], chunk, &o.chunks[i]);
    if (st != SPW_OK) break;
    st = rt->ops->chunk_map(rt->be, (char *)o.base + i * chunk, chunk, o.chunks[i]);
    if (st != SPW_OK) {
      rt->ops->chunk_release(rt->be, o.chunks[i], chunk);
      break;
    }
  }
  size_t offset = sh.offset;
  shared_drop(&sh); /* imported chunks hold the memory; the descriptors are done */
  if (st != SPW_OK) {
    if (o.base) spw__ipc_unmap_chunks(rt, &o);
    else free(o.chunks);
    return st;
  }
  o.dptr = (char *)o.base + offset;
  *out = o;
  return SPW_OK;
}
