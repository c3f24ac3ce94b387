/* SPDX-License-Identifier: Apache-2.0 */
/* The spill trace (see trace.h).
 *
 * The ring is a bounded multi-producer, single-consumer queue of fixed 64-byte records
 * (Vyukov's scheme: a sequence number per cell, one CAS on the head to claim a cell). The
 * only consumer is the trace's writer thread, which owns everything else here: the file,
 * the thread-to-track table, and the merging of a batch's reports. A spill batch reports
 * each victim with the batch's one duration, so consecutive reports of one thread with the
 * same move, start and duration become one slice (its buffer count, total bytes and first
 * handles in the arguments): a batch of 2048 victims is one slice, not 2048 stacked ones.
 * A slice names its buffers' owner ("owner") when they all have the same one, or counts
 * buffers and bytes per owner ("owners") when they have several; the writer keeps a copy of
 * the owners' names, taken again whenever one is set.
 *
 * The file is the JSON array format, one event per line, each followed by a comma: a
 * process that dies without closing the runtime leaves a file that Perfetto and
 * chrome://tracing still open (the array format's closing bracket is optional), and
 * spillway.plot reads it line by line. The cap counts every byte written and keeps room
 * for the closing event, so a closed trace is valid JSON of at most trace_max bytes. */
#include "trace.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "budget.h"
#include "clock.h"
#include "runtime.h"

#define RING_RECORDS 65536u   /* 4 MiB; 2 ms of drain interval holds 32 M events/s */
#define DRAIN_NS 2000000ull   /* the writer's period */
#define LOCKED_EVERY 5        /* locked bytes cost a scan of the slots: every 5th period */
#define MAX_TRACKS 128        /* threads with a track of their own; the rest share one */
#define MERGE_BUFS 8          /* handles listed in a merged slice's arguments */
#define MERGE_GAP_NS 1000000ull /* most time between two reports of one batch */
#define MERGE_OWNERS 8        /* owners counted apart in a merged slice; the rest together */
#define TAIL_RESERVE 512      /* room kept under the cap for the closing event */
#define LINE_MAX 2048         /* a merged slice with MERGE_OWNERS owners of the longest names
                                 and MERGE_BUFS handles fits */

typedef enum { REC_MOVE = 1, REC_LOCK_WAIT, REC_ROOM } rec_kind_t;

typedef struct rec {
  _Atomic uint64_t seq;
  uint8_t kind, from, to, aux; /* REC_ROOM: background; REC_MOVE, REC_LOCK_WAIT: the
                                  buffer's owner id */
  int32_t status;
  uint64_t thread; /* pthread_self of the thread that ran it */
  uint64_t buf, bytes, arg;     /* arg: the stream of a lock wait, the bytes wanted of a spill
                                   for room */
  uint64_t t0, dur;
} rec_t;

/* The buffers of one owner in a merged slice. */
typedef struct owner_part {
  uint32_t id, n;
  uint64_t bytes;
} owner_part_t;

typedef struct track {
  uint64_t thread;
  int named;
  /* A merged slice waiting for more reports of the same batch. */
  int pending, idle;
  rec_t r;
  uint32_t n;
  uint64_t last_t0; /* start of the latest report merged */
  uint64_t bufs[MERGE_BUFS];
  owner_part_t owners[MERGE_OWNERS]; /* its buffers that have an owner, by owner */
  uint32_t nowners;
  owner_part_t others; /* owned buffers past MERGE_OWNERS owners (id unused) */
} track_t;

struct spw_trace {
  spw_runtime_t *rt;
  rec_t *ring;
  _Atomic uint64_t head; /* producers */
  uint64_t tail;         /* the writer */
  _Atomic uint64_t dropped_ring;
  _Atomic uint64_t lane_thread[2];

