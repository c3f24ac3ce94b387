/* SPDX-License-Identifier: Apache-2.0 */
/* The data plane of spw_stress: writing a buffer's new version and checking its contents,
 * enqueued on the acquiring stream between the acquire and the release, as a user's work
 * would be.
 *
 * Host backend: a check is spw_memcpy_async of the device memory into a private staging
 * copy, then a host function on the same stream that compares it with the pattern and
 * frees it; a write fills a staging copy with the pattern, spw_memcpy_async's it into the
 * device memory, and a host function frees the staging copy once the copy has run. CUDA
 * backend: the kernels of stress_kernels.cu, with the mismatches counted on the device.
 * Either way nothing waits, so the locks are released (or not) exactly as the worker
 * chose; a mismatch is recorded for the owning worker, which fails the run at its next
 * step with its history. A fence is a host function that posts the worker's semaphore. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "stress.h"
#include "stress_pattern.h"
#ifdef SPW_STRESS_HAVE_CUDA
#include "stress_kernels.h"
#endif

/* Host staging in flight per worker above which it waits for its streams. */
#define STAGING_MAX (64 * MiB)

typedef struct host_job {
  worker_t *w;
  uint8_t *staging;
  size_t size;
  spw_buf_t h;
  uint64_t id;
  uint32_t version;
} host_job_t;

static void pattern_fill(uint8_t *p, size_t n, uint64_t key) {
  size_t words = n / 8;
  for (size_t i = 0; i < words; i++) {
    uint64_t v = stress_word(key, i);
    memcpy(p + 8 * i, &v, 8);
  }
  if (n % 8) {
    uint64_t v = stress_word(key, words);
    memcpy(p + 8 * words, &v, n % 8); /* little-endian: the low bytes */
  }
}

/* Index of the first wrong word (the tail counts as a word), or (size_t)-1. */
static size_t pattern_mismatch(const uint8_t *p, size_t n, uint64_t key, uint64_t *got) {
  size_t words = n / 8;
  for (size_t i = 0; i < words; i++) {
    uint64_t v;
    memcpy(&v, p + 8 * i, 8);
    if (v != stress_word(key, i)) {
      *got = v;
      return i;
    }
  }
  if (n % 8) {
    uint64_t v = 0, want = stress_word(key, words);
    memcpy(&v, p + 8 * words, n % 8);
    uint64_t mask = (1ull << (8 * (n % 8))) - 1;
    if (v != (want & mask)) {
      *got = v;
      return words;
    }
  }
  return (size_t)-1;
}

/* What the wrong word was: a stale version of this buffer, another buffer's, or garbage. */
static void describe_wrong(char *out, size_t len, uint64_t id, uint32_t version, uint64_t index,
                           uint64_t got, uint64_t next_id) {
  uint64_t key = stress_key_of(got, index);
  uint64_t kid = key >> STRESS_VERSION_BITS;
  uint32_t kver = (uint32_t)(key & ((1u << STRESS_VERSION_BITS) - 1));
  if (got == 0)
    snprintf(out, len, "a zero word");
  else if (kid == id && kver < version)
    snprintf(out, len, "a stale copy: version %u of this buffer", kver);
  else if (kid == id)
    snprintf(out, len, "version %u of this buffer, never written yet", kver);
  else if (kid > 0 && kid < next_id)
    snprintf(out, len, "foreign data: buffer id %llu version %u", (unsigned long long)kid, kver);
  else
    snprintf(out, len, "garbage (not any buffer's word at this index)");
}

static void record_bad(worker_t *w, const char *what, uint64_t id, uint32_t version, uint64_t index,
                       uint64_t got, spw_buf_t h) {
  int expected = 0;
  if (!atomic_compare_exchange_strong(&w->bad, &expected, 1)) return;
  char why[160];
  describe_wrong(why, sizeof why, id, version, index, got, atomic_load(&w->st->next_id));
  snprintf(w->bad_msg, sizeof w->bad_msg,
           "%s: buffer id %llu (handle %#llx) version %u: word %llu reads %#018llx, expected "
           "%#018llx: %s",
           what, (unsigned long long)id, (unsigned long long)h, version, (unsigned long long)index,
           (unsigned long long)got, (unsigned long long)stress_word(stress_key(id, version), index),
           why);
  atomic_store_explicit(&w->bad, 2, memory_order_release);
}

static void host_verify_run(void *arg) {
  host_job_t *j = arg;
  uint64_t got = 0;
  size_t at = pattern_mismatch(j->staging, j->size, stress_key(j->id, j->version), &got);
  if (at != (size_t)-1) record_bad(j->w, "contents check", j->id, j->version, at, got, j->h);
  atomic_fetch_add(&j->w->host_checks, 1);
  atomic_fetch_add(&j->w->host_bytes_checked, j->size);
  atomic_fetch_sub(&j->w->staging, j->size);
  free(j->staging);
  free(j);
}

static void host_free_run(void *arg) {
  host_job_t *j = arg;
  atomic_fetch_sub(&j->w->staging, j->size);
  free(j->staging);
  free(j);
}

static void fence_run(void *arg) { sem_post(arg); }

static host_job_t *host_job(worker_t *w, int s, const mbuf_t *b) {
  if (atomic_load(&w->staging) > STAGING_MAX)
    for (int k = 0; k < w->nstreams; k++) stress_data_fence(w, k);
  (void)s;
  host_job_t *j = malloc(sizeof *j);
  uint8_t *staging = malloc(b->size);
  if (!j || !staging)
    stress_fail(w->st, w, "out of host memory for a %zu-byte staging copy", b->size);
  *j = (host_job_t){w, staging, b->size, b->h, b->id, b->version};
  atomic_fetch_add(&w->staging, b->size);
  return j;
}

