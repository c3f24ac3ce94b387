/* SPDX-License-Identifier: Apache-2.0 */
/* Unit tests of the stable pool (spill/stable_pool.c) over the real host backend, whose
 * emulation of virtual memory management keeps the contract of backend.h: what the pool
 * promises the core, checked call by call without a runtime's timing in the way. Maps are
 * counted (a map of a mapped buffer keeps its memory, the matching unmap only lowers the
 * count), an unreserve that overtakes the last unmap leaves the range to that unmap, small
 * buffers share a page whose chunk goes with its last mapped block, a large buffer is one
 * chunk of its range's size, unmapped chunks are pooled by size up to the cap (the oldest
 * go first) and trimmed, a page whose last block left stays mapped until a trim or its
 * last owned block's free, whatever the cap, and the bytes survive an unmap and a map at the same
 * address only as far as the caller copies them (the pool reuses chunks). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <unistd.h>

#include "backend.h"
#include "stable_pool.h"
#include "test_main.h"
#include "test_util.h"

static spw_backend_t *be;
static spw_stable_t *sp;
static size_t gran;

static void open_pool(uint64_t pool_cap) {
  spw_backend_params_t p = {.device = 0, .host_device_bytes = (uint64_t)64 << 20};
  ASSERT_OK(spw__backend_host_ops.create(&p, &be));
  spw_stable_params_t sp_p = {&spw__backend_host_ops, be, pool_cap};
  ASSERT_OK(spw__stable_create(&sp_p, &sp));
  ASSERT_OK(spw__stable_granularity(sp, &gran));
}

static void before(void) { open_pool((uint64_t)1 << 20); }

static void after(void) {
  spw__stable_destroy(sp);
  sp = NULL;
  if (be) spw__backend_host_ops.destroy(be);
  be = NULL;
}

static uint64_t mapped(void) {
  uint64_t m = 0;
  spw__stable_usage(sp, &m, NULL, NULL);
  return m;
}
static uint64_t pooled(void) {
  uint64_t p = 0;
  spw__stable_usage(sp, NULL, &p, NULL);
  return p;
}
static uint64_t reserved(void) {
  uint64_t r = 0;
  spw__stable_usage(sp, NULL, NULL, &r);
  return r;
}

static void a_large_range_is_rounded_up_to_whole_granules(void) {
  void *va = NULL;
  ASSERT_OK(spw__stable_reserve(sp, 2 * gran + 1, &va));
  ASSERT_UEQ((uintptr_t)va % gran, 0);
  ASSERT_UEQ(reserved(), 3 * gran);
  ASSERT_UEQ(mapped(), 0);
  ASSERT_OK(spw__stable_map(sp, va));
  ASSERT_UEQ(mapped(), 3 * gran);
  memset(va, 0x11, 2 * gran + 1); /* the whole buffer is writable */
  ASSERT_OK(spw__stable_unmap(sp, va));
  spw__stable_unreserve(sp, va);
  ASSERT_UEQ(reserved(), 0);
}

static void a_second_map_keeps_the_memory_until_its_own_unmap(void) {
  void *va = NULL;
  ASSERT_OK(spw__stable_reserve(sp, gran, &va));
  ASSERT_OK(spw__stable_map(sp, va));
  memset(va, 0x5A, gran);
  /* An unspill maps again before the spill's unmap came: same memory, same bytes. */
  ASSERT_OK(spw__stable_map(sp, va));
  ASSERT_OK(spw__stable_unmap(sp, va)); /* the spill's, late */
  ASSERT_UEQ(mapped(), gran);
  ASSERT_EQ(((volatile uint8_t *)va)[gran - 1], 0x5A);
  ASSERT_OK(spw__stable_unmap(sp, va));
  ASSERT_UEQ(mapped(), 0);
  ASSERT_STATUS(spw__stable_unmap(sp, va), SPW_ERR_INTERNAL); /* one unmap per map */
  spw__stable_unreserve(sp, va);
}

