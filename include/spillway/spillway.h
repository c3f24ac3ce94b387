/* SPDX-License-Identifier: Apache-2.0 */
/*
 * spillway.h: the public C API of Spillway, deferrable device memory (RMMEP-1).
 *
 * Device buffers are named by 64-bit handles (spw_buf_t), never by raw pointers. Code
 * retrieves-and-locks a buffer on a stream (spw_acquire) to get a device pointer that stays
 * valid until the lock is released; unlocked buffers may be moved ("spilled") to pinned host
 * memory or to disk when device memory runs short, and are brought back, stream-ordered, by
 * the next acquire. Locks taken on a stream are released by spw_stream_synchronize (the
 * stream is synchronized first), by spw_stream_release_async (when the stream's work so far
 * completes, without blocking the host), or one at a time by spw_release.
 *
 * Conventions, for every function below unless its comment says otherwise:
 *  - it returns SPW_OK (0) on success or a negative spw_status_t; outputs go through pointer
 *    arguments and are written only on success;
 *  - a failed call changes nothing (no partial effects);
 *  - it is thread-safe: any thread may call it on any runtime, buffer and stream at any time;
 *  - bad input (NULL pointers, zero or absurd sizes, stale, freed or forged handles, handles
 *    of another runtime, unknown streams) is an error code, never undefined behaviour;
 *  - an asynchronous call that returns an error never delivers its completion.
 *
 * Streams are cudaStream_t values (spw_stream_t is the same type). On the CUDA backend any
 * stream registered with spw_stream_register, or created with spw_stream_create, may be
 * used; NULL (the legacy default stream) is always accepted. On the host backend (device
 * memory emulated in host memory, for machines without a GPU) streams come from
 * spw_stream_create only, and NULL names a default stream the runtime owns.
 *
 * Several devices: a runtime serves one device (spw_config_t.device); use one runtime per
 * device. A stream of another device is never used: spw_stream_register refuses it with
 * SPW_ERR_WRONG_DEVICE (spw_last_error names both devices), and every other call that takes
 * a stream returns SPW_ERR_INVALID_STREAM for it, as for any stream unknown to the runtime
 * (host backend: a stream of any other runtime). A buffer handle of another runtime,
 * whatever its device, is SPW_ERR_INVALID_HANDLE.
 */
#ifndef SPILLWAY_SPILLWAY_H
#define SPILLWAY_SPILLWAY_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(SPW_BUILDING_LIBRARY) && defined(__GNUC__)
#define SPW_API __attribute__((visibility("default")))
#else
#define SPW_API
#endif

#if defined(__GNUC__)
#define SPW_NODISCARD __attribute__((warn_unused_result))
#else
#define SPW_NODISCARD
#endif

#define SPW_VERSION_MAJOR 0
#define SPW_VERSION_MINOR 1
#define SPW_VERSION_PATCH 0

/* ---------------------------------------------------------------------------------------
 * Status codes. One table generates the enum, spw_strerror() and spw_err_name().
 * ------------------------------------------------------------------------------------- */
#define SPW_STATUS_MAP(X)                                                                    \
  X(OK, 0, "success")                                                                        \
  X(ERR_INVALID_ARG, -1, "invalid argument (NULL pointer, zero or absurd size, bad flags)")  \
  X(ERR_INVALID_HANDLE, -2, "buffer handle is invalid, corrupt or from another runtime")     \
  X(ERR_FREED, -3, "buffer was freed (stale handle)")                                        \
  X(ERR_NOT_LOCKED, -4, "buffer holds no lock on this stream")                               \
  X(ERR_INVALID_STREAM, -5, "stream is unknown to this runtime or was destroyed")            \
  X(ERR_OUT_OF_MEMORY, -6, "device memory exhausted: the remaining buffers are locked")      \
  X(ERR_HOST_OUT_OF_MEMORY, -7, "host spill memory exhausted (host limit reached)")          \
  X(ERR_DISK_FULL, -8, "spill disk full (disk limit reached or ENOSPC)")                     \
  X(ERR_CUDA, -9, "CUDA runtime error (see spw_last_error)")                                 \
  X(ERR_IO, -10, "I/O error on the spill file (see spw_last_error)")                         \
  X(ERR_NO_DEVICE, -11, "no usable CUDA device")                                             \
  X(ERR_CONFIG, -12, "invalid configuration value (see spw_config_validate)")                \
  X(ERR_BUSY, -13, "object is in use (buffers still locked)")                                \
  X(ERR_LOCKED, -14, "buffer is locked and cannot be moved")                                 \
  X(ERR_WOULD_DEADLOCK, -15, "call would wait on the runtime from inside a callback")        \
  X(ERR_UNSUPPORTED, -16, "operation not supported by this backend or build")                \
  X(ERR_NOT_READY, -17, "work has not completed yet")                                        \
  X(ERR_SYSTEM, -18, "operating system call failed (see spw_last_error)")                    \
  X(ERR_INTERNAL, -19, "internal error (a bug in Spillway: please report it)")              \
  X(ERR_WRONG_DEVICE, -20, "stream belongs to another device (see spw_last_error)")

typedef enum spw_status {
#define SPW__STATUS_ENUM(name, value, text) SPW_##name = (value),
  SPW_STATUS_MAP(SPW__STATUS_ENUM)
#undef SPW__STATUS_ENUM
} spw_status_t;

/* Human-readable text / symbolic name ("SPW_ERR_FREED") of a status. Never NULL; unknown
 * codes give "unknown status". Thread-safe; the strings are static. */
SPW_API const char *spw_strerror(int status);
SPW_API const char *spw_err_name(int status);

/* Whether a call that failed with `status` left the failure's own detail (CUDA's error text,
 * the budget's numbers, the errno) in spw_last_error: 1 for SPW_ERR_CUDA, SPW_ERR_IO,
 * SPW_ERR_SYSTEM, SPW_ERR_OUT_OF_MEMORY, SPW_ERR_HOST_OUT_OF_MEMORY, SPW_ERR_DISK_FULL and
 * SPW_ERR_WRONG_DEVICE (the two devices), else 0 (then spw_last_error may hold an earlier failure's text, which the thread's text
 * is never cleared of, and spw_strerror says all there is). Unknown codes give 0; there is
 * no error. Thread-safe: a pure function of its argument. */
SPW_API int spw_status_has_detail(int status);

/* ---------------------------------------------------------------------------------------
 * Types
 * ------------------------------------------------------------------------------------- */
typedef struct spw_runtime spw_runtime_t; /* opaque, one per device per process */
typedef uint64_t spw_buf_t;               /* buffer handle; 0 is never a valid handle */
#define SPW_BUF_NULL ((spw_buf_t)0)

struct CUstream_st;
typedef struct CUstream_st *spw_stream_t; /* identical to cudaStream_t */

typedef enum spw_backend_kind {
  SPW_BACKEND_AUTO = 0, /* CUDA when a device is present, else host */
  SPW_BACKEND_CUDA = 1,
  SPW_BACKEND_HOST = 2, /* device memory emulated in host memory, streams as threads */
} spw_backend_kind_t;

typedef enum spw_io_kind {
  SPW_IO_AUTO = 0,  /* io_uring when the kernel allows it, else POSIX */
  SPW_IO_URING = 1, /* io_uring only; if the kernel refuses it, the disk tier is unavailable
                       (first use fails with SPW_ERR_UNSUPPORTED) */
  SPW_IO_POSIX = 2, /* pread/pwrite from engine threads */
} spw_io_kind_t;

typedef enum spw_log_level {
  SPW_LOG_DEFAULT = 0, /* SPILLWAY_LOG_LEVEL, else WARN */
  SPW_LOG_OFF = 1,
  SPW_LOG_ERROR = 2,
  SPW_LOG_WARN = 3,
  SPW_LOG_INFO = 4,
  SPW_LOG_DEBUG = 5,
} spw_log_level_t;

/* Whether buffers keep one device address for their whole life (see spw_alloc_ex and
 * "Address-stable buffers" in docs/api.md). */
typedef enum spw_stable_mode {
  SPW_STABLE_DEFAULT = 0, /* SPILLWAY_STABLE_ADDRESSES, else off */
  SPW_STABLE_OFF = 1,     /* spw_alloc gives ordinary buffers, whose address may change
                             after a spill (SPW_ALLOC_STABLE still asks for a stable one) */
  SPW_STABLE_ON = 2,      /* spw_alloc gives address-stable buffers (SPW_ALLOC_MOVABLE still
                             asks for an ordinary one) */
} spw_stable_mode_t;

