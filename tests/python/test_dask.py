# SPDX-License-Identifier: Apache-2.0
"""spillway.dask with a real distributed.LocalCluster on the host backend (on the GPU machine
run_gpu.sh's `dask` phase runs the same tests with SPILLWAY_DASK_BACKEND=cuda): two workers,
each with its own runtime; a computation whose deferrable data is 3x the workers' device
budgets together; the right result; spills counted per worker (client.run and Prometheus);
clean teardown, with no Spillway thread or spill file left behind. Skipped without dask."""
import json
import os
import threading
import urllib.request

import numpy as np
import pytest

distributed = pytest.importorskip("distributed")
from distributed import Client, LocalCluster  # noqa: E402

import spillway  # noqa: E402
from spillway.dask import DaskPolicy, SpillwayPlugin, cluster_stats, to_device  # noqa: E402
from watchdog import watchdog  # noqa: E402,F401 (autouse fixture)

MiB = 1 << 20
DEADLINE_S = 240.0
BACKEND = os.environ.get("SPILLWAY_DASK_BACKEND", "host")
BUDGET = spillway.parse_size(os.environ.get("SPILLWAY_DASK_BUDGET", "16MiB"))
CHUNK = 2 * MiB
NCHUNKS = 3 * 2 * BUDGET // CHUNK  # 3x the two workers' budgets together


