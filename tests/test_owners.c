/* SPDX-License-Identifier: Apache-2.0 */
/* Behaviour tests of owner tags (SPW_ALLOC_OWNER, spw_owner_name, spw_owner_stats,
 * spw_buf_owner), public API only: a buffer allocated for an owner counts for it, with its
 * bytes, until it is released (a locked buffer's free waits for its last lock), and moves
 * between tiers change neither its owner nor the counts; untagged buffers count for no
 * owner; the stats summary lists the owners with live buffers; names are copied, bounded
 * and replaceable; and every hostile argument is refused with SPW_ERR_INVALID_ARG (or the
 * handle's error) and changes nothing. The trace's side is in test_trace.c.
 *
 * Fixture: a runtime with room for 8 MiB on the device, a stream, and a spill directory. */
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "test_main.h"
#include "test_util.h"
#include "tmpdir.h"

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)

static char dir[256];
static spw_runtime_t *rt;
static spw_stream_t s;

static void before(void) {
  test_tmpdir(dir, sizeof dir, "owners");
  spw_config_t cfg = SPW_CONFIG_INIT;
  cfg.device_limit = 8 * MIB;
  cfg.host_device_bytes = 64 * MIB;
  cfg.spill_dir = dir;
  cfg.high_watermark = 1.0; /* no background spilling: the tests' moves are their own */
  cfg.low_watermark = 0.9;
  rt = test_runtime(&cfg);
  ASSERT_OK(spw_stream_create(rt, &s));
}

static void after(void) {
  if (rt) ASSERT_OK(spw_runtime_destroy(rt));
  rt = NULL;
  test_tmpdir_remove(dir);
}

/* Owner id's statistics; the call must succeed. */
static spw_owner_stats_t owner_of(unsigned id) {
  spw_owner_stats_t o;
  memset(&o, 0xAB, sizeof o); /* garbage: every field must be written */
  o.struct_size = sizeof o;
  ASSERT_OK(spw_owner_stats(rt, id, &o));
  ASSERT_UEQ(o.struct_size, sizeof o);
  return o;
}

static unsigned buf_owner(spw_buf_t b) {
  unsigned id = 12345;
  ASSERT_OK(spw_buf_owner(rt, b, &id));
  return id;
}

static void expect_counts(unsigned id, uint64_t buffers, uint64_t bytes, uint64_t allocs,
                          uint64_t alloc_bytes) {
  spw_owner_stats_t o = owner_of(id);
  ASSERT_UEQ(o.buffers, buffers);
  ASSERT_UEQ(o.bytes, bytes);
  ASSERT_UEQ(o.allocs, allocs);
  ASSERT_UEQ(o.alloc_bytes, alloc_bytes);
}

static void a_tagged_buffer_counts_for_its_owner_until_it_is_freed(void) {
  spw_buf_t a, b;
  ASSERT_OK(spw_alloc_ex(rt, 4 * KIB, s, SPW_ALLOC_OWNER(3), &a));
  ASSERT_OK(spw_alloc_ex(rt, 8 * KIB, s, SPW_ALLOC_OWNER(3), &b));
  expect_counts(3, 2, 12 * KIB, 2, 12 * KIB);
  ASSERT_OK(spw_free(rt, a));
  expect_counts(3, 1, 8 * KIB, 2, 12 * KIB); /* allocations since creation stay */
  ASSERT_OK(spw_free(rt, b));
  expect_counts(3, 0, 0, 2, 12 * KIB);
}