/* Whether buffers' device memory can be shared with other processes (spw_ipc_export and
 * "Sharing buffers between processes" in docs/api.md). */
typedef enum spw_ipc_mode {
  SPW_IPC_DEFAULT = 0, /* SPILLWAY_IPC, else off */
  SPW_IPC_OFF = 1,     /* device memory from a stream-ordered pool, which CUDA IPC cannot
                          export: spw_ipc_export refuses */
  SPW_IPC_ON = 2,      /* device memory from cudaMalloc'd regions that the runtime divides
                          itself, so that any resident, ordinary buffer can be exported */
} spw_ipc_mode_t;

typedef enum spw_tier {
  SPW_TIER_DEVICE = 0,
  SPW_TIER_HOST = 1, /* pinned host memory */
  SPW_TIER_DISK = 2, /* the runtime's private spill file */
  SPW_TIER_PEER = 3, /* another GPU's memory lent to this runtime (spw_peer_lend) */
} spw_tier_t;

typedef enum spw_state {
  SPW_STATE_RESIDENT = 1,   /* in device memory (tier DEVICE) */
  SPW_STATE_SPILLING = 2,   /* being copied device -> host; the device copy is still valid */
  SPW_STATE_HOST = 3,       /* in pinned host memory (tier HOST) */
  SPW_STATE_DEMOTING = 4,   /* being written host -> disk; the host copy is still valid */
  SPW_STATE_DISK = 5,       /* in the spill file (tier DISK) */
  SPW_STATE_UNSPILLING = 6, /* being brought back to the device (from host or disk) */
  SPW_STATE_PEER = 7,       /* in another GPU's memory lent to this runtime (tier PEER): a
                               HOST buffer whose copy is there; everything said of HOST
                               holds for it */
} spw_state_t;

/* ---------------------------------------------------------------------------------------
 * Configuration. Initialize with SPW_CONFIG_INIT, then set the fields you care about.
 * A field left at zero (or NULL) takes its SPILLWAY_* environment variable, else the
 * built-in default; a field the program sets wins over the environment. docs/config.md
 * lists every variable. A value that cannot be parsed fails runtime creation with
 * SPW_ERR_CONFIG and spw_config_validate() names the variable or field.
 * ------------------------------------------------------------------------------------- */
typedef struct spw_config {
  size_t struct_size;         /* sizeof(spw_config_t); set by SPW_CONFIG_INIT */
  int device;                 /* CUDA device ordinal (SPILLWAY_DEVICE, default 0) */
  spw_backend_kind_t backend; /* SPILLWAY_BACKEND=auto|cuda|host */
  uint64_t device_limit;      /* bytes (SPILLWAY_DEVICE_LIMIT=bytes|N%|1.5GiB ...);
                                 default 80% of free device memory at creation */
  uint64_t host_limit;        /* pinned host bytes for spilled buffers (SPILLWAY_HOST_LIMIT);
                                 default 25% of physical memory */
  uint64_t disk_limit;        /* spill file bytes (SPILLWAY_DISK_LIMIT); default: no limit
                                 beyond the file system's free space */
  const char *spill_dir;      /* SPILLWAY_SPILL_DIR; default $TMPDIR, else /tmp */
  spw_io_kind_t io;           /* SPILLWAY_IO=auto|uring|posix */
  double high_watermark;      /* fraction of device_limit above which the engine spills in
                                 the background (SPILLWAY_HIGH_WATERMARK, default 0.95) */
  double low_watermark;       /* background spilling stops below this fraction
                                 (SPILLWAY_LOW_WATERMARK, default 0.85) */
  spw_log_level_t log_level;  /* SPILLWAY_LOG_LEVEL=off|error|warn|info|debug */
  uint64_t host_device_bytes; /* host backend only: emulated device memory
                                 (SPILLWAY_HOST_DEVICE_BYTES, default 1 GiB) */
  unsigned flags;             /* SPW_CONFIG_* below */
  /* Fields added after version 0.1 (a caller built against an older spillway.h passes a
   * smaller struct_size; what it lacks counts as unset). */
  const char *trace_path;     /* SPILLWAY_TRACE: write a Chrome trace-event JSON file of
                                 every move, lock wait and spill on demand, plus the bytes
                                 per tier over time ("%p" in the path becomes the process
                                 id); default: no trace */
  uint64_t trace_max_bytes;   /* SPILLWAY_TRACE_MAX: largest trace file; events past it are
                                 dropped and counted (default 256 MiB) */
  spw_stable_mode_t stable_addresses; /* SPILLWAY_STABLE_ADDRESSES=0|1|off|on: whether
                                 spw_alloc gives address-stable buffers (default off) */
  spw_ipc_mode_t ipc;         /* SPILLWAY_IPC=0|1|off|on: whether buffers can be exported
                                 to other processes (spw_ipc_export; default off) */
  int engine_helpers;         /* SPILLWAY_ENGINE_HELPERS=auto|0..15: threads beside each of
                                 the engine's two workers that move the slices of a large
                                 spill or prefetch request (or of an spw_acquire_n's batch
                                 from host) at once; in the field -1 means
                                 none, 1 to 15 that many, 0 unset; default auto (3 with 8
                                 cores or more, 1 with 4 or more, else none). Each helper
                                 also brings a copy stream per worker, with 8 MiB of device
                                 staging each on CUDA (outside the device limit) */
} spw_config_t;

#define SPW_CONFIG_IGNORE_ENV 0x1u /* use only the struct and the built-in defaults */

#define SPW_CONFIG_INIT {sizeof(spw_config_t), 0, SPW_BACKEND_AUTO, 0, 0, 0, NULL, SPW_IO_AUTO, \
                         0.0, 0.0, SPW_LOG_DEFAULT, 0, 0, NULL, 0, SPW_STABLE_DEFAULT, \
                         SPW_IPC_DEFAULT, 0}

/* ---------------------------------------------------------------------------------------
 * Runtime lifecycle
 * ------------------------------------------------------------------------------------- */

/* Creates a runtime for one device from `config` (NULL = all defaults and environment).
 * Errors: SPW_ERR_INVALID_ARG (out NULL, struct_size too small), SPW_ERR_CONFIG (a value
 * that cannot be parsed or makes no sense, named by spw_config_validate), SPW_ERR_NO_DEVICE
 * (backend cuda asked for and no device), SPW_ERR_CUDA, SPW_ERR_SYSTEM.
 * Thread-safe; several runtimes may live in one process. */
SPW_API SPW_NODISCARD int spw_runtime_create(const spw_config_t *config, spw_runtime_t **out);

/* Resolves `config` (NULL = defaults) and the environment exactly as spw_runtime_create
 * would, without creating anything, and writes the reason of a failure into `msg` (always
 * NUL-terminated when len > 0; "" on success): "SPILLWAY_DEVICE_LIMIT='abc': expected bytes
 * (e.g. 4GiB) or a percentage (e.g. 80%)". spw_runtime_create logs the same text at error
 * level when it fails. Errors: SPW_ERR_CONFIG, SPW_ERR_INVALID_ARG. */
SPW_API int spw_config_validate(const spw_config_t *config, char *msg, size_t len);

/* Parses a byte size the way the SPILLWAY_* limits are read, so that a program's own
 * options can share the syntax: digits with an optional decimal fraction and an optional
 * binary unit (B, K/KB/KiB, M/MB/MiB, G/GB/GiB, T/TB/TiB, any case; K = 1024), spaces
 * around the value and between number and unit ("1.5 GiB", " 4096 "). A fraction needs a
 * unit and rounds down to whole bytes. Errors: SPW_ERR_CONFIG (syntax, trailing text, more
 * than 2^64-1 bytes), SPW_ERR_INVALID_ARG (NULL). *bytes is written only on success.
 * Thread-safe. */
SPW_API int spw_parse_size(const char *text, uint64_t *bytes);

/* Destroys a runtime: waits for the spill engine, frees every buffer in every tier, closes
 * the spill file (its contents vanish) and destroys the streams the runtime created.
 * Memory it lends is taken back first (spw_peer_reclaim, for each borrower); memory it
 * borrows goes back to its lender. If any buffer is still locked, or lent memory cannot be
 * taken back (that error is returned), it destroys nothing: synchronize (or release) the
 * streams first. No other call on `rt` may run concurrently or follow.
 * NULL is accepted and does nothing. */
SPW_API int spw_runtime_destroy(spw_runtime_t *rt);

/* The backend this runtime runs on (never SPW_BACKEND_AUTO once created). */
SPW_API int spw_runtime_backend(const spw_runtime_t *rt, spw_backend_kind_t *out);