static void an_unreserve_before_the_last_unmap_leaves_the_range_to_it(void) {
  void *va = NULL;
  ASSERT_OK(spw__stable_reserve(sp, gran, &va));
  ASSERT_OK(spw__stable_map(sp, va));
  spw__stable_unreserve(sp, va); /* a free that overtook a mover */
  ASSERT_UEQ(reserved(), gran);  /* still reserved: something is mapped there */
  ASSERT_TRUE(spw__stable_owns(sp, va));
  ASSERT_STATUS(spw__stable_map(sp, va), SPW_ERR_INTERNAL); /* dead: no new map */
  ASSERT_OK(spw__stable_unmap(sp, va));
  ASSERT_UEQ(reserved(), 0);
  ASSERT_TRUE(!spw__stable_owns(sp, va));
}

static void small_buffers_share_a_page_mapped_while_any_block_is(void) {
  void *a = NULL, *b = NULL;
  ASSERT_OK(spw__stable_reserve(sp, 1000, &a));
  ASSERT_OK(spw__stable_reserve(sp, 1024, &b));
  ASSERT_UEQ((uintptr_t)a / gran, (uintptr_t)b / gran);
  ASSERT_UEQ(reserved(), gran);
  ASSERT_OK(spw__stable_map(sp, a));
  ASSERT_OK(spw__stable_map(sp, b));
  ASSERT_UEQ(mapped(), gran);
  ASSERT_OK(spw__stable_unmap(sp, a));
  ASSERT_UEQ(mapped(), gran); /* b keeps the page */
  ASSERT_OK(spw__stable_unmap(sp, b));
  ASSERT_UEQ(mapped(), 0);
  spw__stable_unreserve(sp, a);
  ASSERT_UEQ(reserved(), gran); /* b still owns a block */
  spw__stable_unreserve(sp, b);
  ASSERT_UEQ(reserved(), 0);
}

static size_t device_free(void) {
  size_t f = 0;
  ASSERT_OK(spw__backend_host_ops.mem_info(be, &f, NULL));
  return f;
}

static void unmapped_chunks_are_pooled_by_size_up_to_the_cap_and_trimmed(void) {
  /* A cap of 4 granules; buffers of 2, 2 and 3 granules. */
  after();
  open_pool(4 * (uint64_t)(64 << 10));
  ASSERT_UEQ(gran, 64 << 10);
  void *a = NULL, *b = NULL, *c = NULL;
  ASSERT_OK(spw__stable_reserve(sp, 2 * gran, &a));
  ASSERT_OK(spw__stable_reserve(sp, 2 * gran, &b));
  ASSERT_OK(spw__stable_reserve(sp, 3 * gran, &c));
  const size_t empty = device_free();
  ASSERT_OK(spw__stable_map(sp, a));
  ASSERT_OK(spw__stable_unmap(sp, a));
  ASSERT_UEQ(pooled(), 2 * gran);
  ASSERT_UEQ(device_free(), empty - 2 * gran); /* pooled memory stays taken */
  /* A map of the same size takes the pooled chunk: no new memory. */
  ASSERT_OK(spw__stable_map(sp, b));
  ASSERT_UEQ(pooled(), 0);
  ASSERT_UEQ(device_free(), empty - 2 * gran);
  ASSERT_OK(spw__stable_unmap(sp, b));
  /* Another size makes its own chunk and leaves the pooled one. */
  ASSERT_OK(spw__stable_map(sp, c));
  ASSERT_UEQ(pooled(), 2 * gran);
  ASSERT_UEQ(device_free(), empty - 5 * gran);
  /* Pooling it passes the cap: the oldest pooled chunk goes back to the device. */
  ASSERT_OK(spw__stable_unmap(sp, c));
  ASSERT_UEQ(pooled(), 3 * gran);
  ASSERT_UEQ(device_free(), empty - 3 * gran);
  ASSERT_UEQ(spw__stable_trim(sp), 3 * gran);
  ASSERT_UEQ(pooled(), 0);
  ASSERT_UEQ(device_free(), empty);
  spw__stable_unreserve(sp, a);
  spw__stable_unreserve(sp, b);
  spw__stable_unreserve(sp, c);
}

static void a_chunk_larger_than_the_cap_goes_back_at_its_unmap(void) {
  after();
  open_pool(2 * (uint64_t)(64 << 10));
  void *va = NULL;
  ASSERT_OK(spw__stable_reserve(sp, 4 * gran, &va));
  const size_t empty = device_free();
  ASSERT_OK(spw__stable_map(sp, va));
  ASSERT_UEQ(device_free(), empty - 4 * gran);
  ASSERT_OK(spw__stable_unmap(sp, va));
  ASSERT_UEQ(pooled(), 0);
  ASSERT_UEQ(device_free(), empty);
  spw__stable_unreserve(sp, va);
}

