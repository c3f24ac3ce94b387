/* SPDX-License-Identifier: Apache-2.0 */
/* Sharing buffers between processes (spw_ipc_export / spw_ipc_open): another process reads
 * what this one wrote into a buffer and writes back what this one then reads, on both
 * backends, for buffers of the exportable pool and for address-stable ones (their chunks,
 * handed over by the exporter's socket). The other process is this executable again,
 * started with --ipc-child and the handle in hex on its command line (a handle is plain
 * bytes: any channel carries it). */
#include <pthread.h>
#include <spawn.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test_main.h"
#include "test_util.h"

extern char **environ;

#define SMALL_BYTES ((size_t)64 << 10) /* from a slab */
#define LARGE_BYTES ((size_t)8 << 20)  /* from an arena */
#define LIMIT ((uint64_t)64 << 20)

static spw_runtime_t *ipc_runtime(spw_ipc_mode_t mode) {
  spw_config_t cfg = SPW_CONFIG_INIT;
  cfg.device_limit = LIMIT;
  cfg.ipc = mode;
  return test_runtime(&cfg);
}

/* ---- the other process ----------------------------------------------------------------- */

static void to_hex(const void *p, size_t n, char *out) {
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++) sprintf(out + 2 * i, "%02x", b[i]);
}

static int from_hex(const char *s, void *p, size_t n) {
  unsigned char *b = p;
  if (strlen(s) != 2 * n) return -1;
  for (size_t i = 0; i < n; i++) {
    unsigned v;
    if (sscanf(s + 2 * i, "%2x", &v) != 1) return -1;
    b[i] = (unsigned char)v;
  }
  return 0;
}

static int child_fail(spw_runtime_t *rt, const char *what, int st) {
  fprintf(stderr, "child: %s: %s: %s\n", what, spw_err_name(st), rt ? spw_last_error(rt) : "");
  return 1;
}

/* The child: opens the handle, checks the bytes are pattern `expect`, writes pattern
 * `write` over them, closes. Exit 0, or 1 and a message. With `expect` 0 the open must be
 * refused: the exit code is then the status, negated. */
static int child_main(const char *hex, uint64_t expect, uint64_t write) {
  spw_ipc_handle_t h;
  if (from_hex(hex, &h, sizeof h) != 0) return child_fail(NULL, "handle text", SPW_ERR_INVALID_ARG);
  spw_config_t cfg = SPW_CONFIG_INIT;
  cfg.backend = test_backend();
  cfg.device_limit = LIMIT;
  spw_runtime_t *rt = NULL;
  int st = spw_runtime_create(&cfg, &rt);
  if (st != SPW_OK) return child_fail(NULL, "runtime", st);
  spw_stream_t s;
  void *d = NULL;
  size_t n = (size_t)h.bytes;
  uint8_t *buf = malloc(n);
  if (!buf) return child_fail(rt, "malloc", SPW_ERR_SYSTEM);
  if ((st = spw_stream_create(rt, &s)) != SPW_OK) return child_fail(rt, "stream", st);
  if ((st = spw_ipc_open(rt, &h, &d)) != SPW_OK) {
    if (expect != 0) return child_fail(rt, "open", st);
    /* Refused, as the parent expects: its status is the exit code, the pointer untouched. */
    int code = d == NULL && st < 0 && st > -100 ? -st : 100;
    spw_stream_destroy(rt, s);
    free(buf);
    return spw_runtime_destroy(rt) == SPW_OK ? code : 101;
  }
  if (expect == 0) return child_fail(rt, "open (expected to be refused)", SPW_OK);
  if ((st = spw_memcpy_async(rt, buf, d, n, s)) == SPW_OK) st = spw_stream_synchronize(rt, s);
  if (st != SPW_OK) return child_fail(rt, "read", st);
  size_t bad = test_first_mismatch(buf, n, expect);
  if (bad != SIZE_MAX) {
    fprintf(stderr, "child: byte %zu of %zu differs\n", bad, n);
    return 1;
  }
  test_fill(buf, n, write);
  if ((st = spw_memcpy_async(rt, d, buf, n, s)) == SPW_OK) st = spw_stream_synchronize(rt, s);
  if (st != SPW_OK) return child_fail(rt, "write", st);
  if ((st = spw_ipc_close(rt, d)) != SPW_OK) return child_fail(rt, "close", st);
  if ((st = spw_ipc_close(rt, d)) != SPW_ERR_INVALID_ARG) return child_fail(rt, "second close", st);
  free(buf);
  spw_stream_destroy(rt, s);
  st = spw_runtime_destroy(rt);
  return st == SPW_OK ? 0 : child_fail(NULL, "destroy", st);
}

