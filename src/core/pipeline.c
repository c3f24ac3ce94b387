/* SPDX-License-Identifier: Apache-2.0 */
/* The batch pipeline (see pipeline.h). */
#include "pipeline.h"

void spw__pipeline_run(const spw_pipeline_t *pl) {
  spw_part_t prev = {0};
  int have_prev = 0;
  for (size_t first = 0;;) {
    spw_part_t cur = {.first = first, .status = SPW_OK};
    pl->start(pl->ctx, &cur);
    if (cur.count == 0 && !have_prev) break; /* nothing left */
    if (have_prev) pl->finish(pl->ctx, &prev);
    have_prev = cur.count > 0;
    if (!have_prev) continue; /* room was the previous part's: try again now it is done */
    prev = cur;
    first += cur.count;
  }
  if (have_prev) pl->finish(pl->ctx, &prev);
}

void spw__part_copy(spw_runtime_t *rt, spw_part_t *p, const spw_copy_desc_t *d, size_t nd,
                    spw_copy_dir_t dir, spw_stream_t stream) {
  if (nd == 0) return;
  p->status = rt->ops->copy_batch_async(rt->be, d, nd, dir, stream);
  p->copied = p->status == SPW_OK;
  if (p->status == SPW_OK) p->status = spw__event_get(&rt->events, &p->ev);
  if (p->status == SPW_OK) p->status = rt->ops->event_record(rt->be, p->ev, stream);
}

int spw__part_wait(spw_runtime_t *rt, spw_part_t *p, spw_stream_t stream) {
  int st = p->status;
  if (p->ev) {
    if (st == SPW_OK) st = rt->ops->event_sync(rt->be, p->ev);
    spw__event_put(&rt->events, p->ev);
    p->ev = NULL;
  }
  /* A copy enqueued without a usable event may still run: let it finish first. */
  if (st != SPW_OK && p->copied) rt->ops->stream_sync(rt->be, stream);
  return st;
}
