# SPDX-License-Identifier: Apache-2.0
"""Dask on several GPUs (issue 23, part 3): one worker per GPU, each with its own Spillway
budget, on a computation `factor` (3) times the workers' budgets together; the result
checked exactly against NumPy; per-worker spill statistics in a table and a JSON file.

The cluster is spillway.dask.local_cuda_cluster: one Nanny per GPU, each worker's
CUDA_VISIBLE_DEVICES rotated so that its own GPU comes first (as dask-cuda does), the
Spillway worker plugin with `--budget` on each. Without a GPU (or with --backend host) the
workers use the host backend (device memory emulated in host memory) and still get a
different CUDA_VISIBLE_DEVICES each: that is how tests/python/test_dask_multi.py runs it.

The computation, on int64 blocks of `--block` bytes (deferrable arrays on the workers,
N = factor x workers x budget / block of them, all alive at once after step 1):

1. gen:  block_i[k] = (k*A + i*B) mod 2**31, made on the worker (a Numba kernel on the
   GPU, NumPy on the host backend); the client waits for all N, so that the workers' data
   is `factor` times their budgets together and most of it spilled;
2. mix (the shuffle-ish step): mixed_j = 3*block_j - block_p(j) + j with
   p(j) = (j + N//2 + 1) mod N, a block that usually lives on another worker (it travels
   through the host and arrives as a deferrable array in the reader's runtime);
3. reduce: each mixed block's checksums sum(x) and sum(x * (k & 15)) (int64, wrapping;
   on the GPU a kernel with atomics into a small Numba device array, allocated through
   Spillway's EMM plugin), then one task sums them (mod 2**64).

The check: every block's checksums against NumPy's (the map is linear, so they follow from
each base block's two sums, computed on the client in a thread pool), and a few mixed
blocks gathered whole and compared element by element. Exit status 0 only if all of it
matches and no worker counted a failed move.

    python bench/python/dask_multi_gpu.py --out DIR              # all GPUs, 2 GiB each
    python bench/python/dask_multi_gpu.py --backend host --workers 2 --budget 4MiB \\
        --block 512KiB --out DIR                                   # CI-sized, no GPU
"""
import argparse
import concurrent.futures
import json
import os
import sys
import time

import numpy as np

import spillway
import spillway.dask as sd

A, B, M = 2654435761, 40503, 1 << 31
MASK = (1 << 64) - 1
MiB = 1 << 20


# -- the tasks (run on the workers; pickled by value with this script) -----------------------
def _kernels():
    """This worker's compiled kernels (once per worker, kept on the Worker object: the
    script's globals are copied into every task, so they cannot cache them)."""
    from distributed import get_worker
    w = get_worker()
    k = getattr(w, "_spw_multi_kernels", None)
    if k is not None:
        return k
    from numba import cuda

    import spillway.numba as sn

    def fill(out, i, a, b, m):
        k = cuda.grid(1)
        if k < out.size:
            out[k] = (k * a + i * b) % m

    def mix(x, y, out, j):
        k = cuda.grid(1)
        if k < out.size:
            out[k] = 3 * x[k] - y[k] + j

    def checksum(x, res):
        s1 = 0
        s2 = 0
        for k in range(cuda.grid(1), x.size, cuda.gridsize(1)):
            v = x[k]
            s1 += v
            s2 += v * (k & 15)
        cuda.atomic.add(res, 0, s1)
        cuda.atomic.add(res, 1, s2)

    k = (sn.jit(fill), sn.jit(mix), sn.jit(checksum))
    w._spw_multi_kernels = k
    return k


def _on_gpu():
    return sd.runtime().backend == spillway.Backend.CUDA