  /* The writer's own state, touched by no other thread while it runs. */
  pthread_t thread;
  pthread_mutex_t mu; /* the writer's sleep and the stop flag: no other thread of Spillway
                         takes it */
  pthread_cond_t cv;
  int stop;
  FILE *f;
  uint64_t start_ns, written, max, events, dropped_cap;
  int capped, pid;
  track_t tracks[MAX_TRACKS];
  uint32_t ntracks;
  uint64_t last[5]; /* device, host, disk, locked, peer: last values written */
  int sampled;
  unsigned tick;
  spw_owner_name_t names[SPW_OWNERS]; /* the owners' names, as of names_gen */
  uint32_t names_gen;
  uint64_t owner_device[SPW_OWNERS];  /* scratch of the owners' scan */
  uint64_t owner_last[SPW_OWNERS];    /* last value written per owner's counter */
  uint8_t owner_written[SPW_OWNERS];  /* whether that counter was written at all */
};

/* ---- producers ---------------------------------------------------------------------- */

static void push(spw_trace_t *t, rec_t *r) {
  uint64_t pos = atomic_load_explicit(&t->head, memory_order_relaxed);
  for (;;) {
    rec_t *c = &t->ring[pos & (RING_RECORDS - 1)];
    uint64_t seq = atomic_load_explicit(&c->seq, memory_order_acquire);
    int64_t dif = (int64_t)(seq - pos);
    if (dif == 0) {
      if (atomic_compare_exchange_weak_explicit(&t->head, &pos, pos + 1, memory_order_relaxed,
                                                memory_order_relaxed)) {
        c->kind = r->kind;
        c->from = r->from;
        c->to = r->to;
        c->aux = r->aux;
        c->status = r->status;
        c->thread = (uint64_t)pthread_self();
        c->buf = r->buf;
        c->bytes = r->bytes;
        c->arg = r->arg;
        c->t0 = r->t0;
        c->dur = r->dur;
        atomic_store_explicit(&c->seq, pos + 1, memory_order_release);
        return;
      }
    } else if (dif < 0) {
      atomic_fetch_add_explicit(&t->dropped_ring, 1, memory_order_relaxed);
      return; /* full: the writer is behind; never wait for it */
    } else {
      pos = atomic_load_explicit(&t->head, memory_order_relaxed);
    }
  }
}

void spw__trace_move(spw_trace_t *t, spw_buf_t h, uint32_t owner, spw_state_t from,
                     spw_state_t to, uint64_t bytes, uint64_t duration_ns, int status) {
  uint64_t now = spw__now_ns();
  rec_t r = {.kind = REC_MOVE, .from = (uint8_t)from, .to = (uint8_t)to, .aux = (uint8_t)owner,
             .status = status, .buf = h, .bytes = bytes, .t0 = now - duration_ns,
             .dur = duration_ns};
  push(t, &r);
}

void spw__trace_lock_wait(spw_trace_t *t, spw_buf_t h, uint32_t owner, spw_stream_t stream,
                          uint64_t bytes, uint64_t t0_ns, int status) {
  rec_t r = {.kind = REC_LOCK_WAIT, .aux = (uint8_t)owner, .status = status, .buf = h,
             .bytes = bytes, .arg = (uint64_t)(uintptr_t)stream, .t0 = t0_ns,
             .dur = spw__now_ns() - t0_ns};
  push(t, &r);
}

void spw__trace_spill_for_room(spw_trace_t *t, int background, uint64_t wanted, uint64_t moved,
                               uint64_t t0_ns) {
  rec_t r = {.kind = REC_ROOM, .aux = (uint8_t)(background != 0), .bytes = moved,
             .arg = wanted, .t0 = t0_ns, .dur = spw__now_ns() - t0_ns};
  push(t, &r);
}

void spw__trace_lane(spw_trace_t *t, int lane) {
  uint64_t self = (uint64_t)pthread_self();
  if (atomic_load_explicit(&t->lane_thread[lane], memory_order_relaxed) != self)
    atomic_store_explicit(&t->lane_thread[lane], self, memory_order_relaxed);
}

/* ---- the writer --------------------------------------------------------------------- */

static double us(const spw_trace_t *t, uint64_t ns) {
  return ns > t->start_ns ? (double)(ns - t->start_ns) / 1000.0 : 0.0;
}