static void a_large_buffer_is_one_chunk_of_its_range(void) {
  /* One mapping per buffer, not one per granule: what makes a map cost one cuMemSetAccess
   * (stable_pool.c). Seen through what an export hands out: one descriptor, the range's
   * size. */
  after();
  spw_backend_params_t p = {.device = 0, .host_device_bytes = (uint64_t)64 << 20,
                            .vm_shareable = 1};
  ASSERT_OK(spw__backend_host_ops.create(&p, &be));
  spw_stable_params_t sp_p = {&spw__backend_host_ops, be, (uint64_t)1 << 20};
  ASSERT_OK(spw__stable_create(&sp_p, &sp));
  ASSERT_OK(spw__stable_granularity(sp, &gran));
  void *va = NULL;
  ASSERT_OK(spw__stable_reserve(sp, 5 * gran + 7, &va));
  ASSERT_OK(spw__stable_map(sp, va));
  memset(va, 0x3C, 5 * gran + 7);
  int fd = -1;
  uint64_t fd_offset = 0;
  size_t chunk = 0, offset = 99;
  ASSERT_OK(spw__stable_share(sp, va, &fd, &fd_offset, &chunk, &offset));
  ASSERT_TRUE(fd >= 0);
  ASSERT_UEQ(chunk, 6 * gran);
  ASSERT_UEQ(offset, 0);
  close(fd);
  ASSERT_OK(spw__stable_unmap(sp, va));
  spw__stable_unreserve(sp, va);
}

static void a_page_whose_last_block_left_stays_mapped(void) {
  void *a = NULL, *b = NULL;
  ASSERT_OK(spw__stable_reserve(sp, 1000, &a));
  ASSERT_OK(spw__stable_reserve(sp, 1000, &b));
  const size_t empty = device_free();
  ASSERT_OK(spw__stable_map(sp, a));
  memset(a, 0x77, 1000);
  ASSERT_OK(spw__stable_unmap(sp, a));
  ASSERT_UEQ(mapped(), 0);
  ASSERT_UEQ(pooled(), gran); /* idle, counted with the pool */
  ASSERT_UEQ(device_free(), empty - gran);
  /* A block of it comes back without a new chunk, on the same memory. */
  ASSERT_OK(spw__stable_map(sp, b));
  ASSERT_UEQ(pooled(), 0);
  ASSERT_UEQ(mapped(), gran);
  ASSERT_UEQ(device_free(), empty - gran);
  ASSERT_EQ(((volatile uint8_t *)a)[999], 0x77);
  ASSERT_OK(spw__stable_unmap(sp, b));
  /* A trim gives it back to the device. */
  ASSERT_UEQ(spw__stable_trim(sp), gran);
  ASSERT_UEQ(pooled(), 0);
  ASSERT_UEQ(device_free(), empty);
  spw__stable_unreserve(sp, a);
  spw__stable_unreserve(sp, b);
  ASSERT_UEQ(reserved(), 0);
}

static void an_idle_page_stays_whatever_the_cap_until_a_trim(void) {
  /* A cap of 2 granules, filled by a large buffer's chunk: the idle page is kept beside it,
   * as the device pool keeps its slabs' free blocks, and only a trim gives it back. */
  after();
  open_pool(2 * (uint64_t)(64 << 10));
  void *small = NULL, *large = NULL;
  ASSERT_OK(spw__stable_reserve(sp, 1000, &small));
  ASSERT_OK(spw__stable_reserve(sp, 2 * gran, &large));
  const size_t empty = device_free();
  ASSERT_OK(spw__stable_map(sp, small));
  ASSERT_OK(spw__stable_map(sp, large));
  ASSERT_OK(spw__stable_unmap(sp, small));
  ASSERT_OK(spw__stable_unmap(sp, large));
  ASSERT_UEQ(pooled(), 3 * gran);
  ASSERT_UEQ(device_free(), empty - 3 * gran);
  ASSERT_UEQ(spw__stable_trim(sp), 3 * gran);
  ASSERT_UEQ(pooled(), 0);
  ASSERT_UEQ(device_free(), empty);
  /* The page comes back on its next map, with a new chunk. */
  ASSERT_OK(spw__stable_map(sp, small));
  ASSERT_UEQ(mapped(), gran);
  ASSERT_UEQ(device_free(), empty - gran);
  ASSERT_OK(spw__stable_unmap(sp, small));
  spw__stable_unreserve(sp, small);
  spw__stable_unreserve(sp, large);
  ASSERT_UEQ(device_free(), empty);
}