def gen(i, n):
    """Base block i: n int64 elements on this worker."""
    rt = sd.runtime()
    out = spillway.DeferrableArray(rt, (n,), np.int64)
    if _on_gpu():
        from numba import cuda
        fill = _kernels()[0]
        fill[(n + 255) // 256, 256](out, i, A, B, M)
        cuda.synchronize()
    else:
        out.copy_from_host((np.arange(n, dtype=np.int64) * A + i * B) % M)
    return out


def mix(j, x, y):
    """3*x - y + j as a new deferrable block on this worker."""
    out = spillway.DeferrableArray(sd.runtime(), x.shape, np.int64)
    if _on_gpu():
        import spillway.numba as sn
        from numba import cuda
        kernel = _kernels()[1]
        kernel[(x.size + 255) // 256, 256](sn.read_only(x), sn.read_only(y), out, j)
        cuda.synchronize()
    else:
        out.copy_from_host(3 * x.copy_to_host() - y.copy_to_host() + j)
    return out


def checksum(x):
    """(sum(x), sum(x * (k & 15))) mod 2**64."""
    if _on_gpu():
        import spillway.numba as sn
        from numba import cuda
        kernel = _kernels()[2]
        res = cuda.to_device(np.zeros(2, np.int64))  # Numba memory: through the EMM plugin
        kernel[1024, 256](sn.read_only(x), res)
        cuda.synchronize()
        s = res.copy_to_host()
        return int(s[0]) & MASK, int(s[1]) & MASK
    h = x.copy_to_host()
    w = np.arange(h.size, dtype=np.int64) & 15
    return int(h.sum()) & MASK, int((h * w).sum()) & MASK


def total(sums):
    return sum(s for s, _ in sums) & MASK, sum(t for _, t in sums) & MASK


# -- the client's side ---------------------------------------------------------------------------
def partner(j, nblocks):
    return (j + nblocks // 2 + 1) % nblocks


def base_block(i, n):
    return (np.arange(n, dtype=np.int64) * A + i * B) % M


def base_sums(i, n):
    b = base_block(i, n)
    return int(b.sum()) & MASK, int((b * (np.arange(n, dtype=np.int64) & 15)).sum()) & MASK


def expected_checksums(nblocks, n, threads):
    """Every mixed block's checksums from NumPy: the map is linear over int64's wrapping
    arithmetic, so mixed_j's sums are 3*S(j) - S(p(j)) + j*sum(weights)."""
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        base = list(pool.map(lambda i: base_sums(i, n), range(nblocks)))
    wsum = int((np.arange(n, dtype=np.int64) & 15).sum())
    out = []
    for j in range(nblocks):
        p = partner(j, nblocks)
        out.append(((3 * base[j][0] - base[p][0] + j * n) & MASK,
                    (3 * base[j][1] - base[p][1] + j * wsum) & MASK))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=None,
                    help="workers (default: one per visible GPU; 2 on the host backend)")
    ap.add_argument("--backend", default="auto", choices=["auto", "cuda", "host"])
    ap.add_argument("--budget", default="2GiB",
                    help="each worker's device budget (default 2GiB); a comma list gives "
                         "one per worker")
    ap.add_argument("--block", default="64MiB", help="bytes per block (default 64MiB)")
    ap.add_argument("--factor", type=float, default=3.0,
                    help="working set / the budgets together (default 3)")
    ap.add_argument("--host-device-bytes", default=None,
                    help="host backend: emulated device size (default: 2x the budget)")
    ap.add_argument("--host-limit", default=None, help="each worker's host limit")
    ap.add_argument("--spill-dir", default=None)
    ap.add_argument("--threads", type=int, default=1, help="threads per worker (default 1)")
    ap.add_argument("--compare", type=int, default=4,
                    help="mixed blocks gathered whole and compared (default 4)")
    ap.add_argument("--timeout", type=float, default=300, help="seconds for the computation")
    ap.add_argument("--out", default=".", help="directory for dask-multi.json")
    args = ap.parse_args(argv)

    budgets = [spillway.parse_size(b) for b in args.budget.split(",")]
    block = spillway.parse_size(args.block)
    n = block // 8
    if n < 1:
        ap.error("--block must be at least 8 bytes")
    budget_kw = budgets[0] if len(budgets) == 1 else budgets
    hdb = args.host_device_bytes or 2 * max(budgets)
    t0 = time.perf_counter()
    cluster = sd.local_cuda_cluster(
        args.workers, device_limit=budget_kw, backend=args.backend, host_device_bytes=hdb,
        host_limit=args.host_limit, spill_dir=args.spill_dir,
        threads_per_worker=args.threads, plugin_options={"log_level": "error"})
    from distributed import Client, wait
    times = {}
    with cluster, Client(cluster) as client:
        times["start_s"] = time.perf_counter() - t0
        devices = client.run(sd.worker_device)
        nworkers = len(devices)
        per_worker = budgets if len(budgets) == nworkers else [budgets[0]] * nworkers
        nblocks = max(2, int(args.factor * sum(per_worker) // block))
        backend = next(iter(devices.values()))["backend"]
        print(f"{nworkers} workers on the {backend} backend, budgets "
              f"{[b // MiB for b in per_worker]} MiB; {nblocks} blocks of {block / MiB:g} MiB "
              f"= {nblocks * block / MiB:g} MiB ({nblocks * block / sum(per_worker):.2f}x)",
              flush=True)

        t = time.perf_counter()
        blocks = client.map(gen, range(nblocks), n=n, pure=False)
        wait(blocks, timeout=args.timeout)
        times["gen_s"] = time.perf_counter() - t
        after_gen = sd.cluster_stats(client)

        t = time.perf_counter()
        mixed = [client.submit(mix, j, blocks[j], blocks[partner(j, nblocks)], pure=False)
                 for j in range(nblocks)]
        sums = client.map(checksum, mixed, pure=False)
        tot = client.submit(total, sums, pure=False)
        got_total = tot.result(timeout=args.timeout)
        got_sums = client.gather(sums)
        times["mix_reduce_s"] = time.perf_counter() - t
        stats = sd.cluster_stats(client)
        sample = sorted({0, nblocks - 1} | {int(j) for j in
                        np.linspace(0, nblocks - 1, max(args.compare, 0))}) \
            if args.compare > 0 else []
        whole = client.gather([mixed[j] for j in sample])
        who = client.who_has(mixed)
        del blocks, mixed, sums, tot

    t = time.perf_counter()
    want = expected_checksums(nblocks, n, min(8, os.cpu_count() or 1))
    want_total = (sum(s for s, _ in want) & MASK, sum(w for _, w in want) & MASK)
    bad_blocks = [j for j in range(nblocks) if tuple(got_sums[j]) != want[j]]
    bad_whole = []
    for j, arr in zip(sample, whole):
        ref = 3 * base_block(j, n) - base_block(partner(j, nblocks), n) + j
        if not np.array_equal(np.asarray(arr), ref):
            bad_whole.append(j)
    times["check_s"] = time.perf_counter() - t
    ok = not bad_blocks and not bad_whole and tuple(got_total) == want_total

    workers = {}
    for addr, dev in devices.items():
        st = dict(stats[addr])
        st["after_gen"] = {k: after_gen[addr][k] for k in
                           ("spills", "spill_bytes", "device_bytes", "host_bytes",
                            "disk_bytes")}
        st["mixed_blocks_held"] = sum(addr in w for w in who.values())
        workers[str(dev["name"])] = {**dev, **st}
    uuids = [w["uuid"] for w in workers.values()]
    cvd = [w["cuda_visible_devices"] for w in workers.values()]
    report = {
        "backend": backend, "workers": workers, "n_workers": nworkers,
        "budgets": per_worker, "block_bytes": block, "blocks": nblocks,
        "working_set_bytes": nblocks * block,
        "factor": nblocks * block / sum(per_worker), "times": times,
        "distinct_cuda_visible_devices": len(set(cvd)) == len(cvd),
        "distinct_gpus": (None if backend != "cuda" else
                          None not in uuids and len(set(uuids)) == len(uuids)),
        "result": {"ok": ok, "total": list(got_total), "expected_total": list(want_total),
                   "blocks_checked": nblocks, "bad_blocks": bad_blocks[:20],
                   "compared_whole": sample, "bad_whole": bad_whole},
    }
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "dask-multi.json")
    with open(path, "w") as f:
        json.dump(report, f, indent=1)

    print(f"{'worker':>6} {'CUDA_VISIBLE_DEVICES':>20} {'GPU (PCI)':>14} {'budget':>8} "
          f"{'spills':>7} {'spill MiB':>9} {'unspills':>8} {'unsp MiB':>8} {'demote':>6} "
          f"{'disk rd':>7} {'dev MiB':>7} {'host MiB':>8} {'disk MiB':>8} {'fail':>4}")
    for name, w in workers.items():
        print(f"{name:>6} {str(w['cuda_visible_devices']):>20} {str(w['pci_bus_id'] or '-'):>14} "
              f"{w['device_limit'] // MiB:>7}M {w['spills']:>7} {w['spill_bytes'] // MiB:>9} "
              f"{w['unspills']:>8} {w['unspill_bytes'] // MiB:>8} {w['demotions']:>6} "
              f"{w['disk_reads']:>7} {w['device_bytes'] // MiB:>7} {w['host_bytes'] // MiB:>8} "
              f"{w['disk_bytes'] // MiB:>8} {w['failures']:>4}")
    print("times: " + ", ".join(f"{k} {v:.1f}" for k, v in times.items()))
    failures = sum(w["failures"] for w in workers.values())
    print(f"result {'OK' if ok else 'WRONG'}: {nblocks} block checksums, "
          f"{len(sample)} whole blocks compared ({len(bad_blocks)} + {len(bad_whole)} wrong); "
          f"distinct CUDA_VISIBLE_DEVICES {report['distinct_cuda_visible_devices']}, "
          f"distinct GPUs {report['distinct_gpus']}; failures {failures}; {path}")
    return 0 if ok and failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