/* Runs the child on handle h and returns its exit status. */
static int run_child(const spw_ipc_handle_t *h, uint64_t expect, uint64_t write) {
  char hex[2 * sizeof *h + 1], e[32], w[32];
  to_hex(h, sizeof *h, hex);
  snprintf(e, sizeof e, "%llu", (unsigned long long)expect);
  snprintf(w, sizeof w, "%llu", (unsigned long long)write);
  char *argv[] = {"test_ipc", "--ipc-child", hex, e, w, NULL};
  pid_t pid;
  ASSERT_EQ(posix_spawn(&pid, "/proc/self/exe", NULL, NULL, argv, environ), 0);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  return WEXITSTATUS(status);
}

/* ---- what another process sees ------------------------------------------------------- */

/* A runtime (config.ipc = `mode`), a stream of it, and a buffer of `bytes` holding pattern
 * `seed`, unlocked. */
typedef struct fixture {
  spw_runtime_t *rt;
  spw_stream_t s;
  spw_buf_t b;
} fixture_t;

static fixture_t fixture(spw_ipc_mode_t mode, size_t bytes, uint64_t seed) {
  fixture_t f = {ipc_runtime(mode), NULL, SPW_BUF_NULL};
  ASSERT_OK(spw_stream_create(f.rt, &f.s));
  f.b = test_filled(f.rt, f.s, bytes, seed);
  return f;
}

/* Ends every lock of the stream, frees the buffer (unless freed already) and the runtime. */
static void fixture_end(fixture_t *f) {
  ASSERT_OK(spw_stream_synchronize(f->rt, f->s));
  if (f->b != SPW_BUF_NULL) ASSERT_OK(spw_free(f->rt, f->b));
  ASSERT_OK(spw_runtime_destroy(f->rt));
}

static void *locked(fixture_t *f) {
  void *d = NULL;
  ASSERT_OK(spw_acquire(f->rt, f->b, f->s, 0, &d));
  return d;
}

/* Locks the fixture's buffer and exports it. */
static spw_ipc_handle_t locked_export(fixture_t *f) {
  (void)locked(f);
  spw_ipc_handle_t h;
  ASSERT_OK(spw_ipc_export(f->rt, f->b, &h));
  return h;
}

/* Fills a buffer of `bytes`, exports it under a lock, lets the child read and rewrite it,
 * then reads the child's bytes here. */
static void shared_both_ways(spw_runtime_t *rt, spw_stream_t s, spw_buf_t b, size_t bytes) {
  void *d = NULL;
  ASSERT_OK(spw_acquire(rt, b, s, 0, &d));
  spw_ipc_handle_t h;
  ASSERT_OK(spw_ipc_export(rt, b, &h));
  ASSERT_UEQ(h.bytes, bytes);
  ASSERT_EQ(h.backend, test_backend());
  ASSERT_EQ(h.pid, getpid());
  ASSERT_EQ(run_child(&h, 41, 42), 0);
  ASSERT_OK(spw_stream_synchronize(rt, s)); /* the lock ends: the child has closed */
  test_expect_fill(rt, b, s, bytes, 42);
}

static void small_buffer_is_read_and_written_by_another_process(void) {
  fixture_t f = fixture(SPW_IPC_ON, SMALL_BYTES, 41);
  shared_both_ways(f.rt, f.s, f.b, SMALL_BYTES);
  fixture_end(&f);
}

