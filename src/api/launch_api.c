/* SPDX-License-Identifier: Apache-2.0 */
/* The launch wrappers: RMMEP-1's lockAndLaunch and lockAndLaunchAsync for any function
 * (spw_lock_and_launch, spw_lock_and_launch_async), the kernel launcher (spw_launch_kernel),
 * the graph launcher (spw_graph_launch: address-stable buffers only), and the two calls they
 * are made of that the API lacked: an acquire with flags and an offset per buffer
 * (spw_acquire_args) and a stream wait that releases nothing (spw_stream_wait). The kernel
 * and the graph launcher end alike (after_launch): a launch the backend refused drops its
 * locks at once, an accepted one releases them as the flags say.
 *
 * Built on what the public calls do: spw_acquire one buffer at a time (so a failure knows
 * which argument it was), spw_release to undo, and spw_release_n_async for the release of
 * one launch, which takes out of the stream's lock map exactly the locks the launch took
 * and leaves the stream's other locks alone. The acquire and the release go straight to
 * their insides (the lock and the lock map of the stream entry looked up once), since the
 * launch has checked what they would check again per buffer; the runtime's insides are
 * otherwise reached only for what the API has no call for: the stream's backend handle (to
 * wait on it, and to launch a kernel through the backend seam) and the thread's error text
 * (to name the argument).
 *
 * A launch of up to STACK_ARGS buffers or arguments allocates nothing here. The release it
 * schedules joins the stream's pending release when the poller has not picked that up yet
 * (launches back to back share one completion item and one event, src/core/locks.c), and
 * allocates only when it starts a new one.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api.h"
#include "locks.h"

#define ARG_FLAGS (SPW_ACQUIRE_READ | SPW_ACQUIRE_TRY)
#define LAUNCH_FLAGS (SPW_LAUNCH_BLOCK | SPW_LAUNCH_KEEP_LOCKS)
/* Unknown bits, or both ways of releasing at once. */
#define BAD_LAUNCH_FLAGS(f) (((f) & ~LAUNCH_FLAGS) || ((f) & LAUNCH_FLAGS) == LAUNCH_FLAGS)
#define STACK_ARGS 32

/* ---- errors ---------------------------------------------------------------------------- */

/* Names the argument that failed in spw_last_error ("argument 2 (buffer 0x...):
 * SPW_ERR_FREED: buffer was freed (stale handle)"), keeping the failure's own detail. */
static int arg_failed(spw_runtime_t *rt, int st, const char *what, size_t pos, spw_buf_t buf) {
  const char *d = spw_status_has_detail(st) ? spw_last_error(rt) : "";
  char detail[384];
  snprintf(detail, sizeof detail, "%s", *d ? d : spw_strerror(st));
  return spw__set_error(rt, st, "%s %zu (buffer 0x%016" PRIx64 "): %s: %s", what, pos,
                        (uint64_t)buf, spw_err_name(st), detail);
}

/* ---- acquire and release of one launch ------------------------------------------------- */

/* Releases the first n locks of a list at once: for undoing, when nothing was launched. */
static void undo(spw_runtime_t *rt, const spw_buf_arg_t *a, size_t n, spw_stream_t stream) {
  /* Newest first, which is where the lock map looks first. It cannot fail: the locks were
   * just taken on this stream (a synchronize of the stream by another thread meanwhile is
   * that thread's race, as for spw_acquire_n). */
  for (size_t i = n; i-- > 0;) (void)spw_release(rt, a[i].buf, stream);
}

/* Locks a[0..n) on `stream`, each with its own flags, and writes each device pointer +
 * offset to dptrs[i]. All or nothing; on failure spw_last_error names the entry as
 * "<what> <pos[i]>" (pos NULL: the index). The stream has been validated. */
