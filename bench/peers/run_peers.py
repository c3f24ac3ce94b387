# SPDX-License-Identifier: Apache-2.0
"""Spillway next to its peers, in one process and one run (issue 11, item 6).

Host tier: Spillway spilling N buffers to pinned host memory and bringing them back
(``spill_n(HOST)`` + ``wait_idle``, ``prefetch_n`` + ``wait_idle``, through the Python
package) next to PyTorch per-tensor offload into preallocated pinned tensors
(``dst.copy_(src, non_blocking=True)`` per tensor, one synchronize; and back).
Disk tier: Spillway spilling the same kind of buffers straight to disk (``spill_n(DISK)``,
read back with ``prefetch_n``) next to KvikIO writing and reading device buffers of the same
sizes to a file in the same directory (``CuFile.pwrite`` / ``pread`` per buffer, all in
flight, then wait), in its POSIX mode with its default Direct I/O settings, in POSIX mode
with O_DIRECT reads too, and through GDS when cuFile reports it available.

Method (the same for every system): one warm-up round trip, untimed, pays every first-touch
cost (Spillway's pinned arena slabs and disk tier, PyTorch's pinned tensors, KvikIO's file,
thread pool and bounce buffers); then `reps` timed round trips, of which the median is
reported. Every round trip uses a new pattern (word w of the working set holds a hash of w
and the round's seed), written into the sources untimed. Before each direction its
destination is overwritten with 0xA5 where the program can reach it (PyTorch's pinned and
device tensors, KvikIO's device buffers; for Spillway, the device memory its buffers left
is taken by same-sized buffers filled with 0xA5 before they come back, so that stale memory
cannot pass), and after the round trip every byte is compared with the pattern. Spillway's
passes are also checked by state (every buffer on the tier after a spill, resident after a
prefetch) and by its byte counters (the pass moved exactly the working set; nothing spilled
on demand or in the background). A wrong byte fails the run; nothing asserts on time.

    python bench/peers/run_peers.py                 # GPU machine (bench/peers/run_peers.sh)
    python bench/peers/run_peers.py --smoke         # tiny sizes; host backend without a GPU

Without PyTorch, KvikIO or a CUDA device, those columns are skipped and say why.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import statistics
import sys
import tempfile
import time
import traceback
from typing import Any, Optional

import numpy as np

import spillway
from spillway import State, Tier

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
POISON = 0xA5
GOAL_LINE = ("Goal (issue 11, item 6): Spillway ahead of PyTorch and KvikIO at every size, "
             ">= 5x PyTorch at 64 KiB.")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def fmt_size(n: int) -> str:
    for unit, mult in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= mult and n % mult == 0:
            return f"{n // mult} {unit}"
    return f"{n} B"


def gbs(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9 if seconds > 0 else 0.0


# ---- memory the benchmark itself owns: the pattern, scratch, the peers' buffers ---------

def _pattern_chunk(first: int, n: int, seed: int, xp) -> Any:
    """Words first..first+n of the pattern for `seed`, as uint32 values in int64 (a
    multiplicative hash of the word's index, so a word that lands anywhere else, or is
    left over from another round, does not match)."""
    w = xp.arange(first, first + n, dtype=xp.int64)
    return (w * 0x9E3779B1 + (seed + 1) * 0x85EBCA77) & 0xFFFFFFFF


class NumpyMem:
    """Benchmark memory in host memory (numpy). Spillway's memcpy reaches it on either
    backend; on the host backend it is all there is."""

    name = "host memory (numpy)"
    CHUNK = 1 << 22

    def empty(self, nbytes: int) -> np.ndarray:
        return np.empty(nbytes // 4, np.uint32)

    def addr(self, a: np.ndarray) -> int:
        return a.ctypes.data

    def pattern(self, a: np.ndarray, seed: int) -> None:
        for i in range(0, a.size, self.CHUNK):
            n = min(self.CHUNK, a.size - i)
            a[i:i + n] = _pattern_chunk(i, n, seed, np).astype(np.uint32)

    def poison(self, a: np.ndarray) -> None:
        a.view(np.uint8).fill(POISON)

    def mismatches(self, got: np.ndarray, want: np.ndarray) -> tuple[int, int]:
        """(wrong words, index of the first) over got vs want."""
        bad, first = 0, -1
        for i in range(0, want.size, self.CHUNK):
            diff = np.flatnonzero(got[i:i + self.CHUNK] != want[i:i + self.CHUNK])
            if diff.size and first < 0:
                first = i + int(diff[0])
            bad += int(diff.size)
        return bad, first

    def sync(self) -> None:
        pass


class TorchMem:
    """Benchmark memory on the device (PyTorch), so that filling and checking a GiB costs
    milliseconds. PyTorch works on the legacy default stream and Spillway's copies on a
    non-blocking stream of their own, so every hand-over between them synchronizes."""

    CHUNK = 1 << 24

    def __init__(self, torch) -> None:
        self.torch = torch
        self.dev = torch.device("cuda")
        self.name = f"device memory (PyTorch {torch.__version__})"

    def empty(self, nbytes: int):
        return self.torch.empty(nbytes // 4, dtype=self.torch.int32, device=self.dev)

    def addr(self, a) -> int:
        return a.data_ptr()

    def pattern(self, a, seed: int) -> None:
        for i in range(0, a.numel(), self.CHUNK):
            n = min(self.CHUNK, a.numel() - i)
            v = _pattern_chunk(i, n, seed, _TorchXp(self.torch, self.dev))
            a[i:i + n] = ((v ^ 0x80000000) - 0x80000000).to(self.torch.int32)  # as signed

    def poison(self, a) -> None:
        a.view(self.torch.uint8).fill_(POISON)

    def mismatches(self, got, want) -> tuple[int, int]:
        if self.torch.equal(got, want):
            return 0, -1
        diff = (got != want).nonzero()
        return int(diff.numel()), int(diff[0].item()) if diff.numel() else -1

    def sync(self) -> None:
        self.torch.cuda.synchronize()


class _TorchXp:
    """The two array-module calls _pattern_chunk makes, on the device."""

    def __init__(self, torch, dev) -> None:
        self.int64, self._torch, self._dev = torch.int64, torch, dev

    def arange(self, a: int, b: int, dtype):
        return self._torch.arange(a, b, dtype=dtype, device=self._dev)


# ---- Spillway ------------------------------------------------------------------------------

class Anomalies:
    """What a pass did that it should not have: wrong states, wrong byte counts, bytes
    moved by anything but the timed call. Each is printed once it happens."""

    def __init__(self) -> None:
        self.items: list[str] = []

    def add(self, what: str) -> None:
        log(f"ANOMALY: {what}")
        self.items.append(what)


def _delta(a: spillway.Stats, b: spillway.Stats, field: str) -> int:
    return getattr(b, field) - getattr(a, field)


class SpillwayTier:
    """One runtime for one tier (host or disk), its stream, and the round trips of one
    buffer size through it."""

    def __init__(self, tier: Tier, mem, backend: str, device_limit: int, host_limit: int,
                 spill_dir: str, anomalies: Anomalies) -> None:
        self.tier, self.mem, self.anomalies = tier, mem, anomalies
        kw = dict(backend=backend, device_limit=device_limit, host_limit=host_limit,
                  spill_dir=spill_dir, host_device_bytes=2 * device_limit + 256 * MiB)
        # The disk runtime logs at info, so that the disk tier's open line (I/O path,
        # O_DIRECT) can be read back from stderr for the report.
        self.rt = spillway.Runtime(log_level="info" if tier == Tier.DISK else "warn", **kw)
        self.s = self.rt.stream().handle

    def close(self) -> None:
        self.rt.close()

    # Fill, poison and check go through spw_memcpy_async, one call per buffer, on the
    # runtime's own stream: untimed, and the same code on both backends.
    def _copy_in(self, bufs: list, src: int, size: int) -> None:
        rt, s = self.rt, self.s
        ptrs = rt.acquire_n(bufs, s)  # writable: drops any clean copy on a lower tier
        mc = rt.memcpy
        for i, p in enumerate(ptrs):
            mc(p, src + i * size, size, s, False)
        rt.synchronize(s)

    def _copy_in_same(self, bufs: list, src: int, size: int) -> None:
        rt, s = self.rt, self.s
        ptrs = rt.acquire_n(bufs, s)
        mc = rt.memcpy
        for p in ptrs:
            mc(p, src, size, s, False)
        rt.synchronize(s)

    def _copy_out(self, bufs: list, dst: int, size: int) -> None:
        rt, s = self.rt, self.s
        ptrs = rt.acquire_n(bufs, s, read=True)
        mc = rt.memcpy
        for i, p in enumerate(ptrs):
            mc(dst + i * size, p, size, s, False)
        rt.synchronize(s)

    def _poison_freed(self, size: int, count: int, poison_src: int) -> None:
        """Takes the device memory the spilled buffers left with as many buffers of the
        same size, fills them with 0xA5, and frees them: a prefetch that copied nothing
        would then read 0xA5, not the data still lying there."""
        tmp = [self.rt.alloc(size, self.s) for _ in range(count)]
        self._copy_in_same(tmp, poison_src, size)
        for b in tmp:
            b.free()
        self.rt.wait_idle()

    def _check_states(self, bufs: list, want: State, what: str) -> None:
        off = sum(1 for b in bufs if b.state != want)
        if off:
            self.anomalies.add(f"{what}: {off} of {len(bufs)} buffers not {want.name}")

    def _check_moved(self, a: spillway.Stats, b: spillway.Stats, fields: tuple, want: int,
                     what: str) -> None:
        for f in fields:
            got = _delta(a, b, f)
            if got != want:
                self.anomalies.add(f"{what}: {f} grew by {got}, expected {want}")
        for f in ("spills_on_demand", "spills_background", "demotions", "failures"):
            got = _delta(a, b, f)
            if got:
                self.anomalies.add(f"{what}: {f} grew by {got} during the timed pass")

    def round_trips(self, size: int, count: int, warmup: int, reps: int, seed0: int) -> dict:
        rt, mem, s, tier = self.rt, self.mem, self.s, self.tier
        total = size * count
        where = f"spillway {tier.name.lower()} {fmt_size(size)} x {count}"
        ref, got, poison = mem.empty(total), mem.empty(total), mem.empty(size)
        mem.poison(poison)
        mem.sync()
        bufs = [rt.alloc(size, s) for _ in range(count)]
        rt.synchronize(s)
        on_tier = State.HOST if tier == Tier.HOST else State.DISK
        out_fields = ("spill_bytes",) if tier == Tier.HOST else ("spill_bytes", "disk_write_bytes")
        in_fields = ("unspill_bytes",) if tier == Tier.HOST else ("disk_read_bytes",)
        res: dict = {"out_s": [], "in_s": [], "out_call_s": [], "in_call_s": [], "bad": 0,
                     "checked_bytes": 0, "pinned_before": []}
        try:
            for r in range(warmup + reps):
                timed = r >= warmup
                mem.pattern(ref, seed0 + r)
                mem.sync()
                self._copy_in(bufs, mem.addr(ref), size)
                a = rt.stats()
                t0 = time.perf_counter()
                rt.spill_n(bufs, int(tier))
                t1 = time.perf_counter()
                rt.wait_idle()
                t2 = time.perf_counter()
                b = rt.stats()
                self._check_states(bufs, on_tier, f"{where} after spill (round {r})")
                self._check_moved(a, b, out_fields, total, f"{where} spill (round {r})")
                self._poison_freed(size, count, mem.addr(poison))
                c = rt.stats()
                t3 = time.perf_counter()
                rt.prefetch_n(bufs, s)
                t4 = time.perf_counter()
                rt.wait_idle()
                t5 = time.perf_counter()
                d = rt.stats()
                self._check_states(bufs, State.RESIDENT, f"{where} after prefetch (round {r})")
                self._check_moved(c, d, in_fields, total, f"{where} prefetch (round {r})")
                mem.poison(got)
                mem.sync()
                self._copy_out(bufs, mem.addr(got), size)
                bad, first = mem.mismatches(got, ref)
                res["checked_bytes"] += total
                if bad:
                    res["bad"] += bad
                    log(f"DATA CHECK FAILED: {where} round {r}: {bad} wrong words, the first "
                        f"in buffer {first * 4 // size} at byte {first * 4 % size}")
                if timed:
                    res["out_s"].append(t2 - t0)
                    res["in_s"].append(t5 - t3)
                    res["out_call_s"].append(t1 - t0)
                    res["in_call_s"].append(t4 - t3)
                    res["pinned_before"].append(a.host_pinned_bytes)
        finally:
            for buf in bufs:
                buf.free()
            rt.wait_idle()
        return res


# ---- PyTorch: per-tensor copies into preallocated pinned tensors -------------------------

def torch_round_trips(torch, mem: TorchMem, size: int, count: int, warmup: int, reps: int,
                      seed0: int) -> dict:
    """`count` device tensors of `size` bytes (views of one allocation: each copy_ is still
    one cudaMemcpyAsync, and no allocator runs in the timed loop) to as many views of one
    pinned tensor, and back."""
    total = size * count
    dev = torch.empty(total, dtype=torch.uint8, device="cuda")
    pin = torch.empty(total, dtype=torch.uint8, pin_memory=True)
    dv, pv = list(dev.split(size)), list(pin.split(size))
    ref = mem.empty(total)
    res: dict = {"out_s": [], "in_s": [], "bad": 0, "checked_bytes": 0}
    for r in range(warmup + reps):
        mem.pattern(ref, seed0 + r)
        dev.copy_(ref.view(torch.uint8))
        pin.fill_(POISON)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for d, s in zip(pv, dv):
            d.copy_(s, non_blocking=True)
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        dev.fill_(POISON)
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        for d, s in zip(dv, pv):
            d.copy_(s, non_blocking=True)
        torch.cuda.synchronize()
        t3 = time.perf_counter()
        bad, first = mem.mismatches(dev.view(torch.int32), ref)
        res["checked_bytes"] += total
        if bad:
            res["bad"] += bad
            log(f"DATA CHECK FAILED: pytorch {fmt_size(size)} x {count} round {r}: {bad} wrong "
                f"words, the first in tensor {first * 4 // size}")
        if r >= warmup:
            res["out_s"].append(t1 - t0)
            res["in_s"].append(t3 - t2)
    return res


# ---- KvikIO: CuFile pwrite / pread per buffer ----------------------------------------------

KVIKIO_MODES = {
    # name: (label, settings applied while the mode runs)
    # KvikIO 26.10's own defaults: O_DIRECT writes where aligned, buffered reads.
    "posix": ("KvikIO POSIX (defaults)",
              {"compat_mode": "ON", "auto_direct_io_write": True, "auto_direct_io_read": False}),
    "posix-direct": ("KvikIO POSIX, O_DIRECT both ways",
                     {"compat_mode": "ON", "auto_direct_io_write": True,
                      "auto_direct_io_read": True}),
    "gds": ("KvikIO GDS", {"compat_mode": "OFF"}),
}


def kvikio_probe(kvikio, want: list[str]) -> tuple[list[str], dict]:
    """The modes that can run here, and a note for each one that cannot."""
    notes: dict = {}
    modes = []
    for m in want:
        if m not in KVIKIO_MODES:
            raise SystemExit(f"--kvikio: unknown mode {m!r} (known: {', '.join(KVIKIO_MODES)})")
        if m == "gds":
            try:
                import kvikio.cufile_driver
                if kvikio.defaults.is_compat_mode_preferred():
                    notes[m] = (f"KvikIO's compat_mode {kvikio.defaults.get('compat_mode').name} "
                                "reduces to ON here (no usable cuFile: library, /run/udev, WSL)")
                    continue
                if not kvikio.cufile_driver.get("is_gds_available"):
                    notes[m] = "cuFile reports GDS unavailable on this machine"
                    continue
            except Exception as e:  # noqa: BLE001 - any failure of the probe means "no GDS"
                notes[m] = f"cuFile could not be queried: {e!r}"
                continue
        modes.append(m)
    return modes, notes


def kvikio_round_trips(kvikio, torch, mem: TorchMem, mode: str, path: str, size: int,
                       count: int, warmup: int, reps: int, seed0: int) -> dict:
    """`count` device tensors of `size` bytes written with one pwrite each at offset
    i * size of one file, all in flight at once, then waited for; then read back likewise.
    The write is timed up to fdatasync (its bytes on the disk, as Spillway's O_DIRECT
    writes are); the file's page cache is dropped before every timed pass, untimed."""
    _, settings = KVIKIO_MODES[mode]
    conf = {k: (getattr(kvikio.CompatMode, v) if k == "compat_mode" else v)
            for k, v in settings.items()}
    total = size * count
    dev = torch.empty(total, dtype=torch.uint8, device="cuda")
    dv = list(dev.split(size))
    ref = mem.empty(total)
    res: dict = {"out_s": [], "in_s": [], "bad": 0, "checked_bytes": 0, "short": 0}
    with kvikio.defaults.set(conf):
        f = kvikio.CuFile(path, "w+")
        try:
            res["direct_io"] = bool(f.is_direct_io_supported())
            for r in range(warmup + reps):
                mem.pattern(ref, seed0 + r)
                dev.copy_(ref.view(torch.uint8))
                torch.cuda.synchronize()
                if r > 0:
                    kvikio.drop_file_page_cache(path)
                t0 = time.perf_counter()
                futs = [f.pwrite(v, size, i * size) for i, v in enumerate(dv)]
                done = sum(fu.get() for fu in futs)
                os.fdatasync(f.fileno())
                t1 = time.perf_counter()
                dev.fill_(POISON)
                torch.cuda.synchronize()
                kvikio.drop_file_page_cache(path)
                t2 = time.perf_counter()
                futs = [f.pread(v, size, i * size) for i, v in enumerate(dv)]
                done += sum(fu.get() for fu in futs)
                t3 = time.perf_counter()
                if done != 2 * total:
                    res["short"] += 1
                    log(f"DATA CHECK FAILED: kvikio {mode} round {r}: {done} bytes moved, "
                        f"expected {2 * total}")
                bad, first = mem.mismatches(dev.view(torch.int32), ref)
                res["checked_bytes"] += total
                if bad:
                    res["bad"] += bad
                    log(f"DATA CHECK FAILED: kvikio {mode} {fmt_size(size)} x {count} round "
                        f"{r}: {bad} wrong words, the first in buffer {first * 4 // size}")
                if r >= warmup:
                    res["out_s"].append(t1 - t0)
                    res["in_s"].append(t3 - t2)
        finally:
            f.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
    return res


