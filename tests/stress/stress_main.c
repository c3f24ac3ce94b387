/* SPDX-License-Identifier: Apache-2.0 */
/* spw_stress: a randomized, model-based stress test of Spillway, written only against
 * include/spillway/spillway.h and linked with the shared library.
 *
 * What it does. --threads workers, each on its own stream(s) (one or two per worker; worker
 * 0's second stream is the NULL stream), run every public operation in a weighted random
 * mix on buffers they own (stress_worker.c): alloc of odd and page-multiple sizes, free
 * (also of a buffer locked, of one whose release is pending, of one whose spill was just
 * queued), acquire writable / read-only / TRY, acquire_n with duplicates, release,
 * synchronize, release_async, release_n_async, spill to HOST and DISK, spill_n, prefetch,
 * prefetch_n, wait_idle, async_error, the queries and statistics, stream destroy and create,
 * bad input, and the controller installed, replaced and removed. A meddler thread spills and
 * prefetches anybody's buffers every 200 us (stress_meddler.c). The device budget and the
 * host limit are small, so buffers go to disk constantly; the disk is unlimited.
 *
 * What it checks. Every acquire checks the buffer's contents against the model before any
 * write (stress_data.c: copies and host functions on the host backend, CUDA kernels on the
 * GPU); every call's status against the set the model allows (stress.h: out of memory only
 * when the bytes locked plus the request exceed the budget); every controller event; and at
 * the end every buffer once more, then that freeing everything leaves no byte in any tier,
 * and that spw_runtime_destroy succeeds. The first failure prints the seed, the call, the
 * status and spw_last_error's text, the thread's last 50 operations and the command that
 * replays the run, and exits 1. A thread that makes no progress for --hang-seconds is a
 * failure too.
 *
 * Running it:
 *   spw_stress                       5 s on the host backend (SPILLWAY_BACKEND picks it)
 *   spw_stress --seed 42 ...         replays: each thread draws the same operations again
 *                                    (the interleaving between threads is the OS's)
 *   SPW_STRESS_SECONDS=600 ctest -R spw_stress     the long mode of the CTest runs
 *   spw_stress --sanity              no meddler, no explicit moves, a budget that never
 *                                    spills: proves the model itself right
 *   spw_stress --backend cuda        the GPU variant (kernels check and write the data)
 *   spw_stress --soak                16 workers, 4x oversubscribed, 4 KiB - 64 MiB buffers,
 *                                    10 minutes, progress every 30 s
 *   spw_stress --peer on             also the peer tier: a second runtime (the lender, same
 *                                    backend, --peer-device, default the same device) lends
 *                                    part of its memory to the workers' runtime and takes it
 *                                    back, by spw_peer_reclaim or under its own pressure, every
 *                                    few ms (stress_lender.c); at the end it takes it back, and
 *                                    no byte may be left lent or in lent memory
 * (tests/stress/run_gpu_stress.sh) spw_stress --weights free_locked=20,spill_n=0 ...   reweights
 * the mix (names: --help) Without --spill-dir the spill file lives in a fresh directory under
 * $TMPDIR; a supervisor process runs the test as its child and removes that directory whatever the
 * child's fate (failure, crash, sanitizer abort). Exit status: 0 pass, 1 failure, 2 bad options, 77
 * skipped (no GPU for --backend cuda, or io_uring refused under SPILLWAY_IO=uring). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "stress.h"

extern char **environ;

static const unsigned default_weights[OP_NWEIGHTED] = {
#define STRESS_W(name, text, w, ws) w,
    STRESS_WEIGHTED_OPS(STRESS_W)
#undef STRESS_W
};
static const unsigned soak_weights[OP_NWEIGHTED] = {
#define STRESS_WS(name, text, w, ws) ws,
    STRESS_WEIGHTED_OPS(STRESS_WS)
#undef STRESS_WS
};

/* ---- options ----------------------------------------------------------------------- */

typedef struct cli {
  stress_options_t o;
  int seed_given, child;
  const char *weights_arg, *tolerate_arg;
  /* values given on the command line, applied over the mode's defaults */
  double seconds;
  int threads;
  uint64_t budget, host_limit, min_buf, max_buf, live, lock_cap;
  int controller, meddler, peer_device_given;
} cli_t;

static void usage(FILE *f) {
  fprintf(f,
          "usage: spw_stress [--seed N] [--seconds S] [--threads T] [--budget BYTES]\n"
          "                  [--host-limit BYTES] [--min-buf BYTES] [--max-buf BYTES]\n"
          "                  [--live BYTES per worker] [--lock-cap BYTES per worker]\n"
          "                  [--controller on|off] [--meddler on|off] [--backend host|cuda]\n"
          "                  [--spill-dir DIR] [--sanity | --soak] [--weights op=N,...]\n"
          "                  [--meddle-us N] [--hang-seconds S] [--idle-seconds S] [--progress S]\n"
          "                  [--peer on|off] [--peer-device N  (the lender's; default the same)]\n"
          "                  [--tolerate-async SPW_ERR_X,...  (triage: count these background\n"
          "                   errors instead of failing, to look past a known bug)]\n"
          "sizes as the SPILLWAY_* limits take them (16MiB, 1.5GiB, 4096);\n"
          "SPW_STRESS_SECONDS overrides --seconds.\n"
          "operations (--weights):");
  for (int i = 0; i < OP_NWEIGHTED; i++) fprintf(f, " %s", stress_op_name(i));
  fprintf(f, "\n");
}

/* Sizes take the syntax of the SPILLWAY_* limits ("16MiB", "1.5 GiB", "4096"). */
static int parse_bytes(const char *s, uint64_t *out) {
  return spw_parse_size(s, out) == SPW_OK ? 0 : -1;
}

static int parse_onoff(const char *s, int *out) {
  if (!strcmp(s, "on") || !strcmp(s, "1"))
    *out = 1;
  else if (!strcmp(s, "off") || !strcmp(s, "0"))
    *out = 0;
  else
    return -1;
  return 0;
}

static int parse_weights(const char *arg, unsigned *weights) {
  char buf[1024];
  snprintf(buf, sizeof buf, "%s", arg);
  for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    char *eq = strchr(tok, '=');
    if (!eq) return -1;
    *eq = '\0';
    int found = 0;
    for (int i = 0; i < OP_NWEIGHTED; i++)
      if (!strcmp(tok, stress_op_name(i))) {
        weights[i] = (unsigned)strtoul(eq + 1, NULL, 10);
        found = 1;
      }
    if (!found) return -1;
  }
  return 0;
}