static void the_owner_of_a_buffer_is_its_tag_and_untagged_is_zero(void) {
  spw_buf_t none, zero, one, last, movable;
  ASSERT_OK(spw_alloc(rt, KIB, s, &none));
  ASSERT_OK(spw_alloc_ex(rt, KIB, s, SPW_ALLOC_OWNER(0), &zero));
  ASSERT_OK(spw_alloc_ex(rt, KIB, s, SPW_ALLOC_OWNER(1), &one));
  ASSERT_OK(spw_alloc_ex(rt, KIB, s, SPW_ALLOC_OWNER(SPW_OWNER_MAX), &last));
  ASSERT_OK(spw_alloc_ex(rt, KIB, s, SPW_ALLOC_MOVABLE | SPW_ALLOC_OWNER(77), &movable));
  ASSERT_EQ(buf_owner(none), 0);
  ASSERT_EQ(buf_owner(zero), 0);
  ASSERT_EQ(buf_owner(one), 1);
  ASSERT_EQ(buf_owner(last), SPW_OWNER_MAX);
  ASSERT_EQ(buf_owner(movable), 77);
  int stable = -1;
  ASSERT_OK(spw_buf_is_stable(rt, movable, &stable));
  ASSERT_EQ(stable, 0); /* the flags still mean what they meant */
}

static void untagged_buffers_count_for_no_owner(void) {
  spw_buf_t b[3];
  for (int i = 0; i < 3; i++) ASSERT_OK(spw_alloc(rt, 16 * KIB, s, &b[i]));
  for (unsigned id = 1; id <= SPW_OWNER_MAX; id++) expect_counts(id, 0, 0, 0, 0);
  ASSERT_UEQ(stats_of(rt).buffers, 3);
}

static void moves_between_tiers_keep_the_owner_and_the_counts(void) {
  spw_buf_t b = SPW_BUF_NULL;
  ASSERT_OK(spw_alloc_ex(rt, MIB, s, SPW_ALLOC_OWNER(9), &b));
  uint8_t *src = malloc(MIB);
  ASSERT_TRUE(src != NULL);
  test_fill(src, MIB, 9);
  test_write(rt, b, s, src, MIB);
  free(src);
  ASSERT_OK(spw_spill(rt, b, SPW_TIER_HOST));
  ASSERT_OK(spw_wait_idle(rt));
  ASSERT_EQ(state_of(rt, b), SPW_STATE_HOST);
  ASSERT_EQ(buf_owner(b), 9);
  expect_counts(9, 1, MIB, 1, MIB);
  ASSERT_OK(spw_spill(rt, b, SPW_TIER_DISK));
  ASSERT_OK(spw_wait_idle(rt));
  ASSERT_EQ(state_of(rt, b), SPW_STATE_DISK);
  ASSERT_EQ(buf_owner(b), 9);
  expect_counts(9, 1, MIB, 1, MIB);
  test_expect_fill(rt, b, s, MIB, 9); /* unspilled for the read: the data is intact */
  ASSERT_EQ(state_of(rt, b), SPW_STATE_RESIDENT);
  ASSERT_EQ(buf_owner(b), 9);
  expect_counts(9, 1, MIB, 1, MIB);
  ASSERT_OK(spw_free(rt, b));
  expect_counts(9, 0, 0, 1, MIB);
}

static void a_freed_buffer_still_locked_counts_until_its_last_lock_goes(void) {
  spw_buf_t b;
  void *d;
  ASSERT_OK(spw_alloc_ex(rt, 64 * KIB, s, SPW_ALLOC_OWNER(4), &b));
  ASSERT_OK(spw_acquire(rt, b, s, 0, &d));
  ASSERT_OK(spw_free(rt, b));
  ASSERT_STATUS(spw_buf_owner(rt, b, &(unsigned){0}), SPW_ERR_FREED); /* the handle is dead */
  expect_counts(4, 1, 64 * KIB, 1, 64 * KIB); /* its memory is not released yet */
  ASSERT_UEQ(stats_of(rt).buffers, 1);        /* as the runtime counts it */
  ASSERT_OK(spw_stream_synchronize(rt, s));   /* the last lock goes */
  expect_counts(4, 0, 0, 1, 64 * KIB);
  ASSERT_UEQ(stats_of(rt).buffers, 0);
}

static void a_refused_allocation_counts_for_nobody(void) {
  spw_buf_t b;
  ASSERT_STATUS(spw_alloc_ex(rt, 64 * MIB, s, SPW_ALLOC_OWNER(6), &b), SPW_ERR_OUT_OF_MEMORY);
  expect_counts(6, 0, 0, 0, 0);
}