static int acquire_list(spw_runtime_t *rt, spw_stream_entry_t *e, const spw_buf_arg_t *a,
                        size_t n, spw_stream_t stream, void **dptrs, const char *what,
                        const uint32_t *pos) {
  for (size_t i = 0; i < n; i++)
    if ((a[i].flags & ~ARG_FLAGS) || a[i].reserved)
      return arg_failed(rt, SPW_ERR_INVALID_ARG, what, pos ? pos[i] : i, a[i].buf);
  size_t i = 0, size = 0;
  int st = SPW_OK, past_end = 0;
  for (; i < n; i++) {
    void *p = NULL;
    st = spw__lock(rt, a[i].buf, e, a[i].flags, &p); /* spw_acquire's two steps */
    if (st != SPW_OK) break;
    if ((st = spw__lockmap_push(e, a[i].buf)) != SPW_OK) {
      spw__unlock(rt, a[i].buf);
      break;
    }
    if (a[i].offset != 0) {
      st = spw_buf_size(rt, a[i].buf, &size); /* fails only if freed since the acquire */
      if (st == SPW_OK && a[i].offset > size) {
        st = SPW_ERR_INVALID_ARG;
        past_end = 1;
      }
      if (st != SPW_OK) {
        (void)spw_release(rt, a[i].buf, stream);
        break;
      }
    }
    dptrs[i] = (char *)p + a[i].offset;
  }
  if (st == SPW_OK) return SPW_OK;
  undo(rt, a, i, stream);
  if (past_end)
    return spw__set_error(rt, st, "%s %zu (buffer 0x%016" PRIx64 "): offset %" PRIu64
                          " is past the end of its %zu bytes", what, pos ? (size_t)pos[i] : i,
                          (uint64_t)a[i].buf, a[i].offset, size);
  return arg_failed(rt, st, what, pos ? pos[i] : i, a[i].buf);
}

/* Releases the n locks of one launch once the work enqueued on `stream` so far has
 * completed: without blocking (spw_release_n_async), or by waiting for the stream first
 * (block). A release that cannot be scheduled falls back to waiting: a launch never leaves
 * its locks behind. If the wait fails, the work may still be running, so the locks stay in
 * the stream's lock map for spw_stream_synchronize, and the error is returned. */
static int release_after(spw_runtime_t *rt, spw_stream_entry_t *e, const spw_buf_arg_t *a,
                         size_t n, spw_stream_t stream, int block) {
  if (n == 0) return block ? spw_stream_wait(rt, stream) : SPW_OK;
  if (!block) {
    spw_buf_t stack[STACK_ARGS] = {0}; /* zeroed only to quiet GCC's maybe-uninitialized */
    spw_buf_t *h = n <= STACK_ARGS ? stack : malloc(n * sizeof *h);
    int st = SPW_ERR_SYSTEM;
    if (h) {
      /* spw_release_n_async without its checks: these locks were just taken on e. Not
       * maybe_idle: the kernel was just enqueued, and a look at the stream would cost a
       * driver call per launch to find it still running. */
      for (size_t i = 0; i < n; i++) h[i] = a[i].buf;
      st = spw__release_n_after(rt, e, h, n, 0);
      if (h != stack) free(h);
    }
    /* The other errors mean the locks are not there to release: nothing to fall back to. */
    if (st != SPW_ERR_SYSTEM && st != SPW_ERR_CUDA) return st;
    spw__log(&rt->log, SPW_LOG_WARN, "launch: the release could not be scheduled (%s): "
             "waiting for the stream instead", spw_err_name(st));
  }
  int st = spw_stream_wait(rt, stream);
  if (st != SPW_OK) return st;
  for (size_t i = n; i-- > 0;) {
    int r = spw_release(rt, a[i].buf, stream);
    if (r != SPW_OK && st == SPW_OK) st = r;
  }
  return st;
}

/* The end of a launch through the backend (a kernel, a graph), whose locks a[0..n) were
 * taken on `stream`: `launched` is the backend's status. A refused launch ran nothing, so
 * nothing can be using the buffers: its locks go at once and spw_last_error says "<what>:
 * <the backend's text>". Otherwise the locks go as `flags` say (spw_lock_and_launch). */