static void large_buffer_is_read_and_written_by_another_process(void) {
  fixture_t f = fixture(SPW_IPC_ON, LARGE_BYTES, 41);
  shared_both_ways(f.rt, f.s, f.b, LARGE_BYTES);
  fixture_end(&f);
}

static void buffer_brought_back_from_disk_is_exported_with_its_data(void) {
  fixture_t f = fixture(SPW_IPC_ON, LARGE_BYTES, 41);
  ASSERT_OK(spw_spill(f.rt, f.b, SPW_TIER_DISK));
  ASSERT_OK(spw_wait_idle(f.rt));
  /* The acquire brings it back asynchronously; the export waits for that copy. */
  shared_both_ways(f.rt, f.s, f.b, LARGE_BYTES);
  fixture_end(&f);
}

static void pointer_inside_a_buffer_exports_from_there(void) {
  fixture_t f = fixture(SPW_IPC_ON, LARGE_BYTES, 7);
  spw_runtime_t *rt = f.rt;
  spw_stream_t s = f.s;
  void *d = locked(&f);
  /* The second half: the child sees the pattern of seed 41 there. */
  uint8_t *half = malloc(LARGE_BYTES / 2);
  test_fill(half, LARGE_BYTES / 2, 41);
  ASSERT_OK(spw_memcpy_async(rt, (uint8_t *)d + LARGE_BYTES / 2, half, LARGE_BYTES / 2, s));
  ASSERT_OK(spw_stream_wait(rt, s)); /* waits without releasing the lock */
  spw_ipc_handle_t h;
  ASSERT_OK(spw_ipc_export_ptr(rt, (uint8_t *)d + LARGE_BYTES / 2, LARGE_BYTES / 2, &h));
  ASSERT_UEQ(h.bytes, LARGE_BYTES / 2);
  ASSERT_EQ(run_child(&h, 41, 42), 0);
  ASSERT_OK(spw_memcpy_async(rt, half, (uint8_t *)d + LARGE_BYTES / 2, LARGE_BYTES / 2, s));
  ASSERT_OK(spw_stream_synchronize(rt, s));
  ASSERT_EQ(test_first_mismatch(half, LARGE_BYTES / 2, 42), SIZE_MAX);
  free(half);
  fixture_end(&f);
}

/* ---- refusals ------------------------------------------------------------------------- */

static void export_without_config_ipc_is_unsupported(void) {
  fixture_t f = fixture(SPW_IPC_OFF, SMALL_BYTES, 1);
  void *d = locked(&f);
  spw_ipc_handle_t h;
  ASSERT_STATUS(spw_ipc_export(f.rt, f.b, &h), SPW_ERR_UNSUPPORTED);
  ASSERT_TRUE(strstr(spw_last_error(f.rt), "SPILLWAY_IPC") != NULL);
  ASSERT_STATUS(spw_ipc_export_ptr(f.rt, d, SMALL_BYTES, &h), SPW_ERR_UNSUPPORTED);
  fixture_end(&f);
}

static void export_of_an_unlocked_or_spilled_buffer_is_not_locked(void) {
  fixture_t f = fixture(SPW_IPC_ON, SMALL_BYTES, 1);
  spw_ipc_handle_t h;
  ASSERT_STATUS(spw_ipc_export(f.rt, f.b, &h), SPW_ERR_NOT_LOCKED);
  ASSERT_OK(spw_spill(f.rt, f.b, SPW_TIER_HOST));
  ASSERT_OK(spw_wait_idle(f.rt));
  ASSERT_STATUS(spw_ipc_export(f.rt, f.b, &h), SPW_ERR_NOT_LOCKED);
  ASSERT_OK(spw_free(f.rt, f.b));
  ASSERT_STATUS(spw_ipc_export(f.rt, f.b, &h), SPW_ERR_FREED);
  f.b = SPW_BUF_NULL;
  fixture_end(&f);
}

/* ---- address-stable buffers: their chunks, through the exporter's socket ------------- */

