/* SPDX-License-Identifier: Apache-2.0 */
/* The peer tier (see peer.h): lending, taking back, and the move that empties lent memory
 * (a buffer's copy from the peer to host memory, or to disk when host memory is full).
 *
 * Taking back is the one place where one runtime works on another's buffers: the lender
 * (holding its lend_mu) closes the link under the borrower's peer_rw, so no new spill
 * lands there, then moves every buffer still in it with the borrower's own moves, and
 * frees the memory only once the borrower's arena over it is empty (spills that had their
 * extent before the close commit there first, and are moved on by the next pass). */
#include "peer.h"

#include <stdlib.h>

#include "clock.h"
#include "host_extent.h"
#include "moves.h"

/* Lent memory is placed on this boundary, as host extents are (O_DIRECT-sized). */
#define PEER_ALIGN ((uintptr_t)SPW_ARENA_ALIGN)
/* How long taking back waits for moves in flight (spills that got an extent before the
 * close, unspills still reading one) before it gives up with SPW_ERR_BUSY. */
#define TAKE_BACK_WAIT_NS 60000000000ull
/* One wait of the loop above: deferred extent frees land through the completion poller. */
#define TAKE_BACK_ROUND_NS 2000000ull

int spw__peer_init(spw_runtime_t *rt) {
  if (pthread_rwlock_init(&rt->peer_rw, NULL) != 0) return SPW_ERR_SYSTEM;
  if (pthread_mutex_init(&rt->lend_mu, NULL) != 0) {
    pthread_rwlock_destroy(&rt->peer_rw);
    return SPW_ERR_SYSTEM;
  }
  return SPW_OK;
}

void spw__peer_fini(spw_runtime_t *rt) {
  pthread_mutex_destroy(&rt->lend_mu);
  pthread_rwlock_destroy(&rt->peer_rw);
}

uint64_t spw__peer_limit(spw_runtime_t *rt) {
  pthread_rwlock_rdlock(&rt->peer_rw);
  uint64_t n = rt->peer && !rt->peer->closing ? rt->peer->bytes : 0;
  pthread_rwlock_unlock(&rt->peer_rw);
  return n;
}

size_t spw__peer_alloc_n(spw_runtime_t *rt, const size_t *bytes, size_t n, spw_host_extent_t *out) {
  if (!atomic_load_explicit(&rt->peer_on, memory_order_acquire)) return 0;
  size_t got = 0;
  pthread_rwlock_rdlock(&rt->peer_rw);
  if (rt->peer && !rt->peer->closing) got = spw__arena_alloc_n(rt->peer->arena, bytes, n, out, NULL);
  pthread_rwlock_unlock(&rt->peer_rw);
  return got;
}

void spw__peer_free(spw_runtime_t *rt, spw_host_extent_t *e) {
  pthread_rwlock_rdlock(&rt->peer_rw);
  /* Extents go back before their link does (take_back waits for an empty arena). */
  if (rt->peer) spw__arena_free(rt->peer->arena, e);
  pthread_rwlock_unlock(&rt->peer_rw);
}

/* ---- the move out of lent memory ------------------------------------------------------ */

/* Moves h's copy out of lent memory: to a host extent (copied by the borrower's device over
 * the peer link), or, when host memory is full, to disk through the device staging path.
 * SPW_OK also when h is not there (any more). */
static int move_on(spw_runtime_t *rt, spw_buf_t h) {
  spw_slot_t *s;
  uint64_t w;
  int st = spw__handles_lookup(&rt->handles, h, &s, &w);
  if (st != SPW_OK) return SPW_OK; /* freed meanwhile */
  spw_move_t m;
  if (!spw__move_begin(rt, SPW_MOVE_RETURN, h, s, SPW_CLAIM_WAIT, &m)) return SPW_OK;
  if (!m.from.host.peer) {
    spw__move_abort(rt, &m, 0);
    return SPW_OK;
  }
  uint64_t t0 = spw__now_ns();
  spw_host_extent_t he = {0};
  st = spw__host_extent_alloc_host(rt, m.size, &he);
  if (st == SPW_OK) {
    spw_stream_t d2h = spw__d2h(rt);
    st = rt->ops->memcpy_async(rt->be, he.ptr, m.from.host.ptr, m.size, d2h);
    int sync = rt->ops->stream_sync(rt->be, d2h); /* also when the enqueue failed: nothing reads `he` after */
    if (st == SPW_OK) st = sync;
  }
  uint64_t dt = spw__now_ns() - t0;
  if (st != SPW_OK) {
    spw__host_extent_free(rt, &he);
    spw__move_abort(rt, &m, 0);
    int open_st;
    if (st != SPW_ERR_HOST_OUT_OF_MEMORY || !spw__disk(rt, &open_st)) {
      spw__report_move(rt, h, m.owner, SPW_STATE_PEER, SPW_STATE_PEER, 0, dt, st);
      return st;
    }
    /* Host memory is full: to disk, straight from the peer through device staging. */
    st = spw__demote(rt, h, SPW_CLAIM_WAIT, 1);
    if (st == SPW_OK) {
      atomic_fetch_add(&rt->c.peer_returns, 1);
      atomic_fetch_add(&rt->c.peer_return_bytes, m.size);
    }
    return st == SPW_ERR_BUSY || st == SPW_ERR_FREED ? SPW_OK : st;
  }
  spw_place_t to = {.host = he}, release;
  spw_move_end_t end = spw__move_commit(rt, &m, &to, 0, 0, &release);
  /* WAIT on a HOST buffer: a landing copy may still read the old extent. */
  spw__place_release(rt, &release, m.size, (m.flags & SPW_W_WAIT) ? s->ready : NULL);
  if (end != SPW_MOVE_DONE) return SPW_OK; /* freed meanwhile: released with the slot */
  atomic_fetch_add(&rt->c.peer_returns, 1);
  atomic_fetch_add(&rt->c.peer_return_bytes, m.size);
  spw__report_move(rt, h, m.owner, SPW_STATE_PEER, SPW_STATE_HOST, m.size, dt, SPW_OK);
  return SPW_OK;
}

