# SPDX-License-Identifier: Apache-2.0
"""Numba device allocation + free through three memory managers, in one run.

For each size (1 KiB, 1 MiB, 64 MiB) and each manager, a fresh process (a memory manager
is chosen once per process, before the first CUDA context) times
``d = cuda.device_array(size); del d`` in a loop, synchronizing at the end. Managers:
``builtin`` (Numba's own, cuMemAlloc with deferred frees), ``spillway``
(spillway.numba.SpillwayNumbaManager), ``rmm`` (rmm.allocators.numba.RMMNumbaManager on
RMM's default resource) and ``rmm-pool`` (the same on a pool resource). A manager that
cannot be imported is reported as missing. Goal (issue 8): spillway <= 1.2x builtin and no
slower than RMM.

    python bench/python/bench_alloc.py [--json OUT.json]
"""
import argparse
import json
import os
import subprocess
import sys
import time

SIZES = [(1 << 10, "1 KiB", 20000), (1 << 20, "1 MiB", 5000), (64 << 20, "64 MiB", 500)]
MANAGERS = ["builtin", "spillway", "rmm", "rmm-pool"]


def child(manager: str) -> None:
    import numpy as np
    from numba import cuda
    if manager == "spillway":
        import spillway.numba as sn
        cuda.set_memory_manager(sn.SpillwayNumbaManager)
    elif manager.startswith("rmm"):
        import rmm
        from rmm.allocators.numba import RMMNumbaManager
        rmm.reinitialize(pool_allocator=manager == "rmm-pool", initial_pool_size=1 << 30
                         if manager == "rmm-pool" else None)
        cuda.set_memory_manager(RMMNumbaManager)
    cuda.current_context()
    res = {}
    for size, label, iters in SIZES:
        for _ in range(min(iters // 10, 200)):  # warm up: pools, caches
            d = cuda.device_array(size, np.uint8)
            del d
        cuda.synchronize()
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(iters):
                d = cuda.device_array(size, np.uint8)
                del d
            cuda.synchronize()
            best = min(best, (time.perf_counter() - t0) / iters)
        res[label] = best * 1e6
    print(json.dumps({"manager": type(cuda.current_context().memory_manager).__name__,
                      "us": res}))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--child")
    ap.add_argument("--json")
    a = ap.parse_args()
    if a.child:
        child(a.child)
        return
    env = dict(os.environ)
    env.pop("NUMBA_CUDA_MEMORY_MANAGER", None)
    results = {}
    for m in MANAGERS:
        r = subprocess.run([sys.executable, __file__, "--child", m], capture_output=True,
                           text=True, env=env, timeout=600)
        if r.returncode != 0:
            results[m] = None
            print(f"{m}: not measured ({r.stderr.strip().splitlines()[-1:]})")
            continue
        results[m] = json.loads(r.stdout.strip().splitlines()[-1])["us"]
    print("\n| size | builtin us | spillway us | rmm us | rmm-pool us | spillway / builtin "
          "| spillway / rmm | spillway / rmm-pool |")
    print("|---|---|---|---|---|---|---|---|")
    for _, label, _ in SIZES:
        def us(m):
            return results[m][label] if results.get(m) else float("nan")
        sp = us("spillway")
        print(f"| {label} | {us('builtin'):.2f} | {sp:.2f} | {us('rmm'):.2f} | "
              f"{us('rmm-pool'):.2f} | {sp / us('builtin'):.2f}x | {sp / us('rmm'):.2f}x | "
              f"{sp / us('rmm-pool'):.2f}x |")
    print("goal: spillway <= 1.2x builtin, and no slower than rmm")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
