/* SPDX-License-Identifier: Apache-2.0 */
/* Private header, never installed: the two-stage pipeline of the batch moves. A batch is
 * cut into parts; part k is prepared and its copy enqueued while part k-1's copy runs, then
 * part k-1 is waited for and committed. So the CPU work of one part (extents, claims,
 * commits: a few hundred ns per buffer) hides behind the copy of the previous one, and
 * whoever waits for room goes on as soon as the first part is committed. */
#ifndef SPILLWAY_CORE_PIPELINE_H
#define SPILLWAY_CORE_PIPELINE_H

#include "runtime.h"

typedef struct spw_part {
  size_t first, count; /* its items */
  int status;          /* of enqueueing its copy */
  int copied;          /* a copy was enqueued */
  spw_bevent_t *ev;    /* completes with its copy; NULL when nothing was enqueued */
} spw_part_t;

typedef struct spw_pipeline {
  /* Prepares the part that starts at p->first: sets p->count and enqueues its copy
   * (spw__part_copy). A count of 0 while a previous part is in flight asks to be tried
   * again once that one is finished (room it holds); a count of 0 with none in flight ends
   * the run. Items may be claimed as the parts need them, so the run's length is whatever
   * start finds. */
  void (*start)(void *ctx, spw_part_t *p);
  /* Waits for the part (spw__part_wait) and commits its items. */
  void (*finish)(void *ctx, spw_part_t *p);
  void *ctx;
} spw_pipeline_t;

void spw__pipeline_run(const spw_pipeline_t *pl);

/* The most items of the part that starts at `first`, in a batch of at most `total` whose
 * parts hold at most `most`: fewer at both ends, so that the first copy starts soon after
 * the batch does and the commit of the last part, which nothing hides, is short. The first
 * part has SPW_PART_FIRST items, each next one as many as went before it; near the end, half
 * of what is left. */
#define SPW_PART_FIRST 256
static inline size_t spw__part_limit(size_t first, size_t total, size_t most) {
  size_t left = total > first ? total - first : 0, n = first < most ? first : most;
  if (n < SPW_PART_FIRST) n = SPW_PART_FIRST;
  if (left > SPW_PART_FIRST && n > left / 2)
    n = left / 2 > SPW_PART_FIRST ? left / 2 : SPW_PART_FIRST;
  return n;
}

/* Enqueues one batch copy for the part on `stream` and records its event. */
void spw__part_copy(spw_runtime_t *rt, spw_part_t *p, const spw_copy_desc_t *d, size_t nd,
                    spw_copy_dir_t dir, spw_stream_t stream);
/* Waits for the part's copy; returns its status. After a failure nothing it enqueued is
 * still running (the stream is synchronized), so its memory may be reused. */
int spw__part_wait(spw_runtime_t *rt, spw_part_t *p, spw_stream_t stream);

#endif /* SPILLWAY_CORE_PIPELINE_H */