/* Writes one event line (with its trailing comma) if it fits under the cap. */
static void emit(spw_trace_t *t, const char *line, int len) {
  if (len <= 0 || len >= LINE_MAX) return;
  if (t->capped || t->written + (uint64_t)len + 2 + TAIL_RESERVE > t->max) {
    t->capped = 1;
    t->dropped_cap++;
    return;
  }
  fwrite(line, 1, (size_t)len, t->f);
  fwrite(",\n", 1, 2, t->f);
  t->written += (uint64_t)len + 2;
  t->events++;
}

static const char *state_name(int s) {
  switch (s) {
  case SPW_STATE_RESIDENT: return "RESIDENT";
  case SPW_STATE_SPILLING: return "SPILLING";
  case SPW_STATE_HOST: return "HOST";
  case SPW_STATE_DEMOTING: return "DEMOTING";
  case SPW_STATE_DISK: return "DISK";
  case SPW_STATE_UNSPILLING: return "UNSPILLING";
  case SPW_STATE_PEER: return "PEER";
  default: return "?";
  }
}

/* A move's slice name and direction, from its states. */
static void move_name(const rec_t *r, const char **name, const char **dir) {
  *dir = "";
  if (r->from == r->to) {
    *name = r->status == SPW_ERR_LOCKED ? "spill skipped (locked)" : "failed move";
  } else if (r->from == SPW_STATE_RESIDENT && r->to == SPW_STATE_HOST) {
    *name = "spill";
    *dir = "device->host";
  } else if (r->from == SPW_STATE_RESIDENT && r->to == SPW_STATE_DISK) {
    *name = "spill to disk";
    *dir = "device->disk";
  } else if (r->from == SPW_STATE_HOST && r->to == SPW_STATE_RESIDENT) {
    *name = "unspill";
    *dir = "host->device";
  } else if (r->from == SPW_STATE_HOST && r->to == SPW_STATE_DISK) {
    *name = "demote";
    *dir = "host->disk";
  } else if (r->from == SPW_STATE_DISK && r->to == SPW_STATE_RESIDENT) {
    *name = "disk read";
    *dir = "disk->device";
  } else if (r->from == SPW_STATE_RESIDENT && r->to == SPW_STATE_PEER) {
    *name = "spill to peer";
    *dir = "device->peer";
  } else if (r->from == SPW_STATE_PEER && r->to == SPW_STATE_RESIDENT) {
    *name = "unspill from peer";
    *dir = "peer->device";
  } else if (r->from == SPW_STATE_PEER) {
    *name = r->to == SPW_STATE_HOST ? "peer memory taken back" : "peer memory taken back to disk";
    *dir = r->to == SPW_STATE_HOST ? "peer->host" : "peer->disk";
  } else {
    *name = "move";
  }
}

static uint32_t track_of(spw_trace_t *t, uint64_t thread) {
  for (uint32_t i = 0; i < t->ntracks; i++)
    if (t->tracks[i].thread == thread) return i;
  if (t->ntracks == MAX_TRACKS) return MAX_TRACKS - 1; /* "more threads" */
  track_t *k = &t->tracks[t->ntracks];
  memset(k, 0, sizeof *k);
  k->thread = thread;
  return t->ntracks++;
}

static void name_track(spw_trace_t *t, uint32_t i) {
  track_t *k = &t->tracks[i];
  if (k->named) return;
  k->named = 1;
  char line[LINE_MAX], name[64];
  int sort = 10 + (int)i;
  if (k->thread == atomic_load_explicit(&t->lane_thread[0], memory_order_relaxed)) {
    snprintf(name, sizeof name, "engine down lane (spills)");
    sort = 0;
  } else if (k->thread == atomic_load_explicit(&t->lane_thread[1], memory_order_relaxed)) {
    snprintf(name, sizeof name, "engine up lane (prefetches)");
    sort = 1;
  } else if (i == MAX_TRACKS - 1) {
    snprintf(name, sizeof name, "more threads");
  } else {
    snprintf(name, sizeof name, "thread %u", i + 1);
  }
  emit(t, line, snprintf(line, sizeof line,
                         "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%u,"
                         "\"args\":{\"name\":\"%s\"}}", t->pid, i + 1, name));
  emit(t, line, snprintf(line, sizeof line,
                         "{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":%d,\"tid\":%u,"
                         "\"args\":{\"sort_index\":%d}}", t->pid, i + 1, sort));
}