static void owner_ids_past_the_maximum_and_unknown_bits_are_refused(void) {
  spw_buf_t b = SPW_BUF_NULL;
  ASSERT_STATUS(spw_alloc_ex(rt, KIB, s, SPW_ALLOC_OWNER(SPW_OWNER_MAX + 1), &b),
                SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw_alloc_ex(rt, KIB, s, SPW_ALLOC_OWNER(-1), &b), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw_alloc_ex(rt, KIB, s, SPW_ALLOC_OWNER(1) | 0x8u, &b), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw_alloc_ex(rt, KIB, s, SPW_ALLOC_OWNER(1) | 0x10000u, &b),
                SPW_ERR_INVALID_ARG);
  for (unsigned bit = 0; bit < 32; bit++) { /* every bit outside the flags and the owner */
    unsigned f = 1u << bit;
    if (f & (SPW_ALLOC_STABLE | SPW_ALLOC_MOVABLE | SPW_ALLOC_ARENA | SPW_ALLOC_OWNER_MASK))
      continue;
    ASSERT_STATUS(spw_alloc_ex(rt, KIB, s, f, &b), SPW_ERR_INVALID_ARG);
  }
  ASSERT_STATUS(spw_alloc_ex(rt, KIB, s, SPW_ALLOC_STABLE | SPW_ALLOC_MOVABLE | SPW_ALLOC_OWNER(2),
                             &b),
                SPW_ERR_INVALID_ARG);
  ASSERT_UEQ(b, SPW_BUF_NULL);
  ASSERT_UEQ(stats_of(rt).buffers, 0);
  for (unsigned id = 1; id <= SPW_OWNER_MAX; id++) expect_counts(id, 0, 0, 0, 0);
}

static void owner_stats_refuses_what_is_not_an_owner_or_a_struct(void) {
  spw_owner_stats_t o;
  memset(&o, 0, sizeof o);
  o.struct_size = sizeof o;
  ASSERT_STATUS(spw_owner_stats(NULL, 1, &o), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw_owner_stats(rt, 1, NULL), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw_owner_stats(rt, 0, &o), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw_owner_stats(rt, SPW_OWNER_MAX + 1, &o), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw_owner_stats(rt, 0xFFFFFFFFu, &o), SPW_ERR_INVALID_ARG);
  o.struct_size = 0;
  ASSERT_STATUS(spw_owner_stats(rt, 1, &o), SPW_ERR_INVALID_ARG);
  o.struct_size = sizeof(size_t) - 1;
  ASSERT_STATUS(spw_owner_stats(rt, 1, &o), SPW_ERR_INVALID_ARG);
  ASSERT_UEQ(o.struct_size, sizeof(size_t) - 1); /* a refused call writes nothing */
}

static void a_smaller_owner_stats_struct_gets_only_its_fields(void) {
  /* A caller built against a header whose struct ended before `name`. */
  spw_buf_t b;
  ASSERT_OK(spw_alloc_ex(rt, KIB, s, SPW_ALLOC_OWNER(5), &b));
  ASSERT_OK(spw_owner_name(rt, 5, "five"));
  spw_owner_stats_t o;
  memset(&o, 0x5A, sizeof o);
  o.struct_size = offsetof(spw_owner_stats_t, name);
  ASSERT_OK(spw_owner_stats(rt, 5, &o));
  ASSERT_UEQ(o.struct_size, offsetof(spw_owner_stats_t, name));
  ASSERT_UEQ(o.buffers, 1);
  ASSERT_UEQ(o.alloc_bytes, KIB);
  for (size_t i = 0; i < sizeof o.name; i++) ASSERT_EQ((unsigned char)o.name[i], 0x5A);
}

static void a_name_is_copied_and_a_new_one_replaces_it(void) {
  char name[16];
  snprintf(name, sizeof name, "torch");
  ASSERT_OK(spw_owner_name(rt, 3, name));
  snprintf(name, sizeof name, "garbage");
  ASSERT_TRUE(strcmp(owner_of(3).name, "torch") == 0);
  ASSERT_TRUE(strcmp(owner_of(4).name, "") == 0); /* never named */
  ASSERT_OK(spw_owner_name(rt, 3, "torch.cuda"));
  ASSERT_TRUE(strcmp(owner_of(3).name, "torch.cuda") == 0);
}

