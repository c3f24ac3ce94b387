/* SPDX-License-Identifier: Apache-2.0 */
/* The completion poller (see completions.h). Pending items form a FIFO list; the poller
 * queries every pending event each round and sleeps between rounds with a backoff from 20 us
 * to 1 ms while nothing completes: cheap when idle, prompt when busy, and immune to one long
 * stream holding back a short one (a blocking wait on the oldest event would be). */
#include "completions.h"

#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"

typedef struct spw_completion_item {
  spw_bevent_t *ev;
  int owned;         /* ev is ours (from the pool), recorded on `stream` */
  int on_stream;     /* ev was recorded on `stream` (owned, or a cell's borrowed event) */
  spw_stream_t stream;
  spw_completion_fn fn;
  void *arg;
  uint64_t seq;
  spw_completion_cell_t *cell; /* while open: the cell that points here (under mu) */
  struct spw_completion_item *next;
  max_align_t data[]; /* spw__completions_after_event_with: fn's argument, in the item */
} item_t;

struct spw_completions {
  const spw_backend_ops_t *ops;
  spw_backend_t *be;
  spw_event_pool_t *events;
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv;      /* poller: work arrived or stop */
  pthread_cond_t done_cv; /* drainers: an item finished */
  item_t *head, *tail;
  uint64_t submitted; /* items are numbered in submission order */
  int busy;           /* the poller holds a detached list (outside `head`) */
  int drainers;       /* threads in spw__completions_drain_for */
  int stop;
};

/* Closes an item to new work (mu held): from now on its event is never recorded again, so
 * a query that finds it complete covers everything its function will release. */
static void seal(item_t *it) {
  if (it->cell && it->cell->open == it) it->cell->open = NULL;
  it->cell = NULL;
}

/* Runs a finished item and gives its event back. */
static void finish(spw_completions_t *c, item_t *it, int status) {
  it->fn(it->arg, status);
  if (it->owned) spw__event_put(c->events, it->ev);
  free(it);
}

/* `cell`: the new item becomes its open item (may be NULL). */
static void enqueue(spw_completions_t *c, item_t *it, spw_completion_cell_t *cell) {
  it->next = NULL;
  it->cell = NULL;
  pthread_mutex_lock(&c->mu);
  it->seq = ++c->submitted;
  if (cell) {
    /* Another thread's item may be open there (two started at once): it stays pending,
     * only closed to new work. */
    if (cell->open) seal(cell->open);
    cell->open = it;
    it->cell = cell;
  }
  if (c->tail) c->tail->next = it;
  else c->head = it;
  c->tail = it;
  pthread_cond_signal(&c->cv);
  pthread_mutex_unlock(&c->mu);
}

static void *poller(void *arg) {
  spw_completions_t *c = arg;
  long sleep_ns = 20000;
  pthread_mutex_lock(&c->mu);
  for (;;) {
    while (!c->head && !c->stop) pthread_cond_wait(&c->cv, &c->mu);
    if (!c->head && c->stop) break;
    /* Detach the list so that the events are queried without the lock; sealed first, so
     * that nothing joins an item between its query and its function. */
    item_t *list = c->head;
    c->head = c->tail = NULL;
    for (item_t *it = list; it; it = it->next) seal(it);
    c->busy = 1;
    pthread_mutex_unlock(&c->mu);

    item_t *keep = NULL, *keep_last = NULL;
    uint64_t ran = 0;
    for (item_t *it = list, *next; it; it = next) {
      next = it->next;
      int q = c->ops->event_query(c->be, it->ev);
      if (q == SPW_ERR_NOT_READY) {
        it->next = NULL;
        if (keep_last) keep_last->next = it;
        else keep = it;
        keep_last = it;
        continue;
      }
      /* A failed query still runs fn: the locks it releases must not leak, and the stream
       * error reaches the application through its own synchronize. */
      finish(c, it, q);
      ran++;
    }

    pthread_mutex_lock(&c->mu);
    if (keep) { /* pending items go back in front of what arrived meanwhile */
      keep_last->next = c->head;
      if (!c->head) c->tail = keep_last;
      c->head = keep;
    }
    c->busy = 0;
    pthread_cond_broadcast(&c->done_cv);
    if (!c->head) {
      sleep_ns = 20000;
      continue;
    }
    /* Items are left and some just finished: work is flowing. Unless someone waits for
     * them, pause one short step before the next round, so that a launching thread's
     * releases join the open item instead of each making its own, and the queries leave
     * the driver to the threads that launch. */
    if (ran) {
      sleep_ns = 20000;
      if (c->drainers) continue;
    }
    pthread_mutex_unlock(&c->mu);
    struct timespec ts = {0, sleep_ns};
    nanosleep(&ts, NULL);
    if (sleep_ns < 1000000) sleep_ns *= 2;
    pthread_mutex_lock(&c->mu);
  }
  pthread_mutex_unlock(&c->mu);
  return NULL;
}

