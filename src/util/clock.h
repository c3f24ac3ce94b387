/* SPDX-License-Identifier: Apache-2.0 */
/* Private header, never installed: monotonic clocks. The precise one times moves; the
 * coarse one (a few ms of grain, a fraction of the cost) orders buffers by last use. */
#ifndef SPILLWAY_UTIL_CLOCK_H
#define SPILLWAY_UTIL_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline uint64_t spw__now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static inline uint64_t spw__coarse_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* A CLOCK_REALTIME deadline `ns` from now, for pthread_cond_timedwait. */
static inline struct timespec spw__deadline_in(uint64_t ns) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  ts.tv_sec += (time_t)(ns / 1000000000u);
  ts.tv_nsec += (long)(ns % 1000000000u);
  if (ts.tv_nsec >= 1000000000) {
    ts.tv_sec++;
    ts.tv_nsec -= 1000000000;
  }
  return ts;
}

/* Sleeps `ns` (at most a second), for polling loops. */
static inline void spw__sleep_ns(uint64_t ns) {
  struct timespec ts = {0, (long)(ns % 1000000000u)};
  nanosleep(&ts, NULL);
}

#endif /* SPILLWAY_UTIL_CLOCK_H */