/* `"owner":"<label>"` for one owner. */
static void owner_arg(const spw_trace_t *t, uint32_t id, char *out, size_t len) {
  char label[48];
  spw__owner_label(t->names[id], id, label, sizeof label);
  snprintf(out, len, ",\"owner\":\"%s\"", label);
}

/* The owner arguments of a slice of n buffers: none when no buffer has an owner, "owner"
 * when all n have the same one, else "owners": buffers and bytes of each owner (the owned
 * buffers past MERGE_OWNERS owners under "(other owners)"; buffers without one not listed). */
static void owners_args(const spw_trace_t *t, const track_t *k, uint32_t n, char *out,
                        size_t len) {
  out[0] = '\0';
  if (k->nowners == 0) return;
  if (k->nowners == 1 && k->others.n == 0 && k->owners[0].n == n) {
    owner_arg(t, k->owners[0].id, out, len);
    return;
  }
  size_t o = (size_t)snprintf(out, len, ",\"owners\":{");
  for (uint32_t j = 0; j <= k->nowners && o < len; j++) {
    const owner_part_t *p = j < k->nowners ? &k->owners[j] : &k->others;
    if (j == k->nowners && p->n == 0) break;
    char label[48];
    if (j < k->nowners) spw__owner_label(t->names[p->id], p->id, label, sizeof label);
    else snprintf(label, sizeof label, "(other owners)");
    o += (size_t)snprintf(out + o, len - o, "%s\"%s\":{\"buffers\":%u,\"bytes\":%" PRIu64 "}",
                          j ? "," : "", label, p->n, p->bytes);
  }
  if (o < len) snprintf(out + o, len - o, "}");
}

/* Counts a report of owner `id` (non-zero) into the track's slice. */
static void add_owner(track_t *k, uint32_t id, uint64_t bytes) {
  owner_part_t *p = NULL;
  for (uint32_t j = 0; j < k->nowners && !p; j++)
    if (k->owners[j].id == id) p = &k->owners[j];
  if (!p && k->nowners < MERGE_OWNERS) {
    p = &k->owners[k->nowners++];
    *p = (owner_part_t){.id = id};
  }
  if (!p) p = &k->others;
  p->n++;
  p->bytes += bytes;
}

static void write_move(spw_trace_t *t, uint32_t i, const rec_t *r, uint32_t n,
                       const uint64_t *bufs) {
  const char *name, *dir;
  move_name(r, &name, &dir);
  char owners[MERGE_OWNERS * 96 + 64];
  owners_args(t, &t->tracks[i], n, owners, sizeof owners);
  char list[MERGE_BUFS * 24 + 16] = "";
  if (n > 1) {
    size_t o = (size_t)snprintf(list, sizeof list, ",\"bufs\":[");
    for (uint32_t k = 0; k < n && k < MERGE_BUFS; k++)
      o += (size_t)snprintf(list + o, sizeof list - o, "%s\"0x%" PRIx64 "\"", k ? "," : "",
                            bufs[k]);
    snprintf(list + o, sizeof list - o, "]");
  }
  char line[LINE_MAX];
  emit(t, line, snprintf(line, sizeof line,
                         "{\"name\":\"%s\",\"cat\":\"move\",\"ph\":\"X\",\"ts\":%.3f,"
                         "\"dur\":%.3f,\"pid\":%d,\"tid\":%u,\"args\":{\"bytes\":%" PRIu64
                         ",\"buffers\":%u,\"buf\":\"0x%" PRIx64 "\"%s,\"from\":\"%s\","
                         "\"to\":\"%s\",\"dir\":\"%s\",\"status\":\"%s\"%s}}",
                         name, us(t, r->t0), (double)r->dur / 1000.0, t->pid, i + 1, r->bytes,
                         n, r->buf, list, state_name(r->from), state_name(r->to), dir,
                         spw_err_name(r->status), owners));
}