/* The device byte limit and the host and disk limits in force (after defaults and
 * environment were applied). Any output pointer may be NULL. */
SPW_API int spw_runtime_limits(const spw_runtime_t *rt, uint64_t *device_limit,
                               uint64_t *host_limit, uint64_t *disk_limit);

/* Pins `bytes` of host memory for spilled buffers now, and keeps at least that much pinned
 * for the runtime's life: the pinned arena grows in slabs as spills need them (1 GiB on
 * the CUDA backend; a third of a second per GiB to map and pin), and a program that knows
 * how much it will spill pays that up front rather than in the middle of its first sweep.
 * Memory above the reservation still grows and shrinks as before. A later call replaces
 * the reservation (0 drops it: the memory above the kept slabs then goes back as it
 * empties). Blocks while it pins; spills go on meanwhile. Thread-safe. Errors:
 * SPW_ERR_INVALID_ARG (rt NULL), SPW_ERR_HOST_OUT_OF_MEMORY (bytes above the host limit:
 * nothing changes; or the rest of the limit held by the slabs of buffers larger than a
 * slab), SPW_ERR_WOULD_DEADLOCK (from a controller callback), SPW_ERR_SYSTEM / SPW_ERR_CUDA
 * (the memory could not be mapped or pinned: what was pinned before the failure stays
 * reserved; spw_last_error says why). */
SPW_API int spw_host_reserve(spw_runtime_t *rt, uint64_t bytes);

/* Text of the last CUDA / system / I/O error this thread saw on `rt`
 * ("cudaErrorMemoryAllocation: out of memory"), or "" if none (and for rt NULL). The string
 * stays valid until this thread's next call on `rt`. */
SPW_API const char *spw_last_error(const spw_runtime_t *rt);

/* The first error of background work (an asynchronous spill that failed), then clears it;
 * SPW_OK if none. The buffer involved stays valid in its last good tier. */
SPW_API int spw_async_error(spw_runtime_t *rt);

/* ---------------------------------------------------------------------------------------
 * Streams
 * ------------------------------------------------------------------------------------- */

/* Creates a non-blocking stream owned by the runtime (a cudaStream_t on the CUDA backend,
 * a FIFO worker thread on the host backend). Destroyed by spw_stream_destroy or with the
 * runtime. Errors: SPW_ERR_INVALID_ARG, SPW_ERR_CUDA, SPW_ERR_SYSTEM. */
SPW_API SPW_NODISCARD int spw_stream_create(spw_runtime_t *rt, spw_stream_t *out);

/* Synchronizes `stream`, releases every lock it holds, and destroys it. Errors:
 * SPW_ERR_INVALID_STREAM (unknown, NULL, or registered rather than created). */
SPW_API int spw_stream_destroy(spw_runtime_t *rt, spw_stream_t stream);

/* CUDA backend: makes a stream the application created known to the runtime so it may be
 * passed to acquire. Registering twice is SPW_OK. Host backend: SPW_ERR_UNSUPPORTED.
 * A stream created on another device than the runtime's is refused with
 * SPW_ERR_WRONG_DEVICE (spw_last_error names both devices); a handle CUDA does not know is
 * SPW_ERR_INVALID_STREAM. The device is checked here, once per stream (cudaStreamGetDevice,
 * CUDA 12.8 and later; a build against an older CUDA takes the stream on trust).
 * Up to 4096 streams may be known to a runtime at once (created or registered, not yet
 * destroyed or unregistered); past that, SPW_ERR_BUSY. */
SPW_API int spw_stream_register(spw_runtime_t *rt, spw_stream_t stream);

/* Synchronizes `stream`, releases its locks and forgets it (the stream itself is not
 * destroyed). Errors: SPW_ERR_INVALID_STREAM. */
SPW_API int spw_stream_unregister(spw_runtime_t *rt, spw_stream_t stream);

/* syncAndUnlock: blocks until all work enqueued on `stream` completes, then releases every
 * lock that `stream` held when the call began (locks taken by other threads during the call
 * are kept). Errors: SPW_ERR_INVALID_STREAM, SPW_ERR_CUDA (the locks are kept),
 * SPW_ERR_WOULD_DEADLOCK (called from a controller callback). */
SPW_API int spw_stream_synchronize(spw_runtime_t *rt, spw_stream_t stream);

/* Releases every lock `stream` holds now, when the work enqueued on it so far completes,
 * without blocking the caller. Locks taken later are not affected. Errors:
 * SPW_ERR_INVALID_STREAM, SPW_ERR_CUDA (nothing released or scheduled). */
SPW_API int spw_stream_release_async(spw_runtime_t *rt, spw_stream_t stream);

/* Enqueues fn(arg) on `stream`, after the work enqueued before it (cudaLaunchHostFunc on
 * the CUDA backend; the same rules apply: fn must not call CUDA or Spillway). */
SPW_API int spw_launch_host_func(spw_runtime_t *rt, spw_stream_t stream, void (*fn)(void *),
                                 void *arg);

/* Enqueues a copy of `bytes` (> 0) between any two of device (acquired) and host memory, on
 * `stream` (cudaMemcpyAsync with cudaMemcpyDefault). For tests and tools on both backends. */
SPW_API int spw_memcpy_async(spw_runtime_t *rt, void *dst, const void *src, size_t bytes,
                             spw_stream_t stream);

/* ---------------------------------------------------------------------------------------
 * Buffers
 * ------------------------------------------------------------------------------------- */
#define SPW_MAX_BUFFER_BYTES ((uint64_t)1 << 40) /* 1 TiB; larger requests are rejected */

/* Allocates a deferrable device buffer of `bytes` (contents undefined), stream-ordered on
 * `stream`. If the device limit would be passed, or the device refuses, unlocked buffers
 * are spilled first (the call blocks while they are copied out). Errors:
 * SPW_ERR_INVALID_ARG (bytes 0 or > SPW_MAX_BUFFER_BYTES, out NULL), SPW_ERR_INVALID_STREAM,
 * SPW_ERR_OUT_OF_MEMORY (what remains on the device is locked; spw_last_error says how
 * many bytes), SPW_ERR_CUDA. */
SPW_API SPW_NODISCARD int spw_alloc(spw_runtime_t *rt, size_t bytes, spw_stream_t stream,
                                    spw_buf_t *out);

/* Flags of spw_alloc_ex. */
#define SPW_ALLOC_STABLE 0x1u  /* address-stable: the device pointer every acquire returns is
                                  the same for the buffer's whole life, across spills to host
                                  or disk and back */
#define SPW_ALLOC_ARENA 0x4u   /* an ordinary buffer whose device memory, from 512 KiB up,
                                  comes from the runtime's arenas (device regions it divides
                                  itself) rather than the stream-ordered pool: allocation and
                                  free cost a free-list operation instead of two driver calls
                                  (about 3 us less on an H100). For memory allocated and freed
                                  often and held locked (library allocators); after a spill it
                                  comes back from the pool. Not with SPW_ALLOC_STABLE */
#define SPW_ALLOC_MOVABLE 0x2u /* an ordinary buffer even when the runtime's stable_addresses
                                  is on */
/* Owner tags. SPW_ALLOC_OWNER(id), or'ed into spw_alloc_ex's flags, tags the buffer with an
 * owner id from 1 to SPW_OWNER_MAX (no tag, or SPW_ALLOC_OWNER(0): no owner), for
 * spw_owner_stats, spw_buf_owner, the stats summary and the trace, which names the owner of
 * every buffer it reports (see spw_owner_name). An id past SPW_OWNER_MAX, or a negative one,
 * sets bits outside SPW_ALLOC_OWNER_MASK: spw_alloc_ex refuses it with SPW_ERR_INVALID_ARG.
 * The tag is the buffer's for its whole life; owners are per runtime. */
#define SPW_OWNER_MAX 255
#define SPW_ALLOC_OWNER_SHIFT 8
#define SPW_ALLOC_OWNER_MASK 0xFF00u
#define SPW_ALLOC_OWNER(id) ((unsigned)(id) << SPW_ALLOC_OWNER_SHIFT)

