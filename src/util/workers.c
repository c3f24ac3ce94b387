/* SPDX-License-Identifier: Apache-2.0 */
/* Helper threads (see workers.h). A run is published as a generation: helper k runs part
 * k + 1 of each generation it sees, if there is one, and counts itself done; the caller runs
 * part 0 and waits for the count. The helpers sleep on a condition variable between runs. */
#include "workers.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

typedef struct helper {
  struct spw_workers *w;
  unsigned k;
  pthread_t thread;
} helper_t;

struct spw_workers {
  pthread_mutex_t run_mu; /* one run at a time */
  pthread_mutex_t mu;
  pthread_cond_t go;   /* helpers: a new generation, or stop */
  pthread_cond_t done; /* the caller: a helper finished its part */
  uint64_t gen;
  unsigned parts, left;
  spw_work_fn fn;
  void *ctx;
  int stop;
  unsigned n;
  helper_t helpers[];
};

static void *helper_main(void *arg) {
  helper_t *h = arg;
  struct spw_workers *w = h->w;
  uint64_t seen = 0;
  pthread_mutex_lock(&w->mu);
  for (;;) {
    while (w->gen == seen && !w->stop) pthread_cond_wait(&w->go, &w->mu);
    if (w->stop) break;
    seen = w->gen;
    if (h->k + 1 >= w->parts) continue; /* no part for this helper in this run */
    spw_work_fn fn = w->fn;
    void *ctx = w->ctx;
    pthread_mutex_unlock(&w->mu);
    fn(ctx, h->k + 1);
    pthread_mutex_lock(&w->mu);
    if (--w->left == 0) pthread_cond_signal(&w->done);
  }
  pthread_mutex_unlock(&w->mu);
  return NULL;
}

int spw__workers_start(unsigned helpers, spw_workers_t **out) {
  struct spw_workers *w = calloc(1, sizeof *w + helpers * sizeof(helper_t));
  if (!w) return -1;
  pthread_mutex_init(&w->run_mu, NULL);
  pthread_mutex_init(&w->mu, NULL);
  pthread_cond_init(&w->go, NULL);
  pthread_cond_init(&w->done, NULL);
  for (unsigned k = 0; k < helpers; k++) {
    w->helpers[k] = (helper_t){.w = w, .k = k};
    if (pthread_create(&w->helpers[k].thread, NULL, helper_main, &w->helpers[k]) != 0) {
      spw__workers_stop(w);
      return -1;
    }
    w->n++;
  }
  *out = w;
  return 0;
}

void spw__workers_stop(spw_workers_t *w) {
  if (!w) return;
  pthread_mutex_lock(&w->mu);
  w->stop = 1;
  pthread_cond_broadcast(&w->go);
  pthread_mutex_unlock(&w->mu);
  for (unsigned k = 0; k < w->n; k++) pthread_join(w->helpers[k].thread, NULL);
  pthread_cond_destroy(&w->done);
  pthread_cond_destroy(&w->go);
  pthread_mutex_destroy(&w->mu);
  pthread_mutex_destroy(&w->run_mu);
  free(w);
}

unsigned spw__workers_width(const spw_workers_t *w) { return w ? w->n + 1 : 1; }

void spw__workers_run(spw_workers_t *w, spw_work_fn fn, void *ctx, unsigned parts) {
  unsigned width = spw__workers_width(w);
  if (parts <= 1 || width == 1) {
    for (unsigned i = 0; i < parts; i++) fn(ctx, i);
    return;
  }
  unsigned on_helpers = (parts < width ? parts : width) - 1;
  pthread_mutex_lock(&w->run_mu);
  pthread_mutex_lock(&w->mu);
  w->fn = fn;
  w->ctx = ctx;
  w->parts = on_helpers + 1;
  w->left = on_helpers;
  w->gen++;
  pthread_cond_broadcast(&w->go);
  pthread_mutex_unlock(&w->mu);
  fn(ctx, 0);
  for (unsigned i = width; i < parts; i++) fn(ctx, i); /* more parts than threads */
  pthread_mutex_lock(&w->mu);
  while (w->left > 0) pthread_cond_wait(&w->done, &w->mu);
  pthread_mutex_unlock(&w->mu);
  pthread_mutex_unlock(&w->run_mu);
}