# ---- stderr capture (Spillway's own log line naming its disk I/O path) ---------------------

@contextlib.contextmanager
def captured_fd2(lines: list):
    """Collects what is written to file descriptor 2 inside the block (the library's log
    goes there from its own threads), then writes it through to the real stderr."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            text = tmp.read().decode(errors="replace")
            sys.stderr.write(text)
            lines.extend(text.splitlines())


# ---- the run -------------------------------------------------------------------------------

def median(v: list) -> float:
    return statistics.median(v) if v else 0.0


def parse_sizes(s: str) -> list[int]:
    return [spillway.parse_size(x) for x in s.split(",") if x.strip()]


def counts(sizes: list[int], total: int, max_count: int) -> list[tuple[int, int]]:
    return [(sz, max(1, min(max_count, total // sz))) for sz in sizes]


def device_limit_for(total: int) -> int:
    # Above the working set with room for the same-sized poison buffers while the working
    # set is off the device, and below the 0.85 low watermark, so that no background or
    # on-demand spill moves anything: only the timed calls do.
    return total * 5 // 4 + 64 * MiB


class Run:
    """Options, the optional peers, and everything measured so far (so that an interrupted
    run still prints what it has)."""

    def __init__(self, a: argparse.Namespace) -> None:
        self.a = a
        self.anomalies = Anomalies()
        self.rows: list[dict] = []
        self.py_cost: list[str] = []
        self.notes: list[str] = []
        self.failures: list[str] = []
        self.raw: list[dict] = []
        self.bad = 0
        self.checked = 0
        self.torch = self.kvikio = None
        self.device = "host backend (device memory emulated in host memory)"
        self.stopped = ""
        self.disk_path = ""
        self.backend = ""

    # -- peers --------------------------------------------------------------------------
    def load_peers(self) -> None:
        a = self.a
        if self.backend == "host":
            self.notes.append("PyTorch and KvikIO: skipped (host backend: no CUDA device)")
            return
        try:
            import torch
            if not torch.cuda.is_available():
                raise RuntimeError("torch.cuda.is_available() is False")
            self.torch = torch
            self.device = torch.cuda.get_device_name()
        except Exception as e:  # noqa: BLE001 - any import or CUDA failure skips the column
            self.notes.append(f"PyTorch: skipped ({e!r})")
        if "disk" in a.tiers and a.kvikio and self.torch is not None:
            try:
                import kvikio
                import kvikio.defaults
                self.kvikio = kvikio
                kvikio.defaults.set("num_threads", a.kvikio_threads)
            except Exception as e:  # noqa: BLE001
                self.notes.append(f"KvikIO: skipped ({e!r})")
        elif "disk" in a.tiers and a.kvikio:
            self.notes.append("KvikIO: skipped (needs PyTorch for its device buffers)")

    def mem(self):
        return TorchMem(self.torch) if self.torch is not None else NumpyMem()

    def attempt(self, what: str, fn, *args):
        """fn(*args), or None if it raised: the failure is logged and reported, and the run goes
        on with the next measurement (a peer that breaks must not cost Spillway's rows)."""
        try:
            r = fn(*args)
        except Exception as e:  # noqa: BLE001
            log(f"FAILED: {what}: {e!r}\n{traceback.format_exc()}")
            self.failures.append(f"{what}: {e!r}")
            return None
        self.bad += r["bad"]
        self.checked += r["checked_bytes"]
        self.raw.append({"what": what, **r})
        return r

    # -- rows ---------------------------------------------------------------------------
    def add_rows(self, tier: str, size: int, count: int, sw: Optional[dict], peer: str,
                 pr: Optional[dict], goal_x: float) -> None:
        total = size * count
        dirs = (("device → host", "host → device") if tier == "host"
                else ("device → disk", "disk → device"))
        for key, direction in zip(("out_s", "in_s"), dirs):
            s_gbs = gbs(total, median(sw[key])) if sw else None
            p_gbs = gbs(total, median(pr[key])) if pr else None
            self.rows.append({"tier": tier, "size": size, "count": count,
                              "direction": direction, "spillway_gbs": s_gbs, "peer": peer,
                              "peer_gbs": p_gbs, "goal_x": goal_x,
                              "spillway_s": sw[key] if sw else None,
                              "peer_s": pr[key] if pr else None})

    def add_py_cost(self, tier: str, size: int, count: int, sw: Optional[dict]) -> None:
        if not sw:
            return
        if tier == "host" and min(sw["pinned_before"], default=size * count) < size * count:
            self.notes.append(f"{tier} tier {fmt_size(size)}: Spillway's arena held only "
                              f"{min(sw['pinned_before'])} pinned bytes before a timed spill "
                              "(it pinned more inside the timed pass)")
        for call, key, pass_key in (("spill_n", "out_call_s", "out_s"),
                                    ("prefetch_n", "in_call_s", "in_s")):
            c, p = median(sw[key]), median(sw[pass_key])
            self.py_cost.append(f"| {tier} | {fmt_size(size)} | {count} | {call} | "
                                f"{c * 1e6:.1f} | {c / count * 1e9:.0f} | "
                                f"{100 * c / p if p else 0:.2f}% |")

    # -- tiers --------------------------------------------------------------------------
    def host_tier(self) -> None:
        a, mem = self.a, self.mem()
        plan = counts(a.sizes, a.total, a.max_count)
        ws = max(sz * n for sz, n in plan)
        dl, hl = device_limit_for(ws), 2 * ws + GiB
        self.notes.append(f"host tier: Spillway device_limit {dl} B, host_limit {hl} B")
        t = SpillwayTier(Tier.HOST, mem, a.backend, dl, hl, a.spill_dir, self.anomalies)
        try:
            for i, (size, count) in enumerate(plan):
                what = f"{fmt_size(size)} x {count}"
                seed = 1000 * (i + 1)
                log(f"host tier: spillway {what}")
                sw = self.attempt(f"spillway host {what}", t.round_trips, size, count,
                                  a.warmup, a.reps, seed)
                self.add_py_cost("host", size, count, sw)
                pr = None
                try:
                    if self.torch is not None:
                        log(f"host tier: pytorch {what}")
                        pr = self.attempt(f"pytorch {what}", torch_round_trips, self.torch,
                                          mem, size, count, a.warmup, a.reps, seed + 500)
                        self.torch.cuda.empty_cache()
                finally:  # interrupted during the peer: Spillway's rows still count
                    self.add_rows("host", size, count, sw, "PyTorch copy_ (pinned)", pr,
                                  5.0 if size == 64 * KiB else 1.0)
        finally:
            self.close(t)

    def disk_tier(self) -> None:
        a, mem = self.a, self.mem()
        plan = counts(a.sizes, a.disk_total, a.disk_max_count)
        ws = max(sz * n for sz, n in plan)
        dl = device_limit_for(ws)
        self.notes.append(f"disk tier: Spillway device_limit {dl} B, host_limit "
                          f"{a.disk_host_limit} B (a resident buffer spilled to DISK goes "
                          f"device -> disk directly, through staging), spill dir {a.spill_dir}")
        modes: list[str] = []
        if self.kvikio is not None:
            kv = self.kvikio
            modes, why = kvikio_probe(kv, a.kvikio)
            for m, note in why.items():
                self.notes.append(f"{KVIKIO_MODES[m][0]}: skipped ({note})")
            kd = kv.defaults
            self.notes.append(f"KvikIO {kv.__version__}: {kd.get('num_threads')} threads, "
                              f"task size {kd.get('task_size')} B, bounce buffers "
                              f"{kd.get('bounce_buffer_size')} B, default compat_mode "
                              f"{getattr(kd.get('compat_mode'), 'name', kd.get('compat_mode'))}")
        t = SpillwayTier(Tier.DISK, mem, a.backend, dl, a.disk_host_limit, a.spill_dir,
                         self.anomalies)
        try:
            for i, (size, count) in enumerate(plan):
                what = f"{fmt_size(size)} x {count}"
                seed = 5000 + 1000 * i
                log(f"disk tier: spillway {what}")
                lines: list[str] = []
                with captured_fd2(lines) if i == 0 else contextlib.nullcontext():
                    sw = self.attempt(f"spillway disk {what}", t.round_trips, size, count,
                                      a.warmup, a.disk_reps, seed)
                self.disk_path = self.disk_path or next(
                    (ln.split("info: ", 1)[-1] for ln in lines if "disk tier open" in ln), "")
                self.add_py_cost("disk", size, count, sw)
                if not modes:
                    self.add_rows("disk", size, count, sw, "KvikIO", None, 1.0)
                for k, m in enumerate(modes):
                    log(f"disk tier: kvikio {m} {what}")
                    path = os.path.join(a.spill_dir, f"spw-peers-kvikio-{os.getpid()}.bin")
                    pr = None
                    try:
                        pr = self.attempt(f"kvikio {m} {what}", kvikio_round_trips,
                                          self.kvikio, self.torch, mem, m, path, size, count,
                                          a.warmup, a.disk_reps, seed + 100 * (k + 1))
                        self.torch.cuda.empty_cache()
                    finally:
                        self.add_rows("disk", size, count, sw, KVIKIO_MODES[m][0], pr, 1.0)
                    if pr and pr["short"]:
                        self.failures.append(f"kvikio {m} {what}: short transfers")
                    if pr and i == 0:
                        label, conf = KVIKIO_MODES[m]
                        self.notes.append(
                            f"{label}: {', '.join(f'{k} {v}' for k, v in conf.items())}; "
                            f"Direct I/O {'supported' if pr['direct_io'] else 'NOT supported'} "
                            "on its file handle")
        finally:
            self.close(t)

    def close(self, t: SpillwayTier) -> None:
        try:
            t.close()
        except Exception as e:  # noqa: BLE001 - reported; the run still prints its rows
            self.failures.append(f"closing the {t.tier.name.lower()} runtime: {e!r}")

    # -- report -------------------------------------------------------------------------
    def report(self) -> str:
        a = self.a
        out = []
        date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        out.append(f"Spillway peers (bench/peers/run_peers.py): device {self.device}; backend "
                   f"{self.backend or a.backend}; date {date}; commit {a.commit}")
        if self.stopped:
            out.append(f"STOPPED EARLY: {self.stopped}; the rows below are what was measured")
        out.append("")
        out.append("| tier | size | buffers | direction | Spillway GB/s | peer | peer GB/s | "
                   "Spillway / peer | goal | |")
        out.append("| --- | ---: | ---: | --- | ---: | --- | ---: | ---: | --- | --- |")
        met_all = True
        for r in self.rows:
            sw, peer = r["spillway_gbs"], r["peer_gbs"]
            if sw and peer:
                ratio = sw / peer
                ok = ratio >= r["goal_x"] if r["goal_x"] > 1 else ratio > 1.0
                met_all &= ok
                ratio_s, status = f"{ratio:.2f}", "met" if ok else "NOT met"
            else:
                ratio_s, status = "-", "no peer" if sw else "Spillway FAILED"
                met_all &= bool(sw)
            goal = f">= {r['goal_x']:g}x" if r["goal_x"] > 1 else "> 1x"
            out.append(f"| {r['tier']} | {fmt_size(r['size'])} | {r['count']} | {r['direction']} "
                       f"| {f'{sw:.2f}' if sw else 'FAILED'} | {r['peer']} | "
                       f"{f'{peer:.2f}' if peer else '-'} | {ratio_s} | {goal} | {status} |")
        out.append("")
        out.append(GOAL_LINE)
        if any(r["peer_gbs"] for r in self.rows):
            out.append(f"All rows: {'met' if met_all else 'NOT met'} (each row above says which).")
        out.append("")
        out.append(f"Medians of {a.reps} (host tier) and {a.disk_reps} (disk tier) timed round "
                   f"trips per system and size after {a.warmup} untimed warm-up round trip(s), "
                   "each system's passes back to back. First-touch costs are outside "
                   "the timed region for every system alike: Spillway's pinned arena slabs, "
                   "disk tier and spill file, PyTorch's pinned tensors, KvikIO's file, thread "
                   "pool and bounce buffers are all made before or during the warm-up. "
                   "Spillway: spill_n + wait_idle, prefetch_n + wait_idle. PyTorch: "
                   "dst.copy_(src, non_blocking=True) per tensor into preallocated pinned "
                   "tensors, one synchronize; and back. KvikIO: CuFile.pwrite per buffer, all "
                   "in flight, then wait (+ fdatasync); pread likewise; page cache dropped "
                   "before each pass.")
        for n in self.notes:
            out.append(f"- {n}")
        for f in self.failures:
            out.append(f"- FAILED: {f}")
        if self.disk_path:
            out.append(f"- Spillway's log: {self.disk_path}")
        if self.py_cost:
            out.append("")
            out.append("The Python call's share (from the call to its return: the list turned "
                       "into handles and the request queued; the engine moves the bytes "
                       "afterwards, until wait_idle returns):")
            out.append("")
            out.append("| tier | size | buffers | call | µs per call | ns per buffer | "
                       "share of the timed pass |")
            out.append("| --- | ---: | ---: | --- | ---: | ---: | ---: |")
            out.extend(self.py_cost)
        out.append("")
        ok = self.bad == 0 and not self.anomalies.items
        out.append(f"data check: {'ok' if ok else 'FAILED'} ({self.checked / GiB:.2f} GiB "
                   f"compared byte for byte after every round trip, warm-ups included: "
                   f"{self.bad} wrong words; {len(self.anomalies.items)} unexpected states or "
                   "byte counts" + (": see stderr" if self.anomalies.items else "") + ")")
        return "\n".join(out)

    def json(self) -> dict:
        return {"device": self.device, "backend": self.backend, "commit": self.a.commit,
                "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
                "rows": self.rows, "notes": self.notes, "disk_path": self.disk_path,
                "bad_words": self.bad, "checked_bytes": self.checked, "raw": self.raw,
                "anomalies": self.anomalies.items, "failures": self.failures,
                "stopped": self.stopped,
                "options": {k: v for k, v in vars(self.a).items()}}


def parse_args(argv: Optional[list] = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true",
                    help="other defaults: sizes 4KiB,64KiB,1MiB, 4 MiB per size, 2 repetitions")
    ap.add_argument("--sizes", help="default 4KiB,64KiB,1MiB,256MiB")
    ap.add_argument("--total", help="host tier: bytes per size (default 1GiB)")
    ap.add_argument("--max-count", type=int, default=262144, help="host tier: most buffers")
    ap.add_argument("--disk-total", help="disk tier: bytes per size (default 1GiB)")
    ap.add_argument("--disk-max-count", type=int, default=16384,
                    help="disk tier: most buffers (4 KiB: 64 MiB)")
    ap.add_argument("--reps", type=int, help="host tier: timed round trips (default 5)")
    ap.add_argument("--disk-reps", type=int, help="disk tier: timed round trips (default 3)")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--tiers", default="host,disk")
    ap.add_argument("--backend", default="auto", choices=["auto", "cuda", "host"])
    ap.add_argument("--spill-dir", default=os.environ.get("SPILLWAY_SPILL_DIR")
                    or os.environ.get("TMPDIR") or "/tmp")
    ap.add_argument("--disk-host-limit", default="1MiB")
    ap.add_argument("--kvikio", default="posix,posix-direct,gds",
                    help="KvikIO modes to run ('' for none): posix, posix-direct, gds")
    ap.add_argument("--kvikio-threads", type=int, default=16,
                    help="KvikIO's thread pool (its default is 1)")
    ap.add_argument("--commit", default=os.environ.get("SPW_COMMIT", "unknown"))
    ap.add_argument("--json", help="write every measurement here")
    ap.add_argument("--markdown", help="write the report here too")
    a = ap.parse_args(argv)
    defaults = (dict(sizes="4KiB,64KiB,1MiB", total="4MiB", disk_total="4MiB", reps=2,
                     disk_reps=2) if a.smoke else
                dict(sizes="4KiB,64KiB,1MiB,256MiB", total="1GiB", disk_total="1GiB", reps=5,
                     disk_reps=3))
    for k, v in defaults.items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    a.sizes = parse_sizes(a.sizes)
    a.total, a.disk_total = spillway.parse_size(a.total), spillway.parse_size(a.disk_total)
    a.disk_host_limit = spillway.parse_size(a.disk_host_limit)
    a.tiers = [t for t in a.tiers.split(",") if t]
    a.kvikio = [m for m in a.kvikio.split(",") if m]
    if any(t not in ("host", "disk") for t in a.tiers):
        ap.error("--tiers: host, disk")
    if any(sz % 4 for sz in a.sizes) or min(a.reps, a.disk_reps) < 1 or a.warmup < 0:
        ap.error("sizes must be multiples of 4 bytes; --reps, --disk-reps >= 1, --warmup >= 0")
    return a


def main(argv: Optional[list] = None) -> int:
    a = parse_args(argv)
    run = Run(a)
    # The backend is known once a runtime exists; a throwaway one answers before the peers
    # are loaded (PyTorch is not even imported on the host backend).
    with spillway.Runtime(backend=a.backend, device_limit=64 * MiB,
                          host_device_bytes=256 * MiB) as probe:
        run.backend = "cuda" if probe.backend == spillway.Backend.CUDA else "host"
    run.load_peers()
    run.notes.append(f"patterns written and checked in {run.mem().name}")
    try:
        if "host" in a.tiers:
            run.host_tier()
        if "disk" in a.tiers:
            run.disk_tier()
    except KeyboardInterrupt:  # the wrapper's time limit sends SIGINT: report what we have
        run.stopped = "interrupted (time limit)"
    text = run.report()
    print(text, flush=True)
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write(text + "\n")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(run.json(), f, indent=1)
    clean = run.bad == 0 and not run.anomalies.items and not run.failures
    return 0 if clean and not run.stopped else 1


if __name__ == "__main__":
    sys.exit(main())