/* spw_alloc with `flags` (0: the runtime's default, config.stable_addresses; or one of
 * SPW_ALLOC_STABLE, SPW_ALLOC_MOVABLE; either may be or'ed with SPW_ALLOC_OWNER(id), which
 * costs four relaxed atomic adds on the owner's counters here and two at the buffer's
 * release). An address-stable buffer reserves device address
 * space for its life (rounded up to the granularity spw_stable_granularity reports; buffers
 * smaller than it share reserved pages with other small ones); spilling it unmaps its
 * physical memory and unspilling maps physical memory back at the same address, so raw
 * pointers to it stay meaningful while it is not resident, though they may be
 * dereferenced only under a lock, as for any buffer (a CUDA graph captured over it holds
 * none: launch it with spw_graph_launch). It counts against the device limit
 * by its size, as other buffers do. Stream semantics as spw_alloc's, except that the memory
 * is usable by every stream when the call returns. Errors: as spw_alloc, plus
 * SPW_ERR_INVALID_ARG (unknown flag bits, an owner id past SPW_OWNER_MAX, both STABLE and
 * MOVABLE), SPW_ERR_UNSUPPORTED (a stable buffer on a device or driver without virtual
 * memory management). Thread-safe. */
SPW_API SPW_NODISCARD int spw_alloc_ex(spw_runtime_t *rt, size_t bytes, spw_stream_t stream,
                                       unsigned flags, spw_buf_t *out);

/* Whether `buf` is address-stable: *out 1 or 0. Errors: handle errors, SPW_ERR_INVALID_ARG.
 * Lock-free; thread-safe. */
SPW_API int spw_buf_is_stable(spw_runtime_t *rt, spw_buf_t buf, int *out);

/* The granularity of address-stable memory on this runtime's device (the physical chunk
 * size, 2 MiB on current GPUs; 64 KiB on the host backend): stable buffers of at least this
 * size get their own address range, smaller ones share pages. Errors: SPW_ERR_INVALID_ARG,
 * SPW_ERR_UNSUPPORTED (no virtual memory management here), SPW_ERR_CUDA. Thread-safe. */
SPW_API int spw_stable_granularity(spw_runtime_t *rt, size_t *out);

/* Frees a buffer. The handle is dead at once: every later use returns SPW_ERR_FREED. If the
 * buffer is locked, its memory is released only when the last lock is (a kernel still
 * running on a stream can keep touching it); the holders may still release their locks. */
SPW_API int spw_free(spw_runtime_t *rt, spw_buf_t buf);

SPW_API int spw_buf_size(spw_runtime_t *rt, spw_buf_t buf, size_t *out);
SPW_API int spw_buf_state(spw_runtime_t *rt, spw_buf_t buf, spw_state_t *out);
SPW_API int spw_buf_tier(spw_runtime_t *rt, spw_buf_t buf, spw_tier_t *out);
/* Current lock count of the buffer (all streams together). */
SPW_API int spw_buf_lock_count(spw_runtime_t *rt, spw_buf_t buf, uint32_t *out);
/* The owner id the buffer was allocated with (SPW_ALLOC_OWNER), 0 for none. Errors:
 * SPW_ERR_INVALID_ARG (rt or out NULL), SPW_ERR_INVALID_HANDLE (also a handle of another
 * runtime), SPW_ERR_FREED. Lock-free; thread-safe. */
SPW_API int spw_buf_owner(spw_runtime_t *rt, spw_buf_t buf, unsigned *out);

/* ---------------------------------------------------------------------------------------
 * Retrieve-and-lock
 * ------------------------------------------------------------------------------------- */
#define SPW_ACQUIRE_READ 0x1u /* read-only use: a host copy is kept after unspill, so
                                 spilling the buffer again moves no bytes */
#define SPW_ACQUIRE_TRY 0x2u  /* never wait: if the buffer is not on the device (or is being
                                 moved to it), fail with SPW_ERR_NOT_READY instead of bringing
                                 it back. Lets a binding that holds a global lock (Python's
                                 GIL) take the fast path without releasing it, and release it
                                 only for the call that may wait. */

/* Retrieves-and-locks `buf` on `stream` and returns its device pointer, valid until this
 * lock is released. Locks nest: each acquire takes one more. If the buffer is in host
 * memory, the copy back is enqueued on the engine and `stream` waits on it (the host does
 * not block, unless room must first be made by spilling); from disk the calling thread
 * blocks for the read only. The lock is recorded in `stream`'s lock map. Errors:
 * SPW_ERR_INVALID_HANDLE, SPW_ERR_FREED, SPW_ERR_INVALID_STREAM, SPW_ERR_INVALID_ARG,
 * SPW_ERR_OUT_OF_MEMORY, SPW_ERR_CUDA, SPW_ERR_IO, SPW_ERR_BUSY (2^31 nested locks),
 * SPW_ERR_SYSTEM (the lock map could not grow), SPW_ERR_WOULD_DEADLOCK (from a controller
 * callback, for a buffer that is not on the device), SPW_ERR_NOT_READY (SPW_ACQUIRE_TRY and
 * the buffer is not on the device). When everything on the device is
 * locked, an allocation or unspill first waits up to 2 s for locks that
 * spw_stream_release_async will release, then fails with SPW_ERR_OUT_OF_MEMORY. */
SPW_API SPW_NODISCARD int spw_acquire(spw_runtime_t *rt, spw_buf_t buf, spw_stream_t stream,
                                      unsigned flags, void **dptr);

/* Acquires `n` buffers on one stream, all or nothing: on error no lock is held and `dptrs`
 * is untouched. A handle may appear more than once (it is locked that many times). Buffers
 * on host come back first as one batch, and those on disk as another (the calling thread
 * blocks for their reads), unless flags has SPW_ACQUIRE_TRY; a batch of thousands from host
 * is cut into slices that the engine's helpers bring back with the calling thread
 * (config.engine_helpers). Thread-safe; errors as spw_acquire. */
SPW_API SPW_NODISCARD int spw_acquire_n(spw_runtime_t *rt, const spw_buf_t *bufs, size_t n,
                                        spw_stream_t stream, unsigned flags, void **dptrs);

/* Releases one lock that `stream` holds on `buf` at once: the synchronous case
 * (lockAndLaunch), for when the caller knows the work using it has completed. Errors:
 * SPW_ERR_NOT_LOCKED (no lock of `stream` on `buf`), SPW_ERR_INVALID_STREAM, handle errors. */
SPW_API int spw_release(spw_runtime_t *rt, spw_buf_t buf, spw_stream_t stream);

/* Releases one lock of `stream` on each of bufs[0..n) once the work enqueued on `stream` so
 * far has completed, without blocking the caller: the per-launch release of a launch
 * wrapper, which must not touch locks that other code holds on the same stream. The locks
 * leave the stream's lock map at once (a later spw_stream_synchronize or
 * spw_stream_release_async does not release them again); until the work completes they
 * still count as held, and spw_stream_synchronize of `stream` releases them at once. A
 * handle may appear several times (one lock each). All or nothing: if any buffer holds
 * fewer locks of `stream` than it appears in bufs, nothing changes and the call returns
 * SPW_ERR_NOT_LOCKED. Errors: SPW_ERR_INVALID_ARG (bufs NULL, n 0), SPW_ERR_INVALID_STREAM,
 * SPW_ERR_NOT_LOCKED, handle errors, SPW_ERR_CUDA / SPW_ERR_SYSTEM (nothing released or
 * scheduled). Behind a stream with nothing left to run, the locks go before the call
 * returns. Releases behind one stream that follow each other closely (before the
 * completion thread looks again, 20 us to 1 ms) share one event, recorded again by each: a
 * lock may then go only once a later call's work has completed too, never before its own. */
SPW_API int spw_release_n_async(spw_runtime_t *rt, const spw_buf_t *bufs, size_t n,
                                spw_stream_t stream);

/* ---------------------------------------------------------------------------------------
 * Spilling, explicitly
 *
 * These calls are hints, with a bounded cost however often they are sent: the runtime keeps
 * at most one pending hint per buffer. A hint equal to the pending one merges with it
 * (stats.hints_merged), a different one replaces it, the newest winning
 * (stats.hints_replaced); a hint for a buffer being moved by an earlier hint of the same
 * kind merges too. So what is left to do is at most one move per buffer. A prefetch brings
 * in only what can stay: up to the high watermark, making room only from buffers that no
 * prefetch brought in since their last acquire; the rest of the request stays where it is
 * (stats.prefetch_dropped), which is no failure.
 * ------------------------------------------------------------------------------------- */

/* Asks the engine to move an unlocked buffer down to `tier` (HOST or DISK), asynchronously.
 * HOST means off the device: into lent peer memory first where the runtime has some.
 * Completion is observable through spw_buf_state, the controller's state_changed callback
 * or spw_wait_idle; a failure of the background work is reported through the controller and
 * spw_async_error, and the buffer stays where it was. A buffer already at or below `tier`
 * is SPW_OK. Errors: SPW_ERR_LOCKED, SPW_ERR_INVALID_ARG (tier DEVICE or PEER), handle errors.
 * If the disk tier cannot be opened (spill directory missing, io_uring refused under
 * SPW_IO_URING), a spill to DISK fails in the background with that reason. May be called
 * from a controller callback. */