static int after_launch(spw_runtime_t *rt, spw_stream_entry_t *e, const spw_buf_arg_t *a,
                        size_t n, spw_stream_t stream, unsigned flags, int launched,
                        const char *what) {
  if (launched != SPW_OK) {
    char detail[384];
    snprintf(detail, sizeof detail, "%s",
             spw_status_has_detail(launched) ? spw_last_error(rt) : "");
    undo(rt, a, n, stream);
    return spw__set_error(rt, launched, "%s: %s", what, *detail ? detail : spw_strerror(launched));
  }
  if (flags & SPW_LAUNCH_KEEP_LOCKS) return SPW_OK;
  return release_after(rt, e, a, n, stream, flags & SPW_LAUNCH_BLOCK);
}

/* ---- public calls ---------------------------------------------------------------------- */

int spw_stream_wait(spw_runtime_t *rt, spw_stream_t stream) {
  if (!rt) return SPW_ERR_INVALID_ARG;
  if (spw__in_callback(rt)) return SPW_ERR_WOULD_DEADLOCK;
  spw_stream_entry_t *e;
  int st = spw__stream_entry(rt, stream, &e);
  if (st != SPW_OK) return st;
  return rt->ops->stream_sync(rt->be, e->bstream);
}

int spw_acquire_args(spw_runtime_t *rt, const spw_buf_arg_t *args, size_t n, spw_stream_t stream,
                     void **dptrs) {
  if (!rt || !args || !dptrs || n == 0 || n > SIZE_MAX / sizeof(void *))
    return SPW_ERR_INVALID_ARG;
  spw_stream_entry_t *e;
  int st = spw__stream_entry(rt, stream, &e);
  if (st != SPW_OK) return st;
  /* Outputs are written only on success: the pointers gather here first. */
  void *stack[STACK_ARGS];
  void **tmp = n <= STACK_ARGS ? stack : malloc(n * sizeof *tmp);
  if (!tmp) return SPW_ERR_SYSTEM;
  st = acquire_list(rt, e, args, n, stream, tmp, "argument", NULL);
  if (st == SPW_OK) memcpy(dptrs, tmp, n * sizeof *tmp);
  if (tmp != stack) free(tmp);
  return st;
}

int spw_lock_and_launch(spw_runtime_t *rt, const spw_buf_arg_t *args, size_t n,
                        spw_stream_t stream, unsigned flags, spw_launch_fn fn, void *user) {
  if (!rt || !fn || (n > 0 && !args) || n > SIZE_MAX / sizeof(void *) || BAD_LAUNCH_FLAGS(flags))
    return SPW_ERR_INVALID_ARG;
  if ((flags & SPW_LAUNCH_BLOCK) && spw__in_callback(rt)) return SPW_ERR_WOULD_DEADLOCK;
  spw_stream_entry_t *e;
  int st = spw__stream_entry(rt, stream, &e);
  if (st != SPW_OK) return st;
  void *stack[STACK_ARGS];
  void **dptrs = n <= STACK_ARGS ? stack : malloc(n * sizeof *dptrs);
  if (!dptrs) return SPW_ERR_SYSTEM;
  st = acquire_list(rt, e, args, n, stream, dptrs, "argument", NULL);
  if (st == SPW_OK) {
    int r = fn(user, dptrs, stream);
    /* A failed fn leaves nothing locked whatever the flags: its locks go once whatever it
     * did enqueue has completed. */
    if (r != 0 || !(flags & SPW_LAUNCH_KEEP_LOCKS))
      st = release_after(rt, e, args, n, stream, r == 0 && (flags & SPW_LAUNCH_BLOCK));
    if (r != 0) st = r;
  }
  if (dptrs != stack) free(dptrs);
  return st;
}

int spw_lock_and_launch_async(spw_runtime_t *rt, const spw_buf_arg_t *args, size_t n,
                              spw_stream_t stream, spw_launch_fn fn, void *user) {
  return spw_lock_and_launch(rt, args, n, stream, SPW_LAUNCH_KEEP_LOCKS, fn, user);
}