int spw__completions_start(const spw_backend_ops_t *ops, spw_backend_t *be,
                           spw_event_pool_t *events, spw_completions_t **out) {
  spw_completions_t *c = calloc(1, sizeof *c);
  if (!c) return SPW_ERR_SYSTEM;
  c->ops = ops;
  c->be = be;
  c->events = events;
  pthread_mutex_init(&c->mu, NULL);
  pthread_cond_init(&c->cv, NULL);
  pthread_cond_init(&c->done_cv, NULL);
  if (pthread_create(&c->thread, NULL, poller, c) != 0) {
    pthread_cond_destroy(&c->done_cv);
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    free(c);
    return SPW_ERR_SYSTEM;
  }
  *out = c;
  return SPW_OK;
}

void spw__completions_stop(spw_completions_t *c) {
  if (!c) return;
  pthread_mutex_lock(&c->mu);
  c->stop = 1;
  pthread_cond_signal(&c->cv);
  pthread_mutex_unlock(&c->mu);
  pthread_join(c->thread, NULL);
  pthread_cond_destroy(&c->done_cv);
  pthread_cond_destroy(&c->cv);
  pthread_mutex_destroy(&c->mu);
  free(c);
}

static int after(spw_completions_t *c, spw_stream_t bstream, spw_completion_cell_t *cell,
                 int or_now, spw_completion_fn fn, void *arg) {
  item_t *it = malloc(sizeof *it);
  if (!it) return SPW_ERR_SYSTEM;
  int s = spw__event_get(c->events, &it->ev);
  if (s != SPW_OK) {
    free(it);
    return s;
  }
  s = c->ops->event_record(c->be, it->ev, bstream);
  int done = s == SPW_OK && or_now && c->ops->event_query(c->be, it->ev) == SPW_OK;
  if (s != SPW_OK || done) {
    spw__event_put(c->events, it->ev);
    free(it);
    if (done) fn(arg, SPW_OK);
    return s;
  }
  it->owned = 1;
  it->on_stream = 1;
  it->fn = fn;
  it->arg = arg;
  it->stream = bstream;
  enqueue(c, it, cell);
  return SPW_OK;
}

int spw__completions_after(spw_completions_t *c, spw_stream_t bstream, spw_completion_fn fn,
                           void *arg) {
  return after(c, bstream, NULL, 0, fn, arg);
}

int spw__completions_after_or_now(spw_completions_t *c, spw_stream_t bstream,
                                  spw_completion_fn fn, void *arg) {
  return after(c, bstream, NULL, 1, fn, arg);
}

int spw__completions_after_open(spw_completions_t *c, spw_stream_t bstream,
                                spw_completion_cell_t *cell, int or_now, spw_completion_fn fn,
                                void *arg) {
  return after(c, bstream, cell, or_now, fn, arg);
}

int spw__completions_join(spw_completions_t *c, spw_stream_t bstream, spw_completion_cell_t *cell,
                          spw_completion_join_fn join, const void *add) {
  pthread_mutex_lock(&c->mu);
  item_t *it = cell->open;
  int st = SPW_ERR_NOT_READY;
  /* Only an item of this very stream: a cell outlives its stream's incarnation. */
  if (it && it->owned && it->stream == bstream) {
    /* The record first: if it fails, nothing was joined and the item is as it was. */
    st = c->ops->event_record(c->be, it->ev, bstream);
    if (st == SPW_OK) st = join(it->arg, add);
  }
  pthread_mutex_unlock(&c->mu);
  return st;
}

