# SPDX-License-Identifier: Apache-2.0
"""A Numba workload streaming over 3x the device budget in deferrable arrays, against the
transfer floor measured in the same run.

`factor` x budget of float32 deferrable arrays (default 4 GiB budget, 12 GiB of 64 MiB
arrays), swept `passes` times in order by a light kernel (x += 1) launched with the
Spillway extension on one stream; `depth` arrays ahead are prefetched (0: none), so
transfers overlap compute. The first pass fills the device; the timed passes follow.
The floors follow bench/oversubscribe.c: the link is measured with pinned copies of
array-sized pieces each way and both ways at once (two streams); duplex floor =
max(out / D2H, in / H2D, (out + in) / both-ways rate) on the bytes that moved (Spillway's
statistics), and the same on the bytes LRU must move (every array in, and out dirty).
At the end every array is checked (its value = passes run). Goal (issue 8): <= 1.5x the
transfer floor.

    NUMBA_CUDA_MEMORY_MANAGER=spillway.numba python bench/python/bench_stream.py
"""
import argparse
import json
import time

import numpy as np
from numba import cuda

import spillway
import spillway.numba as sn

MiB = 1 << 20


@sn.jit
def inc(x):
    i = cuda.grid(1)
    if i < x.size:
        x[i] += 1.0


def measure_link(nbytes, reps=4):
    """GB/s of pinned copies: D2H, H2D, and both at once on two streams."""
    n = nbytes // 4
    h1, h2 = cuda.pinned_array(n, np.float32), cuda.pinned_array(n, np.float32)
    d1, d2 = cuda.device_array(n, np.float32), cuda.device_array(n, np.float32)
    s1, s2 = cuda.stream(), cuda.stream()

    def timed(fn):
        fn()
        cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        cuda.synchronize()
        return (time.perf_counter() - t0) / reps

    d2h = nbytes / timed(lambda: d1.copy_to_host(h1, stream=s1)) / 1e9
    h2d = nbytes / timed(lambda: d2.copy_to_device(h2, stream=s2)) / 1e9
    both = 2 * nbytes / timed(lambda: (d1.copy_to_host(h1, stream=s1),
                                        d2.copy_to_device(h2, stream=s2))) / 1e9
    return d2h, h2d, both


def duplex_floor(link, out, inn):
    d2h, h2d, both = (x * 1e9 for x in link)
    serial = out / d2h + inn / h2d
    return min(serial, max(out / d2h, inn / h2d, (out + inn) / both))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget", default="4GiB")
    ap.add_argument("--array", default="64MiB")
    ap.add_argument("--factor", type=float, default=3.0)
    ap.add_argument("--passes", type=int, default=3)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--json")
    a = ap.parse_args()
    budget, size = spillway.parse_size(a.budget), spillway.parse_size(a.array)
    sn.configure(device_limit=budget)
    rt = sn.runtime()
    link = measure_link(size)
    count = int(a.factor * budget // size)
    n = size // 4
    s = cuda.stream()
    arrays = [sn.device_array(n, np.float32) for _ in range(count)]
    zero = np.zeros(n, np.float32)
    for x in arrays:
        x.copy_from_host(zero)
    grid = (n + 255) // 256

    def sweep():
        for i, x in enumerate(arrays):
            if a.depth:
                nxt = arrays[(i + a.depth) % count]
                nxt.prefetch(s)
            inc[grid, 256, s](x)
        s.synchronize()

    sweep()  # warm: compile, fill the device
    rt.wait_idle()
    st0 = rt.stats()
    t0 = time.perf_counter()
    for _ in range(a.passes - 1):
        sweep()
    wall = time.perf_counter() - t0
    rt.wait_idle()
    st1 = rt.stats()
    out = (st1.spill_bytes - st0.spill_bytes) + (st1.disk_write_bytes - st0.disk_write_bytes)
    inn = (st1.unspill_bytes - st0.unspill_bytes) + (st1.disk_read_bytes - st0.disk_read_bytes)
    timed_passes = a.passes - 1
    lru = timed_passes * count * size
    floor = duplex_floor(link, out, inn)
    floor_lru = duplex_floor(link, lru, lru)
    for x in arrays[:: max(1, count // 16)]:
        got = x.copy_to_host()
        assert (got == a.passes).all(), f"wrong contents: {got[:4]}"
    r = {"budget": budget, "array": size, "arrays": count, "timed_passes": timed_passes,
         "wall_s": wall, "out_bytes": out, "in_bytes": inn, "link_gbps": link,
         "duplex_floor_s": floor, "lru_floor_s": floor_lru}
    print(f"link GB/s: D2H {link[0]:.1f}, H2D {link[1]:.1f}, both ways {link[2]:.1f}")
    print(f"{count} arrays of {size >> 20} MiB = {a.factor:.1f}x a {budget >> 30} GiB budget, "
          f"{timed_passes} timed passes, prefetch depth {a.depth}")
    print("| wall s | moved out GiB | moved in GiB | duplex floor s | time / floor | "
          "time / floor at LRU bytes |")
    print("|---|---|---|---|---|---|")
    print(f"| {wall:.3f} | {out / 2**30:.2f} | {inn / 2**30:.2f} | {floor:.3f} | "
          f"{wall / floor:.2f}x | {wall / floor_lru:.2f}x |")
    print("goal: <= 1.5x the transfer floor; contents verified")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(r, f, indent=1)


if __name__ == "__main__":
    main()