/* "SPW_ERR_INVALID_ARG,SPW_ERR_CUDA" -> a mask of ACC() bits */
static int parse_statuses(const char *arg, unsigned *mask) {
  char buf[512];
  snprintf(buf, sizeof buf, "%s", arg);
  for (char *save = NULL, *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    int found = 0;
    for (int k = 1; k < 32 && !found; k++)
      if (!strcmp(tok, spw_err_name(-k))) {
        *mask |= 1u << k;
        found = 1;
      }
    if (!found) return -1;
  }
  return 0;
}

enum {
  O_SEED = 256,
  O_SECONDS,
  O_THREADS,
  O_BUDGET,
  O_HOST,
  O_MIN,
  O_MAX,
  O_LIVE,
  O_CAP,
  O_CTRL,
  O_MEDDLER,
  O_BACKEND,
  O_DIR,
  O_SANITY,
  O_SOAK,
  O_WEIGHTS,
  O_MEDDLE_US,
  O_HANG,
  O_IDLE,
  O_PROGRESS,
  O_CHILD,
  O_TOLERATE,
  O_PEER,
  O_PEER_DEVICE,
  O_HELP
};

static int parse(int argc, char **argv, cli_t *c) {
  static const struct option opts[] = {{"seed", 1, 0, O_SEED},
                                       {"seconds", 1, 0, O_SECONDS},
                                       {"threads", 1, 0, O_THREADS},
                                       {"budget", 1, 0, O_BUDGET},
                                       {"host-limit", 1, 0, O_HOST},
                                       {"min-buf", 1, 0, O_MIN},
                                       {"max-buf", 1, 0, O_MAX},
                                       {"live", 1, 0, O_LIVE},
                                       {"lock-cap", 1, 0, O_CAP},
                                       {"controller", 1, 0, O_CTRL},
                                       {"meddler", 1, 0, O_MEDDLER},
                                       {"backend", 1, 0, O_BACKEND},
                                       {"spill-dir", 1, 0, O_DIR},
                                       {"sanity", 0, 0, O_SANITY},
                                       {"soak", 0, 0, O_SOAK},
                                       {"weights", 1, 0, O_WEIGHTS},
                                       {"meddle-us", 1, 0, O_MEDDLE_US},
                                       {"hang-seconds", 1, 0, O_HANG},
                                       {"idle-seconds", 1, 0, O_IDLE},
                                       {"progress", 1, 0, O_PROGRESS},
                                       {"child", 0, 0, O_CHILD},
                                       {"tolerate-async", 1, 0, O_TOLERATE},
                                       {"peer", 1, 0, O_PEER},
                                       {"peer-device", 1, 0, O_PEER_DEVICE},
                                       {"help", 0, 0, O_HELP},
                                       {0, 0, 0, 0}};
  stress_options_t *o = &c->o;
  const char *env = getenv("SPILLWAY_BACKEND");
  o->backend = env && !strcmp(env, "cuda") ? SPW_BACKEND_CUDA : SPW_BACKEND_HOST;
  c->controller = c->meddler = -1;
  c->seconds = -1;
  o->peer_device = -1;
  int opt, bad = 0;
  while ((opt = getopt_long(argc, argv, "", opts, NULL)) != -1) {
    switch (opt) {
    case O_SEED:
      o->seed = strtoull(optarg, NULL, 0);
      c->seed_given = 1;
      break;
    case O_SECONDS: c->seconds = atof(optarg); break;
    case O_THREADS: c->threads = atoi(optarg); break;
    case O_BUDGET: bad |= parse_bytes(optarg, &c->budget); break;
    case O_HOST: bad |= parse_bytes(optarg, &c->host_limit); break;
    case O_MIN: bad |= parse_bytes(optarg, &c->min_buf); break;
    case O_MAX: bad |= parse_bytes(optarg, &c->max_buf); break;
    case O_LIVE: bad |= parse_bytes(optarg, &c->live); break;
    case O_CAP: bad |= parse_bytes(optarg, &c->lock_cap); break;
    case O_CTRL: bad |= parse_onoff(optarg, &c->controller); break;
    case O_MEDDLER: bad |= parse_onoff(optarg, &c->meddler); break;
    case O_BACKEND:
      if (!strcmp(optarg, "host"))
        o->backend = SPW_BACKEND_HOST;
      else if (!strcmp(optarg, "cuda"))
        o->backend = SPW_BACKEND_CUDA;
      else
        bad = 1;
      break;
    case O_DIR: o->spill_dir = optarg; break;
    case O_SANITY: o->sanity = 1; break;
    case O_SOAK: o->soak = 1; break;
    case O_WEIGHTS: c->weights_arg = optarg; break;
    case O_MEDDLE_US: o->meddle_us = (unsigned)atoi(optarg); break;
    case O_HANG: o->hang_seconds = atof(optarg); break;
    case O_IDLE: o->idle_seconds = atof(optarg); break;
    case O_PROGRESS: o->progress_seconds = atof(optarg); break;
    case O_CHILD: c->child = 1; break;
    case O_TOLERATE:
      c->tolerate_arg = optarg;
      bad |= parse_statuses(optarg, &o->tolerate_async);
      break;
    case O_PEER: bad |= parse_onoff(optarg, &o->peer); break;
    case O_PEER_DEVICE:
      o->peer_device = atoi(optarg);
      c->peer_device_given = 1;
      bad |= o->peer_device < 0;
      break;
    case O_HELP: usage(stdout); exit(0);
    default: bad = 1; break;
    }
  }
  /* --sanity never spills, so the peer tier would never be used */
  if (bad || optind < argc || (o->sanity && o->soak) || (o->sanity && o->peer)) {
    usage(stderr);
    return -1;
  }
  /* The mode's defaults, then what was given. */
  bool cuda = o->backend == SPW_BACKEND_CUDA;
  if (o->soak) {
    o->threads = 16;
    o->seconds = 600;
    o->budget = 2 * GiB;
    o->min_buf = 4 * KiB;
    o->max_buf = 64 * MiB;
    o->progress_seconds = o->progress_seconds ? o->progress_seconds : 30;
    memcpy(o->weights, soak_weights, sizeof o->weights);
  } else {
    o->threads = 4;
    o->seconds = 5;
    o->budget = cuda ? 256 * MiB : 16 * MiB;
    o->min_buf = 1;
    o->max_buf = cuda ? 16 * MiB : 2 * MiB;
    memcpy(o->weights, default_weights, sizeof o->weights);
  }
  if (c->threads) o->threads = c->threads;
  if (c->seconds >= 0) o->seconds = c->seconds;
  if (c->budget) o->budget = c->budget;
  if (c->min_buf) o->min_buf = c->min_buf;
  if (c->max_buf) o->max_buf = c->max_buf;
  if (o->threads < 1 || o->threads > STRESS_MAX_THREADS) {
    fprintf(stderr, "spw_stress: --threads must be 1..%d\n", STRESS_MAX_THREADS);
    return -1;
  }
  /* 4x oversubscribed in a soak, 3x otherwise: with the host limit at half the data in a
   * soak, and the disk holding the rest. */
  uint64_t total_live = o->soak ? 4 * o->budget : 3 * o->budget;
  o->live = total_live / (uint64_t)o->threads;
  o->host_limit = o->soak ? total_live / 2 : o->budget / 2;
  if (c->live) o->live = c->live;
  if (c->host_limit) o->host_limit = c->host_limit;
  o->controller = c->controller >= 0 ? c->controller : 1;
  o->meddler = c->meddler >= 0 ? c->meddler : !o->sanity;
  if (o->sanity) { /* nothing may spill: no explicit moves, and room for everything */
    o->weights[OP_SPILL_HOST] = o->weights[OP_SPILL_DISK] = o->weights[OP_SPILL_N] = 0;
    o->weights[OP_PREFETCH] = o->weights[OP_PREFETCH_N] = o->weights[OP_FREE_SPILLING] = 0;
    if (!c->budget) o->budget = 4 * o->live * (uint64_t)o->threads + 4 * o->max_buf;
    if (!c->host_limit) o->host_limit = o->budget;
  }
  if (c->weights_arg && parse_weights(c->weights_arg, o->weights) != 0) {
    fprintf(stderr, "spw_stress: bad --weights '%s'\n", c->weights_arg);
    usage(stderr);
    return -1;
  }
  o->lock_cap = c->lock_cap              ? c->lock_cap
                : o->budget > o->max_buf ? (o->budget - o->max_buf) / (uint64_t)o->threads
                                         : o->budget / (uint64_t)o->threads;
  if (!o->meddle_us) o->meddle_us = 200;
  if (o->hang_seconds <= 0) o->hang_seconds = 60;
  /* Once nothing sends work, what is left queued is at most one move per buffer (the hint
   * rules of docs/design.md): the whole live data read back from disk, at the slowest disk
   * seen on the GPU machines (about 1 GB/s), takes well under this in a 2-3 GiB soak. */
  if (o->idle_seconds <= 0) o->idle_seconds = 60;
  const char *secs = getenv("SPW_STRESS_SECONDS"); /* the long mode wins over the command line */
  if (secs && *secs) o->seconds = atof(secs);
  if (!o->progress_seconds && o->seconds >= 60) o->progress_seconds = 30;
  if (o->min_buf < 1 || o->min_buf > o->max_buf || o->max_buf > o->budget || o->live < o->min_buf ||
      o->budget == 0 || o->host_limit == 0) {
    fprintf(stderr, "spw_stress: need 1 <= min-buf <= max-buf <= budget and live >= min-buf\n");
    return -1;
  }
  if (o->peer && o->budget < 2 * MiB) { /* the lender lends at least 1 MiB of the same budget */
    fprintf(stderr, "spw_stress: --peer on needs a budget of at least 2 MiB\n");
    return -1;
  }
  if (!c->seed_given) {
    const char *s = getenv("SPW_STRESS_SEED");
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    o->seed = s && *s
                  ? strtoull(s, NULL, 0)
                  : ((uint64_t)ts.tv_sec * 1000003u) ^ (uint64_t)ts.tv_nsec ^ (uint64_t)getpid();
  }
  return 0;
}

