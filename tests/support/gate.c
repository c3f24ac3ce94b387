/* SPDX-License-Identifier: Apache-2.0 */
/* Gates (see gate.h). */
#include "gate.h"

#include <errno.h>
#include <stdlib.h>
#include <time.h>

#include "test_util.h"

void gate_init(gate_t *g) {
  pthread_condattr_t ca;
  ASSERT_EQ(pthread_condattr_init(&ca), 0);
  ASSERT_EQ(pthread_condattr_setclock(&ca, CLOCK_MONOTONIC), 0);
  ASSERT_EQ(pthread_mutex_init(&g->mu, NULL), 0);
  ASSERT_EQ(pthread_cond_init(&g->cv, &ca), 0);
  pthread_condattr_destroy(&ca);
  g->open = g->entered = g->timed_out = false;
}

void gate_fini(gate_t *g) {
  pthread_cond_destroy(&g->cv);
  pthread_mutex_destroy(&g->mu);
}

static struct timespec deadline_s(int s) {
  struct timespec d;
  clock_gettime(CLOCK_MONOTONIC, &d);
  d.tv_sec += s;
  return d;
}

void gate_wait(void *arg) {
  gate_t *g = arg;
  struct timespec deadline = deadline_s(GATE_TIMEOUT_S);
  pthread_mutex_lock(&g->mu);
  g->entered = true;
  pthread_cond_broadcast(&g->cv);
  while (!g->open) {
    if (pthread_cond_timedwait(&g->cv, &g->mu, &deadline) == ETIMEDOUT) {
      g->timed_out = true;
      break;
    }
  }
  pthread_mutex_unlock(&g->mu);
}

void gate_open(gate_t *g) {
  pthread_mutex_lock(&g->mu);
  g->open = true;
  pthread_cond_broadcast(&g->cv);
  pthread_mutex_unlock(&g->mu);
}

void gate_await_entered(gate_t *g) {
  struct timespec deadline = deadline_s(GATE_TIMEOUT_S);
  pthread_mutex_lock(&g->mu);
  while (!g->entered)
    if (pthread_cond_timedwait(&g->cv, &g->mu, &deadline) == ETIMEDOUT) break;
  bool entered = g->entered;
  pthread_mutex_unlock(&g->mu);
  ASSERT_TRUE(entered);
}

/* One of the gate's flags, read under its mutex. */
static bool flag_of(gate_t *g, const bool *flag) {
  pthread_mutex_lock(&g->mu);
  bool v = *flag;
  pthread_mutex_unlock(&g->mu);
  return v;
}

bool gate_entered(gate_t *g) { return flag_of(g, &g->entered); }

bool gate_timed_out(gate_t *g) { return flag_of(g, &g->timed_out); }

typedef struct later {
  gate_t *g;
  long ms;
} later_t;

static void *open_later_main(void *arg) {
  later_t *l = arg;
  test_sleep_ms(l->ms);
  gate_open(l->g);
  free(l);
  return NULL;
}

void gate_open_later(gate_t *g, long ms, pthread_t *thread) {
  later_t *l = malloc(sizeof *l);
  ASSERT_TRUE(l != NULL);
  *l = (later_t){g, ms};
  ASSERT_EQ(pthread_create(thread, NULL, open_later_main, l), 0);
}