#define STABLE_SMALL ((size_t)16 << 10) /* a block of a shared page */
#define STABLE_LARGE ((size_t)5 << 20)  /* a range of its own: one chunk of several granules */

/* A stable buffer of `bytes` holding pattern `seed`, unlocked; NULL-handle and a skip where
 * the device has no virtual memory management. */
static spw_buf_t stable_filled(fixture_t *f, size_t bytes, uint64_t seed) {
  spw_buf_t b;
  int st = spw_alloc_ex(f->rt, bytes, f->s, SPW_ALLOC_STABLE, &b);
  TEST_SKIP_IF(st == SPW_ERR_UNSUPPORTED, "no virtual memory management on this device");
  ASSERT_OK(st);
  uint8_t *src = malloc(bytes);
  ASSERT_TRUE(src != NULL);
  test_fill(src, bytes, seed);
  test_write(f->rt, b, f->s, src, bytes);
  free(src);
  return b;
}

static fixture_t stable_fixture(spw_ipc_mode_t mode, size_t bytes, uint64_t seed) {
  fixture_t f = {ipc_runtime(mode), NULL, SPW_BUF_NULL};
  ASSERT_OK(spw_stream_create(f.rt, &f.s));
  f.b = stable_filled(&f, bytes, seed);
  return f;
}

static void stable_shared_both_ways(size_t bytes) {
  fixture_t f = stable_fixture(SPW_IPC_ON, bytes, 41);
  void *d = locked(&f);
  spw_ipc_handle_t h, again;
  ASSERT_OK(spw_ipc_export(f.rt, f.b, &h));
  ASSERT_EQ(h.kind, SPW_IPC_KIND_CHUNKS);
  ASSERT_UEQ(h.bytes, bytes);
  ASSERT_OK(spw_ipc_export(f.rt, f.b, &again)); /* the same export, the same handle */
  ASSERT_EQ(memcmp(&h, &again, sizeof h), 0);
  ASSERT_EQ(run_child(&h, 41, 42), 0);
  ASSERT_OK(spw_stream_synchronize(f.rt, f.s)); /* the lock ends: the child has closed */
  test_expect_fill(f.rt, f.b, f.s, bytes, 42);
  /* Its address did not change, spilled and back, and the next export still serves. */
  ASSERT_OK(spw_spill(f.rt, f.b, SPW_TIER_HOST));
  ASSERT_OK(spw_wait_idle(f.rt));
  ASSERT_PTR_EQ(locked(&f), d);
  ASSERT_OK(spw_ipc_export(f.rt, f.b, &again));
  ASSERT_EQ(run_child(&again, 42, 43), 0);
  ASSERT_OK(spw_stream_synchronize(f.rt, f.s));
  test_expect_fill(f.rt, f.b, f.s, bytes, 43);
  fixture_end(&f);
}

static void small_stable_buffer_is_read_and_written_by_another_process(void) {
  stable_shared_both_ways(STABLE_SMALL);
}

static void large_stable_buffer_is_read_and_written_by_another_process(void) {
  stable_shared_both_ways(STABLE_LARGE);
}

/* The lock is what keeps an exported buffer in place: once it is gone, or the buffer is,
 * the exporter refuses the handle, and a made-up token is refused all along. */
static void a_stable_handle_is_refused_unless_its_buffer_is_locked(void) {
  fixture_t f = stable_fixture(SPW_IPC_ON, STABLE_LARGE, 7);
  spw_ipc_handle_t h = locked_export(&f);
  spw_ipc_handle_t forged = h;
  forged.handle[24] ^= 1; /* in the token */
  ASSERT_EQ(run_child(&forged, 0, 0), -SPW_ERR_INVALID_ARG);
  ASSERT_OK(spw_stream_synchronize(f.rt, f.s)); /* unlocked, still resident */
  ASSERT_EQ(run_child(&h, 0, 0), -SPW_ERR_NOT_LOCKED);
  ASSERT_OK(spw_spill(f.rt, f.b, SPW_TIER_HOST));
  ASSERT_OK(spw_wait_idle(f.rt));
  ASSERT_EQ(run_child(&h, 0, 0), -SPW_ERR_NOT_LOCKED);
  ASSERT_OK(spw_free(f.rt, f.b));
  f.b = SPW_BUF_NULL;
  ASSERT_EQ(run_child(&h, 0, 0), -SPW_ERR_FREED);
  fixture_end(&f);
}

