# SPDX-License-Identifier: Apache-2.0
"""spillway.dask with a real distributed.LocalCluster on the host backend (on the GPU machine
run_gpu.sh's `dask` phase runs the same tests with SPILLWAY_DASK_BACKEND=cuda): two workers,
each with its own runtime; a computation whose deferrable data is 3x the workers' device
budgets together; the right result; spills counted per worker (client.run and Prometheus);
clean teardown, with no Spillway thread or spill file left behind; once the client releases
its keys, every worker's buffers are freed within 5 s (issue 17). Skipped without dask."""
import gc
import json
import os
import threading
import time
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


def test_the_first_in_process_worker_takes_the_process_runtime_and_gives_it_back(tmp_path):
    import spillway.process as P
    if BACKEND != "host":
        pytest.skip("on CUDA the first worker also installs the Numba plugin, and the shared "
                    "runtime lives on as Numba's (by design); this checks the hand-back")
    if P.existing(0) is not None:
        pytest.skip("this process already uses its shared runtime (the GPU tests' own)")
    prior = P.configuration()
    plugin = SpillwayPlugin(backend=BACKEND, device_limit=BUDGET, spill_dir=str(tmp_path),
                            log_level="error")
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                      dashboard_address=None, plugins={plugin}) as cluster:
        with Client(cluster):
            rts = [spillway.dask.runtime(w) for w in cluster.workers.values()]
            shared = P.existing(0)
            assert shared is not None and sum(rt is shared.runtime for rt in rts) == 1
    assert P.existing(0) is None  # closed with the worker that took it
    assert P.configuration() == prior
    assert all(rt.closed for rt in rts)


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


# -- host memory reserved when a worker starts ------------------------------------------------

def _pinned(dask_worker=None):
    return spillway.dask.runtime(dask_worker).stats().host_pinned_bytes


def test_the_plugin_reserves_host_memory_on_every_worker(tmp_path):
    plugin = SpillwayPlugin(backend=BACKEND, device_limit=BUDGET, spill_dir=str(tmp_path),
                            host_limit="256MiB", host_reserve="64MiB", log_level="error")
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                      dashboard_address=None, plugins={plugin}) as cluster:
        with Client(cluster) as client:
            pinned = client.run(_pinned)
            assert len(pinned) == 2
            assert all(n >= 64 * MiB for n in pinned.values()), pinned


def test_the_dask_config_names_the_host_reserve(tmp_path):
    import dask
    plugin = SpillwayPlugin(backend=BACKEND, device_limit=BUDGET, spill_dir=str(tmp_path),
                            host_limit="256MiB", log_level="error")
    with dask.config.set({"spillway.host-reserve": "96MiB"}):
        with LocalCluster(n_workers=1, processes=False, dashboard_address=None,
                          plugins={plugin}) as cluster:
            with Client(cluster) as client:
                assert [n >= 96 * MiB for n in client.run(_pinned).values()] == [True]


def test_a_host_reserve_above_the_host_limit_fails_the_worker_and_gives_its_runtime_back(
        tmp_path):
    import spillway.process as P
    if P.existing(0) is not None:
        pytest.skip("this process already uses its shared runtime (the GPU tests' own)")
    prior = P.configuration()
    plugin = SpillwayPlugin(backend=BACKEND, device_limit=BUDGET, spill_dir=str(tmp_path),
                            host_limit="32MiB", host_reserve="64MiB", log_level="error")
    with pytest.raises(RuntimeError, match="failed to start"):
        with LocalCluster(n_workers=1, processes=False, dashboard_address=None,
                          plugins={plugin}):
            pass
    if BACKEND == "host":  # on CUDA the runtime may live on as Numba's (by design)
        assert P.existing(0) is None
        assert P.configuration() == prior


@pytest.mark.parametrize("value, error", [("lots", ValueError), (0, ValueError),
                                          (-1, ValueError), (1.5, TypeError),
                                          (True, TypeError), (b"1GiB", TypeError)])
def test_a_host_reserve_that_is_not_a_size_is_refused_when_the_plugin_is_made(value, error):
    with pytest.raises(error, match="host_reserve"):
        SpillwayPlugin(host_reserve=value)


# -- issue 17: release is prompt ---------------------------------------------------------------
# On the GPU, 2 process workers (64 MiB budget, 32 MiB host limit each) computed and gathered
# 96 chunks of 4 MiB; after every future was cancelled and released, one worker still held 46
# buffers (12 MiB device, 16 MiB host, 163 MiB disk) 30 s later. The values were alive in
# reference cycles, which only Python's cyclic collector frees, and an idle worker may not run
# a full collection for minutes: a launch with read_only(a) made one (a caches its read-only
# marker, which referred back to it; array.py now refers back weakly), and any other cycle
# through a value (the plugin now collects them itself) kept the chunks the same way.
RELEASE_S = 5.0
R_CHUNK = 4 * MiB
R_CHUNKS = 96
_kernel = None


