/* SPDX-License-Identifier: Apache-2.0 */
/* The runtime's lifecycle: from resolved settings to a running runtime (backend behind the
 * fault shim, limits, handle and stream tables, tiers, device pool, completion poller and
 * engine), the disk tier opened on first need, and everything torn down in the reverse
 * order of creation. */
#include "runtime.h"
#include "ipc.h"
#include "ipc_share.h"
#include "host_extent.h"
#include "peer.h"

#include <stdlib.h>
#include <unistd.h>

#include "clock.h"
#include "jobs.h"

/* Helpers beside each lane for large requests: the per-buffer work of a move (claim, host
 * extent or device block, copy descriptor, commit) is CPU work, about 0.2 µs a 4 KiB buffer
 * on an H100 machine, where the host link would take 0.08 (docs/benchmarks.md, issue 20).
 * By default up to three a lane, leaving most cores to the application. */
static unsigned lane_helpers(const spw_settings_t *s) {
  if (s->engine_helpers >= 0) return (unsigned)s->engine_helpers;
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  return cores >= 8 ? 3 : cores >= 4 ? 1 : 0;
}

static int open_backend(spw_runtime_t *rt) {
  spw_backend_params_t p = {.device = rt->settings.device,
                            .host_device_bytes = rt->settings.host_device_bytes,
                            .on_error = spw__error_sink,
                            .err_ctx = rt,
                            .vm_shareable = rt->settings.ipc};
  const spw_backend_ops_t *ops = NULL;
  spw_backend_t *b = NULL;
  int st = SPW_ERR_NO_DEVICE;
  spw_backend_kind_t want = rt->settings.backend;
#ifdef SPW_HAVE_CUDA
  if (want == SPW_BACKEND_CUDA || want == SPW_BACKEND_AUTO) {
    ops = &spw__backend_cuda_ops;
    st = ops->create(&p, &b);
    if (st != SPW_OK && want == SPW_BACKEND_CUDA) return st;
    if (st != SPW_OK && st != SPW_ERR_NO_DEVICE) return st;
  }
#else
  if (want == SPW_BACKEND_CUDA) {
    spw__log(&rt->log, SPW_LOG_ERROR, "backend cuda asked for, but this build has no CUDA");
    return SPW_ERR_NO_DEVICE;
  }
#endif
  if (st != SPW_OK) {
    ops = &spw__backend_host_ops;
    st = ops->create(&p, &b);
    if (st != SPW_OK) return st;
  }
  rt->kind = ops->kind;
  st = spw__faults_wrap(ops, b, spw__error_sink, rt, &rt->ops, &rt->be);
  if (st != SPW_OK) ops->destroy(b);
  return st;
}

static int compute_limits(spw_runtime_t *rt) {
  size_t free_b = 0, total_b = 0;
  int st = rt->ops->mem_info(rt->be, &free_b, &total_b);
  if (st != SPW_OK) return st;
  uint64_t limit = rt->settings.device_limit;
  if (limit == 0) limit = (uint64_t)((double)free_b * rt->settings.device_limit_fraction);
  if (limit > total_b)
    spw__log(&rt->log, SPW_LOG_WARN,
             "device limit %llu bytes exceeds the device's %zu bytes; the device will refuse first",
             (unsigned long long)limit, total_b);
  spw_budget_t *b = &rt->budget;
  b->limit = limit;
  b->high = (uint64_t)((double)limit * rt->settings.high_watermark);
  b->low = (uint64_t)((double)limit * rt->settings.low_watermark);
  return SPW_OK;
}

static void free_shell(spw_runtime_t *rt) {
  for (spw_tls_t *t = rt->tls_list, *n; t; t = n) {
    n = t->next;
    free(t);
  }
  pthread_key_delete(rt->tls_key);
  pthread_mutex_destroy(&rt->tls_mu);
  pthread_mutex_destroy(&rt->ctl_mu);
  pthread_mutex_destroy(&rt->ipc_mu);
  free(rt->ipc_opened);
  spw__hints_destroy(&rt->hints);
  pthread_mutex_destroy(&rt->hints_mu);
  pthread_mutex_destroy(&rt->d2h_gate);
  pthread_mutex_destroy(&rt->disk_mu);
  pthread_cond_destroy(&rt->budget.cv);
  pthread_mutex_destroy(&rt->budget.mu);
  spw__peer_fini(rt);
  spw__owners_destroy(rt->owners);
  free(rt);
}

