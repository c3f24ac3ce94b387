/* SPDX-License-Identifier: Apache-2.0 */
/* Private header, never installed: the spill engine's workers and copy streams.
 *
 * Two non-blocking copy streams and two worker threads ("lanes"), one per direction, because
 * the link is full duplex: the down lane (device -> host/disk, stream d2h) and the up lane
 * (host/disk -> device, stream h2d). Each lane has its own queue of jobs. The engine knows
 * nothing of buffers: a job is an opaque, intrusively linked record, and what a lane does
 * with its jobs is the work functions its creator hands down (libuv's thread pool runs its
 * caller's work and done callbacks the same way). A lane takes its whole queue at once, so
 * requests queued together are run as one batch. The down lane also runs a background
 * function when kicked (spilling above the high watermark), and housekeeping when it has
 * nothing else to do.
 *
 * Thread-safe. Work functions run on the lane threads with no engine lock held.
 */
#ifndef SPILLWAY_SPILL_ENGINE_H
#define SPILLWAY_SPILL_ENGINE_H

#include "backend.h"

typedef struct spw_engine spw_engine_t;

typedef enum spw_lane {
  SPW_LANE_DOWN = 0, /* spills: stream d2h */
  SPW_LANE_UP = 1,   /* prefetches: stream h2d */
} spw_lane_t;

/* A queued job; the creator embeds it first in its own record. */
typedef struct spw_job {
  struct spw_job *next;
} spw_job_t;

#define SPW_TIDY_DONE 0u
#define SPW_TIDY_NOW 1u

typedef struct spw_engine_work {
  /* Runs `jobs` (a list in queue order) on lane `lane`'s thread and frees them. */
  void (*run)(void *ctx, spw_lane_t lane, spw_job_t *jobs);
  /* Runs on the down lane's thread after a kick. */
  void (*background)(void *ctx);
  /* Housekeeping that moves no data (giving the spill file's freed space back to the file
   * system), a short step at a time: once asked for (spw__engine_tidy), one step runs on the
   * down lane's thread after each round of its work, or alone. It returns SPW_TIDY_DONE,
   * SPW_TIDY_NOW (another step at once) or any larger value: another step after that many
   * nanoseconds, unless asked for sooner. Waiters never wait for it; a stopping engine
   * leaves what is left. May be NULL. */
  uint64_t (*tidy)(void *ctx);
  /* Frees jobs that no lane will run: queued by one lane's thread (a controller callback)
   * after the other lane had stopped. */
  void (*discard)(void *ctx, spw_job_t *jobs);
  void *ctx;
} spw_engine_work_t;

/* The most slices a lane's request is cut into (its helpers and its own thread). */
#define SPW_ENGINE_MAX_SLICES 16

/* Creates each lane's streams, `slices` of them (1 to SPW_ENGINE_MAX_SLICES: the first is
 * the lane's stream, the others its slices'), and starts both lanes. On error nothing is
 * left behind; an invalid `slices` is SPW_ERR_INVALID_ARG. */
int spw__engine_start(const spw_backend_ops_t *ops, spw_backend_t *be,
                      const spw_engine_work_t *work, unsigned slices, spw_engine_t **out);
/* Runs the queued jobs, stops both lanes, destroys the streams; jobs queued after a lane
 * stopped are discarded. NULL-safe. */
void spw__engine_stop(spw_engine_t *e);
/* The lane's copy stream (d2h for DOWN, h2d for UP). */
spw_stream_t spw__engine_stream(const spw_engine_t *e, spw_lane_t lane);
/* How many streams the lane's slices copy on (the lane's own included), and the one of
 * slice i (i modulo that count; slice 0's is the lane's stream). Fixed while the engine
 * runs: callable from any thread without a lock. */
unsigned spw__engine_slices(const spw_engine_t *e, spw_lane_t lane);
spw_stream_t spw__engine_slice_stream(const spw_engine_t *e, spw_lane_t lane, unsigned i);
/* Queues `job` on `lane`; the lane's work function frees it. Never fails. */
void spw__engine_submit(spw_engine_t *e, spw_lane_t lane, spw_job_t *job);
/* Wakes the down lane for its background function. Cheap; callable from anywhere;
 * NULL-safe. A kick from a lane's own thread is the running work's own: waiters wait for it
 * (spw__engine_wait_idle), so the background function must not kick itself, or a waiter
 * follows the chain for as long as it goes on. */
void spw__engine_kick(spw_engine_t *e);
/* Whether the calling thread is `lane`'s worker. */
int spw__engine_on_lane(const spw_engine_t *e, spw_lane_t lane);
/* Asks the down lane for tidy steps (see spw_engine_work_t). Cheap; callable from anywhere;
 * NULL-safe. */
void spw__engine_tidy(spw_engine_t *e);
/* Blocks until every job queued and every kick made before the call has been run, and the
 * jobs and kicks that those runs made from the lanes' own threads (work queued meanwhile by
 * other threads is not waited for, nor are tidy steps). */
void spw__engine_wait_idle(spw_engine_t *e);

#endif /* SPILLWAY_SPILL_ENGINE_H */