static void names_are_bounded_printable_and_refused_otherwise(void) {
  char longest[SPW_OWNER_NAME_MAX + 1], too_long[SPW_OWNER_NAME_MAX + 2];
  memset(longest, 'x', SPW_OWNER_NAME_MAX);
  longest[SPW_OWNER_NAME_MAX] = '\0';
  memset(too_long, 'y', SPW_OWNER_NAME_MAX + 1);
  too_long[SPW_OWNER_NAME_MAX + 1] = '\0';
  ASSERT_OK(spw_owner_name(rt, 2, longest));
  ASSERT_TRUE(strcmp(owner_of(2).name, longest) == 0);
  ASSERT_OK(spw_owner_name(rt, 1, "cuda.core (pool 0) #1"));
  const char *bad[] = {too_long, "", "quote\"d", "back\\slash", "new\nline", "tab\t",
                       "\x7f", "caf\xc3\xa9"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    ASSERT_STATUS(spw_owner_name(rt, 2, bad[i]), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw_owner_name(rt, 2, NULL), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw_owner_name(NULL, 2, "numba"), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw_owner_name(rt, 0, "numba"), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw_owner_name(rt, SPW_OWNER_MAX + 1, "numba"), SPW_ERR_INVALID_ARG);
  ASSERT_TRUE(strcmp(owner_of(2).name, longest) == 0); /* the refusals changed nothing */
}

static void buf_owner_refuses_what_is_not_a_live_buffer_of_this_runtime(void) {
  spw_buf_t b;
  unsigned id = 0;
  ASSERT_OK(spw_alloc_ex(rt, KIB, s, SPW_ALLOC_OWNER(8), &b));
  ASSERT_STATUS(spw_buf_owner(NULL, b, &id), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw_buf_owner(rt, b, NULL), SPW_ERR_INVALID_ARG);
  ASSERT_STATUS(spw_buf_owner(rt, SPW_BUF_NULL, &id), SPW_ERR_INVALID_HANDLE);
  spw_runtime_t *other = test_runtime(NULL);
  spw_buf_t ob;
  ASSERT_OK(spw_alloc_ex(other, KIB, NULL, SPW_ALLOC_OWNER(8), &ob));
  ASSERT_STATUS(spw_buf_owner(rt, ob, &id), SPW_ERR_INVALID_HANDLE);
  ASSERT_STATUS(spw_buf_owner(other, b, &id), SPW_ERR_INVALID_HANDLE);
  /* Owners are per runtime: the other one's buffer counts there only. */
  spw_owner_stats_t o = {.struct_size = sizeof o};
  ASSERT_OK(spw_owner_stats(other, 8, &o));
  ASSERT_UEQ(o.buffers, 1);
  expect_counts(8, 1, KIB, 1, KIB);
  ASSERT_OK(spw_free(other, ob));
  ASSERT_OK(spw_runtime_destroy(other));
  ASSERT_OK(spw_free(rt, b));
  ASSERT_STATUS(spw_buf_owner(rt, b, &id), SPW_ERR_FREED);
  ASSERT_EQ(id, 0); /* never written by a refusal */
}

static void the_summary_lists_the_owners_with_live_buffers(void) {
  spw_buf_t t1, t2, anon, gone;
  ASSERT_OK(spw_owner_name(rt, 3, "torch"));
  ASSERT_OK(spw_owner_name(rt, 9, "freed-already"));
  ASSERT_OK(spw_alloc_ex(rt, MIB, s, SPW_ALLOC_OWNER(3), &t1));
  ASSERT_OK(spw_alloc_ex(rt, MIB, s, SPW_ALLOC_OWNER(3), &t2));
  ASSERT_OK(spw_alloc_ex(rt, 4 * KIB, s, SPW_ALLOC_OWNER(7), &anon));
  ASSERT_OK(spw_alloc_ex(rt, 4 * KIB, s, SPW_ALLOC_OWNER(9), &gone));
  ASSERT_OK(spw_free(rt, gone));
  char text[1024];
  ASSERT_OK(spw_stats_summary(rt, text, sizeof text));
  ASSERT_TRUE(strstr(text, "; owners: torch 2 buffers 2.0 MiB, owner 7 1 buffer 4.0 KiB") != NULL);
  ASSERT_TRUE(strstr(text, "freed-already") == NULL);
  /* Cut short where it does not fit (here inside the owners' part), and still a string. */
  size_t cut = strlen(text) - 10;
  char *small = malloc(cut + 1);
  ASSERT_TRUE(small != NULL);
  ASSERT_OK(spw_stats_summary(rt, small, cut + 1));
  ASSERT_UEQ(strlen(small), cut);
  ASSERT_TRUE(strncmp(small, text, cut) == 0);
  free(small);
}

static void the_summary_has_no_owners_part_without_tagged_buffers(void) {
  spw_buf_t b;
  ASSERT_OK(spw_alloc(rt, MIB, s, &b));
  ASSERT_OK(spw_owner_name(rt, 3, "named-but-unused"));
  char text[1024];
  ASSERT_OK(spw_stats_summary(rt, text, sizeof text));
  ASSERT_TRUE(strstr(text, "owners") == NULL);
}

/* ---- many threads ---------------------------------------------------------------------- */
#define THREADS 4
#define ROUNDS 2000

static void *churn(void *arg) {
  unsigned id = (unsigned)(uintptr_t)arg;
  char name[32];
  for (int i = 0; i < ROUNDS; i++) {
    spw_buf_t b;
    ASSERT_OK(spw_alloc_ex(rt, 256 + (size_t)id, NULL, SPW_ALLOC_OWNER(id), &b));
    if (i % 100 == 0) { /* names change while others allocate, count and summarize */
      snprintf(name, sizeof name, "thread-%u-%d", id, i);
      ASSERT_OK(spw_owner_name(rt, id, name));
      char text[512];
      ASSERT_OK(spw_stats_summary(rt, text, sizeof text));
      spw_owner_stats_t o = {.struct_size = sizeof o};
      ASSERT_OK(spw_owner_stats(rt, id % THREADS + 1, &o));
    }
    ASSERT_EQ(buf_owner(b), id);
    ASSERT_OK(spw_free(rt, b));
  }
  return NULL;
}

static void counts_from_many_threads_add_up(void) {
  pthread_t t[THREADS];
  for (unsigned i = 0; i < THREADS; i++)
    ASSERT_EQ(pthread_create(&t[i], NULL, churn, (void *)(uintptr_t)(i + 1)), 0);
  for (unsigned i = 0; i < THREADS; i++) ASSERT_EQ(pthread_join(t[i], NULL), 0);
  for (unsigned id = 1; id <= THREADS; id++)
    expect_counts(id, 0, 0, ROUNDS, (uint64_t)ROUNDS * (256 + id));
}

static const spw_test_t tests[] = {
    TEST(a_tagged_buffer_counts_for_its_owner_until_it_is_freed),
    TEST(the_owner_of_a_buffer_is_its_tag_and_untagged_is_zero),
    TEST(untagged_buffers_count_for_no_owner),
    TEST(moves_between_tiers_keep_the_owner_and_the_counts),
    TEST(a_freed_buffer_still_locked_counts_until_its_last_lock_goes),
    TEST(a_refused_allocation_counts_for_nobody),
    TEST(owner_ids_past_the_maximum_and_unknown_bits_are_refused),
    TEST(owner_stats_refuses_what_is_not_an_owner_or_a_struct),
    TEST(a_smaller_owner_stats_struct_gets_only_its_fields),
    TEST(a_name_is_copied_and_a_new_one_replaces_it),
    TEST(names_are_bounded_printable_and_refused_otherwise),
    TEST(buf_owner_refuses_what_is_not_a_live_buffer_of_this_runtime),
    TEST(the_summary_lists_the_owners_with_live_buffers),
    TEST(the_summary_has_no_owners_part_without_tagged_buffers),
    TEST(counts_from_many_threads_add_up),
};

TEST_MAIN_FIXTURE(tests, before, after)
