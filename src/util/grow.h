/* SPDX-License-Identifier: Apache-2.0 */
/* Private header, never installed: growth by doubling for the arrays behind lists (lock
 * maps, free lists, pools), so every list grows the same way and checks for overflow. */
#ifndef SPILLWAY_UTIL_GROW_H
#define SPILLWAY_UTIL_GROW_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

/* Room for at least `need` (>= 1) elements of `elem` bytes in `arr`, whose capacity is
 * *cap: doubles, starting from `first`. Returns the array (moved or not) and updates *cap,
 * or NULL when memory runs out or the size would overflow; `arr` is then unchanged. */
static inline void *spw__grow(void *arr, size_t *cap, size_t need, size_t elem, size_t first) {
  if (need <= *cap) return arr;
  size_t n = *cap ? *cap : first;
  while (n < need) {
    if (n > SIZE_MAX / 2) return NULL;
    n *= 2;
  }
  if (n > SIZE_MAX / elem) return NULL;
  void *p = realloc(arr, n * elem);
  if (p) *cap = n;
  return p;
}

#endif /* SPILLWAY_UTIL_GROW_H */
