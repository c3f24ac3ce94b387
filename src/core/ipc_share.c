/* SPDX-License-Identifier: Apache-2.0 */
/* Sharing address-stable buffers with other processes (config.ipc).
 *
 * CUDA's legacy IPC refuses memory of virtual memory management: a stable buffer's chunks
 * are shared as POSIX file descriptors (cuMemExportToShareableHandle), and a descriptor is
 * not bytes: it travels over a Unix socket (SCM_RIGHTS). So an export is a capability, not
 * the descriptors themselves: the handle names this runtime's socket (an abstract name made
 * of the pid and a random nonce, so a reused pid cannot answer) and an export record (an
 * id and a random 128-bit token). A server thread, started by the first such export,
 * answers an importer's request with the descriptor of the buffer's chunk (a large buffer
 * is one chunk of its own, a small one lies in its page's chunk: stable_pool.h), made at
 * that moment and only while the buffer is resident and locked, which is what keeps it in
 * place (the same contract as a legacy export). The importer reserves a range, imports and
 * maps the chunk there, and closes the descriptor; spw_ipc_close unmaps and releases it.
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
#define SHARE_VERSION 2u        /* 1 sent a descriptor per 2 MiB chunk */
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

/* With status SPW_OK, the message carries the chunk's descriptor; otherwise none. */
typedef struct share_reply {
  int32_t status;
  uint32_t reserved;
  uint64_t chunk, offset; /* the chunk's bytes; the buffer's offset in it */
  uint64_t fd_offset;     /* where the chunk starts in its descriptor (host backend: a memfd) */
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

/* `fd`: the chunk's descriptor, or -1 (a refusal). */
static void send_reply(int conn, const share_reply_t *r, int fd) {
  struct iovec iov = {(void *)r, sizeof *r};
  union {
    char buf[CMSG_SPACE(sizeof(int))];
    struct cmsghdr align;
  } c;
  struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
  if (fd >= 0) {
    m.msg_control = c.buf;
    m.msg_controllen = sizeof c.buf;
    struct cmsghdr *h = CMSG_FIRSTHDR(&m);
    h->cmsg_level = SOL_SOCKET;
    h->cmsg_type = SCM_RIGHTS;
    h->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(h), &fd, sizeof fd);
  }
  /* A failed send leaves the importer with a broken answer, which it reports. */
  (void)sendmsg(conn, &m, MSG_NOSIGNAL);
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

/* The descriptor of the buffer's chunk, if it is still resident and locked. */
static int share_buffer(spw_runtime_t *rt, spw_buf_t buf, int *fd, share_reply_t *r) {
  spw_slot_t *s;
  uint64_t w;
  int st = spw__handles_lookup(&rt->handles, buf, &s, &w);
  if (st != SPW_OK) return st;
  if (w & SPW_W_FREE_PENDING) return SPW_ERR_FREED;
  void *va = spw__slot_va(s);
  if (!va || spw__w_count(w) == 0 || spw__w_state(w) != SPW_STATE_RESIDENT)
    return SPW_ERR_NOT_LOCKED;
  /* The pool checks again, under its own lock, that the memory is mapped. */
  size_t chunk = 0, offset = 0;
  st = spw__stable_share(rt->stable, va, fd, &r->fd_offset, &chunk, &offset);
  r->chunk = chunk;
  r->offset = offset;
  return st;
}

static void serve(spw_ipc_server_t *sv, int conn) {
  share_request_t req;
  if (recv(conn, &req, sizeof req, 0) != (ssize_t)sizeof req) return;
  share_reply_t r = {.status = SPW_ERR_INVALID_ARG};
  int fd = -1;
  spw_buf_t buf;
  if (find_export(sv, &req, &buf)) r.status = share_buffer(sv->rt, buf, &fd, &r);
  if (r.status != SPW_OK) r = (share_reply_t){.status = r.status};
  send_reply(conn, &r, r.status == SPW_OK ? fd : -1);
  if (fd >= 0) close(fd); /* the importer holds its own copy */
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
  share_ref_t ref = {.magic = SHARE_MAGIC, .version = SHARE_VERSION, .nonce = sv->nonce,
                     .id = e.id};
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

/* Receives the answer: its chunk's descriptor in *fd with status SPW_OK, none otherwise.
 * Any other shape is an error, and then no descriptor is left open. */
static int recv_reply(int conn, share_reply_t *r, int *fd) {
  struct iovec iov = {r, sizeof *r};
  union {
    char buf[CMSG_SPACE(sizeof(int) * 4)]; /* room to see, and close, a few too many */
    struct cmsghdr align;
  } c;
  struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = c.buf,
                     .msg_controllen = sizeof c.buf};
  ssize_t got = recvmsg(conn, &m, MSG_CMSG_CLOEXEC);
  size_t nfd = 0;
  *fd = -1;
  for (struct cmsghdr *h = got >= 0 ? CMSG_FIRSTHDR(&m) : NULL; h; h = CMSG_NXTHDR(&m, h)) {
    if (h->cmsg_level != SOL_SOCKET || h->cmsg_type != SCM_RIGHTS) continue;
    size_t k = (h->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < k; i++, nfd++) {
      int one;
      memcpy(&one, CMSG_DATA(h) + i * sizeof one, sizeof one);
      if (nfd == 0) *fd = one;
      else close(one);
    }
  }
  if (got == (ssize_t)sizeof *r && !(m.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) &&
      nfd == (r->status == SPW_OK ? 1u : 0u))
    return 0;
  if (*fd >= 0) close(*fd);
  *fd = -1;
  return -1;
}

static int refused(spw_runtime_t *rt, uint32_t pid, int status) {
  const char *why = status == SPW_ERR_NOT_LOCKED    ? "the buffer is not resident and locked"
                    : status == SPW_ERR_FREED       ? "the buffer was freed"
                    : status == SPW_ERR_INVALID_ARG ? "no such export"
                                                    : spw_err_name(status);
  return spw__set_error(rt, status, "the exporter (pid %u) refused the handle: %s", pid, why);
}

/* Asks the exporter for the buffer's chunk: *fd and *r on success. */
static int ask(spw_runtime_t *rt, const spw_ipc_handle_t *h, const share_ref_t *ref,
               share_reply_t *r, int *fd) {
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
  int bad = recv_reply(conn, r, fd);
  close(conn);
  if (bad)
    return spw__set_error(rt, SPW_ERR_CUDA, "the exporter (pid %u) broke off its answer",
                          h->pid);
  return r->status == SPW_OK ? SPW_OK : refused(rt, h->pid, r->status);
}

void spw__ipc_unmap_chunks(spw_runtime_t *rt, const spw_ipc_opened_t *o) {
  (void)rt->ops->chunk_unmap(rt->be, o->base, o->chunk_bytes);
  rt->ops->chunk_release(rt->be, o->chunk, o->chunk_bytes);
  (void)rt->ops->vm_free(rt->be, o->base, o->chunk_bytes);
}

int spw__ipc_open_chunks(spw_runtime_t *rt, const spw_ipc_handle_t *h, spw_ipc_opened_t *out) {
  share_ref_t ref;
  memcpy(&ref, h->handle, sizeof ref);
  if (ref.magic != SHARE_MAGIC)
    return spw__set_error(rt, SPW_ERR_INVALID_ARG, "not a handle of an address-stable buffer");
  if (ref.version != SHARE_VERSION)
    return spw__set_error(rt, SPW_ERR_INVALID_ARG,
                          "a handle of another Spillway version (format %u, this one reads %u)",
                          ref.version, SHARE_VERSION);
  size_t gran = 0;
  int st = spw__stable_granularity(rt->stable, &gran);
  if (st != SPW_OK)
    return spw__set_error(rt, st, "this device has no virtual memory management, which an "
                                  "address-stable buffer's handle needs");
  share_reply_t r;
  int fd = -1;
  if ((st = ask(rt, h, &ref, &r, &fd)) != SPW_OK) return st;
  /* Whole granules of this device, holding the buffer's bytes, and no more granules than
   * they need: an answer cannot make this process map more than the handle says. */
  const uint64_t bytes = h->bytes; /* spw__ipc_open bounds it under SIZE_MAX / 2 */
  int fits = r.chunk > 0 && r.chunk <= SIZE_MAX / 2 && r.chunk % gran == 0 &&
             r.offset < r.chunk && bytes <= r.chunk - r.offset &&
             r.chunk == (r.offset + bytes + gran - 1) / gran * gran;
  if (!fits) {
    close(fd);
    return spw__set_error(rt, SPW_ERR_INVALID_ARG,
                          "the exporter's chunk of %llu bytes does not fit this device's "
                          "granule of %zu for a buffer of %llu bytes",
                          (unsigned long long)r.chunk, gran, (unsigned long long)bytes);
  }
  spw_ipc_opened_t o = {.chunk_bytes = (size_t)r.chunk};
  st = rt->ops->vm_reserve(rt->be, o.chunk_bytes, &o.base);
  if (st == SPW_OK) {
    st = rt->ops->chunk_import(rt->be, fd, r.fd_offset, o.chunk_bytes, &o.chunk);
    if (st == SPW_OK && (st = rt->ops->chunk_map(rt->be, o.base, o.chunk_bytes, o.chunk)) != SPW_OK)
      rt->ops->chunk_release(rt->be, o.chunk, o.chunk_bytes);
    if (st != SPW_OK) (void)rt->ops->vm_free(rt->be, o.base, o.chunk_bytes);
  }
  close(fd); /* an imported chunk holds the memory; the descriptor is done */
  if (st != SPW_OK) return st;
  o.dptr = (char *)o.base + r.offset;
  *out = o;
  return SPW_OK;
}