int spw__completions_join_event(spw_completions_t *c, spw_stream_t bstream,
                                spw_completion_cell_t *cell, spw_bevent_t *ev,
                                spw_completion_join_fn join, const void *add) {
  pthread_mutex_lock(&c->mu);
  item_t *it = cell->open;
  int st = SPW_ERR_NOT_READY;
  if (it && it->on_stream && !it->owned && it->stream == bstream) {
    st = join(it->arg, add);
    if (st == SPW_OK) it->ev = ev;
  }
  pthread_mutex_unlock(&c->mu);
  return st;
}

int spw__completions_after_event_open(spw_completions_t *c, spw_stream_t bstream,
                                      spw_completion_cell_t *cell, spw_bevent_t *ev,
                                      spw_completion_fn fn, void *arg) {
  item_t *it = malloc(sizeof *it);
  if (!it) return SPW_ERR_SYSTEM;
  *it = (item_t){.ev = ev, .on_stream = 1, .stream = bstream, .fn = fn, .arg = arg};
  enqueue(c, it, cell);
  return SPW_OK;
}

int spw__completions_after_event(spw_completions_t *c, spw_bevent_t *ev, spw_completion_fn fn,
                                 void *arg) {
  item_t *it = malloc(sizeof *it);
  if (!it) return SPW_ERR_SYSTEM;
  *it = (item_t){.ev = ev, .owned = 0, .fn = fn, .arg = arg};
  enqueue(c, it, NULL);
  return SPW_OK;
}

int spw__completions_after_event_with(spw_completions_t *c, spw_bevent_t *ev, spw_completion_fn fn,
                                      const void *data, size_t size) {
  item_t *it = malloc(sizeof *it + size);
  if (!it) return SPW_ERR_SYSTEM;
  *it = (item_t){.ev = ev, .owned = 0, .fn = fn, .arg = it->data};
  memcpy(it->data, data, size);
  enqueue(c, it, NULL);
  return SPW_OK;
}

void spw__completions_drain(spw_completions_t *c) { spw__completions_drain_for(c, UINT64_MAX); }

int spw__completions_drain_for(spw_completions_t *c, uint64_t timeout_ns) {
  if (!c) return 1;
  struct timespec deadline = spw__deadline_in(timeout_ns == UINT64_MAX ? 0 : timeout_ns);
  int drained = 1;
  pthread_mutex_lock(&c->mu);
  /* Items finish out of order: everything submitted so far has run once none of them is in
   * the list and the poller holds no detached list. */
  uint64_t target = c->submitted;
  c->drainers++;
  for (;;) {
    int older_pending = c->busy;
    for (item_t *it = c->head; it && !older_pending; it = it->next)
      if (it->seq <= target) older_pending = 1;
    if (!older_pending) break;
    if (timeout_ns == UINT64_MAX) {
      pthread_cond_wait(&c->done_cv, &c->mu);
    } else if (pthread_cond_timedwait(&c->done_cv, &c->mu, &deadline) != 0) {
      drained = 0;
      break;
    }
  }
  c->drainers--;
  pthread_mutex_unlock(&c->mu);
  return drained;
}

uint64_t spw__completions_mark(spw_completions_t *c, spw_completion_cell_t *cells, size_t n) {
  pthread_mutex_lock(&c->mu);
  for (size_t i = 0; i < n; i++)
    if (cells[i].open) seal(cells[i].open);
  uint64_t m = c->submitted;
  pthread_mutex_unlock(&c->mu);
  return m;
}

void spw__completions_flush_stream(spw_completions_t *c, spw_stream_t bstream, uint64_t mark) {
  if (!c) return;
  item_t *mine = NULL;
  pthread_mutex_lock(&c->mu);
  /* Items the poller has detached are run by it; wait for that round to end, then take this
   * stream's items out of the list. */
  while (c->busy) pthread_cond_wait(&c->done_cv, &c->mu);
  item_t **link = &c->head, *last = NULL;
  while (*link) {
    item_t *it = *link;
    if (it->on_stream && it->stream == bstream && it->seq <= mark) {
      seal(it);
      *link = it->next;
      it->next = mine;
      mine = it;
    } else {
      last = it;
      link = &it->next;
    }
  }
  c->tail = last;
  pthread_mutex_unlock(&c->mu);
  /* The stream was synchronized after these events were recorded: they are complete. */
  while (mine) {
    item_t *n = mine->next;
    finish(c, mine, SPW_OK);
    mine = n;
  }
  pthread_mutex_lock(&c->mu);
  pthread_cond_broadcast(&c->done_cv);
  pthread_mutex_unlock(&c->mu);
}
