/* SPDX-License-Identifier: Apache-2.0 */
/* The stress test's data pattern, shared by the host code and the CUDA kernels (private to
 * tests/stress/, never installed).
 *
 * Every write of a buffer gets a key, (buffer id << 24) | version, unique in the run. Word i
 * (8 bytes, little-endian) of a buffer written with key k is stress_word(k, i); a buffer
 * whose size is not a multiple of 8 ends with the low bytes of its last word. stress_word
 * is a bijection of k ^ (i * odd constant), so a stale version, another buffer's page, a
 * word moved within the buffer and a torn word all read differently, and a wrong word can
 * be decoded back into the key that wrote it (stress_key_of) to say which of these it was.
 */
#ifndef SPILLWAY_TESTS_STRESS_PATTERN_H
#define SPILLWAY_TESTS_STRESS_PATTERN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __CUDACC__
#define STRESS_HD __host__ __device__
#else
#define STRESS_HD
#endif

#define STRESS_VERSION_BITS 24
#define STRESS_INDEX_MUL 0x9E3779B97F4A7C15ull
#define STRESS_MIX_MUL 0xBF58476D1CE4E5B9ull

static inline STRESS_HD uint64_t stress_key(uint64_t id, uint32_t version) {
  return (id << STRESS_VERSION_BITS) | (version & ((1u << STRESS_VERSION_BITS) - 1));
}

static inline STRESS_HD uint64_t stress_word(uint64_t key, uint64_t i) {
  uint64_t x = key ^ (i * STRESS_INDEX_MUL);
  x ^= x >> 31;
  x *= STRESS_MIX_MUL;
  return x ^ (x >> 27);
}

/* The key that wrote `word` at index i, if it was written by stress_word at that index. */
static inline uint64_t stress_key_of(uint64_t word, uint64_t i) {
  uint64_t inv = STRESS_MIX_MUL; /* Newton's iteration: the inverse of an odd number mod 2^64 */
  for (int k = 0; k < 5; k++) inv *= 2 - STRESS_MIX_MUL * inv;
  uint64_t x = word ^ (word >> 27) ^ (word >> 54);
  x *= inv;
  x ^= (x >> 31) ^ (x >> 62);
  return x ^ (i * STRESS_INDEX_MUL);
}

#endif /* SPILLWAY_TESTS_STRESS_PATTERN_H */