/* Once the exporting runtime is gone, its socket is too. */
static void a_stable_handle_outlives_no_exporter(void) {
  fixture_t f = stable_fixture(SPW_IPC_ON, STABLE_SMALL, 7);
  spw_ipc_handle_t h = locked_export(&f);
  fixture_end(&f);
  ASSERT_EQ(run_child(&h, 0, 0), -SPW_ERR_CUDA);
}

static void stable_export_without_config_ipc_is_unsupported(void) {
  fixture_t f = stable_fixture(SPW_IPC_OFF, STABLE_SMALL, 1);
  void *d = locked(&f);
  spw_ipc_handle_t h;
  ASSERT_STATUS(spw_ipc_export(f.rt, f.b, &h), SPW_ERR_UNSUPPORTED);
  ASSERT_TRUE(strstr(spw_last_error(f.rt), "SPILLWAY_IPC") != NULL);
  /* By pointer: not in a region of CUDA IPC, whatever the runtime's setting. */
  ASSERT_STATUS(spw_ipc_export_ptr(f.rt, d, STABLE_SMALL, &h), SPW_ERR_UNSUPPORTED);
  fixture_end(&f);
}

static void export_arguments_are_checked(void) {
  fixture_t f = fixture(SPW_IPC_ON, SMALL_BYTES, 1);
  spw_runtime_t *rt = f.rt, *other = ipc_runtime(SPW_IPC_ON);
  spw_buf_t b = f.b;
  void *d = locked(&f);
  spw_ipc_handle_t h;
  ASSERT_STATUS(spw_ipc_export(NULL, b, &h), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw_ipc_export(rt, b, NULL), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw_ipc_export(rt, SPW_BUF_NULL, &h), SPW_ERR_INVALID_HANDLE);
  ASSERT_STATUS(spw_ipc_export(other, b, &h), SPW_ERR_INVALID_HANDLE);
  ASSERT_STATUS(spw_ipc_export_ptr(rt, NULL, 1, &h), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw_ipc_export_ptr(rt, d, 0, &h), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw_ipc_export_ptr(rt, d, 1, NULL), SPW_ERR_INVALID_ARG);
  /* Memory the runtime does not own, and a range running past its region. */
  static uint8_t elsewhere[64];
  ASSERT_STATUS(spw_ipc_export_ptr(rt, elsewhere, sizeof elsewhere, &h), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw_ipc_export_ptr(rt, d, (size_t)1 << 40, &h), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw_ipc_export_ptr(other, d, SMALL_BYTES, &h), SPW_ERR_INVALID_ARG);
  ASSERT_OK(spw_runtime_destroy(other));
  fixture_end(&f);
}

static void open_of_a_handle_of_this_process_is_unsupported(void) {
  fixture_t f = fixture(SPW_IPC_ON, SMALL_BYTES, 1);
  spw_ipc_handle_t h = locked_export(&f);
  void *opened = NULL;
  ASSERT_STATUS(spw_ipc_open(f.rt, &h, &opened), SPW_ERR_UNSUPPORTED);
  ASSERT_PTR_EQ(opened, NULL);
  fixture_end(&f);
}

/* An exporter's answer that does not fit the handle: chunks that are not whole granules of
 * this device, or more granules than the handle's bytes need. The importer refuses it
 * before mapping anything. The exporter here is a thread of this test that speaks the wire
 * format of src/core/ipc_share.c (mirrored below on purpose: a change there must be seen
 * here), under a made-up pid, since a process may not open its own handles. */
