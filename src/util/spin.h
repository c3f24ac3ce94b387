/* SPDX-License-Identifier: Apache-2.0 */
/* Private header, never installed: a small spin lock for critical sections of a few dozen
 * instructions on hot paths (a stream's lock map). An uncontended pair costs two atomic
 * operations, against about twice that for a pthread mutex; contended waiters back off and
 * yield so a preempted holder is not starved. Never held across a call that can block. */
#ifndef SPILLWAY_UTIL_SPIN_H
#define SPILLWAY_UTIL_SPIN_H

#include <sched.h>
#include <stdatomic.h>

typedef struct spw_spin {
  atomic_int v;
} spw_spin_t;

static inline void spw__spin_init(spw_spin_t *l) { atomic_init(&l->v, 0); }

static inline void spw__spin_lock(spw_spin_t *l) {
  for (unsigned spins = 0;; spins++) {
    if (!atomic_exchange_explicit(&l->v, 1, memory_order_acquire)) return;
    while (atomic_load_explicit(&l->v, memory_order_relaxed)) {
      if (++spins > 64) sched_yield();
#if defined(__x86_64__) || defined(__i386__)
      else __builtin_ia32_pause();
#endif
    }
  }
}

static inline void spw__spin_unlock(spw_spin_t *l) {
  atomic_store_explicit(&l->v, 0, memory_order_release);
}

#endif /* SPILLWAY_UTIL_SPIN_H */