SPW_API int spw_spill(spw_runtime_t *rt, spw_buf_t buf, spw_tier_t tier);

/* Starts bringing `buf` back to the device, without locking it and without blocking the
 * caller: the engine's upload worker makes room (spilling if it must), copies it back and
 * marks it resident once the copy has completed, so work on any stream may use it after a
 * later acquire. Prefetches queued together move as one batch. The host copy is kept as a
 * clean copy (a re-spill before any write moves no bytes). A buffer already on the device
 * or on its way is SPW_OK. A prefetched buffer is not pushed out by a later prefetch until
 * it has been acquired once; one that finds no such room is dropped (see above).
 * Completion: spw_wait_idle, or the state / the controller. Errors as for spw_acquire's
 * validation; a failed prefetch (a copy or read error) leaves the buffer where it was and
 * is reported through spw_async_error. May be called from a controller callback. */
SPW_API int spw_prefetch(spw_runtime_t *rt, spw_buf_t buf, spw_stream_t stream);

/* spw_spill and spw_prefetch for many buffers in one request: the engine moves them as one
 * batch (one copy launch for all the small ones), which is what makes spilling tens of
 * thousands of small buffers run at the link's speed. The handles are all validated first
 * (an invalid one fails the call and nothing is queued). A buffer that is locked, or moved
 * elsewhere, by the time the engine reaches it is skipped (spw_spill_n reports it through
 * the controller with status SPW_ERR_LOCKED). spw_prefetch_n marks a buffer resident only
 * once its copy has completed, so work on any stream may use it afterwards; like
 * spw_prefetch it keeps the host copy as a clean copy. Completion: spw_wait_idle. */
SPW_API int spw_spill_n(spw_runtime_t *rt, const spw_buf_t *bufs, size_t n, spw_tier_t tier);
SPW_API int spw_prefetch_n(spw_runtime_t *rt, const spw_buf_t *bufs, size_t n,
                           spw_stream_t stream);

/* Runs every pending stream completion (locks given to spw_stream_release_async whose work
 * has completed go), then blocks until every spill, demotion and prefetch queued before the
 * call has been carried out, with what that work queued itself (a controller callback on an
 * engine thread ordering a spill, the next background step), and the background spilling
 * asked for before the call; what other threads queue meanwhile is not waited for, so
 * threads that keep sending hints cannot hold it back. Then the completions pending by then
 * run. Returns the first asynchronous error since the last call (and clears it), else
 * SPW_OK. SPW_ERR_WOULD_DEADLOCK from inside a controller callback. Thread-safe. */
SPW_API int spw_wait_idle(spw_runtime_t *rt);

/* ---------------------------------------------------------------------------------------
 * Several GPUs: the peer tier
 *
 * A runtime serves one device (spw_config_t.device); a process may create one per device.
 * A runtime may lend part of its device memory to another as that one's peer tier: the
 * borrower then spills there first (over NVLink where the devices have it, 7x the host
 * link on an H200 pair), falls back to host memory when the lent memory is full, and brings
 * buffers back from there as from host. The lender counts what it lends against its own
 * device limit and takes it back when its own work needs the room: the borrower's buffers
 * in it move on to host memory (or to disk when host memory is full) first, so no byte is
 * lost. Buffers in lent memory are in state SPW_STATE_PEER and tier SPW_TIER_PEER;
 * controller events name that state.
 * ------------------------------------------------------------------------------------- */

/* Lends `bytes` of `lender`'s device memory to `borrower` as its peer tier. The memory is
 * reserved from the lender's device limit (spilling the lender's unlocked buffers if needed)
 * and allocated at once. The two runtimes may serve the same device (useful for tests; no
 * faster than host memory there). A borrower has at most one lender at a time; a lender may
 * lend to several borrowers. Thread-safe. Errors: SPW_ERR_INVALID_ARG (NULL, the same
 * runtime twice, bytes < 1 MiB or more than the lender's limit, backends of different
 * kinds), SPW_ERR_BUSY (the borrower already has a peer tier, or it
 * lends to the lender, directly or through others: a cycle), SPW_ERR_UNSUPPORTED (the borrower's device cannot access the lender's:
 * no peer access; spills then keep going to host), SPW_ERR_OUT_OF_MEMORY (the lender has
 * no such room), SPW_ERR_CUDA. */
SPW_API int spw_peer_lend(spw_runtime_t *lender, spw_runtime_t *borrower, uint64_t bytes);

/* Takes back what `lender` lent to `borrower`: no new spill goes there, every buffer in it
 * moves on to the borrower's host memory (or its disk when host memory is full), then the
 * memory goes back to the lender's budget. Blocks until done. The lender does the same by
 * itself, for every borrower, when a reservation of its own finds nothing left to spill.
 * Thread-safe. Errors: SPW_ERR_INVALID_ARG (NULL, or nothing lent to that borrower), the
 * borrower's SPW_ERR_HOST_OUT_OF_MEMORY / SPW_ERR_DISK_FULL / SPW_ERR_IO when buffers could
 * not move on (the memory then stays lent and the buffers stay in it, intact: call again
 * once room is made), SPW_ERR_WOULD_DEADLOCK from inside a controller callback. */
SPW_API int spw_peer_reclaim(spw_runtime_t *lender, spw_runtime_t *borrower);

/* ---------------------------------------------------------------------------------------
 * Sharing buffers between processes (CUDA IPC)
 *
 * A runtime created with config.ipc on (SPILLWAY_IPC=1) takes its device memory from
 * cudaMalloc'd regions it divides itself, which CUDA's IPC can export (memory from the
 * stream-ordered pool it uses otherwise cannot be). A process exports a locked, resident
 * buffer; another process on the same machine opens the handle and gets a device pointer to
 * the same memory. The handle is plain bytes: send it any way (a pipe, a socket, a file);
 * no file descriptor travels. What the other process sees is the exporter's memory itself,
 * so the exporter must keep the buffer locked, and neither free nor spill it, for as long
 * as any process has the handle open: a lock is what keeps it in place, as for the
 * exporter's own kernels. On the host backend the regions are shared memory (memfd) and the
 * importer maps them through /proc/<pid>/fd, so the same calls work between processes
 * there too.
 *
 * An address-stable buffer (virtual memory management) is exported too, with the same
 * calls and the same rule, another way underneath: its physical chunks are shared as file
 * descriptors (cuMemExportToShareableHandle), which cannot travel as bytes. Its handle
 * (kind SPW_IPC_KIND_CHUNKS) names the exporting runtime's Unix socket (abstract, per
 * process and runtime) and a random 128-bit token; spw_ipc_open asks that socket, and a
 * thread of the exporting runtime answers with the chunks' descriptors (SCM_RIGHTS) while
 * the buffer is resident and locked, refusing otherwise. The importer maps the chunks at
 * an address of its own. So a handle works while its exporter lives, from any process on
 * the machine that can reach the socket; the token is the capability.
 * ------------------------------------------------------------------------------------- */

#define SPW_IPC_HANDLE_BYTES 64

#define SPW_IPC_KIND_REGION 0u /* a region of CUDA IPC (cudaIpcMemHandle_t) */
#define SPW_IPC_KIND_CHUNKS 1u /* an address-stable buffer's chunks, asked of the exporter */

typedef struct spw_ipc_handle {
  unsigned char handle[SPW_IPC_HANDLE_BYTES]; /* REGION: cudaIpcMemHandle_t of the region
                                                 holding the memory (host backend: its own
                                                 form); CHUNKS: the exporter's socket and
                                                 the export's token */
  uint64_t offset;       /* REGION: of the exported memory inside that region; CHUNKS: 0 */
  uint64_t bytes;        /* of the exported memory */
  int32_t backend;       /* spw_backend_kind_t of the exporter */
  int32_t device;        /* the exporter's device ordinal */
  uint32_t pid;          /* the exporter's process id */
  uint32_t kind;         /* SPW_IPC_KIND_REGION or SPW_IPC_KIND_CHUNKS */
} spw_ipc_handle_t;