/* The arrays of one kernel launch, each nargs long (buffers: at most nargs). */
typedef struct karrays {
  spw_buf_arg_t *bufs; /* the buffer arguments, in order */
  uint32_t *pos;       /* bufs[j] is argument pos[j] */
  void **dptrs;        /* bufs[j]'s device pointer + offset */
  void **vals;         /* what the backend is given: vals[i] points to argument i's value */
  size_t *sizes;
} karrays_t;

/* Checks one argument; on a bad one, says which in spw_last_error. */
static int karg_check(spw_runtime_t *rt, const spw_kernel_arg_t *a, size_t i) {
  if (a->reserved != 0 || (a->kind != SPW_KARG_VALUE && a->kind != SPW_KARG_BUFFER))
    return spw__set_error(rt, SPW_ERR_INVALID_ARG, "kernel argument %zu: unknown kind %" PRIu32
                          " or reserved field not 0", i, a->kind);
  if (a->kind == SPW_KARG_VALUE && (!a->value || a->size == 0))
    return spw__set_error(rt, SPW_ERR_INVALID_ARG, "kernel argument %zu: value NULL or of "
                          "size 0", i);
  return SPW_OK;
}

int spw_launch_kernel(spw_runtime_t *rt, const void *func, spw_dim3_t grid, spw_dim3_t block,
                      const spw_kernel_arg_t *args, size_t nargs, size_t shared_bytes,
                      spw_stream_t stream, unsigned flags) {
  if (!rt || !func || !grid.x || !grid.y || !grid.z || !block.x || !block.y || !block.z ||
      nargs > SPW_KERNEL_ARGS_MAX || (nargs > 0 && !args) || BAD_LAUNCH_FLAGS(flags))
    return SPW_ERR_INVALID_ARG;
  if ((flags & SPW_LAUNCH_BLOCK) && spw__in_callback(rt)) return SPW_ERR_WOULD_DEADLOCK;
  size_t bytes = 0;
  for (size_t i = 0; i < nargs; i++) {
    int st = karg_check(rt, &args[i], i);
    if (st != SPW_OK) return st;
    bytes += args[i].kind == SPW_KARG_VALUE ? args[i].size : sizeof(void *);
    if (bytes > SPW_KERNEL_ARG_BYTES_MAX)
      return spw__set_error(rt, SPW_ERR_INVALID_ARG, "kernel arguments 0..%zu: more than %u "
                            "bytes of values", i, SPW_KERNEL_ARG_BYTES_MAX);
  }
  spw_stream_entry_t *e;
  int st = spw__stream_entry(rt, stream, &e);
  if (st != SPW_OK) return st;

  spw_buf_arg_t s_bufs[STACK_ARGS];
  uint32_t s_pos[STACK_ARGS];
  void *s_dptrs[STACK_ARGS], *s_vals[STACK_ARGS];
  size_t s_sizes[STACK_ARGS];
  karrays_t k = {s_bufs, s_pos, s_dptrs, s_vals, s_sizes};
  void *heap = NULL;
  if (nargs > STACK_ARGS) {
    size_t per = sizeof *k.bufs + sizeof *k.pos + sizeof *k.dptrs + sizeof *k.vals +
                 sizeof *k.sizes;
    if (!(heap = malloc(nargs * per))) return SPW_ERR_SYSTEM;
    /* Largest alignment first, so that each array starts aligned. */
    k.bufs = heap;
    k.dptrs = (void **)(k.bufs + nargs);
    k.vals = k.dptrs + nargs;
    k.sizes = (size_t *)(k.vals + nargs);
    k.pos = (uint32_t *)(k.sizes + nargs);
  }

  size_t nb = 0;
  for (size_t i = 0; i < nargs; i++) {
    if (args[i].kind == SPW_KARG_BUFFER) {
      k.bufs[nb] = args[i].buf;
      k.pos[nb++] = (uint32_t)i;
    }
  }
  st = nb > 0 ? acquire_list(rt, e, k.bufs, nb, stream, k.dptrs, "kernel argument", k.pos) : SPW_OK;
  if (st == SPW_OK) {
    /* The device pointers go into our own array; the caller's stays as it was. */
    for (size_t i = 0, j = 0; i < nargs; i++) {
      if (args[i].kind == SPW_KARG_BUFFER) {
        k.vals[i] = &k.dptrs[j++];
        k.sizes[i] = sizeof(void *);
      } else {
        k.vals[i] = (void *)args[i].value;
        k.sizes[i] = args[i].size;
      }
    }
    st = rt->ops->launch_kernel(rt->be, e->bstream, func, grid, block, shared_bytes, k.vals,
                                k.sizes, nargs);
    st = after_launch(rt, e, k.bufs, nb, stream, flags, st, "kernel launch");
  }
  free(heap);
  return st;
}

