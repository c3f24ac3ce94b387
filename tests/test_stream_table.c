/* SPDX-License-Identifier: Apache-2.0 */
/* Unit test of the stream table (src/core/stream_table.c) with synthetic stream values, so that
 * every value is distinct (real streams often come back at the same address): dead entries
 * are taken over by new streams, a dead stream is not found, and the table refuses a
 * stream only when it is full of live ones. */
#include <stdint.h>

#include "stream_table.h"
#include "test_main.h"
#include "test_util.h"

static spw_stream_t key(size_t i) { return (spw_stream_t)(uintptr_t)(0x10000 + i * 64); }

static void insert_live(spw_stream_table_t *t, size_t i) {
  spw_stream_entry_t *e = NULL;
  int existed = 1;
  ASSERT_OK(spw__streams_insert(t, key(i), key(i), 1, &e, &existed));
  ASSERT_EQ(existed, 0);
  ASSERT_PTR_EQ(spw__streams_find(t, key(i)), e);
}

static void more_distinct_streams_over_a_lifetime_than_the_table_holds(void) {
  spw_stream_table_t *t = malloc(sizeof *t);
  ASSERT_OK(spw__streams_init(t, NULL));
  for (size_t i = 0; i < 3 * SPW_STREAM_TABLE_CAP; i++) {
    insert_live(t, i);
    atomic_store(&spw__streams_find(t, key(i))->live, 0); /* unregistered */
    ASSERT_PTR_EQ(spw__streams_find(t, key(i)), NULL);
    if (i > 0) ASSERT_PTR_EQ(spw__streams_find(t, key(i - 1)), NULL);
  }
  spw__streams_destroy(t);
  free(t);
}

static void a_table_full_of_live_streams_refuses_one_more(void) {
  spw_stream_table_t *t = malloc(sizeof *t);
  ASSERT_OK(spw__streams_init(t, NULL));
  for (size_t i = 0; i < SPW_STREAM_TABLE_CAP; i++) insert_live(t, i);
  spw_stream_entry_t *e = NULL;
  int existed = 0;
  ASSERT_STATUS(spw__streams_insert(t, key(SPW_STREAM_TABLE_CAP), NULL, 1, &e, &existed),
                SPW_ERR_BUSY);
  for (size_t i = 0; i < SPW_STREAM_TABLE_CAP; i++)
    ASSERT_PTR_NE(spw__streams_find(t, key(i)), NULL); /* nothing lost */
  atomic_store(&spw__streams_find(t, key(7))->live, 0);
  insert_live(t, SPW_STREAM_TABLE_CAP); /* takes over the dead entry */
  ASSERT_PTR_EQ(spw__streams_find(t, key(7)), NULL);
  spw__streams_destroy(t);
  free(t);
}

static const spw_test_t tests[] = {
    TEST(more_distinct_streams_over_a_lifetime_than_the_table_holds),
    TEST(a_table_full_of_live_streams_refuses_one_more),
};
TEST_MAIN(tests)
