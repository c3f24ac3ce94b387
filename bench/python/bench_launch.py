# SPDX-License-Identifier: Apache-2.0
"""Added cost of a kernel launch with 4 deferrable arguments over 4 plain device arrays.

One kernel body, compiled twice: plain ``cuda.jit`` launched with 4 Numba device arrays,
and ``spillway.numba.jit`` (the launch extension) launched with 4 resident deferrable
arrays (each launch acquires them on the stream and schedules their release). Also the
extension kernel with the 4 plain arrays (the extension's cost on arguments that are not
deferrable). Launches are asynchronous, on one user stream, 1 block of 32 threads over
1024 elements; time per launch = wall time of N launches + one synchronize, best of 7.
Goal (issue 8): (deferrable - plain) / plain <= 25%.

    NUMBA_CUDA_MEMORY_MANAGER=spillway.numba python bench/python/bench_launch.py
"""
import argparse
import json
import time

import numpy as np
from numba import cuda

import spillway.numba as sn


def body(a, b, c, d):
    i = cuda.grid(1)
    if i < a.size:
        a[i] += b[i] + c[i] + d[i]


def per_launch(kernel, args, stream, n):
    kernel[1, 32, stream](*args)
    stream.synchronize()
    best = float("inf")
    for _ in range(7):
        t0 = time.perf_counter()
        for _ in range(n):
            kernel[1, 32, stream](*args)
        stream.synchronize()
        best = min(best, (time.perf_counter() - t0) / n)
    return best * 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=20000)
    ap.add_argument("--json")
    a = ap.parse_args()
    plain_k, ext_k = cuda.jit(body), sn.jit(body)
    s = cuda.stream()
    plain = [cuda.to_device(np.ones(1024, np.float32)) for _ in range(4)]
    defer = [sn.to_device(np.ones(1024, np.float32)) for _ in range(4)]
    r = {"plain": per_launch(plain_k, plain, s, a.n),
         "extension, plain arrays": per_launch(ext_k, plain, s, a.n),
         "extension, deferrable arrays": per_launch(ext_k, defer, s, a.n)}
    sn.runtime().wait_idle()
    base = r["plain"]
    print("| launch (4 array arguments) | us per launch | added over plain |")
    print("|---|---|---|")
    for k, v in r.items():
        print(f"| {k} | {v:.2f} | {100 * (v - base) / base:+.1f}% |")
    print("goal: deferrable arrays add <= 25% to a plain launch")
    assert all(x.lock_count == 0 for x in defer)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(r, f, indent=1)


if __name__ == "__main__":
    main()