/* Exports `buf`'s device memory: fills *out for spw_ipc_open in another process. The buffer
 * must be resident and locked on some stream (spw_acquire), and stay so while the handle is
 * open anywhere. The call waits for Spillway's own copy into the buffer (an unspill still
 * landing); ordering the exporter's kernels before the importer's reads is the program's, as
 * with any CUDA IPC (a stream synchronize, or an event shared through IPC). An
 * address-stable buffer's export starts the runtime's IPC thread and socket the first time;
 * exporting a buffer again gives the same handle. Errors: handle errors,
 * SPW_ERR_INVALID_ARG (out NULL), SPW_ERR_UNSUPPORTED (config.ipc off), SPW_ERR_NOT_LOCKED
 * (no stream holds a lock on it, or it is not resident), SPW_ERR_CUDA, SPW_ERR_SYSTEM (the
 * socket or thread could not be made). Thread-safe. */
SPW_API int spw_ipc_export(spw_runtime_t *rt, spw_buf_t buf, spw_ipc_handle_t *out);

/* Exports the device memory [dptr, dptr + bytes) of this runtime, for a caller that holds
 * a lock on the buffer around it but knows only the pointer (a plugin handed a pointer by
 * the library it serves, e.g. Numba's get_ipc_handle). The range must lie in one region of
 * the runtime's IPC memory; that a lock holds it in place is the caller's to keep. Errors:
 * SPW_ERR_INVALID_ARG (NULL, bytes 0, a range outside the runtime's IPC memory),
 * SPW_ERR_UNSUPPORTED (config.ipc off), SPW_ERR_CUDA, SPW_ERR_SYSTEM. Thread-safe. */
SPW_API int spw_ipc_export_ptr(spw_runtime_t *rt, const void *dptr, size_t bytes,
                               spw_ipc_handle_t *out);

/* Opens a handle another process exported: *dptr points to its memory, on this runtime's
 * device (which may be another ordinal than the exporter's, where the two devices have peer
 * access). The memory is the exporter's: it does not count against this runtime's limits
 * and is never spilled. Close it with spw_ipc_close before the exporter lets it go. A
 * process cannot open its own handles (CUDA refuses; use the buffer itself). Errors:
 * SPW_ERR_INVALID_ARG (NULL, a handle of another backend kind, of an unknown kind, with a
 * bad offset or size, or whose token the exporter does not know; an address-stable
 * buffer's handle made by another Spillway version, or whose exporter's answer does not
 * fit it), SPW_ERR_UNSUPPORTED (a handle from this same process; an address-stable
 * buffer's handle on a device without virtual memory management), SPW_ERR_NOT_LOCKED /
 * SPW_ERR_FREED (an address-stable buffer's exporter no longer holds it resident and
 * locked, or freed it), SPW_ERR_CUDA (the driver refused it, or the exporter has exited),
 * SPW_ERR_SYSTEM. Blocks for the exporter's
 * answer (at most 10 s without progress). Thread-safe. */
SPW_API int spw_ipc_open(spw_runtime_t *rt, const spw_ipc_handle_t *handle, void **dptr);

/* Closes what spw_ipc_open opened at `dptr`; every other use of that pointer must be over.
 * Errors: SPW_ERR_INVALID_ARG (NULL, or a pointer spw_ipc_open did not return on this
 * runtime, or one already closed), SPW_ERR_CUDA. Thread-safe. */
SPW_API int spw_ipc_close(spw_runtime_t *rt, void *dptr);

/* ---------------------------------------------------------------------------------------
 * Statistics
 * ------------------------------------------------------------------------------------- */
typedef struct spw_stats {
  size_t struct_size;              /* set to sizeof(spw_stats_t) before the call */
  uint64_t buffers;                /* live buffers */
  uint64_t device_bytes;           /* bytes held in device memory by buffers */
  uint64_t host_bytes;             /* bytes of buffers whose authoritative copy is on host */
  uint64_t disk_bytes;             /* bytes of buffers on disk */
  uint64_t locked_bytes;           /* bytes of buffers with at least one lock */
  uint64_t device_limit;
  uint64_t host_pinned_bytes;      /* pinned host memory held by the arena (slabs) */
  uint64_t spills, spill_bytes;    /* device -> host, and device -> disk directly */
  uint64_t unspills, unspill_bytes;/* host -> device */
  uint64_t demotions, demote_bytes;/* host -> disk */
  uint64_t disk_reads, disk_read_bytes; /* disk -> device (through staging) */
  uint64_t disk_writes, disk_write_bytes;
  uint64_t spills_on_demand;       /* spills (to host) forced by an allocation, acquire or
                                      prefetch that needed room */
  uint64_t spills_background;      /* spills started above the high watermark, or above the
                                      low one to make room ahead of prefetches */
  uint64_t spills_abandoned;       /* spills cancelled by an acquire */
  uint64_t clean_respills;         /* spills that moved no bytes (clean host copy kept) */
  uint64_t failures;               /* failed spills, unspills, demotions, reads */
  uint64_t spill_ns, unspill_ns, demote_ns, disk_read_ns; /* time spent (wall, engine) */
  uint64_t disk_requests;          /* reads and writes issued to the spill file: buffers
                                      moved together whose extents are neighbours share one */
  /* Hints (spw_spill, spw_prefetch and their _n forms) keep at most one pending wish per
   * buffer; see "Hints" in docs/api.md. */
  uint64_t hints_merged;           /* hints for a buffer that already had the same one pending */
  uint64_t hints_replaced;         /* hints that replaced a different pending one */
  uint64_t hints_pending;          /* buffers with a pending hint now */
  uint64_t prefetch_dropped;       /* prefetched buffers left where they were: no room that
                                      would stay (see spw_prefetch) */
  /* The peer tier (spw_peer_lend). Peer moves are also counted in spills / unspills. */
  uint64_t peer_bytes;             /* bytes of buffers whose authoritative copy is in lent
                                      peer memory (not in host_bytes) */
  uint64_t peer_limit;             /* bytes another runtime lends this one now (0: none) */
  uint64_t peer_spills, peer_spill_bytes;     /* device -> peer */
  uint64_t peer_unspills, peer_unspill_bytes; /* peer -> device */
  uint64_t peer_returns, peer_return_bytes;   /* peer -> host or disk: the lender took its
                                                 memory back */
  uint64_t lent_bytes;             /* this runtime's device memory lent to others now (part
                                      of its device limit) */
} spw_stats_t;

/* Fills `out` (set out->struct_size first; fields past it are not written). */
SPW_API int spw_get_stats(spw_runtime_t *rt, spw_stats_t *out);

/* Writes a one-line summary ("12 buffers; device 1.2 GiB of 4.0 GiB (locked 256.0 MiB); host
 * 3.1 GiB; disk 0 B; spilled 12.4 GiB in 210 (0.250 s, ...) ...", then "; peer ..." and
 * "; lent ..." where the runtime has a peer tier or lends, then "; owners: torch 3 buffers
 * 1.5 GiB, owner 7 1 buffer 4.0 KiB" for the owners with live buffers, named or not) into
 * `buf` (always NUL-terminated when len > 0; cut short where it does not fit). Thread-safe. */
SPW_API int spw_stats_summary(spw_runtime_t *rt, char *buf, size_t len);

/* ---------------------------------------------------------------------------------------
 * Owners: who allocated what. A buffer allocated with SPW_ALLOC_OWNER(id) in spw_alloc_ex's
 * flags counts for owner `id` (1..SPW_OWNER_MAX) of its runtime until it is released; the
 * trace names the owner in the events of its moves and lock waits and draws each owner's
 * device bytes, and the stats summary lists owners with live buffers. Libraries that share
 * one runtime pick distinct ids (the Python package's allocators use 1 to 4: docs/python.md).
 * ------------------------------------------------------------------------------------- */
#define SPW_OWNER_NAME_MAX 31 /* characters of an owner's name, without the NUL */

/* Names owner `id` for the trace and the summary, in place of "owner <id>". The name is
 * copied; naming again replaces it (trace events written after the call, up to 2 ms after
 * their moves, carry the new one). A name is 1 to SPW_OWNER_NAME_MAX printable ASCII
 * characters (0x20 to 0x7e) other than '"' and '\', so it goes into JSON and text as it is.
 * Errors: SPW_ERR_INVALID_ARG (rt or name NULL, id 0 or past SPW_OWNER_MAX, a name empty,
 * too long or with another character; nothing changes). Thread-safe (names are kept under a
 * mutex of their own that no allocation takes). */
SPW_API int spw_owner_name(spw_runtime_t *rt, unsigned id, const char *name);