static void flush_track(spw_trace_t *t, uint32_t i) {
  track_t *k = &t->tracks[i];
  if (!k->pending) return;
  k->pending = 0;
  write_move(t, i, &k->r, k->n, k->bufs);
}

/* The reports of one batch share the batch's duration and come one after another, so their
 * start (now - duration, taken at each report) creeps forward a little with each. */
static int same_batch(const track_t *k, const rec_t *b) {
  const rec_t *a = &k->r;
  return a->from == b->from && a->to == b->to && a->status == b->status && a->dur == b->dur &&
         b->t0 >= k->last_t0 && b->t0 - k->last_t0 < MERGE_GAP_NS;
}

static void write_rec(spw_trace_t *t, const rec_t *r) {
  uint32_t i = track_of(t, r->thread);
  name_track(t, i);
  track_t *k = &t->tracks[i];
  char line[LINE_MAX];
  switch (r->kind) {
  case REC_MOVE:
    if (k->pending && same_batch(k, r)) {
      if (k->n < MERGE_BUFS) k->bufs[k->n] = r->buf;
      k->last_t0 = r->t0;
      k->n++;
      k->r.bytes += r->bytes;
      if (r->aux) add_owner(k, r->aux, r->bytes);
      k->idle = 0;
      return;
    }
    flush_track(t, i);
    k->pending = 1;
    k->idle = 0;
    k->r.from = r->from;
    k->r.to = r->to;
    k->r.status = r->status;
    k->r.buf = r->buf;
    k->r.bytes = r->bytes;
    k->r.t0 = k->last_t0 = r->t0;
    k->r.dur = r->dur;
    k->n = 1;
    k->bufs[0] = r->buf;
    k->nowners = 0;
    k->others = (owner_part_t){0};
    if (r->aux) add_owner(k, r->aux, r->bytes);
    return;
  case REC_LOCK_WAIT: {
    char owner[96] = "";
    if (r->aux) owner_arg(t, r->aux, owner, sizeof owner);
    emit(t, line, snprintf(line, sizeof line,
                           "{\"name\":\"lock wait\",\"cat\":\"lock\",\"ph\":\"X\",\"ts\":%.3f,"
                           "\"dur\":%.3f,\"pid\":%d,\"tid\":%u,\"args\":{\"buf\":\"0x%" PRIx64
                           "\",\"bytes\":%" PRIu64 ",\"stream\":\"0x%" PRIx64
                           "\",\"status\":\"%s\"%s}}",
                           us(t, r->t0), (double)r->dur / 1000.0, t->pid, i + 1, r->buf,
                           r->bytes, r->arg, spw_err_name(r->status), owner));
    return;
  }
  case REC_ROOM:
    emit(t, line, snprintf(line, sizeof line,
                           "{\"name\":\"%s\",\"cat\":\"room\",\"ph\":\"X\",\"ts\":%.3f,"
                           "\"dur\":%.3f,\"pid\":%d,\"tid\":%u,\"args\":{\"wanted\":%" PRIu64
                           ",\"moved\":%" PRIu64 "}}",
                           r->aux ? "background spill" : "spill on demand", us(t, r->t0),
                           (double)r->dur / 1000.0, t->pid, i + 1, r->arg, r->bytes));
    return;
  default: return;
  }
}