/* One pass over the borrower's HOST buffers, moving on those in lent memory. Returns the
 * first failure, else SPW_OK. */
static int move_all_on(spw_runtime_t *rt) {
  int first = SPW_OK;
  uint32_t n = atomic_load(&rt->handles.nslots);
  for (uint32_t i = 0; i < n; i++) {
    spw_slot_t *s = spw__handles_slot_at(&rt->handles, i);
    uint64_t w = atomic_load_explicit(&s->word, memory_order_acquire);
    if (spw__w_state(w) != SPW_STATE_HOST) continue;
    int st = move_on(rt, spw__handle_make(&rt->handles, spw__w_gen(w), i));
    if (st != SPW_OK && first == SPW_OK) first = st;
  }
  return first;
}

static uint64_t arena_in_use(spw_host_arena_t *a) {
  spw_arena_stats_t as;
  spw__arena_get_stats(a, &as);
  return as.in_use;
}

static void set_closing(spw_peer_link_t *l, int closing) {
  spw_runtime_t *b = l->borrower;
  pthread_rwlock_wrlock(&b->peer_rw);
  l->closing = closing;
  pthread_rwlock_unlock(&b->peer_rw);
}

/* Takes l off its lender's list (lend_mu held). */
static void unlist(spw_peer_link_t *l) {
  for (spw_peer_link_t **p = &l->lender->lent; *p; p = &(*p)->next)
    if (*p == l) {
      *p = l->next;
      return;
    }
}

/* Empties link l and gives its memory back. Called with the lender's lend_mu held. On a
 * failure the link stays, open again, with whatever could not move still in it. */
static int take_back(spw_peer_link_t *l) {
  spw_runtime_t *b = l->borrower;
  set_closing(l, 1);
  uint64_t start = spw__now_ns();
  int st = SPW_OK;
  while (arena_in_use(l->arena) > 0) {
    st = move_all_on(b);
    if (st != SPW_OK) break;
    if (b->completions) spw__completions_drain_for(b->completions, TAKE_BACK_ROUND_NS);
    if (arena_in_use(l->arena) > 0 && spw__now_ns() - start > TAKE_BACK_WAIT_NS) {
      st = spw__set_error(b, SPW_ERR_BUSY, "lent peer memory still holds %llu bytes after %llu s",
                          (unsigned long long)arena_in_use(l->arena),
                          (unsigned long long)(TAKE_BACK_WAIT_NS / 1000000000ull));
      break;
    }
  }
  if (st != SPW_OK) {
    set_closing(l, 0);
    return st;
  }
  unlist(l);
  spw__peer_give_back_end(b);
  return SPW_OK;
}

/* ---- lending and taking back ------------------------------------------------------------ */

/* Whether `a` lends to `b`, directly or through borrowers that lend on: lending from b to a
 * then would close a cycle, in which one's taking back waits on the other's. */
static int lends_to(spw_runtime_t *a, spw_runtime_t *b) {
  for (int hops = 0; b && hops < 64; hops++) {
    pthread_rwlock_rdlock(&b->peer_rw);
    spw_runtime_t *up = b->peer ? b->peer->lender : NULL;
    pthread_rwlock_unlock(&b->peer_rw);
    if (up == a) return 1;
    b = up;
  }
  return 0;
}