static void format_replay(const cli_t *c, const char *argv0, char *out, size_t len) {
  const stress_options_t *o = &c->o;
  const char *io = getenv("SPILLWAY_IO");
  int n = snprintf(
      out, len,
      "%s%s%sSPILLWAY_BACKEND=%s %s --seed %llu --seconds %g --threads %d --budget %llu "
      "--host-limit %llu --min-buf %llu --max-buf %llu --live %llu --lock-cap %llu "
      "--controller %s --meddler %s --meddle-us %u --peer %s%s%s",
      io ? "SPILLWAY_IO=" : "", io ? io : "", io ? " " : "",
      o->backend == SPW_BACKEND_CUDA ? "cuda" : "host", argv0, (unsigned long long)o->seed,
      o->seconds, o->threads, (unsigned long long)o->budget, (unsigned long long)o->host_limit,
      (unsigned long long)o->min_buf, (unsigned long long)o->max_buf, (unsigned long long)o->live,
      (unsigned long long)o->lock_cap, o->controller ? "on" : "off", o->meddler ? "on" : "off",
      o->meddle_us, o->peer ? "on" : "off", o->sanity ? " --sanity" : "", o->soak ? " --soak" : "");
  if (c->peer_device_given && n > 0 && (size_t)n < len)
    n += snprintf(out + n, len - (size_t)n, " --peer-device %d", o->peer_device);
  if (c->weights_arg && n > 0 && (size_t)n < len)
    n += snprintf(out + n, len - (size_t)n, " --weights %s", c->weights_arg);
  if (c->tolerate_arg && n > 0 && (size_t)n < len)
    n += snprintf(out + n, len - (size_t)n, " --tolerate-async %s", c->tolerate_arg);
  if (o->spill_dir && !c->child && n > 0 && (size_t)n < len)
    snprintf(out + n, len - (size_t)n, " --spill-dir %s", o->spill_dir);
}

/* ---- the supervisor: owns the temporary spill directory ------------------------------ */

static volatile sig_atomic_t forward_to;

static void forward_signal(int sig) {
  if (forward_to > 0) kill((pid_t)forward_to, sig);
}

static int remove_dir(const char *dir) {
  DIR *d = opendir(dir);
  if (d) {
    for (struct dirent *e; (e = readdir(d));)
      if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) unlinkat(dirfd(d), e->d_name, 0);
    closedir(d);
  }
  return rmdir(dir);
}