static void drain(spw_trace_t *t) {
  /* Names set since the last round apply from here on; the owners' counters are written
   * again under their new names at the next sample. */
  if (spw__owner_names_copy(t->rt->owners, t->names, &t->names_gen))
    memset(t->owner_written, 0, sizeof t->owner_written);
  for (;;) {
    rec_t *c = &t->ring[t->tail & (RING_RECORDS - 1)];
    uint64_t seq = atomic_load_explicit(&c->seq, memory_order_acquire);
    if (seq != t->tail + 1) break;
    rec_t r = {.kind = c->kind, .from = c->from, .to = c->to, .aux = c->aux,
               .status = c->status, .thread = c->thread, .buf = c->buf, .bytes = c->bytes,
               .arg = c->arg, .t0 = c->t0, .dur = c->dur};
    atomic_store_explicit(&c->seq, t->tail + RING_RECORDS, memory_order_release);
    t->tail++;
    write_rec(t, &r);
  }
  /* A batch's reports arrive together: a slice that gained nothing for two periods is
   * complete. */
  for (uint32_t i = 0; i < t->ntracks; i++)
    if (t->tracks[i].pending && ++t->tracks[i].idle >= 2) flush_track(t, i);
}

/* Each owner's bytes on the device, for the owners that allocated, written when they
 * changed: a scan of the slots, made with the locked bytes' (every LOCKED_EVERY periods). */
static void sample_owners(spw_trace_t *t) {
  spw_runtime_t *rt = t->rt;
  int any = 0;
  for (uint32_t id = 1; id < SPW_OWNERS && !any; id++)
    any = atomic_load_explicit(&rt->owners->c[id].allocs, memory_order_relaxed) != 0;
  if (!any) return;
  spw__owner_device_bytes(rt, t->owner_device);
  double ts = us(t, spw__now_ns());
  for (uint32_t id = 1; id < SPW_OWNERS; id++) {
    uint64_t v = t->owner_device[id];
    if (t->owner_written[id] ? v == t->owner_last[id]
                             : !atomic_load_explicit(&rt->owners->c[id].allocs,
                                                     memory_order_relaxed))
      continue;
    char line[LINE_MAX], label[48];
    spw__owner_label(t->names[id], id, label, sizeof label);
    emit(t, line, snprintf(line, sizeof line,
                           "{\"name\":\"device (%s)\",\"ph\":\"C\",\"ts\":%.3f,\"pid\":%d,"
                           "\"args\":{\"bytes\":%" PRIu64 "}}", label, ts, t->pid, v));
    t->owner_last[id] = v;
    t->owner_written[id] = 1;
  }
}

/* The bytes in each tier, written when they changed. */
static void sample(spw_trace_t *t, int all) {
  spw_runtime_t *rt = t->rt;
  uint64_t v[5] = {atomic_load(&rt->budget.used), atomic_load(&rt->c.host_bytes),
                   atomic_load(&rt->c.disk_bytes), t->last[3], atomic_load(&rt->c.peer_bytes)};
  if (all || t->tick % LOCKED_EVERY == 0) v[3] = spw__locked_device_bytes(rt);
  static const char *const names[5] = {"device", "host", "disk", "locked", "peer"};
  double ts = us(t, spw__now_ns());
  for (int i = 0; i < 5; i++) {
    if (t->sampled && v[i] == t->last[i]) continue;
    if (i == 4 && !t->sampled && v[i] == 0) continue; /* no peer tier: no counter */
    char line[LINE_MAX];
    emit(t, line, snprintf(line, sizeof line,
                           "{\"name\":\"%s\",\"ph\":\"C\",\"ts\":%.3f,\"pid\":%d,"
                           "\"args\":{\"bytes\":%" PRIu64 "}}", names[i], ts, t->pid, v[i]));
    t->last[i] = v[i];
  }
  t->sampled = 1;
  if (all || t->tick % LOCKED_EVERY == 0) sample_owners(t);
}

static void *writer(void *arg) {
  spw_trace_t *t = arg;
  pthread_mutex_lock(&t->mu);
  for (;;) {
    int stop = t->stop;
    pthread_mutex_unlock(&t->mu);
    drain(t);
    sample(t, 0);
    t->tick++;
    fflush(t->f); /* a process that exits without closing loses at most one period */
    pthread_mutex_lock(&t->mu);
    if (stop) break;
    struct timespec ts = spw__deadline_in(DRAIN_NS);
    if (!t->stop) pthread_cond_timedwait(&t->cv, &t->mu, &ts);
  }
  pthread_mutex_unlock(&t->mu);
  return NULL;
}