typedef struct wire_ref {
  uint32_t magic, version;
  uint64_t nonce, id;
  uint8_t token[16];
} wire_ref_t;
typedef struct wire_request {
  uint64_t id;
  uint8_t token[16];
} wire_request_t;
typedef struct wire_reply {
  int32_t status;
  uint32_t reserved;
  uint64_t chunk, offset, fd_offset;
} wire_reply_t;

typedef struct fake_exporter {
  int listen_fd;
  uint64_t chunk; /* what it claims each chunk holds */
} fake_exporter_t;

static void *fake_exporter_serve(void *arg) {
  fake_exporter_t *fx = arg;
  int conn = accept(fx->listen_fd, NULL, NULL);
  if (conn < 0) return NULL;
  wire_request_t req;
  if (recv(conn, &req, sizeof req, 0) == (ssize_t)sizeof req) {
    int fd = memfd_create("fake-chunk", MFD_CLOEXEC);
    if (fx->chunk <= ((uint64_t)64 << 20)) (void)ftruncate(fd, (off_t)fx->chunk);
    wire_reply_t r = {.status = SPW_OK, .chunk = fx->chunk};
    struct iovec iov = {&r, sizeof r};
    union {
      char buf[CMSG_SPACE(sizeof(int))];
      struct cmsghdr align;
    } c;
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = c.buf,
                       .msg_controllen = sizeof c.buf};
    struct cmsghdr *h = CMSG_FIRSTHDR(&m);
    h->cmsg_level = SOL_SOCKET;
    h->cmsg_type = SCM_RIGHTS;
    h->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(h), &fd, sizeof fd);
    (void)sendmsg(conn, &m, MSG_NOSIGNAL);
    close(fd);
  }
  close(conn);
  return NULL;
}

/* Opens a handle of `bytes` (in the wire format `version`) whose exporter answers with one
 * chunk of `chunk` bytes; reads and writes the buffer's bytes when it opens. */
static int open_from_a_fake_exporter(spw_runtime_t *rt, size_t bytes, uint64_t chunk,
                                     uint32_t version) {
  const uint32_t pid = (uint32_t)getpid() + 100000;
  const uint64_t nonce = 0x5eed0000u + (uint64_t)chunk;
  fake_exporter_t fx = {socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0), chunk};
  ASSERT_TRUE(fx.listen_fd >= 0);
  struct sockaddr_un a;
  memset(&a, 0, sizeof a);
  a.sun_family = AF_UNIX;
  int len = snprintf(a.sun_path + 1, sizeof a.sun_path - 1, "spillway-ipc.%u.%016llx", pid,
                     (unsigned long long)nonce);
  ASSERT_EQ(bind(fx.listen_fd, (struct sockaddr *)&a,
                 (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)len)), 0);
  ASSERT_EQ(listen(fx.listen_fd, 1), 0);
  pthread_t t;
  ASSERT_EQ(pthread_create(&t, NULL, fake_exporter_serve, &fx), 0);
  spw_ipc_handle_t h;
  memset(&h, 0, sizeof h);
  wire_ref_t ref = {.magic = 0x56575053u, .version = version, .nonce = nonce, .id = 1};
  memcpy(h.handle, &ref, sizeof ref);
  h.bytes = bytes;
  h.backend = (int32_t)test_backend();
  h.pid = pid;
  h.kind = SPW_IPC_KIND_CHUNKS;
  void *d = NULL;
  int st = spw_ipc_open(rt, &h, &d);
  if (version != 2) { /* refused before asking: let the exporter's accept return */
    int c = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    (void)connect(c, (struct sockaddr *)&a,
                  (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)len));
    close(c);
  }
  pthread_join(t, NULL);
  close(fx.listen_fd);
  if (st == SPW_OK) {
    memset(d, 0x5A, bytes);
    ASSERT_UEQ(((unsigned char *)d)[bytes - 1], 0x5A);
    ASSERT_OK(spw_ipc_close(rt, d));
  }
  return st;
}