int spw__peer_lend(spw_runtime_t *lender, spw_runtime_t *borrower, uint64_t bytes) {
  int st = borrower->ops->peer_access(borrower->be, lender->settings.device);
  if (st == SPW_ERR_UNSUPPORTED)
    return spw__set_error(borrower, st, "device %d cannot access device %d's memory (no peer "
                          "access): spills keep going to host memory",
                          borrower->settings.device, lender->settings.device);
  if (st != SPW_OK) return st;
  /* The lender's room first, before lend_mu: making it may spill the lender's buffers or
   * take back what it lent to others, which takes lend_mu. It comes back on failure. */
  st = spw__budget_reserve(lender, bytes, 0);
  if (st != SPW_OK) return st;
  pthread_mutex_lock(&lender->lend_mu);
  pthread_rwlock_rdlock(&borrower->peer_rw);
  int busy = borrower->peer != NULL;
  pthread_rwlock_unlock(&borrower->peer_rw);
  busy = busy || lends_to(borrower, lender);
  if (busy) {
    pthread_mutex_unlock(&lender->lend_mu);
    spw__budget_credit(lender, bytes);
    return spw__set_error(borrower, SPW_ERR_BUSY, "the borrower already has a peer tier, or "
                          "lends to this lender (directly or through others)");
  }
  spw_host_arena_t *arena = NULL;
  void *mem = NULL;
  spw_peer_link_t *l = calloc(1, sizeof *l);
  st = l ? lender->ops->peer_alloc(lender->be, (size_t)bytes + PEER_ALIGN, &mem) : SPW_ERR_SYSTEM;
  if (st == SPW_OK) {
    void *base = (void *)(((uintptr_t)mem + PEER_ALIGN - 1) & ~(PEER_ALIGN - 1));
    st = spw__arena_create_borrowed(base, (size_t)bytes, &arena);
  }
  if (st != SPW_OK) {
    if (mem) (void)lender->ops->peer_free(lender->be, mem);
    free(l);
    pthread_mutex_unlock(&lender->lend_mu);
    spw__budget_credit(lender, bytes);
    return st;
  }
  *l = (spw_peer_link_t){.lender = lender, .borrower = borrower, .base = mem, .bytes = bytes,
                         .arena = arena, .next = lender->lent};
  lender->lent = l;
  atomic_fetch_add(&lender->lent_bytes, bytes);
  pthread_rwlock_wrlock(&borrower->peer_rw);
  borrower->peer = l;
  atomic_store_explicit(&borrower->peer_on, 1, memory_order_release);
  pthread_rwlock_unlock(&borrower->peer_rw);
  pthread_mutex_unlock(&lender->lend_mu);
  return SPW_OK;
}

int spw__peer_reclaim(spw_runtime_t *lender, spw_runtime_t *borrower) {
  pthread_mutex_lock(&lender->lend_mu);
  spw_peer_link_t *l = lender->lent;
  while (l && l->borrower != borrower) l = l->next;
  int st = l ? take_back(l)
             : spw__set_error(lender, SPW_ERR_INVALID_ARG, "nothing is lent to that runtime");
  pthread_mutex_unlock(&lender->lend_mu);
  return st;
}

uint64_t spw__peer_take_back(spw_runtime_t *lender) {
  uint64_t back = 0;
  pthread_mutex_lock(&lender->lend_mu);
  for (spw_peer_link_t *l = lender->lent, *next; l; l = next) {
    next = l->next;
    uint64_t bytes = l->bytes;
    if (take_back(l) == SPW_OK) back += bytes;
  }
  pthread_mutex_unlock(&lender->lend_mu);
  return back;
}

int spw__peer_take_back_all(spw_runtime_t *rt) {
  pthread_mutex_lock(&rt->lend_mu);
  int st = SPW_OK;
  while (st == SPW_OK && rt->lent) st = take_back(rt->lent);
  pthread_mutex_unlock(&rt->lend_mu);
  return st;
}

static spw_peer_link_t *peer_of(spw_runtime_t *rt) {
  pthread_rwlock_rdlock(&rt->peer_rw);
  spw_peer_link_t *l = rt->peer;
  pthread_rwlock_unlock(&rt->peer_rw);
  return l;
}

void spw__peer_give_back_begin(spw_runtime_t *rt) {
  spw_peer_link_t *l = peer_of(rt);
  if (!l) return;
  spw_runtime_t *lender = l->lender; /* alive: not destroyed while rt is */
  /* Off the lender's list under its lend_mu: a take-back of the lender's that is under way
   * ends first (and may have given the memory back: read the link again), and none starts
   * on this runtime while it closes. */
  pthread_mutex_lock(&lender->lend_mu);
  l = peer_of(rt);
  if (l) unlist(l);
  pthread_mutex_unlock(&lender->lend_mu);
  if (l) set_closing(l, 1);
}

void spw__peer_give_back_end(spw_runtime_t *rt) {
  pthread_rwlock_wrlock(&rt->peer_rw);
  spw_peer_link_t *l = rt->peer;
  rt->peer = NULL;
  atomic_store_explicit(&rt->peer_on, 0, memory_order_release);
  pthread_rwlock_unlock(&rt->peer_rw);
  if (!l) return;
  /* Every buffer of rt is freed by now, so the arena is empty. */
  spw_runtime_t *lender = l->lender;
  spw__arena_destroy(l->arena);
  (void)lender->ops->peer_free(lender->be, l->base);
  atomic_fetch_sub(&lender->lent_bytes, l->bytes);
  spw__budget_credit(lender, l->bytes);
  free(l);
}
