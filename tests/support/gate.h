/* SPDX-License-Identifier: Apache-2.0 */
/* A gate: a host function that blocks the stream it is enqueued on until the test opens
 * it, standing for a long kernel (on the CUDA backend it blocks the stream exactly as one
 * would). It opens by itself after GATE_TIMEOUT_S, so a library that waits where it must not
 * fails the test instead of hanging it. */
#ifndef SPILLWAY_TESTS_GATE_H
#define SPILLWAY_TESTS_GATE_H

#include <pthread.h>
#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

#define GATE_TIMEOUT_S 5

typedef struct gate {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool open, entered, timed_out;
} gate_t;

void gate_init(gate_t *g);
void gate_fini(gate_t *g);
/* The host function: spw_launch_host_func(rt, stream, gate_wait, &gate). */
void gate_wait(void *arg);
void gate_open(gate_t *g);
/* Blocks until a stream has reached the gate (fails the test after GATE_TIMEOUT_S). */
void gate_await_entered(gate_t *g);
bool gate_entered(gate_t *g);
/* Whether the gate opened by itself: something waited where it must not have. */
bool gate_timed_out(gate_t *g);
/* Opens `g` after `ms` from another thread (for a blocked call to go on); join *thread
 * before the gate goes away. */
void gate_open_later(gate_t *g, long ms, pthread_t *thread);

#ifdef __cplusplus
}
#endif

#endif /* SPILLWAY_TESTS_GATE_H */
