/* SPDX-License-Identifier: Apache-2.0 */
/* Private header, never installed: a few helper threads that run the parts of one job beside
 * the thread that asks (see workers.c). Thread-safe; runs of one pool take turns. */
#ifndef SPILLWAY_UTIL_WORKERS_H
#define SPILLWAY_UTIL_WORKERS_H

typedef struct spw_workers spw_workers_t;

/* Runs part `i` of a job. */
typedef void (*spw_work_fn)(void *ctx, unsigned i);

/* Starts `helpers` threads (0 is a pool that runs everything on the caller). Returns 0, or
 * nonzero with nothing left behind when a thread or the pool cannot be had. */
int spw__workers_start(unsigned helpers, spw_workers_t **out);
/* Stops and joins the helpers (no run may be under way). NULL-safe. */
void spw__workers_stop(spw_workers_t *w);
/* How many parts a run does at once: the helpers and the caller (1 for NULL). */
unsigned spw__workers_width(const spw_workers_t *w);
/* Runs fn(ctx, i) for every i < parts, at most spw__workers_width at once: part 0 on the
 * caller, the others on helpers (the caller runs those past the width itself). Returns once
 * every part has returned. A run waits for the run before it to end. */
void spw__workers_run(spw_workers_t *w, spw_work_fn fn, void *ctx, unsigned parts);

#endif /* SPILLWAY_UTIL_WORKERS_H */
