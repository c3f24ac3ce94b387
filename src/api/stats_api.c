/* SPDX-License-Identifier: Apache-2.0 */
/* Statistics: the counters, plus what is cheaper to count when asked (locked bytes: a scan
 * of the slots, so that the lock fast path touches no shared counter). */
#include <stdio.h>
#include <string.h>

#include "api.h"
#include "budget.h"
#include "jobs.h"
#include "peer.h"

#define LOAD(x) atomic_load_explicit(&(x), memory_order_relaxed)

int spw_get_stats(spw_runtime_t *rt, spw_stats_t *out) {
  if (!rt || !out || out->struct_size < sizeof(size_t)) return SPW_ERR_INVALID_ARG;
  spw_stats_t s;
  memset(&s, 0, sizeof s);
  s.struct_size = sizeof s;
  s.buffers = LOAD(rt->handles.live);
  s.device_bytes = LOAD(rt->budget.used);
  s.host_bytes = LOAD(rt->c.host_bytes);
  s.disk_bytes = LOAD(rt->c.disk_bytes);
  s.locked_bytes = spw__locked_device_bytes(rt);
  s.device_limit = rt->budget.limit;
  spw_arena_stats_t as;
  spw__arena_get_stats(rt->arena, &as);
  s.host_pinned_bytes = as.mapped;
  s.spills = LOAD(rt->c.spills);
  s.spill_bytes = LOAD(rt->c.spill_bytes);
  s.unspills = LOAD(rt->c.unspills);
  s.unspill_bytes = LOAD(rt->c.unspill_bytes);
  s.demotions = LOAD(rt->c.demotions);
  s.demote_bytes = LOAD(rt->c.demote_bytes);
  s.disk_reads = LOAD(rt->c.disk_reads);
  s.disk_read_bytes = LOAD(rt->c.disk_read_bytes);
  s.disk_writes = LOAD(rt->c.disk_writes);
  s.disk_write_bytes = LOAD(rt->c.disk_write_bytes);
  s.spills_on_demand = LOAD(rt->c.spills_on_demand);
  s.spills_background = LOAD(rt->c.spills_background);
  s.spills_abandoned = LOAD(rt->c.spills_abandoned);
  s.clean_respills = LOAD(rt->c.clean_respills);
  s.failures = LOAD(rt->c.failures);
  s.spill_ns = LOAD(rt->c.spill_ns);
  s.unspill_ns = LOAD(rt->c.unspill_ns);
  s.demote_ns = LOAD(rt->c.demote_ns);
  s.disk_read_ns = LOAD(rt->c.disk_read_ns);
  s.disk_requests = LOAD(rt->c.disk_requests);
  s.hints_merged = LOAD(rt->c.hints_merged);
  s.hints_replaced = LOAD(rt->c.hints_replaced);
  s.hints_pending = spw__jobs_pending(rt);
  s.prefetch_dropped = LOAD(rt->c.prefetch_dropped);
  s.peer_bytes = LOAD(rt->c.peer_bytes);
  s.peer_limit = spw__peer_limit(rt);
  s.peer_spills = LOAD(rt->c.peer_spills);
  s.peer_spill_bytes = LOAD(rt->c.peer_spill_bytes);
  s.peer_unspills = LOAD(rt->c.peer_unspills);
  s.peer_unspill_bytes = LOAD(rt->c.peer_unspill_bytes);
  s.peer_returns = LOAD(rt->c.peer_returns);
  s.peer_return_bytes = LOAD(rt->c.peer_return_bytes);
  s.lent_bytes = LOAD(rt->lent_bytes);
  size_t n = out->struct_size < sizeof s ? out->struct_size : sizeof s;
  memcpy(out, &s, n);
  out->struct_size = n;
  return SPW_OK;
}

static const char *human(uint64_t b, char *buf, size_t len) {
  const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = (double)b;
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    u++;
  }
  snprintf(buf, len, u ? "%.1f %s" : "%.0f %s", v, unit[u]);
  return buf;
}

/* "; owners: torch 3 buffers 1.5 GiB, owner 7 1 buffer 4.0 KiB": the owners with live
 * buffers, appended to buf as far as it fits. */
static void owners_summary(spw_runtime_t *rt, char *buf, size_t len) {
  const char *sep = "; owners: ";
  for (uint32_t id = 1; id < SPW_OWNERS; id++) {
    uint64_t n = LOAD(rt->owners->c[id].live), bytes = LOAD(rt->owners->c[id].live_bytes);
    size_t used = strlen(buf);
    if (n == 0) continue;
    if (used + 1 >= len) return;
    spw_owner_name_t name;
    spw__owner_get_name(rt->owners, id, name);
    char label[48], b[32];
    spw__owner_label(name, id, label, sizeof label);
    snprintf(buf + used, len - used, "%s%s %llu buffer%s %s", sep, label, (unsigned long long)n,
             n == 1 ? "" : "s", human(bytes, b, sizeof b));
    sep = ", ";
  }
}

int spw_stats_summary(spw_runtime_t *rt, char *buf, size_t len) {
  if (!rt || !buf || len == 0) return SPW_ERR_INVALID_ARG;
  spw_stats_t s = {.struct_size = sizeof s};
  int st = spw_get_stats(rt, &s);
  if (st != SPW_OK) return st;
  char a[32], b[32], c[32], d[32], e[32], f[32];
  snprintf(buf, len,
           "%llu buffers; device %s of %s (locked %s); host %s; disk %s; spilled %s in %llu "
           "(%.3f s, %llu on demand, %llu background, %llu abandoned); unspilled %llu; "
           "demoted %llu; disk reads %llu; failures %llu",
           (unsigned long long)s.buffers, human(s.device_bytes, a, sizeof a),
           human(s.device_limit, b, sizeof b), human(s.locked_bytes, c, sizeof c),
           human(s.host_bytes, d, sizeof d), human(s.disk_bytes, e, sizeof e),
           human(s.spill_bytes, f, sizeof f), (unsigned long long)s.spills, s.spill_ns / 1e9,
           (unsigned long long)s.spills_on_demand, (unsigned long long)s.spills_background,
           (unsigned long long)s.spills_abandoned, (unsigned long long)s.unspills,
           (unsigned long long)s.demotions, (unsigned long long)s.disk_reads,
           (unsigned long long)s.failures);
  /* The peer tier, only where there is or was one. */
  size_t used = strlen(buf);
  if ((s.peer_limit || s.peer_spills || s.peer_bytes) && used + 1 < len)
    snprintf(buf + used, len - used, "; peer %s of %s (%llu spills, %llu back, %llu moved on)",
             human(s.peer_bytes, a, sizeof a), human(s.peer_limit, b, sizeof b),
             (unsigned long long)s.peer_spills, (unsigned long long)s.peer_unspills,
             (unsigned long long)s.peer_returns);
  used = strlen(buf);
  if (s.lent_bytes && used + 1 < len)
    snprintf(buf + used, len - used, "; lent %s", human(s.lent_bytes, a, sizeof a));
  owners_summary(rt, buf, len);
  return SPW_OK;
}