typedef struct spw_owner_stats_s {
  size_t struct_size;   /* set to sizeof(spw_owner_stats_t) before the call */
  uint64_t buffers;     /* live buffers of the owner: allocated and not yet released (a freed
                           buffer still locked counts until its last lock goes, as in
                           spw_stats_t.buffers) */
  uint64_t bytes;       /* their bytes, in whatever tier they are */
  uint64_t allocs;      /* buffers allocated for the owner since the runtime was created */
  uint64_t alloc_bytes; /* their bytes */
  char name[SPW_OWNER_NAME_MAX + 1]; /* its name (spw_owner_name), "" if it has none */
} spw_owner_stats_t;

/* Fills `out` with owner `id`'s counters (set out->struct_size first; fields past it are not
 * written, and it is set to the size written). Each counter is exact and read without a
 * lock; an allocation or free racing with the call may show in one and not yet in another.
 * An owner never used reads all zeros. Errors: SPW_ERR_INVALID_ARG (rt or out NULL,
 * struct_size smaller than a size_t, id 0 or past SPW_OWNER_MAX). Thread-safe. */
SPW_API int spw_owner_stats(spw_runtime_t *rt, unsigned id, spw_owner_stats_t *out);

/* ---------------------------------------------------------------------------------------
 * Controller (RMMEP-1's controller; Dask-style). Every callback is optional (NULL), runs on
 * the thread that caused the event (the allocating / freeing thread, or an engine thread for
 * background work) and never while Spillway holds one of its own locks. From a callback you
 * may call spw_spill, spw_prefetch, the queries and the statistics; calls that would wait on
 * the runtime (spw_wait_idle, spw_stream_synchronize, spw_stream_destroy,
 * spw_stream_unregister, spw_runtime_destroy, and spw_acquire of a buffer that is not on
 * the device) return SPW_ERR_WOULD_DEADLOCK.
 * ------------------------------------------------------------------------------------- */
typedef struct spw_state_event {
  spw_buf_t buf;
  spw_state_t from, to;
  uint64_t bytes;       /* bytes moved (0 for a clean re-spill) */
  uint64_t duration_ns; /* time of the move */
  int status;           /* SPW_OK, or the error of a failed move (from == to then) */
} spw_state_event_t;

typedef struct spw_controller {
  size_t struct_size; /* sizeof(spw_controller_t) */
  void (*allocated)(void *user, spw_buf_t buf, size_t bytes);
  void (*freed)(void *user, spw_buf_t buf, size_t bytes);
  void (*state_changed)(void *user, const spw_state_event_t *event);
  /* Device memory is short by `bytes_needed`: write up to `max` victims into `victims` and
   * return how many. Locked or non-resident victims are skipped; if the named ones do not
   * free enough, least-recently-used buffers make up the rest. */
  size_t (*pressure)(void *user, uint64_t bytes_needed, spw_buf_t *victims, size_t max);
} spw_controller_t;

/* Installs (or, with NULL, removes) the controller. Callbacks already running finish
 * with the old table. */
SPW_API int spw_set_controller(spw_runtime_t *rt, const spw_controller_t *controller,
                               void *user);

/* =======================================================================================
 * Launch wrappers (RMMEP-1's lockAndLaunch, lockAndLaunchAsync and syncAndUnlock):
 * src/api/launch_api.c. This section ends at "end of launch wrappers" below.
 *
 * Each wrapper acquires a list of buffers on one stream (all or nothing, each buffer with its
 * own flags and byte offset), runs the caller's work on that stream, and releases exactly the
 * locks it took once that work has completed, leaving every other lock of the stream alone.
 * On any failure nothing stays locked and spw_last_error names the argument that failed
 * ("argument 2 (buffer 0x...): SPW_ERR_FREED: ..."). syncAndUnlock is
 * spw_stream_synchronize. include/spillway/spillway.hpp builds the C++ templates on these.
 * ===================================================================================== */

/* One buffer of a launch. The device pointer handed on is the buffer's + `offset` (at most
 * the buffer's size); `flags` are spw_acquire's (SPW_ACQUIRE_READ, SPW_ACQUIRE_TRY) for this
 * buffer alone. `reserved` must be 0, so that a later version can give it a meaning; build
 * entries with spw_buf_arg(). */
typedef struct spw_buf_arg_s {
  spw_buf_t buf;
  uint64_t offset;
  uint32_t flags;
  uint32_t reserved;
} spw_buf_arg_t;

static inline spw_buf_arg_t spw_buf_arg(spw_buf_t buf, uint64_t offset, unsigned flags) {
  spw_buf_arg_t a;
  a.buf = buf;
  a.offset = offset;
  a.flags = (uint32_t)flags;
  a.reserved = 0;
  return a;
}

/* How the wrappers release the locks they took (0: asynchronously, see each function). */
#define SPW_LAUNCH_BLOCK 0x1u      /* block until the launched work has completed, then release */
#define SPW_LAUNCH_KEEP_LOCKS 0x2u /* leave the locks in the stream's lock map, for
                                      spw_stream_synchronize or spw_stream_release_async
                                      (lockAndLaunchAsync) */

/* Blocks until the work enqueued on `stream` so far has completed, and releases nothing
 * (cudaStreamSynchronize; unlike spw_stream_synchronize, every lock stays held). Errors:
 * SPW_ERR_INVALID_ARG, SPW_ERR_INVALID_STREAM, SPW_ERR_CUDA, SPW_ERR_WOULD_DEADLOCK (from a
 * controller callback). */
SPW_API int spw_stream_wait(spw_runtime_t *rt, spw_stream_t stream);

/* spw_acquire_n with flags and an offset per buffer: locks args[0..n) on `stream` (recorded
 * in its lock map, like spw_acquire) and writes each device pointer + offset to dptrs[i].
 * All or nothing: on error no lock is held, dptrs is untouched and spw_last_error names the
 * failing entry. A handle may appear several times (one lock each). Errors: as spw_acquire,
 * plus SPW_ERR_INVALID_ARG (args or dptrs NULL, n 0, unknown flag bits, reserved not 0, an
 * offset past the end of its buffer). */
SPW_API SPW_NODISCARD int spw_acquire_args(spw_runtime_t *rt, const spw_buf_arg_t *args,
                                           size_t n, spw_stream_t stream, void **dptrs);

/* The caller's work: enqueue it on `stream`, using dptrs[i] for args[i]; return 0, or a
 * nonzero code of your choice, which the wrapper returns as it is (Spillway's own codes are
 * negative). Runs on the calling thread, with the locks held and no Spillway lock held: it
 * may call Spillway (a nested wrapper included), but must not synchronize `stream` with
 * spw_stream_synchronize (that would release the wrapper's locks under it). */
typedef int (*spw_launch_fn)(void *user, void *const *dptrs, spw_stream_t stream);

/* lockAndLaunch: acquires args[0..n) on `stream` as spw_acquire_args does, calls
 * fn(user, dptrs, stream), then releases those locks, and only those, once the work fn
 * enqueued on `stream` has completed. `flags`:
 *  - 0: returns at once; the locks are released when `stream` passes this point
 *    (spw_release_n_async). If that cannot be scheduled (out of memory, an event failure),
 *    the call waits for the stream instead, then releases;
 *  - SPW_LAUNCH_BLOCK: waits for the stream (spw_stream_wait), then releases; on return the
 *    locks are gone. If the wait fails, the locks stay in the stream's lock map (released by
 *    a later spw_stream_synchronize) and its error is returned;
 *  - SPW_LAUNCH_KEEP_LOCKS: spw_lock_and_launch_async.
 * If fn returns nonzero, its locks are released as with flags 0 (after whatever fn enqueued,
 * also under SPW_LAUNCH_KEEP_LOCKS), and its code is returned. n may be 0 (args then may be
 * NULL). Errors: as spw_acquire_args (fn is not called), SPW_ERR_INVALID_ARG (fn NULL, unknown
 * flags, both flags), SPW_ERR_INVALID_STREAM, SPW_ERR_WOULD_DEADLOCK (SPW_LAUNCH_BLOCK from a
 * controller callback), and the release's errors after fn ran. Thread-safe; the same stream
 * may be used by several threads at once. */
SPW_API int spw_lock_and_launch(spw_runtime_t *rt, const spw_buf_arg_t *args, size_t n,
                                spw_stream_t stream, unsigned flags, spw_launch_fn fn,
                                void *user);

/* lockAndLaunchAsync: spw_lock_and_launch with SPW_LAUNCH_KEEP_LOCKS. The locks stay in
 * `stream`'s lock map, like spw_acquire's, and go with the stream's other locks at the next
 * spw_stream_synchronize (syncAndUnlock) or spw_stream_release_async. */
SPW_API int spw_lock_and_launch_async(spw_runtime_t *rt, const spw_buf_arg_t *args, size_t n,
                                      spw_stream_t stream, spw_launch_fn fn, void *user);