static int supervise(int argc, char **argv, const cli_t *c, const char *replay) {
  const char *tmp = getenv("TMPDIR");
  char dir[4096];
  snprintf(dir, sizeof dir, "%s/spw_stress.XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (!mkdtemp(dir)) {
    fprintf(stderr, "spw_stress: mkdtemp(%s): %s\n", dir, strerror(errno));
    return 1;
  }
  char seed[32];
  snprintf(seed, sizeof seed, "%llu", (unsigned long long)c->o.seed);
  char **args = calloc((size_t)argc + 6, sizeof *args);
  if (!args) return 1;
  int n = 0;
  for (int i = 0; i < argc; i++) args[n++] = argv[i];
  args[n++] = "--seed";
  args[n++] = seed;
  args[n++] = "--spill-dir";
  args[n++] = dir;
  args[n++] = "--child";
  pid_t pid;
  int rc = posix_spawn(&pid, "/proc/self/exe", NULL, NULL, args, environ);
  free(args);
  if (rc != 0) {
    fprintf(stderr, "spw_stress: posix_spawn: %s\n", strerror(rc));
    remove_dir(dir);
    return 1;
  }
  forward_to = pid;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = forward_signal;
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGHUP, &sa, NULL);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (remove_dir(dir) != 0 && errno != ENOENT)
    fprintf(stderr, "spw_stress: could not remove %s: %s\n", dir, strerror(errno));
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  int sig = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
  fprintf(stderr,
          "spw_stress: FAIL: the test process died of signal %d (%s), seed %llu\nreplay: %s\n", sig,
          strsignal(sig), (unsigned long long)c->o.seed, replay);
  return 128 + sig;
}

/* ---- the run ----------------------------------------------------------------------- */

static void phase(stress_t *st, const char *what) {
  atomic_store(&st->main_phase, what);
  atomic_fetch_add(&st->main_heartbeat, 1);
}