class _Cyclic:
    """Refers to an array that refers back to it (through its read-only marker's slot): the
    value of a key in a reference cycle, as a stand-in for cycles made elsewhere."""

    def __init__(self, a):
        self.a = a
        a._readonly = self


try:
    from numba import cuda as _cuda
    from spillway import numba as _sn
except ImportError:  # no numba-cuda: the launch step takes only the read-only marker
    _cuda = _sn = None


def _double(src, dst):
    """The kernel of the launch step (compiled with spillway.numba.jit on the CUDA backend)."""
    i = _cuda.grid(1)
    if i < dst.size:
        dst[i] = src[i] * 2


def _launch_read_only(a, out):
    """out = 2 * a through what a kernel launch does with read_only(a): on the CUDA backend a
    real kernel (spillway.numba.jit); on the host backend the launch extension's prepare_args
    as numba-cuda's launch calls it (the simulator cannot run the extension), then the work."""
    global _kernel
    sn = _sn
    if sn is None:
        a.read_only
        out.copy_from_host(a.copy_to_host() * 2)
        return
    if BACKEND == "cuda":
        if _kernel is None:
            _kernel = sn.jit(_double)
        _kernel[(a.size + 255) // 256, 256](sn.read_only(a), out)
        return
    retr = []
    for x in (sn.read_only(a), out):
        sn.extension.prepare_args(x._numba_type_, x, stream=None, retr=retr)
    for f in retr:
        f()
    out.copy_from_host(a.copy_to_host() * 2)


def r_make(i, how):
    a = to_device(np.full(R_CHUNK // 8, float(i)))
    out = spillway.DeferrableArray(spillway.dask.runtime(), a.shape, a.dtype)
    _launch_read_only(a, out)
    if how == "cycle":
        _Cyclic(out)
    return out


def _holders(dask_worker=None):
    """What still refers to this worker's live DeferrableArrays (for a failure's message)."""
    arrays = [o for o in gc.get_objects() if isinstance(o, spillway.DeferrableArray)]
    kinds = {}
    for a in arrays:
        for r in gc.get_referrers(a):
            if r is not arrays:
                name = type(r).__name__
                kinds[name] = kinds.get(name, 0) + 1
    return {"arrays": len(arrays), "referrers": kinds}


@pytest.mark.parametrize("how", ["launch", "cycle"])
def test_released_keys_leave_no_buffer_on_any_worker_within_5s(tmp_path, how):
    spill = tmp_path / "spill"
    spill.mkdir()
    plugin = SpillwayPlugin(backend=BACKEND, device_limit=64 * MiB, host_limit=32 * MiB,
                            spill_dir=str(spill), log_level="error")
    with LocalCluster(n_workers=2, threads_per_worker=2, processes=True,
                      dashboard_address=None, plugins={plugin}) as cluster:
        with Client(cluster) as client:
            futures = client.map(r_make, range(R_CHUNKS), how=how, pure=False)
            got = client.gather(futures)
            assert [float(g[0]) for g in got] == [2.0 * i for i in range(R_CHUNKS)]
            assert all(float(g[-1]) == 2.0 * i for i, g in enumerate(got))
            del got
            before = cluster_stats(client)
            assert sum(st["buffers"] for st in before.values()) == R_CHUNKS, before
            assert sum(st["disk_bytes"] for st in before.values()) > 0  # as on the GPU
            client.cancel(futures)
            del futures
            t0 = time.monotonic()
            while True:
                stats = cluster_stats(client)
                left = {a: (st["buffers"], st["device_bytes"], st["host_bytes"],
                            st["disk_bytes"]) for a, st in stats.items()}
                if all(n == 0 for n, *_ in left.values()):
                    break
                if time.monotonic() - t0 > RELEASE_S:
                    pytest.fail(f"{RELEASE_S} s after the client released its keys the workers "
                                f"still hold (buffers, device, host, disk bytes) {left}; "
                                f"holders {client.run(_holders)}")
                time.sleep(0.1)
            took = time.monotonic() - t0
            collections = {a: st["release_collections"] for a, st in stats.items()}
            print(f"{how}: every buffer freed {took:.2f} s after the release; "
                  f"plugin collections {collections}")
            assert all(st["released_held"] == 0 for st in stats.values())
            if how == "cycle":  # only a collection frees a cycle
                assert all(n > 0 for n in collections.values()), collections
    assert list(spill.iterdir()) == []