def make(i):
    """A chunk of deferrable data on the worker that runs this task."""
    return to_device(np.arange(CHUNK // 8, dtype=np.float64) + i)


def mix(a, b):
    """A new deferrable chunk from two (b may come from the other worker)."""
    return to_device(a.copy_to_host() * 2 - b.copy_to_host())


def total(parts):
    return float(sum(p.copy_to_host().sum() for p in parts))


def expected():
    base = np.arange(CHUNK // 8, dtype=np.float64)
    return float(sum(((base + i) * 2 - (base + (i + 1) % NCHUNKS)).sum()
                     for i in range(NCHUNKS)))


def spillway_threads():
    """OS threads of this process that Spillway's host backend started (named by it)."""
    n = 0
    for t in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{t}/comm") as f:
                n += f.read().strip() == "spw-host-stream"
        except OSError:
            pass
    return n


def run(client):
    chunks = client.map(make, range(NCHUNKS), pure=False)
    distributed.wait(chunks)  # all of it at once: 3x the budgets
    mixed = [client.submit(mix, chunks[i], chunks[(i + 1) % NCHUNKS], pure=False)
             for i in range(NCHUNKS)]
    return client.submit(total, mixed).result()


def check_stats(stats):
    assert len(stats) == 2
    for addr, st in stats.items():
        assert st["backend"] == BACKEND
        assert st["device_limit"] == BUDGET
        assert st["spills"] > 0, (addr, st)
        assert st["unspills"] + st["disk_reads"] > 0, (addr, st)
        assert st["failures"] == 0


def test_two_worker_processes_compute_3x_their_budget_and_count_spills(tmp_path):
    spill = tmp_path / "spill"
    spill.mkdir()
    plugin = SpillwayPlugin(backend=BACKEND, device_limit=BUDGET, spill_dir=str(spill),
                            log_level="error")
    with LocalCluster(n_workers=2, threads_per_worker=2, processes=True,
                      dashboard_address=None, plugins={plugin}) as cluster:
        with Client(cluster) as client:
            assert run(client) == expected()
            stats = cluster_stats(client)
            check_stats(stats)
            if os.environ.get("SPW_DASK_STATS"):  # run_gpu.sh's dask phase keeps them
                with open(os.environ["SPW_DASK_STATS"], "w") as f:
                    json.dump({"backend": BACKEND, "budget_per_worker": BUDGET,
                               "chunks": NCHUNKS, "chunk_bytes": CHUNK, "workers": stats},
                              f, indent=1)
            # Each worker has its own runtime: the data spread over both.
            assert all(st["spills"] < sum(s["spills"] for s in stats.values())
                       for st in stats.values())
    assert list(spill.iterdir()) == []  # spill files are private and gone with the runtimes


def test_in_process_workers_export_metrics_and_leave_nothing_behind(tmp_path):
    before = spillway_threads()
    threads_before = set(threading.enumerate())
    plugin = SpillwayPlugin(backend=BACKEND, device_limit=BUDGET, spill_dir=str(tmp_path),
                            log_level="error")
    with LocalCluster(n_workers=2, threads_per_worker=2, processes=False,
                      dashboard_address=None, plugins={plugin}) as cluster:
        with Client(cluster) as client:
            assert run(client) == expected()
            check_stats(cluster_stats(client))
            workers = list(cluster.workers.values())
            assert all(w.plugins["spillway"]._worker() is w for w in workers)
            assert isinstance(spillway.dask.runtime(workers[0]).controller, DaskPolicy)
            if BACKEND == "host":
                assert spillway_threads() > before
            for w in workers:
                port = w.http_server.port
                text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                              timeout=10).read().decode()
                for metric in ("spillway_spills_total", "spillway_device_bytes",
                               "spillway_host_bytes", "spillway_disk_bytes",
                               "spillway_locked_bytes", "spillway_unspill_bytes_total"):
                    assert f'{metric}{{worker="{w.address}"}}' in text, metric
    assert spillway_threads() == before
    new = set(threading.enumerate()) - threads_before
    for t in new:  # the controller threads end once their runtime is destroyed
        if t.name == "spillway-controller":
            t.join(10)
    # Only ours: distributed's own threads (asyncio_0, its sampling profiler "Profile") may
    # outlive an in-process cluster for a while, as they do without Spillway.
    assert {t.name for t in new if t.is_alive() and t.name.startswith("spillway")} == set()
    assert list(tmp_path.iterdir()) == []


def test_the_policy_spills_keys_without_pending_dependents_first():
    """DaskPolicy's order on a worker's task graph: keys whose dependents all ran come
    first, then the key whose next dependent runs latest."""

    class TS:
        def __init__(self, key, state, priority=None, dependents=()):
            self.key, self.state, self.priority = key, state, priority
            self.dependents = set(dependents)

    class W:
        pass

    soon, late, done_dep = TS("soon", "waiting", (1,)), TS("late", "waiting", (9,)), \
        TS("d", "memory", (0,))
    tasks = {"a": TS("a", "memory", (0,), [late]), "b": TS("b", "memory", (0,), [soon]),
             "c": TS("c", "memory", (0,), [done_dep]), "e": TS("e", "memory", (0,), [soon, late])}
    w = W()
    w.state = W()
    w.state.tasks = tasks
    p = DaskPolicy()
    with spillway.Runtime(backend="host", device_limit=8 * MiB, ignore_env=True) as rt:
        bufs = {k: rt.alloc(MiB) for k in "abce"}
        for k, b in bufs.items():
            p.key_in_memory(k, [b])
        p.rerank(w, list(tasks))
        assert p.victims_order() == ["c", "a", "b", "e"] or \
            p.victims_order() == ["c", "a", "e", "b"]
        order = p.pressure(MiB, 64)
        assert order[0] == bufs["c"].handle and order[1] == bufs["a"].handle
        p.key_released("c")
        assert bufs["c"].handle not in p.pressure(MiB, 64)


def test_the_preload_installs_the_plugin_from_the_dask_config(tmp_path):
    """`dask worker --preload spillway.dask` (here LocalCluster's preload=): the runtime is
    configured from the worker's Dask configuration."""
    import dask
    with dask.config.set({"spillway.device-limit": "12MiB", "spillway.backend": BACKEND,
                          "spillway.spill-dir": str(tmp_path), "spillway.log-level": "error"}):
        with LocalCluster(n_workers=1, processes=False, dashboard_address=None,
                          preload=["spillway.dask"]) as cluster:
            with Client(cluster) as client:
                stats = cluster_stats(client)
                assert [s["device_limit"] for s in stats.values()] == [12 * MiB]
                assert [s["backend"] for s in stats.values()] == [BACKEND]