static void sleep_s(double s) {
  struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

static void progress_line(stress_t *st, double t) {
  uint64_t ops = 0, groups = 0, checked = 0, written = 0;
  for (int i = 0; i < st->nworkers; i++) {
    worker_t *w = &st->workers[i];
    ops += atomic_load(&w->heartbeat);
    groups += atomic_load(&w->groups);
    checked += atomic_load(&w->bytes_checked);
    written += atomic_load(&w->bytes_written);
  }
  spw_stats_t s;
  memset(&s, 0, sizeof s);
  s.struct_size = sizeof s;
  if (spw_get_stats(st->rt, &s) != SPW_OK) return;
  char peer[160] = ""; /* --peer on: the same line, so that its last one says everything */
  if (st->o.peer)
    snprintf(peer, sizeof peer, "; peer: lent %.0f MiB, %.0f MiB in it, spills %llu, unspills "
             "%llu, returns %llu",
             (double)s.peer_limit / (double)MiB, (double)s.peer_bytes / (double)MiB,
             (unsigned long long)s.peer_spills, (unsigned long long)s.peer_unspills,
             (unsigned long long)s.peer_returns);
  printf(
      "[%6.0f s] ops %llu, launch groups %llu, checked %.1f GiB, written %.1f GiB; spills %llu "
      "(%.1f GiB), unspills %llu, demotions %llu, disk reads %llu (%.1f GiB), failures %llu; "
      "device %.0f MiB, host %.0f MiB, disk %.0f MiB%s\n",
      t, (unsigned long long)ops, (unsigned long long)groups, (double)checked / (double)GiB,
      (double)written / (double)GiB, (unsigned long long)s.spills,
      (double)s.spill_bytes / (double)GiB, (unsigned long long)s.unspills,
      (unsigned long long)s.demotions, (unsigned long long)s.disk_reads,
      (double)s.disk_read_bytes / (double)GiB, (unsigned long long)s.failures,
      (double)s.device_bytes / (double)MiB, (double)s.host_bytes / (double)MiB,
      (double)s.disk_bytes / (double)MiB, peer);
  fflush(stdout);
}

typedef struct watch {
  stress_t *st;
  atomic_int done;
} watch_t;

/* A thread that has not advanced for hang_seconds is stuck: print what every thread was
 * doing and fail. Also prints the progress line. */
static void *watchdog_main(void *arg) {
  watch_t *wd = arg;
  stress_t *st = wd->st;
  int n = st->nworkers;
  uint64_t last[STRESS_MAX_THREADS + 3]; /* the workers, the meddler, the lender, main */
  double since[STRESS_MAX_THREADS + 3];
  double now = stress_now(), next_progress = st->t0 + st->o.progress_seconds;
  for (int i = 0; i < n + 3; i++) {
    last[i] = UINT64_MAX;
    since[i] = now;
  }
  while (!atomic_load(&wd->done)) {
    sleep_s(0.05);
    now = stress_now();
    if (st->o.progress_seconds > 0 && now >= next_progress) {
      progress_line(st, now - st->t0);
      next_progress += st->o.progress_seconds;
    }
    for (int i = 0; i < n + 3; i++) {
      uint64_t hb;
      bool active;
      if (i < n) {
        hb = atomic_load(&st->workers[i].heartbeat);
        active = atomic_load(&st->workers[i].phase) < 3;
      } else if (i == n) {
        hb = atomic_load(&st->meddler_heartbeat);
        active = st->o.meddler && atomic_load(&st->meddler_phase) < 2;
      } else if (i == n + 1) {
        hb = atomic_load(&st->lender_heartbeat);
        active = st->o.peer && atomic_load(&st->lender_phase) < 2;
      } else {
        hb = atomic_load(&st->main_heartbeat);
        active = true;
      }
      if (hb != last[i] || !active) {
        last[i] = hb;
        since[i] = now;
        continue;
      }
      if (now - since[i] < st->o.hang_seconds) continue;
      if (atomic_load(&st->failing)) return NULL; /* a report is being printed */
      fprintf(stderr, "\nspw_stress: no progress for %.0f s; what each thread did last:\n",
              now - since[i]);
      for (int k = 0; k < n; k++) {
        char who[32];
        snprintf(who, sizeof who, "worker %d (phase %d)", k, atomic_load(&st->workers[k].phase));
        stress_print_history(&st->workers[k].hist, who, 8);
      }
      if (st->o.meddler) stress_print_history(&st->meddler_hist, "the meddler", 8);
      if (st->o.peer) stress_print_history(&st->lender_hist, "the lender", 8);
      stress_fail(st, NULL, "hang: %s has made no progress for %.0f s (main thread: %s)",
                  i < n        ? "a worker"
                  : i == n     ? "the meddler"
                  : i == n + 1 ? "the lender"
                               : "the main thread",
                  now - since[i], atomic_load(&st->main_phase));
    }
  }
  return NULL;
}

/* When SPILLWAY_IO=uring and the kernel refuses io_uring, the disk tier reports itself
 * unsupported: the run is skipped (77), as the other disk tests do. */
static int probe_disk(stress_t *st) {
  spw_buf_t b;
  int rc = spw_alloc(st->rt, 4096, NULL, &b);
  if (rc != SPW_OK) stress_fail(st, NULL, "probe: spw_alloc returned %s", spw_err_name(rc));
  rc = spw_spill(st->rt, b, SPW_TIER_DISK);
  if (rc != SPW_OK) stress_fail(st, NULL, "probe: spw_spill(DISK) returned %s", spw_err_name(rc));
  int idle = spw_wait_idle(st->rt);
  rc = spw_free(st->rt, b);
  if (rc != SPW_OK) stress_fail(st, NULL, "probe: spw_free returned %s", spw_err_name(rc));
  const char *io = getenv("SPILLWAY_IO");
  if (idle == SPW_ERR_UNSUPPORTED && io && !strcmp(io, "uring")) return 77;
  if (idle != SPW_OK)
    stress_fail(st, NULL, "probe: a spill to disk failed: spw_wait_idle returned %s",
                spw_err_name(idle));
  return 0;
}

static int setup_workers(stress_t *st) {
  st->nworkers = st->o.threads;
  st->workers = calloc((size_t)st->nworkers, sizeof *st->workers);
  if (!st->workers) return -1;
  for (int i = 0; i < st->nworkers; i++) {
    worker_t *w = &st->workers[i];
    w->st = st;
    w->index = i;
    w->rng = st->o.seed ^ ((uint64_t)(i + 1) * 0xA0761D6478BD642Full);
    w->nstreams = (i == 0 || i % 2 == 1) ? 2 : 1;
    w->null_stream = i == 0 ? 1 : -1;
    for (int s = 0; s < w->nstreams; s++) {
      if (s == w->null_stream) {
        w->streams[s] = NULL;
        continue;
      }
      int rc = spw_stream_create(st->rt, &w->streams[s]);
      if (rc != SPW_OK) stress_fail(st, NULL, "spw_stream_create: %s", spw_err_name(rc));
    }
    for (int k = 0; k < STRESS_PUB; k++) w->pub_free[k] = STRESS_PUB - 1 - k;
    w->npub_free = STRESS_PUB;
    w->tracker_call = 2 * i;
    w->tracker_async = 2 * i + 1;
    if (stress_data_init(w) != 0) return -1;
  }
  st->meddler_tracker = 2 * st->nworkers;
  st->run_tracker = 2 * st->nworkers + 2;
  st->meddler_rng = st->o.seed ^ 0x6D6564646C6572ull;
  st->lender_rng = st->o.seed ^ 0x6C656E646572ull;
  return 0;
}

static void summary(stress_t *st, double elapsed) {
  uint64_t counts[OP_COUNT] = {0}, oom = 0, not_ready = 0, locked = 0, groups = 0, checks = 0,
           checked = 0, written = 0, peer_seen = 0;
  for (int i = 0; i < st->nworkers; i++) {
    worker_t *w = &st->workers[i];
    peer_seen += w->peer_seen;
    for (int k = 0; k < OP_COUNT; k++) counts[k] += w->counts[k];
    oom += w->oom_accepted;
    not_ready += w->not_ready;
    locked += w->locked_refused;
    groups += atomic_load(&w->groups);
    checks += w->checks;
    checked += atomic_load(&w->bytes_checked);
    written += atomic_load(&w->bytes_written);
  }
  char ops[2048];
  size_t len = 0;
  uint64_t total = 0;
  for (int k = 0; k < OP_NWEIGHTED; k++) {
    total += counts[k];
    len += (size_t)snprintf(ops + len, sizeof ops - len, "%s%s=%llu", k ? " " : "",
                            stress_op_name(k), (unsigned long long)counts[k]);
  }
  char stats[1024];
  if (spw_stats_summary(st->rt, stats, sizeof stats) != SPW_OK) snprintf(stats, sizeof stats, "?");
  spw_stats_t hs = {.struct_size = sizeof hs};
  (void)spw_get_stats(st->rt, &hs); /* zeros if it failed: only printed */
#define TR(a, b) (unsigned long long)atomic_load(&st->cb_transitions[SPW_STATE_##a][SPW_STATE_##b])
  char peer[640] = "";
  if (st->o.peer)
    snprintf(peer, sizeof peer,
             "; peer: lends %llu (busy %llu), reclaims %llu (refused for want of room %llu), "
             "pressure take-backs %llu, failures 0; seen in state PEER %llu times by the "
             "workers, %llu by the meddler; controller R->P %llu, P->R %llu, P->H %llu, P->D "
             "%llu, P->P failures %llu; peer_spills %llu (%.1f MiB), peer_unspills %llu, "
             "peer_returns %llu (%.1f MiB)",
             (unsigned long long)st->lends, (unsigned long long)st->lend_busy,
             (unsigned long long)st->reclaims, (unsigned long long)st->reclaims_refused,
             (unsigned long long)st->pressure_takebacks, (unsigned long long)peer_seen,
             (unsigned long long)st->meddle_peer_seen, TR(RESIDENT, PEER), TR(PEER, RESIDENT),
             TR(PEER, HOST), TR(PEER, DISK), (unsigned long long)atomic_load(&st->cb_peer_stuck),
             (unsigned long long)hs.peer_spills, (double)hs.peer_spill_bytes / (double)MiB,
             (unsigned long long)hs.peer_unspills, (unsigned long long)hs.peer_returns,
             (double)hs.peer_return_bytes / (double)MiB);
  printf(
      "spw_stress: PASS seed %llu, %.1f s, %d workers, %s backend: %llu operations (%s); "
      "launch groups %llu; contents checks %llu (%.1f MiB verified, %.1f MiB written, 0 wrong "
      "words%s); "
      "accepted out-of-memory %llu, not-ready %llu, locked %llu; meddler %llu calls (%llu "
      "freed, %llu locked); controller %llu events (R->H %llu, R->D %llu, H->D %llu, H->R "
      "%llu, D->R %llu), %llu locked skips, %llu out-of-memory prefetches, %llu pressure "
      "calls naming %llu victims, %llu "
      "allocated, %llu freed, %llu calls and %llu deadlock checks from callbacks; "
      "tolerated background errors %llu; spw_wait_idle %.2f s after the stop, %.2f s after "
      "the final checks (bound %g s); hints merged %llu, replaced %llu, prefetches dropped "
      "%llu%s; stats: %s\n",
      (unsigned long long)st->o.seed, elapsed, st->nworkers,
      st->backend == SPW_BACKEND_CUDA ? "cuda" : "host", (unsigned long long)total, ops,
      (unsigned long long)groups, (unsigned long long)checks, (double)checked / (double)MiB,
      (double)written / (double)MiB, st->backend == SPW_BACKEND_CUDA ? ", no CUDA error" : "",
      (unsigned long long)oom, (unsigned long long)not_ready, (unsigned long long)locked,
      (unsigned long long)st->meddles, (unsigned long long)st->meddle_freed,
      (unsigned long long)st->meddle_locked, (unsigned long long)atomic_load(&st->cb_events),
      TR(RESIDENT, HOST), TR(RESIDENT, DISK), TR(HOST, DISK), TR(HOST, RESIDENT),
      TR(DISK, RESIDENT), (unsigned long long)atomic_load(&st->cb_locked_skips),
      (unsigned long long)atomic_load(&st->cb_oom_events),
      (unsigned long long)atomic_load(&st->cb_pressure),
      (unsigned long long)atomic_load(&st->cb_victims),
      (unsigned long long)atomic_load(&st->cb_allocated),
      (unsigned long long)atomic_load(&st->cb_freed),
      (unsigned long long)atomic_load(&st->cb_calls),
      (unsigned long long)atomic_load(&st->cb_deadlock_checks),
      (unsigned long long)atomic_load(&st->tolerated), st->idle_stop_s, st->idle_s,
      st->o.idle_seconds,
      (unsigned long long)hs.hints_merged, (unsigned long long)hs.hints_replaced,
      (unsigned long long)hs.prefetch_dropped, peer, stats);
#undef TR
}

/* Issue 17: after a burst of hints, spw_wait_idle did not return for minutes while the
 * engine worked through every hint ever queued. With every thread stopped and every buffer
 * still alive, spw_wait_idle must return within the bound, and then nothing may move. */
static void check_idle(stress_t *st) {
  phase(st, "spw_wait_idle after the workers stopped");
  double t = stress_now();
  int rc = spw_wait_idle(st->rt);
  st->idle_s = stress_now() - t;
  stress_expect_async(st, NULL, "spw_wait_idle after the workers stopped", rc,
                      st->meddler_tracker + 1);
  if (st->idle_s > st->o.idle_seconds)
    stress_fail(st, NULL, "spw_wait_idle took %.1f s after the workers stopped (bound %g s)",
                st->idle_s, st->o.idle_seconds);
  phase(st, "nothing moves once idle");
  spw_stats_t a = {.struct_size = sizeof a}, b = {.struct_size = sizeof b};
  rc = spw_get_stats(st->rt, &a);
  for (int i = 0; i < 50; i++) {
    sleep_s(0.02);
    atomic_fetch_add(&st->main_heartbeat, 1);
  }
  if (rc == SPW_OK) rc = spw_get_stats(st->rt, &b);
  if (rc != SPW_OK) stress_fail(st, NULL, "spw_get_stats returned %s", spw_err_name(rc));
  if (a.spill_bytes != b.spill_bytes || a.unspill_bytes != b.unspill_bytes ||
      a.demote_bytes != b.demote_bytes || a.disk_read_bytes != b.disk_read_bytes ||
      b.hints_pending != 0)
    stress_fail(st, NULL,
                "the engine still moves data after spw_wait_idle with nothing running: in 1 s, "
                "%llu B spilled, %llu B unspilled, %llu B demoted, %llu B read from disk; %llu "
                "hints pending",
                (unsigned long long)(b.spill_bytes - a.spill_bytes),
                (unsigned long long)(b.unspill_bytes - a.unspill_bytes),
                (unsigned long long)(b.demote_bytes - a.demote_bytes),
                (unsigned long long)(b.disk_read_bytes - a.disk_read_bytes),
                (unsigned long long)b.hints_pending);
}

/* After every buffer was freed and the engine is idle, nothing may be left anywhere. */
static void check_empty(stress_t *st) {
  spw_stats_t s;
  memset(&s, 0, sizeof s);
  s.struct_size = sizeof s;
  int rc = spw_get_stats(st->rt, &s);
  if (rc != SPW_OK) stress_fail(st, NULL, "spw_get_stats returned %s", spw_err_name(rc));
  if (s.buffers || s.device_bytes || s.host_bytes || s.disk_bytes || s.locked_bytes ||
      s.peer_bytes)
    stress_fail(st, NULL,
                "leak: with every buffer freed and spw_wait_idle returned, the runtime still "
                "counts %llu buffers, %llu device bytes, %llu host bytes, %llu disk bytes, %llu "
                "locked bytes, %llu bytes in lent peer memory",
                (unsigned long long)s.buffers, (unsigned long long)s.device_bytes,
                (unsigned long long)s.host_bytes, (unsigned long long)s.disk_bytes,
                (unsigned long long)s.locked_bytes, (unsigned long long)s.peer_bytes);
  /* the probe's spill to disk is the only move before the run */
  if (st->o.sanity && (s.spills > 1 || s.demotions || s.disk_writes > 1))
    stress_fail(st, NULL,
                "--sanity: the budget leaves room for everything, yet %llu spills, %llu "
                "demotions and %llu disk writes happened",
                (unsigned long long)s.spills, (unsigned long long)s.demotions,
                (unsigned long long)s.disk_writes);
  if (st->backend == SPW_BACKEND_HOST)
    for (int i = 0; i < st->nworkers; i++) {
      worker_t *w = &st->workers[i];
      if (atomic_load(&w->host_checks) != w->checks)
        stress_fail(st, w, "%llu contents checks were enqueued, %llu ran",
                    (unsigned long long)w->checks,
                    (unsigned long long)atomic_load(&w->host_checks));
    }
}

/* --peer on: the lender, a second runtime on the same backend with the borrower's budget
 * (and its own emulated device on the host backend), and its stream. */
static void create_lender(stress_t *st) {
  const stress_options_t *o = &st->o;
  spw_config_t cfg = SPW_CONFIG_INIT;
  cfg.backend = st->backend;
  /* -1: left unset, so the lender resolves SPILLWAY_DEVICE (else 0) as the borrower did */
  if (o->peer_device >= 0) cfg.device = o->peer_device;
  cfg.device_limit = o->budget;
  cfg.host_limit = o->host_limit;
  cfg.spill_dir = o->spill_dir;
  cfg.host_device_bytes = 2 * o->budget + 64 * MiB;
  phase(st, "spw_runtime_create (the lender)");
  int rc = spw_runtime_create(&cfg, &st->lender);
  if (rc != SPW_OK) {
    char msg[512];
    spw_config_validate(&cfg, msg, sizeof msg);
    stress_fail(st, NULL, "--peer on: spw_runtime_create (the lender): %s: %s", spw_err_name(rc),
                msg);
  }
  rc = spw_stream_create(st->lender, &st->lender_stream);
  if (rc != SPW_OK) stress_fail(st, NULL, "spw_stream_create (the lender): %s", spw_err_name(rc));
}

/* --peer on, once the lender thread is joined (the workers still run): the lender takes
 * back what it lends, if anything, and then nothing may be lent, nor be in lent memory. */
static void final_reclaim(stress_t *st) {
  phase(st, "spw_peer_reclaim at the end");
  int rc = spw_peer_reclaim(st->lender, st->rt);
  /* The borrower's host tier may be full for a moment, and the disk unlimited: a refusal
   * leaves the buffers intact in lent memory, so try again while the workers go on. */
  for (int tries = 0; tries < 100 && (rc == SPW_ERR_HOST_OUT_OF_MEMORY || rc == SPW_ERR_DISK_FULL);
       tries++) {
    st->reclaims_refused++;
    sleep_s(0.02);
    atomic_fetch_add(&st->main_heartbeat, 1);
    rc = spw_peer_reclaim(st->lender, st->rt);
  }
  if (rc != (st->lent ? SPW_OK : SPW_ERR_INVALID_ARG))
    stress_fail(st, NULL,
                "spw_peer_reclaim at the end returned %s (%s) with %llu bytes lent, expected "
                "%s; last error text: lender \"%s\", borrower \"%s\"",
                spw_err_name(rc), spw_strerror(rc), (unsigned long long)st->lent,
                st->lent ? "SPW_OK" : "SPW_ERR_INVALID_ARG (nothing lent)",
                spw_last_error(st->lender), spw_last_error(st->rt));
  if (rc == SPW_OK) st->reclaims++;
  st->lent = 0;
  spw_stats_t ls = {.struct_size = sizeof ls}, bs = {.struct_size = sizeof bs};
  rc = spw_get_stats(st->lender, &ls);
  if (rc == SPW_OK) rc = spw_get_stats(st->rt, &bs);
  if (rc != SPW_OK) stress_fail(st, NULL, "spw_get_stats returned %s", spw_err_name(rc));
  if (ls.lent_bytes || bs.peer_limit || bs.peer_bytes)
    stress_fail(st, NULL,
                "after spw_peer_reclaim at the end, the lender still lends %llu bytes, and the "
                "borrower counts %llu bytes lent to it and %llu bytes of buffers in lent memory",
                (unsigned long long)ls.lent_bytes, (unsigned long long)bs.peer_limit,
                (unsigned long long)bs.peer_bytes);
}

/* --peer on, once every buffer is freed: the lender holds nothing, and the run used the
 * peer tier (a run that never put a byte into lent memory checked nothing of it). */
static void check_peer_end(stress_t *st) {
  spw_stats_t ls = {.struct_size = sizeof ls}, bs = {.struct_size = sizeof bs};
  int rc = spw_get_stats(st->lender, &ls);
  if (rc == SPW_OK) rc = spw_get_stats(st->rt, &bs);
  if (rc != SPW_OK) stress_fail(st, NULL, "spw_get_stats returned %s", spw_err_name(rc));
  if (ls.lent_bytes || ls.buffers || ls.device_bytes || ls.host_bytes || ls.disk_bytes)
    stress_fail(st, NULL,
                "leak: the lender, with nothing lent and its buffers freed, counts %llu bytes "
                "lent, %llu buffers, %llu device bytes, %llu host bytes, %llu disk bytes",
                (unsigned long long)ls.lent_bytes, (unsigned long long)ls.buffers,
                (unsigned long long)ls.device_bytes, (unsigned long long)ls.host_bytes,
                (unsigned long long)ls.disk_bytes);
  if (st->lends == 0 || bs.peer_spills == 0)
    stress_fail(st, NULL,
                "--peer on, yet the peer tier was not used: %llu lends, %llu spills into lent "
                "memory (a longer run, or a smaller --budget)",
                (unsigned long long)st->lends, (unsigned long long)bs.peer_spills);
}

static int run(stress_t *st) {
  const stress_options_t *o = &st->o;
  spw_config_t cfg = SPW_CONFIG_INIT;
  cfg.backend = o->backend;
  cfg.device_limit = o->budget;
  cfg.host_limit = o->host_limit;
  cfg.spill_dir = o->spill_dir;
  cfg.host_device_bytes = 2 * o->budget + 64 * MiB; /* host backend: room for fragmentation */
  phase(st, "spw_runtime_create");
  int rc = spw_runtime_create(&cfg, &st->rt);
  if (rc == SPW_ERR_NO_DEVICE) {
    printf("SKIP: no CUDA device on this machine\n");
    return 77;
  }
  if (rc != SPW_OK) {
    char msg[512];
    spw_config_validate(&cfg, msg, sizeof msg);
    fprintf(stderr, "spw_stress: spw_runtime_create: %s: %s\n", spw_err_name(rc), msg);
    return 1;
  }
  spw_runtime_backend(st->rt, &st->backend);
#ifndef SPW_STRESS_HAVE_CUDA
  if (st->backend == SPW_BACKEND_CUDA) {
    printf("SKIP: spw_stress was built without its CUDA kernels\n");
    spw_runtime_destroy(st->rt);
    return 77;
  }
#endif
  if (probe_disk(st) == 77) {
    printf("SKIP: SPILLWAY_IO=uring and io_uring refused by this kernel\n");
    spw_runtime_destroy(st->rt);
    return 77;
  }
  rc = spw_stream_create(st->rt, &st->meddler_stream);
  if (rc != SPW_OK) stress_fail(st, NULL, "spw_stream_create: %s", spw_err_name(rc));
  if (o->peer) create_lender(st);
  if (setup_workers(st) != 0) stress_fail(st, NULL, "worker setup failed");
  stress_controller_set(st, NULL, o->controller ? 1 : 0);
  stress_tracker_begin(st, st->meddler_tracker + 1);
  stress_tracker_begin(st, st->run_tracker);

  watch_t wd = {st, 0};
  st->t0 = stress_now();
  pthread_t watchdog, meddler, lender, *threads = calloc((size_t)st->nworkers, sizeof *threads);
  if (!threads || pthread_create(&watchdog, NULL, watchdog_main, &wd) != 0)
    stress_fail(st, NULL, "cannot start the watchdog");
  for (int i = 0; i < st->nworkers; i++)
    if (pthread_create(&threads[i], NULL, stress_worker_main, &st->workers[i]) != 0)
      stress_fail(st, NULL, "cannot start worker %d", i);
  if (o->meddler && pthread_create(&meddler, NULL, stress_meddler_main, st) != 0)
    stress_fail(st, NULL, "cannot start the meddler");
  if (o->peer && pthread_create(&lender, NULL, stress_lender_main, st) != 0)
    stress_fail(st, NULL, "cannot start the lender");
  phase(st, "running");
  while (stress_now() - st->t0 < o->seconds) {
    sleep_s(0.05);
    atomic_fetch_add(&st->main_heartbeat, 1);
  }
  if (o->peer) { /* the lender stops first: the final reclaim runs under the workers' load */
    phase(st, "joining the lender");
    atomic_store(&st->lender_stop, 1);
    pthread_join(lender, NULL);
    final_reclaim(st);
  }
  phase(st, "joining the meddler");
  atomic_store(&st->stop, 1);
  if (o->meddler) pthread_join(meddler, NULL);
  /* What the issue measured: the backlog of hints, waited for as soon as the meddler and
   * the workers stop sending them (the workers go on to their final checks meanwhile). */
  phase(st, "spw_wait_idle as soon as nothing sends hints");
  double t_idle = stress_now();
  rc = spw_wait_idle(st->rt);
  st->idle_stop_s = stress_now() - t_idle;
  stress_expect_async(st, NULL, "spw_wait_idle as soon as nothing sends hints", rc,
                      st->meddler_tracker + 1);
  if (st->idle_stop_s > o->idle_seconds)
    stress_fail(st, NULL, "spw_wait_idle took %.1f s once nothing sent hints (bound %g s)",
                st->idle_stop_s, o->idle_seconds);
  phase(st, "waiting for the workers' final checks");
  for (int i = 0; i < st->nworkers; i++)
    while (atomic_load(&st->workers[i].phase) < 2) { /* the watchdog watches them meanwhile */
      sleep_s(0.02);
      atomic_fetch_add(&st->main_heartbeat, 1);
    }
  check_idle(st);
  atomic_store(&st->may_free, 1);
  for (int i = 0; i < st->nworkers; i++) {
    while (atomic_load(&st->workers[i].phase) < 3) {
      sleep_s(0.02);
      atomic_fetch_add(&st->main_heartbeat, 1);
    }
    pthread_join(threads[i], NULL);
  }
  double elapsed = stress_now() - st->t0;
  phase(st, "spw_wait_idle at the end");
  rc = spw_wait_idle(st->rt);
  stress_expect_async(st, NULL, "spw_wait_idle at the end", rc, st->meddler_tracker + 1);
  phase(st, "checks at the end");
  stress_controller_set(st, NULL, 0);
  check_empty(st);
  if (o->peer) check_peer_end(st);
  stress_data_finish(st);
  summary(st, elapsed);
  /* The lender goes first, while the borrower lives on: the borrower's own destroy then
   * runs after its lender is gone, so it must hold nothing of it any more (a stale
   * reference would show under ASan); the other order is exercised by test_peer_tier. */
  if (o->peer) {
    phase(st, "spw_runtime_destroy (the lender)");
    rc = spw_stream_destroy(st->lender, st->lender_stream);
    if (rc != SPW_OK) stress_fail(st, NULL, "spw_stream_destroy (the lender) returned %s",
                                  spw_err_name(rc));
    rc = spw_runtime_destroy(st->lender);
    if (rc != SPW_OK)
      stress_fail(st, NULL, "spw_runtime_destroy (the lender) returned %s", spw_err_name(rc));
    st->lender = NULL;
  }
  phase(st, "spw_runtime_destroy");
  for (int i = 0; i < st->nworkers; i++) stress_data_fini(&st->workers[i]);
  rc = spw_runtime_destroy(st->rt);
  if (rc != SPW_OK) stress_fail(st, NULL, "spw_runtime_destroy returned %s", spw_err_name(rc));
  atomic_store(&wd.done, 1);
  pthread_join(watchdog, NULL);
  for (int i = 0; i < st->nworkers; i++) {
    free(st->workers[i].live);
    free(st->workers[i].zombies);
  }
  free(st->workers);
  free(threads);
  return 0;
}

int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  cli_t c;
  memset(&c, 0, sizeof c);
  if (parse(argc, argv, &c) != 0) return 2;
  char replay[1024];
  format_replay(&c, argv[0], replay, sizeof replay);
  if (!c.child) {
    printf("spw_stress: seed %llu\nreplay: %s\n", (unsigned long long)c.o.seed, replay);
    fflush(stdout);
  }
  if (!c.o.spill_dir) return supervise(argc, argv, &c, replay);
  if (c.child) prctl(PR_SET_PDEATHSIG, SIGKILL);
  stress_t *st = calloc(1, sizeof *st);
  if (!st) return 1;
  st->o = c.o;
  snprintf(st->replay, sizeof st->replay, "%s", replay);
  st->t0 = stress_now();
  atomic_store(&st->next_id, 1);
  int rc = run(st);
  free(st);
  return rc;
}