int stress_data_init(worker_t *w) {
  if (sem_init(&w->fence, 0, 0) != 0) return -1;
#ifdef SPW_STRESS_HAVE_CUDA
  if (w->st->backend == SPW_BACKEND_CUDA) {
    stress_cuda_check_t *c = NULL;
    int e = stress_cuda_check_create(&c);
    if (e != 0) {
      fprintf(stderr, "spw_stress: cannot set up the check record: %s\n",
              stress_cuda_error_name(e));
      return -1;
    }
    w->cuda_check = c;
  }
#endif
  return 0;
}

void stress_data_fini(worker_t *w) {
#ifdef SPW_STRESS_HAVE_CUDA
  stress_cuda_check_destroy(w->cuda_check);
  w->cuda_check = NULL;
#endif
  sem_destroy(&w->fence);
}

void stress_data_verify(worker_t *w, int s, const void *dptr, const mbuf_t *b) {
  stress_t *st = w->st;
  w->checks++;
  w->bytes_checked += b->size;
  stress_note(&w->hist, OP_VERIFY, 0, s, 0, b->h, b->id, b->version, b->size, 0);
#ifdef SPW_STRESS_HAVE_CUDA
  if (st->backend == SPW_BACKEND_CUDA) {
    int e = stress_cuda_verify(dptr, b->size, stress_key(b->id, b->version), w->cuda_check,
                               w->streams[s]);
    if (e != 0) stress_fail(st, w, "check kernel launch: %s", stress_cuda_error_name(e));
    return;
  }
#endif
  host_job_t *j = host_job(w, s, b);
  stress_expect(st, w, "spw_memcpy_async (device to host, check)",
                spw_memcpy_async(st->rt, j->staging, dptr, b->size, w->streams[s]), ACC(OK), b);
  stress_expect(st, w, "spw_launch_host_func (check)",
                spw_launch_host_func(st->rt, w->streams[s], host_verify_run, j), ACC(OK), b);
}

void stress_data_write(worker_t *w, int s, void *dptr, const mbuf_t *b) {
  stress_t *st = w->st;
  w->bytes_written += b->size;
  stress_note(&w->hist, OP_WRITE, 0, s, 0, b->h, b->id, b->version, b->size, 0);
#ifdef SPW_STRESS_HAVE_CUDA
  if (st->backend == SPW_BACKEND_CUDA) {
    int e = stress_cuda_write(dptr, b->size, stress_key(b->id, b->version), w->streams[s]);
    if (e != 0) stress_fail(st, w, "write kernel launch: %s", stress_cuda_error_name(e));
    return;
  }
#endif
  host_job_t *j = host_job(w, s, b);
  pattern_fill(j->staging, b->size, stress_key(b->id, b->version));
  stress_expect(st, w, "spw_memcpy_async (host to device, write)",
                spw_memcpy_async(st->rt, dptr, j->staging, b->size, w->streams[s]), ACC(OK), b);
  stress_expect(st, w, "spw_launch_host_func (write)",
                spw_launch_host_func(st->rt, w->streams[s], host_free_run, j), ACC(OK), b);
}

void stress_data_fence(worker_t *w, int s) {
  stress_t *st = w->st;
  int rc = spw_launch_host_func(st->rt, w->streams[s], fence_run, &w->fence);
  stress_note(&w->hist, OP_FENCE, rc, s, 0, 0, 0, 0, 0, 0);
  stress_expect(st, w, "spw_launch_host_func (fence)", rc, ACC(OK), NULL);
  while (sem_wait(&w->fence) != 0) {
  }
}

void stress_data_check(worker_t *w, bool device) {
  if (atomic_load_explicit(&w->bad, memory_order_acquire) == 2)
    stress_fail(w->st, w, "%s", w->bad_msg);
#ifdef SPW_STRESS_HAVE_CUDA
  if (device && w->cuda_check) {
    stress_cuda_result_t r;
    int e = stress_cuda_check_read(w->cuda_check, &r);
    if (e != 0) stress_fail(w->st, w, "reading the check record: %s", stress_cuda_error_name(e));
    if (r.wrong_words > 0) {
      uint64_t key = r.first_set == 1 ? r.first_key : 0;
      uint64_t id = key >> STRESS_VERSION_BITS;
      uint32_t version = (uint32_t)(key & ((1u << STRESS_VERSION_BITS) - 1));
      char why[160] = "details not recorded";
      if (r.first_set == 1)
        describe_wrong(why, sizeof why, id, version, r.first_index, r.first_got,
                       atomic_load(&w->st->next_id));
      stress_fail(w->st, w,
                  "check kernels found %llu wrong words; the first: buffer id %llu version %u "
                  "word %llu reads %#018llx: %s",
                  r.wrong_words, (unsigned long long)id, version, (unsigned long long)r.first_index,
                  r.first_got, why);
    }
  }
#else
  (void)device;
#endif
}

void stress_data_finish(stress_t *st) {
#ifdef SPW_STRESS_HAVE_CUDA
  if (st->backend == SPW_BACKEND_CUDA) {
    int e = stress_cuda_finish();
    if (e != 0)
      stress_fail(st, NULL, "CUDA error at the end of the run: %s", stress_cuda_error_name(e));
  }
#else
  (void)st;
#endif
}
