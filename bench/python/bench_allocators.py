# SPDX-License-Identifier: Apache-2.0
"""Allocation + free through CuPy's, PyTorch's and cuda.core's allocator hooks: the library's
own allocator, Spillway's, and RMM's (default and pool resource), in one run.

Each (library, allocator) pair runs in a fresh process (an allocator is chosen once per
process, PyTorch's before its first CUDA allocation) and times ``x = alloc(size); del x``
at 1 KiB, 1 MiB and 64 MiB, synchronizing at the end; the best of 5 loops. A pair whose
modules cannot be imported is reported as not measured. Goal (issue 22): Spillway no slower
than RMM's pool at each size.

    python bench/python/bench_allocators.py [--json OUT.json] [--libs cupy,torch,cuda.core]
"""
import argparse
import json
import subprocess
import sys
import time

SIZES = [(1 << 10, "1 KiB", 20000), (1 << 20, "1 MiB", 5000), (64 << 20, "64 MiB", 500)]
# spillway-ipc: the same, on a runtime created with ipc=True (SPILLWAY_IPC=1), whose large
# blocks come from cudaMalloc'd arenas the runtime divides itself instead of the stream-ordered
# pool (docs/api.md, "Sharing buffers between processes")
ALLOCATORS = {
    "cupy": ["own", "spillway", "spillway-ipc", "rmm", "rmm-pool"],
    # spillway-mempool: PyTorch's caching allocator over a MemPool of Spillway's allocator
    "torch": ["own", "spillway", "spillway-ipc", "spillway-mempool", "rmm", "rmm-pool"],
    "cuda.core": ["own", "spillway", "spillway-ipc"],
}


def _rmm(pool: bool) -> None:
    import rmm
    rmm.reinitialize(pool_allocator=pool, initial_pool_size=(1 << 30) if pool else None)


def _spillway_config(how: str) -> None:
    import spillway.process as P
    P.configure(device_limit="8GiB", ipc=how == "spillway-ipc")


def setup(lib: str, how: str):
    """Returns alloc(size) -> object whose deletion frees, and sync()."""
    if lib == "cupy":
        import cupy
        if how in ("spillway", "spillway-ipc"):
            _spillway_config(how)
            import spillway.cupy as sc
            cupy.cuda.set_allocator(sc.malloc)
        elif how.startswith("rmm"):
            _rmm(how == "rmm-pool")
            from rmm.allocators.cupy import rmm_cupy_allocator
            cupy.cuda.set_allocator(rmm_cupy_allocator)
        return (lambda n: cupy.empty(n, dtype=cupy.uint8)), cupy.cuda.Device().synchronize
    if lib == "torch":
        import torch
        ctx = None
        if how in ("spillway", "spillway-ipc"):
            _spillway_config(how)
            import spillway.torch as st
            st.install()
        elif how == "spillway-mempool":
            _spillway_config(how)
            import spillway.torch as st
            ctx = torch.cuda.use_mem_pool(st.mem_pool())
            ctx.__enter__()
        elif how.startswith("rmm"):
            _rmm(how == "rmm-pool")
            from rmm.allocators.torch import rmm_torch_allocator
            torch.cuda.memory.change_current_allocator(rmm_torch_allocator)
        return (lambda n: torch.empty(n, dtype=torch.uint8, device="cuda")), torch.cuda.synchronize
    if lib == "cuda.core":
        try:
            from cuda.core import Device
        except ImportError:
            from cuda.core.experimental import Device
        d = Device()
        d.set_current()
        s = d.default_stream
        if how in ("spillway", "spillway-ipc"):
            _spillway_config(how)
            from spillway.cuda_core import SpillwayMemoryResource
            mr = SpillwayMemoryResource(d.device_id)
        else:
            mr = d.memory_resource
        return (lambda n: mr.allocate(n, stream=s)), d.sync
    raise ValueError(lib)


def child(lib: str, how: str) -> None:
    alloc, sync = setup(lib, how)
    res = {}
    for size, label, iters in SIZES:
        for _ in range(min(iters // 10, 200)):  # warm up: pools, caches, stream registration
            x = alloc(size)
            del x
        sync()
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(iters):
                x = alloc(size)
                del x
            sync()
            best = min(best, (time.perf_counter() - t0) / iters)
        res[label] = best * 1e6
    print(json.dumps({"us": res}))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", nargs=2)
    ap.add_argument("--json")
    ap.add_argument("--libs", default="cupy,torch,cuda.core")
    a = ap.parse_args()
    if a.child:
        child(*a.child)
        return
    results: dict = {}
    for lib in a.libs.split(","):
        results[lib] = {}
        for how in ALLOCATORS[lib]:
            r = subprocess.run([sys.executable, __file__, "--child", lib, how],
                               capture_output=True, text=True, timeout=600)
            if r.returncode != 0:
                results[lib][how] = None
                print(f"{lib} {how}: not measured ({r.stderr.strip().splitlines()[-1:]})")
                continue
            results[lib][how] = json.loads(r.stdout.strip().splitlines()[-1])["us"]
        hows = ALLOCATORS[lib]
        print(f"\n{lib}: microseconds per allocation + free")
        print("| size | " + " | ".join(hows) + " | spillway / rmm-pool | spillway-ipc / rmm-pool |")
        print("|---|" + "---|" * (len(hows) + 2))
        for _, label, _ in SIZES:
            def us(h):
                v = results[lib].get(h)
                return v[label] if v else float("nan")
            ratio = us("spillway") / us("rmm-pool") if "rmm-pool" in hows else float("nan")
            ipc = us("spillway-ipc") / us("rmm-pool") if "rmm-pool" in hows else float("nan")
            print(f"| {label} | " + " | ".join(f"{us(h):.2f}" for h in hows) +
                  f" | {ratio:.2f}x | {ipc:.2f}x |")
    print("goal: spillway no slower than rmm-pool at each size")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