int spw_graph_launch(spw_runtime_t *rt, const void *graph_exec, const spw_buf_arg_t *args,
                     size_t n, spw_stream_t stream, unsigned flags) {
  if (!rt) return SPW_ERR_INVALID_ARG;
  if (!graph_exec || !args || n == 0 || n > SPW_GRAPH_BUFS_MAX || BAD_LAUNCH_FLAGS(flags))
    return spw__set_error(rt, SPW_ERR_INVALID_ARG, "graph launch: %s",
                          !graph_exec ? "graph_exec is NULL"
                          : !args     ? "args is NULL"
                          : n == 0    ? "no buffers (n is 0)"
                          : n > SPW_GRAPH_BUFS_MAX ? "more buffers than SPW_GRAPH_BUFS_MAX"
                                                   : "unknown launch flags, or both");
  if ((flags & SPW_LAUNCH_BLOCK) && spw__in_callback(rt))
    return spw__set_error(rt, SPW_ERR_WOULD_DEADLOCK, "graph launch: SPW_LAUNCH_BLOCK from a "
                          "controller callback");
  spw_stream_entry_t *e;
  int st = spw__stream_entry(rt, stream, &e);
  if (st != SPW_OK)
    return spw__set_error(rt, st, "graph launch: stream %p: %s", (void *)stream,
                          spw_strerror(st));
  /* A graph kept the addresses it was captured with: only a buffer that comes back at its
   * address may be under one, and an offset could not reach the graph's kernels. Whether a
   * buffer is stable never changes, so checking before the acquire is enough. */
  for (size_t i = 0; i < n; i++) {
    int stable = 0;
    if ((st = spw_buf_is_stable(rt, args[i].buf, &stable)) != SPW_OK)
      return arg_failed(rt, st, "graph argument", i, args[i].buf);
    if (!stable || args[i].offset != 0)
      return spw__set_error(rt, SPW_ERR_INVALID_ARG, "graph argument %zu (buffer 0x%016" PRIx64
                            "): SPW_ERR_INVALID_ARG: %s", i, (uint64_t)args[i].buf,
                            !stable ? "not address-stable (a graph keeps the addresses it was "
                                      "captured with; allocate it with SPW_ALLOC_STABLE)"
                                    : "offset not 0 (a graph's kernels got their pointers at "
                                      "capture)");
  }
  void *stack[STACK_ARGS];
  void **dptrs = n <= STACK_ARGS ? stack : malloc(n * sizeof *dptrs);
  if (!dptrs) return SPW_ERR_SYSTEM;
  st = acquire_list(rt, e, args, n, stream, dptrs, "graph argument", NULL);
  if (dptrs != stack) free(dptrs); /* the graph has its pointers: these are not needed */
  if (st != SPW_OK) return st;
  st = rt->ops->graph_launch(rt->be, e->bstream, graph_exec);
  return after_launch(rt, e, args, n, stream, flags, st, "graph launch");
}