/* Everything below the shell, in the reverse order of creation; each part NULL-safe. */
static void close_parts(spw_runtime_t *rt) {
  spw__ipc_server_stop(rt); /* it reads buffers and the stable pool */
  spw__engine_stop(rt->engine);
  rt->engine = NULL;
  for (int i = 0; i < 2; i++) { /* after the lanes that run them */
    spw__workers_stop(rt->workers[i]);
    rt->workers[i] = NULL;
  }
  spw__completions_stop(rt->completions);
  rt->completions = NULL;
  spw__trace_close(rt->trace); /* nothing adds events any more */
  rt->trace = NULL;
  spw__dpool_destroy(rt->dpool);
  spw__stable_destroy(rt->stable);
  rt->stable = NULL;
  if (rt->ops) {
    rt->ops->stream_sync(rt->be, rt->null_bstream);
    spw__event_pool_fini(&rt->events);
    uint32_t n = atomic_load(&rt->handles.nslots);
    for (uint32_t i = 0; i < n; i++) {
      spw_slot_t *s = spw__handles_slot_at(&rt->handles, i);
      if (s->ready) rt->ops->event_destroy(rt->be, s->ready);
      s->ready = NULL;
    }
  }
  spw__disk_destroy(rt->disk);
  if (rt->arena) spw__arena_destroy(rt->arena);
  if (rt->ops) spw__ipc_close_all(rt);
  if (rt->ops) rt->ops->destroy(rt->be);
  spw__handles_destroy(&rt->handles);
  spw__streams_destroy(&rt->streams);
}

int spw__runtime_open(const spw_settings_t *settings, void (*armed)(spw_backend_t *shim, void *arg),
                      void *arg, spw_runtime_t **out) {
  spw_runtime_t *rt = calloc(1, sizeof *rt);
  if (!rt) return SPW_ERR_SYSTEM;
  rt->settings = *settings;
  rt->log.level = settings->log_level;
  pthread_mutex_init(&rt->budget.mu, NULL);
  pthread_cond_init(&rt->budget.cv, NULL);
  pthread_mutex_init(&rt->disk_mu, NULL);
  pthread_mutex_init(&rt->d2h_gate, NULL);
  pthread_mutex_init(&rt->ctl_mu, NULL);
  pthread_mutex_init(&rt->hints_mu, NULL);
  pthread_mutex_init(&rt->tls_mu, NULL);
  pthread_mutex_init(&rt->ipc_mu, NULL);
  rt->owners = spw__owners_create();
  if (!rt->owners || spw__peer_init(rt) != SPW_OK) {
    spw__owners_destroy(rt->owners);
    free(rt);
    return SPW_ERR_SYSTEM;
  }
  if (pthread_key_create(&rt->tls_key, NULL) != 0) {
    spw__peer_fini(rt);
    spw__owners_destroy(rt->owners);
    free(rt);
    return SPW_ERR_SYSTEM;
  }
  /* The tag tells this runtime's handles from another's: the address and the clock mixed. */
  uint64_t mix = ((uint64_t)(uintptr_t)rt * 0x9E3779B97F4A7C15ull) ^ spw__now_ns();
  uint16_t tag = (uint16_t)(mix ^ (mix >> 16) ^ (mix >> 32) ^ (mix >> 48));
  int st = spw__handles_init(&rt->handles, tag);
  if (st == SPW_OK) st = open_backend(rt);
  if (st == SPW_OK && armed) armed(rt->be, arg);
  if (st == SPW_OK) {
    spw__event_pool_init(&rt->events, rt->ops, rt->be);
    rt->null_bstream = rt->ops->default_stream(rt->be);
    st = spw__streams_init(&rt->streams, rt->null_bstream);
  }
  if (st == SPW_OK) st = compute_limits(rt);
  if (st == SPW_OK) {
    /* Slabs as large as the largest common buffers (a larger one gets a slab of its own,
     * mapped and pinned for each spill). */
    size_t slab = rt->kind == SPW_BACKEND_HOST ? (size_t)64 << 20 : (size_t)1 << 30;
    st = spw__arena_create(rt->ops, rt->be, rt->settings.host_limit, slab, &rt->arena);
  }
  if (st == SPW_OK) st = spw__completions_start(rt->ops, rt->be, &rt->events, &rt->completions);
  if (st == SPW_OK) {
    spw_dpool_params_t p = {rt->ops, rt->be, rt->null_bstream, rt->budget.limit, rt->completions,
                            rt->settings.ipc};
    st = spw__dpool_create(&p, &rt->dpool);
  }
  if (st == SPW_OK) {
    /* Unmapped chunks kept for the next unspill: an eighth of the limit, so that a steady
     * spill/unspill churn of stable buffers creates no chunk, while cached chunks cannot
     * hold much that an ordinary allocation might need (they go back when one is refused). */
    spw_stable_params_t p = {rt->ops, rt->be, rt->budget.limit / 8};
    st = spw__stable_create(&p, &rt->stable);
  }
  /* A trace that cannot be written is logged and left out: it must not stop the program. */
  if (st == SPW_OK) (void)spw__trace_open(rt, &rt->trace);
  const char *slice_min = getenv("SPILLWAY_TEST_SLICE_MIN");
  if (slice_min && atol(slice_min) > 0) rt->slice_min = (size_t)atol(slice_min);
  for (int i = 0; i < 2 && st == SPW_OK; i++)
    if (spw__workers_start(lane_helpers(&rt->settings), &rt->workers[i]) != 0) st = SPW_ERR_SYSTEM;
  if (st == SPW_OK) {
    spw_engine_work_t work = spw__jobs_work(rt);
    /* A stream for each slice a request can be cut into (spw__slice_count). */
    const unsigned slices = spw__workers_width(rt->workers[SPW_LANE_DOWN]);
    st = spw__engine_start(rt->ops, rt->be, &work, slices, &rt->engine);
  }
  if (st != SPW_OK) {
    spw__log(&rt->log, SPW_LOG_ERROR, "runtime creation failed: %s", spw_err_name(st));
    close_parts(rt);
    free_shell(rt);
    return st;
  }
  spw__log(&rt->log, SPW_LOG_INFO,
           "runtime on backend %s: device limit %llu B (high %llu, low %llu), host limit %llu B",
           rt->kind == SPW_BACKEND_CUDA ? "cuda" : "host", (unsigned long long)rt->budget.limit,
           (unsigned long long)rt->budget.high, (unsigned long long)rt->budget.low,
           (unsigned long long)rt->settings.host_limit);
  *out = rt;
  return SPW_OK;
}