static void an_exporter_answer_that_does_not_fit_the_handle_is_refused(void) {
  TEST_SKIP_IF(test_backend() != SPW_BACKEND_HOST, "the fake exporter's chunk is a memfd");
  spw_runtime_t *rt = ipc_runtime(SPW_IPC_OFF);
  size_t gran = 0;
  ASSERT_OK(spw_stable_granularity(rt, &gran));
  ASSERT_STATUS(open_from_a_fake_exporter(rt, gran, gran + 4096, 2), SPW_ERR_INVALID_ARG);
  ASSERT_TRUE(strstr(spw_last_error(rt), "granule") != NULL);
  ASSERT_STATUS(open_from_a_fake_exporter(rt, gran, 4 * gran, 2), SPW_ERR_INVALID_ARG);
  ASSERT_TRUE(strstr(spw_last_error(rt), "granule") != NULL);
  /* The control: the same exporter answering with the chunk the handle needs is opened. */
  ASSERT_OK(open_from_a_fake_exporter(rt, gran, gran, 2));
  ASSERT_OK(spw_runtime_destroy(rt));
}

static void a_handle_of_another_wire_format_is_refused_by_name(void) {
  TEST_SKIP_IF(test_backend() != SPW_BACKEND_HOST, "the fake exporter's chunk is a memfd");
  spw_runtime_t *rt = ipc_runtime(SPW_IPC_OFF);
  size_t gran = 0;
  ASSERT_OK(spw_stable_granularity(rt, &gran));
  /* Format 1 (a descriptor per 2 MiB chunk) is another Spillway's: no answer is read. */
  ASSERT_STATUS(open_from_a_fake_exporter(rt, gran, gran, 1), SPW_ERR_INVALID_ARG);
  ASSERT_TRUE(strstr(spw_last_error(rt), "another Spillway version") != NULL);
  ASSERT_OK(spw_runtime_destroy(rt));
}

static void open_arguments_and_forged_handles_are_refused(void) {
  spw_runtime_t *rt = ipc_runtime(SPW_IPC_OFF); /* an importer needs no exportable memory */
  spw_ipc_handle_t h;
  memset(&h, 0, sizeof h);
  h.backend = (int32_t)test_backend();
  h.pid = (uint32_t)getpid() + 1;
  h.bytes = 4096;
  void *d = NULL;
  ASSERT_STATUS(spw_ipc_open(NULL, &h, &d), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw_ipc_open(rt, NULL, &d), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw_ipc_open(rt, &h, NULL), SPW_ERR_INVALID_ARG);
  spw_ipc_handle_t bad = h;
  bad.backend = test_backend() == SPW_BACKEND_HOST ? SPW_BACKEND_CUDA : SPW_BACKEND_HOST;
  ASSERT_STATUS(spw_ipc_open(rt, &bad, &d), SPW_ERR_INVALID_ARG);
  bad = h;
  bad.bytes = 0;
  ASSERT_STATUS(spw_ipc_open(rt, &bad, &d), SPW_ERR_INVALID_ARG);
  bad = h;
  bad.offset = UINT64_MAX;
  ASSERT_STATUS(spw_ipc_open(rt, &bad, &d), SPW_ERR_INVALID_ARG);
  bad = h;
  bad.kind = 2;
  ASSERT_STATUS(spw_ipc_open(rt, &bad, &d), SPW_ERR_INVALID_ARG);
  bad = h;
  bad.kind = SPW_IPC_KIND_CHUNKS; /* zero bytes: not a stable buffer's handle */
  ASSERT_STATUS(spw_ipc_open(rt, &bad, &d), SPW_ERR_INVALID_ARG);
  /* Zero bytes are no handle either backend made: host refuses its form, CUDA the handle. */
  int st = spw_ipc_open(rt, &h, &d);
  ASSERT_TRUE(st == SPW_ERR_INVALID_ARG || st == SPW_ERR_CUDA);
  ASSERT_PTR_EQ(d, NULL);
  ASSERT_STATUS(spw_ipc_close(rt, NULL), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw_ipc_close(rt, &h), SPW_ERR_INVALID_ARG);
  ASSERT_OK(spw_runtime_destroy(rt));
}