/* Grid and block dimensions, laid out as CUDA's dim3. */
typedef struct spw_dim3_s {
  unsigned x, y, z;
} spw_dim3_t;

static inline spw_dim3_t spw_dim3(unsigned x, unsigned y, unsigned z) {
  spw_dim3_t d;
  d.x = x;
  d.y = y;
  d.z = z;
  return d;
}

/* One kernel argument: a value (as cudaLaunchKernel's args[i], plus its size), or a buffer,
 * which the kernel receives as a pointer-sized argument holding its device pointer + offset.
 * `reserved` must be 0. Build them with spw_karg_value / SPW_KARG and spw_karg_buf. */
typedef enum spw_karg_kind {
  SPW_KARG_VALUE = 1,
  SPW_KARG_BUFFER = 2,
} spw_karg_kind_t;

typedef struct spw_kernel_arg {
  uint32_t kind;     /* spw_karg_kind_t */
  uint32_t reserved; /* 0 */
  const void *value; /* VALUE: the argument's value, read during the call */
  size_t size;       /* VALUE: its size in bytes (CUDA takes the real size from the kernel;
                        the host backend copies this many) */
  spw_buf_arg_t buf; /* BUFFER: handle, byte offset, flags */
} spw_kernel_arg_t;

static inline spw_kernel_arg_t spw_karg_value(const void *value, size_t size) {
  spw_kernel_arg_t a;
  a.kind = SPW_KARG_VALUE;
  a.reserved = 0;
  a.value = value;
  a.size = size;
  a.buf = spw_buf_arg(SPW_BUF_NULL, 0, 0);
  return a;
}
#define SPW_KARG(lvalue) spw_karg_value(&(lvalue), sizeof(lvalue))

static inline spw_kernel_arg_t spw_karg_buf(spw_buf_t buf, uint64_t offset, unsigned flags) {
  spw_kernel_arg_t a;
  a.kind = SPW_KARG_BUFFER;
  a.reserved = 0;
  a.value = NULL;
  a.size = 0;
  a.buf = spw_buf_arg(buf, offset, flags);
  return a;
}

#define SPW_KERNEL_ARGS_MAX 1024          /* arguments of one launch */
#define SPW_KERNEL_ARG_BYTES_MAX 32764u   /* their values together (CUDA's parameter limit) */

/* The host backend's stand-in for a kernel: run once on the stream's worker thread, with
 * args[i] pointing to a copy of argument i (buffers: a void * holding device pointer +
 * offset), taken when the launch was enqueued, as cudaLaunchKernel copies its arguments.
 * Grid, block and shared memory size are not used there. Pass it as spw_host_kernel(fn). */
typedef void (*spw_host_kernel_fn)(void **args);

static inline const void *spw_host_kernel(spw_host_kernel_fn fn) {
#ifdef __cplusplus
  return reinterpret_cast<const void *>(fn);
#else
  /* ISO C has no cast from a function pointer to void *; POSIX gives both one layout. */
  union {
    spw_host_kernel_fn fn;
    const void *p;
  } u;
  u.fn = fn;
  return u.p;
#endif
}

/* Launches a kernel cudaLaunchKernel-style with buffers among its arguments: acquires every
 * SPW_KARG_BUFFER argument on `stream` (all or nothing, each with its own flags), puts its
 * device pointer + offset in a copy of the argument array, launches, and releases those
 * locks once the kernel has completed, as spw_lock_and_launch does with the same `flags`
 * (0: without blocking; SPW_LAUNCH_BLOCK; SPW_LAUNCH_KEEP_LOCKS). The argument values are
 * read before the call returns; `args` may be reused at once.
 *
 * `func`: on the CUDA backend the kernel, as for cudaLaunchKernel: its host stub when the
 * caller and Spillway share one CUDA runtime (linking the static library), or in any case a
 * cudaKernel_t from cudaGetKernel(&k, kernel) cast to const void * (the shared library
 * carries its own CUDA runtime, which does not know the application's host stubs). On the
 * host backend, spw_host_kernel(fn).
 *
 * Errors: SPW_ERR_INVALID_ARG (func NULL, a zero grid or block dimension, nargs past
 * SPW_KERNEL_ARGS_MAX, args NULL with nargs > 0, an unknown kind, a value NULL or of size 0,
 * values past SPW_KERNEL_ARG_BYTES_MAX together, bad flags, and spw_acquire_args' reasons),
 * SPW_ERR_INVALID_STREAM, the acquire errors of a buffer argument (spw_last_error names it:
 * "kernel argument 3 (buffer 0x...): ..."), SPW_ERR_CUDA (the launch failed: nothing was
 * launched, nothing stays locked, spw_last_error has CUDA's text), and the release's errors
 * after a launch (spw_lock_and_launch). Thread-safe. */
SPW_API int spw_launch_kernel(spw_runtime_t *rt, const void *func, spw_dim3_t grid,
                              spw_dim3_t block, const spw_kernel_arg_t *args, size_t nargs,
                              size_t shared_bytes, spw_stream_t stream, unsigned flags);

/* CUDA graphs over deferrable buffers. A graph keeps the device pointers it was captured
 * with, so the rule is: a graph may use Spillway buffers only if they are address-stable
 * (SPW_ALLOC_STABLE), and only when it is launched through spw_graph_launch, which holds
 * their locks while it runs. Launched any other way, nothing keeps the buffers on the
 * device under it (docs/api.md, "CUDA graphs").
 *
 * The host backend has no graphs: its stand-in is a spw_host_graph_t, whose fn(user) runs
 * once per launch on the stream's worker thread, in stream order (as a host function:
 * it must not call Spillway). fn and user are read when the launch is enqueued; the struct
 * may be reused at once. Pass its address as graph_exec. */
typedef struct spw_host_graph_s {
  void (*fn)(void *user);
  void *user;
} spw_host_graph_t;

#define SPW_GRAPH_BUFS_MAX 65536u /* buffers of one graph launch */

/* Launches an instantiated CUDA graph whose kernels use the address-stable buffers
 * args[0..n): acquires them all on `stream` (all or nothing, each with its own flags;
 * spilled ones come back at the addresses the graph captured), launches the graph on
 * `stream` (cudaGraphLaunch), and releases exactly those locks once the graph has completed,
 * as spw_lock_and_launch does with the same `flags` (0: without blocking; SPW_LAUNCH_BLOCK;
 * SPW_LAUNCH_KEEP_LOCKS). The graph may be launched again at once: each launch takes and
 * releases its own locks, and the buffers may be spilled between launches.
 *
 * `graph_exec`: on the CUDA backend a cudaGraphExec_t cast to const void * (a driver
 * object: it may come from any CUDA runtime of the process, the application's or
 * Spillway's), instantiated on this runtime's device; on the host backend a
 * spw_host_graph_t *. Every offset in args must be 0: a graph's kernels got their pointers
 * at capture, and an offset could not reach them. List every Spillway buffer the graph
 * touches; a buffer the graph only reads may carry SPW_ACQUIRE_READ.
 *
 * Errors: SPW_ERR_INVALID_ARG (rt NULL; graph_exec NULL; args NULL; n 0 or past
 * SPW_GRAPH_BUFS_MAX; bad flags; and, named in spw_last_error as "graph argument 2 (buffer
 * 0x...): ...", a buffer that is not address-stable, an offset not 0, unknown flag bits or
 * reserved not 0; on the host backend a spw_host_graph_t with fn NULL), SPW_ERR_INVALID_STREAM
 * (unknown stream, or one of another runtime), SPW_ERR_WOULD_DEADLOCK (SPW_LAUNCH_BLOCK from
 * a controller callback), the acquire errors of a buffer (SPW_ERR_FREED, SPW_ERR_INVALID_HANDLE
 * and the others of spw_acquire, named the same way), SPW_ERR_CUDA (the launch failed:
 * nothing was launched, nothing stays locked, spw_last_error has CUDA's text), and the
 * release's errors after a launch (spw_lock_and_launch). On every error before the launch
 * nothing stays locked. Thread-safe; a graph exec may not be launched by two threads at
 * once (CUDA's rule), but different ones may. */
SPW_API int spw_graph_launch(spw_runtime_t *rt, const void *graph_exec, const spw_buf_arg_t *args,
                             size_t n, spw_stream_t stream, unsigned flags);

/* ======================================================================================
 * end of launch wrappers
 * ==================================================================================== */

#ifdef __cplusplus
}
#endif

#endif /* SPILLWAY_SPILLWAY_H */