static void destroy_owned_stream(spw_stream_entry_t *e, void *arg) {
  spw_runtime_t *rt = arg;
  if (e->owned && atomic_load(&e->live)) {
    rt->ops->stream_destroy(rt->be, e->bstream);
    atomic_store(&e->live, 0);
  }
}

void spw__runtime_close(spw_runtime_t *rt) {
  spw__engine_stop(rt->engine);
  rt->engine = NULL;
  for (int i = 0; i < 2; i++) {
    spw__workers_stop(rt->workers[i]);
    rt->workers[i] = NULL;
  }
  spw__completions_stop(rt->completions);
  rt->completions = NULL;
  /* Whatever buffers are left, in every tier: nothing can touch them any more. */
  uint32_t n = atomic_load(&rt->handles.nslots);
  for (uint32_t i = 0; i < n; i++) {
    spw_slot_t *s = spw__handles_slot_at(&rt->handles, i);
    if (spw__w_state(atomic_load(&s->word)) == SPW_SLOT_UNUSED) continue;
    void *va = spw__slot_va(s);
    if (va) {
      if (s->dptr) spw__stable_unmap(rt->stable, va);
      spw__stable_unreserve(rt->stable, va);
    } else {
      spw__dpool_free_now(rt->dpool, s->dptr, s->size);
    }
    spw__host_extent_free(rt, &s->host);
    spw__disk_free(rt->disk, &s->disk);
    s->dptr = NULL;
  }
  spw__peer_give_back_end(rt);
  spw__streams_foreach(&rt->streams, destroy_owned_stream, rt);
  close_parts(rt);
  free_shell(rt);
}

spw_disk_t *spw__disk(spw_runtime_t *rt, int *status) {
  pthread_mutex_lock(&rt->disk_mu);
  int st = rt->disk_status;
  if (st == SPW_OK && !rt->disk) {
    spw_disk_params_t p = {.ops = rt->ops,
                           .be = rt->be,
                           .dir = rt->settings.spill_dir,
                           .limit = rt->settings.disk_limit,
                           .io = rt->settings.io,
                           .log = spw__log_sink,
                           .on_error = spw__error_sink,
                           .requests = &rt->c.disk_requests,
                           .ctx = rt};
    st = spw__disk_create(&p, &rt->disk);
    /* A directory that is not there or an I/O path the kernel refuses stays so: remembered,
     * and not tried again. Anything else (a failed registration, memory) may pass: the
     * next need tries again. */
    if (st == SPW_ERR_CONFIG || st == SPW_ERR_UNSUPPORTED) rt->disk_status = st;
    if (st != SPW_OK && st != rt->disk_logged) {
      rt->disk_logged = st;
      spw__log(&rt->log, SPW_LOG_WARN, "disk tier unavailable (%s)%s", spw_err_name(st),
               rt->disk_status ? ": spilling stops at host memory" : "; will try again");
    }
  }
  spw_disk_t *d = rt->disk;
  pthread_mutex_unlock(&rt->disk_mu);
  *status = st;
  return d;
}

/* A request this large is cut into slices moved at once by a lane and its helpers; below
 * it, waking them would cost more than it saves. */
#define SLICE_MIN 4096

int spw__lane_sync(spw_runtime_t *rt, spw_lane_t lane) {
  int st = SPW_OK;
  for (unsigned i = 0; i < spw__engine_slices(rt->engine, lane); i++) {
    int k = rt->ops->stream_sync(rt->be, spw__engine_slice_stream(rt->engine, lane, i));
    if (st == SPW_OK) st = k;
  }
  return st;
}

unsigned spw__slice_count(const spw_runtime_t *rt, spw_lane_t lane, size_t n) {
  size_t want = n / (rt->slice_min ? rt->slice_min : SLICE_MIN);
  unsigned width = spw__workers_width(rt->workers[lane]);
  return want < 1 ? 1 : want > width ? width : (unsigned)want;
}

void spw__inject_fault(spw_runtime_t *rt, spw_fault_t f, uint32_t count) {
  spw__faults_arm(rt->be, f, 0, count);
}

void spw__inject_disk_fault(spw_runtime_t *rt, int status, unsigned count) {
  int st;
  spw_disk_t *d = spw__disk(rt, &st);
  if (d) spw__disk_inject_fault(d, status, count);
}