static void write_header(spw_trace_t *t) {
  spw_runtime_t *rt = t->rt;
  const char *backend = rt->kind == SPW_BACKEND_CUDA ? "cuda" : "host";
  fputs("[\n", t->f);
  t->written = 2;
  char line[LINE_MAX];
  emit(t, line, snprintf(line, sizeof line,
                         "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,"
                         "\"args\":{\"name\":\"spillway (%s backend)\"}}", t->pid, backend));
  /* The limits, for readers that draw occupancy against them (spillway.plot). */
  emit(t, line, snprintf(line, sizeof line,
                         "{\"name\":\"spillway\",\"cat\":\"config\",\"ph\":\"i\",\"s\":\"p\","
                         "\"ts\":0,\"pid\":%d,\"tid\":0,\"args\":{\"backend\":\"%s\","
                         "\"device_limit\":%" PRIu64 ",\"host_limit\":%" PRIu64
                         ",\"disk_limit\":%" PRIu64 "}}", t->pid, backend, rt->budget.limit,
                         rt->settings.host_limit, rt->settings.disk_limit));
}

int spw__trace_open(spw_runtime_t *rt, spw_trace_t **out) {
  *out = NULL;
  if (rt->settings.trace_path[0] == '\0') return SPW_OK;
  spw_trace_t *t = calloc(1, sizeof *t);
  if (!t) return SPW_ERR_SYSTEM;
  t->ring = malloc(RING_RECORDS * sizeof *t->ring);
  t->f = t->ring ? fopen(rt->settings.trace_path, "w") : NULL;
  if (!t->f) {
    int e = errno;
    spw__log(&rt->log, SPW_LOG_WARN, "trace file '%s' cannot be created (%s): no trace",
             rt->settings.trace_path, strerror(e));
    free(t->ring);
    free(t);
    return SPW_ERR_SYSTEM;
  }
  for (uint32_t i = 0; i < RING_RECORDS; i++) atomic_init(&t->ring[i].seq, i);
  setvbuf(t->f, NULL, _IOFBF, 1 << 20);
  t->rt = rt;
  t->max = rt->settings.trace_max;
  t->pid = (int)getpid();
  t->start_ns = spw__now_ns();
  pthread_mutex_init(&t->mu, NULL);
  pthread_cond_init(&t->cv, NULL);
  write_header(t);
  if (pthread_create(&t->thread, NULL, writer, t) != 0) {
    fclose(t->f);
    pthread_cond_destroy(&t->cv);
    pthread_mutex_destroy(&t->mu);
    free(t->ring);
    free(t);
    return SPW_ERR_SYSTEM;
  }
  *out = t;
  return SPW_OK;
}

void spw__trace_close(spw_trace_t *t) {
  if (!t) return;
  pthread_mutex_lock(&t->mu);
  t->stop = 1;
  pthread_cond_signal(&t->cv);
  pthread_mutex_unlock(&t->mu);
  pthread_join(t->thread, NULL);
  drain(t); /* anything added while the writer made its last round */
  for (uint32_t i = 0; i < t->ntracks; i++) flush_track(t, i);
  sample(t, 1);
  fprintf(t->f,
          "{\"name\":\"trace end\",\"cat\":\"trace\",\"ph\":\"i\",\"s\":\"g\",\"ts\":%.3f,"
          "\"pid\":%d,\"tid\":0,\"args\":{\"events\":%" PRIu64 ",\"dropped_full_buffer\":%" PRIu64
          ",\"dropped_size_cap\":%" PRIu64 ",\"max_bytes\":%" PRIu64 "}}\n]\n",
          us(t, spw__now_ns()), t->pid, t->events,
          atomic_load_explicit(&t->dropped_ring, memory_order_relaxed), t->dropped_cap, t->max);
  if (fclose(t->f) != 0)
    spw__log(&t->rt->log, SPW_LOG_WARN, "trace file '%s': write failed (%s)",
             t->rt->settings.trace_path, strerror(errno));
  pthread_cond_destroy(&t->cv);
  pthread_mutex_destroy(&t->mu);
  free(t->ring);
  free(t);
}