static void an_idle_page_goes_with_its_last_owned_block(void) {
  void *a = NULL;
  ASSERT_OK(spw__stable_reserve(sp, 1000, &a));
  const size_t empty = device_free();
  ASSERT_OK(spw__stable_map(sp, a));
  ASSERT_OK(spw__stable_unmap(sp, a));
  ASSERT_UEQ(pooled(), gran);
  spw__stable_unreserve(sp, a); /* the page's last block: range and chunk go */
  ASSERT_UEQ(reserved(), 0);
  ASSERT_UEQ(pooled(), 0);
  ASSERT_UEQ(device_free(), empty);
}

static void a_chunk_the_device_refuses_maps_nothing(void) {
  /* 64 MiB of emulated device: a range of 65 MiB cannot be mapped. */
  void *va = NULL;
  ASSERT_OK(spw__stable_reserve(sp, (size_t)65 << 20, &va));
  ASSERT_STATUS(spw__stable_map(sp, va), SPW_ERR_OUT_OF_MEMORY);
  ASSERT_UEQ(mapped(), 0);
  size_t free_bytes = 0;
  ASSERT_OK(spw__backend_host_ops.mem_info(be, &free_bytes, NULL));
  ASSERT_UEQ(free_bytes + pooled(), (size_t)64 << 20); /* what was taken is back or pooled */
  spw__stable_unreserve(sp, va);
  ASSERT_UEQ(reserved(), 0);
}

static void addresses_that_are_no_buffer_are_refused(void) {
  void *a = NULL;
  ASSERT_OK(spw__stable_reserve(sp, 1000, &a));
  ASSERT_STATUS(spw__stable_map(sp, (uint8_t *)a + 8), SPW_ERR_INTERNAL);
  int local = 0;
  ASSERT_STATUS(spw__stable_map(sp, &local), SPW_ERR_INTERNAL);
  ASSERT_TRUE(!spw__stable_owns(sp, &local));
  ASSERT_STATUS(spw__stable_unmap(sp, a), SPW_ERR_INTERNAL); /* never mapped */
  spw__stable_unreserve(sp, a);
}

static const spw_test_t tests[] = {
    {"a_large_range_is_rounded_up_to_whole_granules", a_large_range_is_rounded_up_to_whole_granules},
    {"a_second_map_keeps_the_memory_until_its_own_unmap",
     a_second_map_keeps_the_memory_until_its_own_unmap},
    {"an_unreserve_before_the_last_unmap_leaves_the_range_to_it",
     an_unreserve_before_the_last_unmap_leaves_the_range_to_it},
    {"small_buffers_share_a_page_mapped_while_any_block_is",
     small_buffers_share_a_page_mapped_while_any_block_is},
    {"unmapped_chunks_are_pooled_by_size_up_to_the_cap_and_trimmed",
     unmapped_chunks_are_pooled_by_size_up_to_the_cap_and_trimmed},
    {"a_chunk_larger_than_the_cap_goes_back_at_its_unmap",
     a_chunk_larger_than_the_cap_goes_back_at_its_unmap},
    {"a_large_buffer_is_one_chunk_of_its_range", a_large_buffer_is_one_chunk_of_its_range},
    {"a_page_whose_last_block_left_stays_mapped", a_page_whose_last_block_left_stays_mapped},
    {"an_idle_page_stays_whatever_the_cap_until_a_trim",
     an_idle_page_stays_whatever_the_cap_until_a_trim},
    {"an_idle_page_goes_with_its_last_owned_block", an_idle_page_goes_with_its_last_owned_block},
    {"a_chunk_the_device_refuses_maps_nothing", a_chunk_the_device_refuses_maps_nothing},
    {"addresses_that_are_no_buffer_are_refused", addresses_that_are_no_buffer_are_refused},
};

TEST_MAIN_FIXTURE(tests, before, after)