static void config_ipc_is_validated(void) {
  spw_config_t cfg = SPW_CONFIG_INIT;
  cfg.flags = SPW_CONFIG_IGNORE_ENV;
  cfg.ipc = (spw_ipc_mode_t)7;
  char msg[256];
  ASSERT_STATUS(spw_config_validate(&cfg, msg, sizeof msg), SPW_ERR_CONFIG);
  ASSERT_TRUE(strstr(msg, "config.ipc") != NULL);
  cfg.ipc = SPW_IPC_ON;
  ASSERT_OK(spw_config_validate(&cfg, msg, sizeof msg));
}

/* ---- the exportable pool under ordinary work ------------------------------------------ */

/* Four times the limit in buffers of both kinds, spilled and brought back through host and
 * disk: arenas and slabs give and take memory as the async pool would, and no byte is lost. */
static void exportable_memory_keeps_every_byte_through_spills(void) {
  spw_runtime_t *rt = ipc_runtime(SPW_IPC_ON);
  spw_stream_t s;
  ASSERT_OK(spw_stream_create(rt, &s));
  enum { NL = 24, NS = 64 };
  spw_buf_t large[NL], small[NS];
  for (int i = 0; i < NL; i++) large[i] = test_filled(rt, s, LARGE_BYTES + 4096 * (size_t)i, 100 + (uint64_t)i);
  for (int i = 0; i < NS; i++) small[i] = test_filled(rt, s, SMALL_BYTES, 500 + (uint64_t)i);
  for (int round = 0; round < 2; round++) {
    spw_tier_t tier = round == 0 ? SPW_TIER_HOST : SPW_TIER_DISK;
    (void)test_spill_counted(rt, large, NL / 2, tier);
    (void)test_spill_counted(rt, small, NS / 2, tier);
    for (int i = 0; i < NL; i++)
      test_expect_fill(rt, large[i], s, LARGE_BYTES + 4096 * (size_t)i, 100 + (uint64_t)i);
    for (int i = 0; i < NS; i++) test_expect_fill(rt, small[i], s, SMALL_BYTES, 500 + (uint64_t)i);
  }
  for (int i = 0; i < NL; i++) ASSERT_OK(spw_free(rt, large[i]));
  for (int i = 0; i < NS; i++) ASSERT_OK(spw_free(rt, small[i]));
  ASSERT_OK(spw_wait_idle(rt));
  ASSERT_OK(spw_runtime_destroy(rt));
}

static const spw_test_t tests[] = {
    TEST(small_buffer_is_read_and_written_by_another_process),
    TEST(large_buffer_is_read_and_written_by_another_process),
    TEST(buffer_brought_back_from_disk_is_exported_with_its_data),
    TEST(pointer_inside_a_buffer_exports_from_there),
    TEST(export_without_config_ipc_is_unsupported),
    TEST(export_of_an_unlocked_or_spilled_buffer_is_not_locked),
    TEST(small_stable_buffer_is_read_and_written_by_another_process),
    TEST(large_stable_buffer_is_read_and_written_by_another_process),
    TEST(a_stable_handle_is_refused_unless_its_buffer_is_locked),
    TEST(a_stable_handle_outlives_no_exporter),
    TEST(stable_export_without_config_ipc_is_unsupported),
    TEST(export_arguments_are_checked),
    TEST(open_of_a_handle_of_this_process_is_unsupported),
    TEST(open_arguments_and_forged_handles_are_refused),
    TEST(an_exporter_answer_that_does_not_fit_the_handle_is_refused),
    TEST(a_handle_of_another_wire_format_is_refused_by_name),
    TEST(config_ipc_is_validated),
    TEST(exportable_memory_keeps_every_byte_through_spills),
};

int main(int argc, char **argv) {
  if (argc == 5 && strcmp(argv[1], "--ipc-child") == 0)
    return child_main(argv[2], strtoull(argv[3], NULL, 10), strtoull(argv[4], NULL, 10));
  spw_suite_t suite = {tests, sizeof tests / sizeof tests[0], NULL, NULL, NULL, NULL};
  return spw_test_main(&suite, argc, argv);
}
