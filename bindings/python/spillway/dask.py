# SPDX-License-Identifier: Apache-2.0
"""spillway.dask: a Spillway runtime in every Dask worker.

    from distributed import Client, LocalCluster
    from spillway.dask import SpillwayPlugin, cluster_stats, to_device

    cluster = LocalCluster(n_workers=2, plugins={SpillwayPlugin(device_limit="4GiB")})
    # or: client.register_plugin(SpillwayPlugin(...)); or `dask worker --preload spillway.dask`
    client = Client(cluster)
    x = client.submit(lambda: to_device(np.arange(10**6)))   # a DeferrableArray on a worker
    print(cluster_stats(client))                               # {worker address: {...}}

    # One worker process per GPU, each with its own CUDA_VISIBLE_DEVICES and budget:
    cluster = local_cuda_cluster(device_limit="2GiB")   # host backend where there is no GPU

What the plugin does in each worker process (docs/python.md, "Dask"):

* creates the worker's Runtime (:func:`runtime`) from its arguments, else the worker's Dask
  configuration (``spillway.device-limit``, ``spillway.host-limit``, ``spillway.spill-dir``,
  ``spillway.backend``, ``spillway.trace``), else the SPILLWAY_* variables; the spill files
  go into the worker's local directory unless told otherwise;
* with ``host_reserve`` (or ``spillway.host-reserve``), pins that much host memory for
  spilled data before the worker runs a task (:meth:`Runtime.host_reserve`), so that the
  pinning is not paid while transfers run;
* on the CUDA backend with numba-cuda installed, makes it Numba's memory manager (the EMM
  plugin of spillway.numba), so that Numba's allocations in tasks share its budget;
* installs :class:`DaskPolicy`, a controller that spills first the buffers of keys that
  Dask will need last (below);
* exposes Spillway's statistics: :func:`worker_stats` (``client.run(worker_stats)``,
  :func:`cluster_stats`) and the worker's Prometheus endpoint (``/metrics``,
  ``spillway_*`` metrics labelled with the worker's address);
* makes release prompt: once Dask drops a key, the buffers of its value are freed at once
  when nothing else refers to them; if they outlive it (a reference cycle, which only
  Python's cyclic collector frees, and which an idle worker may not run for minutes), the
  plugin runs that collector within a second (:class:`_Releases`);
* on teardown removes the controller and destroys the runtime.

:func:`local_cuda_cluster` starts one worker process per visible GPU, as dask-cuda's
LocalCUDACluster does (without depending on it): each worker's Nanny sets
``CUDA_VISIBLE_DEVICES`` to the list rotated so that its own GPU comes first (device 0 in
the worker), and each worker gets the plugin with its own budget. :func:`worker_device`
says which GPU a worker uses.

Deferrable data travelling between workers (or to the client) is serialized through the host:
a DeferrableArray arrives as a DeferrableArray on a worker that has the plugin, and as a NumPy
array anywhere else.
"""
from __future__ import annotations

import copy
import ctypes
import gc
import logging
import os
import threading
import time
import weakref
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import numpy as np

from . import _spillway as _c
from . import process as _process
from ._runtime import Backend, Buffer, Runtime
from .array import DeferrableArray
from .controller import Controller

try:
    import dask
    from distributed import Nanny, Scheduler, SpecCluster, WorkerPlugin, get_worker
    from distributed.protocol import dask_deserialize, dask_serialize
except ImportError as e:  # pragma: no cover (the tests skip without dask)
    raise ImportError("spillway.dask needs dask and distributed (pip install distributed)") from e

__all__ = ["SpillwayPlugin", "DaskPolicy", "runtime", "to_device", "worker_stats",
           "cluster_stats", "dask_setup", "local_cuda_cluster", "visible_gpus",
           "worker_device"]

log = logging.getLogger("spillway.dask")

_ATTR = "_spillway_plugin"   # the worker's plugin state, as an attribute of the Worker
_CONFIG_KEYS = ("device-limit", "host-limit", "disk-limit", "spill-dir", "backend", "io",
                "log-level", "trace", "trace-max", "host-device-bytes")


def _buffers_in(value: Any, depth: int = 0) -> List[Tuple[int, int]]:
    """(handle, bytes) of the deferrable buffers a task's result holds: a DeferrableArray or
    a Buffer, or such objects in a list, tuple, set or dict (two levels deep)."""
    if isinstance(value, DeferrableArray):
        return [] if value.closed else [(value.buffer.handle, value.nbytes)]
    if isinstance(value, Buffer):
        return [] if value.closed else [(value.handle, value.size)]
    if depth >= 2:
        return []
    if isinstance(value, dict):
        value = value.values()
    if isinstance(value, (list, tuple, set, frozenset, type({}.values()))):
        out: List[Tuple[int, int]] = []
        for v in value:
            out += _buffers_in(v, depth + 1)
        return out
    return []


_DONE = frozenset({"memory", "released", "forgotten", "error", "cancelled"})


class DaskPolicy(Controller):
    """Spills first what Dask will need last.

    It reads, from the worker only (on its event loop, in the plugin's ``transition``
    hook): ``worker.data[key]`` when a key enters memory (to find the deferrable buffers of
    its value), and ``worker.state.tasks[key]``: ``dependents`` (the tasks this worker knows
    will read the key), their ``state`` and ``priority`` (Dask's order of execution: smaller
    runs sooner). When device memory is short (``pressure``) it names, in this order:

    1. buffers of keys with no dependent left to run on this worker (all done, or none
       known): Dask holds them for a client or for another worker, not for work here;
    2. then buffers of the other keys, the key whose next dependent runs latest first (the
       furthest next use, as in Belady's rule).

    Buffers that are locked (a task is using them) are skipped by Spillway, and
    least-recently-used ones make up what the policy's choices do not cover.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._owner: Dict[int, Any] = {}        # handle -> key
        self._handles: Dict[Any, List[int]] = {}  # key -> handles
        self._rank: Dict[Any, tuple] = {}       # key -> (0,) | (1, earliest priority)

    # -- fed by the plugin, on the worker's event loop ---------------------------------------
    def key_in_memory(self, key: Any, value: Any,
                      found: Optional[List[Tuple[int, int]]] = None) -> None:
        if found is None:
            found = _buffers_in(value)
        with self._lock:
            self._drop(key)
            if found:
                self._handles[key] = [h for h, _ in found]
                for h, _ in found:
                    self._owner[h] = key

    def key_released(self, key: Any) -> None:
        with self._lock:
            self._drop(key)

    def _drop(self, key: Any) -> None:
        for h in self._handles.pop(key, ()):
            self._owner.pop(h, None)
        self._rank.pop(key, None)

    def rerank(self, worker: Any, keys: Iterable[Any]) -> None:
        tasks = worker.state.tasks
        ranks = {}
        for key in keys:
            ts = tasks.get(key)
            if ts is None:
                continue
            pending = [d.priority for d in ts.dependents
                       if d.state not in _DONE and d.priority is not None]
            ranks[key] = (1, min(pending)) if pending else (0,)
        with self._lock:
            for key, r in ranks.items():
                if key in self._handles:
                    self._rank[key] = r

    # -- the controller ------------------------------------------------------------------------
    def freed(self, handle: int, nbytes: int) -> None:
        with self._lock:
            key = self._owner.pop(handle, None)
            if key is not None:
                hs = self._handles.get(key)
                if hs and handle in hs:
                    hs.remove(handle)

    def pressure(self, nbytes_needed: int, max_victims: int) -> List[int]:
        with self._lock:
            done, later = [], []
            for key, hs in self._handles.items():
                r = self._rank.get(key, (0,))
                if r[0] == 0:
                    done.extend(hs)
                else:
                    later.append((r[1], hs))
        later.sort(key=lambda t: t[0], reverse=True)  # furthest next use first
        out = done[:max_victims]
        for _, hs in later:
            if len(out) >= max_victims:
                break
            out.extend(hs[:max_victims - len(out)])
        return out

    def victims_order(self) -> List[Any]:
        """The keys in the order pressure would name their buffers (for tests and logs)."""
        with self._lock:
            items = [(k, self._rank.get(k, (0,))) for k in self._handles]
        done = [k for k, r in items if r[0] == 0]
        later = sorted((t for t in items if t[1][0] == 1), key=lambda t: t[1][1], reverse=True)
        return done + [k for k, _ in later]


class _Releases:
    """Makes the release of a key's buffers prompt (issue 17).

    A DeferrableArray's buffer is freed when the array is: at once, by reference counting,
    when Dask drops the last reference to a key's value, unless the value sits in a
    reference cycle (an object that refers to itself, a stored exception's traceback, a
    cache that refers back). Only Python's cyclic collector frees a cycle, and it runs a
    full collection only after many new objects have survived, which an idle worker may not
    see for minutes: the buffers, spilled to host or disk, stay counted against the worker.

    So the plugin notes the handles of every key's value when the key enters memory, and
    when the key leaves it, those no other key in memory names. About 0.25 s later, on the
    event loop, it checks whether any of them is still alive (a handle query, no reference
    to the buffer); if so, or if the worker holds no data and runs nothing while its
    runtime still has buffers (values never seen entering memory: a cancelled task's
    result), it runs one full collection, at most one a second (and at most 5% of the
    loop's time). Buffers still alive after it are held by a live reference, which is not
    the plugin's to free: they are counted (``released_held``) and logged, and not checked
    again. Runs on the worker's event loop only, as ``transition`` does."""

    DELAY_S = 0.25
    MIN_GAP_S = 1.0

    def __init__(self, worker: Any, rt: Runtime) -> None:
        self._worker = weakref.ref(worker)
        self._rt = rt
        self._keys: Dict[Any, List[int]] = {}  # key in memory -> handles of its value
        self._refs: Dict[int, int] = {}        # handle -> keys in memory naming it
        self._released: set = set()            # handles of released keys, maybe alive
        self._scheduled = False
        self._idle_collected = False
        self._next_gc = 0.0
        self.collections = 0                   # full collections run for released keys
        self.held = 0                          # released buffers a live reference kept
        self.closed = False

    def key_in_memory(self, key: Any, handles: List[int]) -> None:
        self.key_released(key, schedule=False)
        if handles:
            self._keys[key] = handles
            for h in handles:
                self._refs[h] = self._refs.get(h, 0) + 1
                self._released.discard(h)
        self._idle_collected = False

    def key_released(self, key: Any, schedule: bool = True) -> None:
        for h in self._keys.pop(key, ()):
            n = self._refs.pop(h, 1) - 1
            if n > 0:
                self._refs[h] = n
            else:
                self._released.add(h)
        if schedule:
            self._schedule(self.DELAY_S)

    def _schedule(self, delay: float) -> None:
        worker = self._worker()
        if self._scheduled or self.closed or worker is None:
            return
        self._scheduled = True
        worker.loop.call_later(delay, self._check)

    def _alive(self, h: int) -> bool:
        try:
            self._rt._handle_info(h)
            return True
        except Exception:  # FreedError: gone (InvalidHandleError, or a closed runtime, too)
            return False

    def _idle(self, worker: Any) -> bool:
        try:
            return len(worker.data) == 0 and not worker.state.executing and \
                not worker.state.long_running
        except Exception:
            return False

    def _check(self) -> None:
        self._scheduled = False
        worker = self._worker()
        if self.closed or worker is None or self._rt.closed:
            return
        self._released = {h for h in self._released if self._alive(h)}
        idle = not self._idle_collected and self._idle(worker) and \
            self._rt.stats().buffers > 0
        if not self._released and not idle:
            return
        now = time.monotonic()
        if now < self._next_gc:
            self._schedule(self._next_gc - now)
            return
        t0 = time.perf_counter()
        gc.collect()
        took = time.perf_counter() - t0
        self.collections += 1
        self._next_gc = time.monotonic() + max(self.MIN_GAP_S, 20 * took)
        self._idle_collected = self._idle_collected or idle
        kept = [h for h in self._released if self._alive(h)]
        self._released.clear()
        if kept:
            self.held += len(kept)
            log.info("spillway: worker %s: %d buffers of released keys are still referenced "
                     "after a garbage collection (%.3f s); not the plugin's to free",
                     worker.address, len(kept), took)
        else:
            log.debug("spillway: worker %s: a garbage collection (%.3f s) freed the buffers "
                      "of released keys", worker.address, took)


class _WorkerState:
    def __init__(self, worker: Any, rt: Runtime, policy: Optional[DaskPolicy],
                 shared_device: Optional[int] = None) -> None:
        self.worker = weakref.ref(worker)
        # The device whose process-wide runtime (spillway.process) this worker took, or None
        # for a runtime of its own.
        self.shared_device = shared_device
        self.address = worker.address
        self.runtime = rt
        self.policy = policy
        self.releases = _Releases(worker, rt)


_states: "weakref.WeakSet[_WorkerState]" = weakref.WeakSet()
_states_lock = threading.Lock()


class SpillwayPlugin(WorkerPlugin):
    """Gives every worker its own Spillway runtime (see the module's documentation).

    Keyword arguments are those of :class:`spillway.Runtime` (``device_limit``,
    ``host_limit``, ``spill_dir``, ``backend``, ``trace``, ...); one left out takes the
    worker's Dask configuration ``spillway.<name with dashes>``, else its SPILLWAY_*
    variable. ``policy=False`` leaves victim choice to least recently used; ``numba=False``
    does not install the Numba EMM plugin (it is installed only on the CUDA backend, and
    only if numba-cuda is there). ``shared=False`` gives the worker a runtime of its own
    instead of the process's shared one (spillway.process), and installs no Numba plugin.
    ``host_reserve`` (an int or a size string such as "20GiB"; else the worker's Dask
    configuration ``spillway.host-reserve``) pins that much host memory for spilled data
    when the worker starts (:meth:`Runtime.host_reserve`): a worker whose spilled data will
    reach it pays the pinning once, up front, not while transfers run. If it cannot be
    pinned (above the host limit, for one), the worker fails to start, and the runtime it
    took is given back.

    TypeError / ValueError at construction for a ``host_reserve`` that is not a size > 0."""

    name = "spillway"
    idempotent = True
    _worker: Optional["weakref.ref[Any]"] = None

    def __init__(self, *, policy: bool = True, numba: bool = True, shared: bool = True,
                 host_reserve: Union[int, str, None] = None, **runtime_kwargs: Any) -> None:
        self._worker = None
        self.policy = policy
        self.numba = numba
        self.shared = shared
        self.host_reserve = None if host_reserve is None else _size("host_reserve",
                                                                    host_reserve)
        self.kwargs = runtime_kwargs

    def _host_reserve_bytes(self) -> int:
        """The bytes to reserve: the argument, else the worker's Dask configuration; 0 for
        none."""
        v = self.host_reserve
        if v is None:
            v = dask.config.get("spillway.host-reserve", None)
            if v is None:
                return 0
            v = _size("spillway.host-reserve", v)
        return int(_c.parse_size(v))

    def _config(self, worker: Any) -> Dict[str, Any]:
        kw = dict(self.kwargs)
        for k in _CONFIG_KEYS:
            name = k.replace("-", "_")
            if kw.get(name) is None:
                v = dask.config.get(f"spillway.{k}", None)
                if v is not None:
                    kw[name] = v
        if kw.get("spill_dir") is None and not os.environ.get("SPILLWAY_SPILL_DIR"):
            d = os.path.join(worker.local_directory, "spillway")
            os.makedirs(d, exist_ok=True)
            kw["spill_dir"] = d
        return kw

    def _runtime(self, kw: Dict[str, Any]) -> Tuple[Runtime, Optional[int]]:
        """The worker's runtime, and the device whose shared runtime it is (or None).

        By default (``shared=True``) the worker takes the process's shared runtime
        (spillway.process), configured from its keywords, so that tasks using CuPy,
        PyTorch, cuda.core or Numba through Spillway's allocators share the worker's budget.
        If the process already has one (another in-process worker's, or the program's own
        use), the worker gets a runtime of its own instead."""
        if not self.shared:
            return Runtime(**kw), None
        device_id = int(kw.get("device") or 0)
        self._prior_config = _process.configuration()
        try:
            _process.configure(**{k: v for k, v in kw.items() if k != "device"})
        except RuntimeError:
            return Runtime(**kw), None
        rt = _process.runtime(device_id)
        if self.numba and rt.backend == Backend.CUDA:
            try:
                from numba import cuda
                if cuda.is_available():
                    import spillway.numba as sn
                    cuda.set_memory_manager(sn.SpillwayNumbaManager)
            except ImportError:
                pass
        return rt, device_id

    def setup(self, worker: Any) -> None:
        if getattr(worker, _ATTR, None) is not None:
            return
        if self._worker is None or self._worker() is not worker:
            # Dask calls `transition` without saying which worker, and in-process workers
            # (LocalCluster(processes=False, plugins=...)) share one plugin object: each
            # worker gets its own copy, bound to it, in place of the shared one.
            bound = copy.copy(self)
            bound._worker = weakref.ref(worker)
            for name, p in list(worker.plugins.items()):
                if p is self:
                    worker.plugins[name] = bound
            return bound.setup(worker)
        kw = self._config(worker)
        rt, shared_device = self._runtime(kw)
        reserve = self._host_reserve_bytes()
        if reserve:
            try:
                rt.host_reserve(reserve)
            except Exception:
                self._give_back(rt, shared_device, reserved=False)
                raise
        self._reserved = reserve
        policy = DaskPolicy() if self.policy else None
        if policy is not None:
            rt.set_controller(policy)
        state = _WorkerState(worker, rt, policy, shared_device)
        setattr(worker, _ATTR, state)
        with _states_lock:
            _states.add(state)
        _register_metrics()
        log.info("spillway: worker %s: %r", state.address, rt)

    def transition(self, key: Any, start: str, finish: str, **kwargs: Any) -> None:
        worker = self._worker() if self._worker is not None else None
        state = getattr(worker, _ATTR, None)
        if worker is None or state is None:
            return
        policy = state.policy
        if finish == "memory":
            value = worker.data.get(key) if key in worker.data else None
            found = _buffers_in(value)
            state.releases.key_in_memory(key, [h for h, _ in found])
            if policy is not None:
                policy.key_in_memory(key, value, found)
                policy.rerank(worker, [key])
        elif start == "memory":
            state.releases.key_released(key)
            if policy is not None:
                policy.key_released(key)
        if policy is None:
            return
        ts = worker.state.tasks.get(key)
        # A task that ran or was dropped changes its dependencies' next use.
        if ts is not None and (start == "executing" or finish in _DONE):
            policy.rerank(worker, [d.key for d in ts.dependencies])

    def __getstate__(self) -> Dict[str, Any]:
        d = dict(self.__dict__)
        d["_worker"] = None  # a weak reference does not travel
        return d

    def teardown(self, worker: Any) -> None:
        state = getattr(worker, _ATTR, None)
        if state is None:
            return
        setattr(worker, _ATTR, None)
        state.releases.closed = True
        with _states_lock:
            _states.discard(state)
        try:
            state.runtime.set_controller(None)
            self._give_back(state.runtime, state.shared_device,
                            reserved=bool(getattr(self, "_reserved", 0)))
        except Exception as e:  # keep the worker's shutdown going
            log.warning("spillway: worker %s: runtime not destroyed: %s", state.address, e)

    def _give_back(self, rt: Runtime, shared_device: Optional[int], reserved: bool) -> None:
        """Destroys the worker's runtime, or gives the process's shared one back."""
        if shared_device is None:
            rt.close()
            return
        import sys
        if rt.backend == Backend.CUDA and "spillway.numba" in sys.modules:
            # Numba's runtime too: it lives as long as Numba's context, without the pinned
            # memory this worker asked for.
            if reserved:
                rt.host_reserve(0)
            return
        if _process.reset(shared_device):
            try:  # what the process had before this worker configured it
                _process.configure(**getattr(self, "_prior_config", {}))
            except RuntimeError:
                pass


def _state(worker: Any = None) -> _WorkerState:
    worker = worker if worker is not None else get_worker()
    state = getattr(worker, _ATTR, None)
    if state is None:
        raise RuntimeError(f"the worker {worker.address} has no SpillwayPlugin")
    return state


def runtime(worker: Any = None) -> Runtime:
    """The Spillway runtime of this worker (inside a task), or of `worker`."""
    return _state(worker).runtime


def to_device(ary: Any, worker: Any = None) -> DeferrableArray:
    """A DeferrableArray holding a copy of `ary` in this worker's runtime."""
    return DeferrableArray.from_host(runtime(worker), ary)


def worker_stats(dask_worker: Any = None) -> Dict[str, Any]:
    """This worker's Spillway statistics as a dict (``client.run(worker_stats)`` passes
    `dask_worker`): every field of spillway.Stats, plus backend and limits, and the
    plugin's release check (:class:`_Releases`): ``release_collections`` (full garbage
    collections it ran because buffers of released keys, or of an idle worker, were still
    alive) and ``released_held`` (buffers of released keys that a live reference still held
    after such a collection)."""
    st = _state(dask_worker)
    rt = st.runtime
    d = dict(rt.stats().__dict__)
    d["backend"] = rt.backend.name.lower()
    d["host_limit"], d["disk_limit"] = rt.host_limit, rt.disk_limit
    d["release_collections"] = st.releases.collections
    d["released_held"] = st.releases.held
    return d


def cluster_stats(client: Any) -> Dict[str, Dict[str, Any]]:
    """{worker address: worker_stats} for every worker of `client`'s cluster."""
    return client.run(worker_stats)


# -- Prometheus (the worker's /metrics) ---------------------------------------------------------
_GAUGES = [("device_bytes", "Bytes of deferrable buffers on the device"),
           ("host_bytes", "Bytes of buffers spilled to pinned host memory"),
           ("peer_bytes", "Bytes of buffers spilled to device memory lent by another runtime"),
           ("disk_bytes", "Bytes of buffers spilled to disk"),
           ("locked_bytes", "Bytes of buffers locked (in use) on the device"),
           ("device_limit", "The device budget in bytes"),
           ("peer_limit", "Bytes of device memory another runtime lends this one"),
           ("lent_bytes", "Bytes of this runtime's device memory lent to others"),
           ("buffers", "Live deferrable buffers")]
_COUNTERS = [("spills", "Buffers spilled device to host, peer or disk"),
             ("spill_bytes", "Bytes spilled device to host, peer or disk"),
             ("unspills", "Buffers brought back host or peer to device"),
             ("unspill_bytes", "Bytes brought back host or peer to device"),
             ("peer_spills", "Buffers spilled device to lent peer memory"),
             ("peer_spill_bytes", "Bytes spilled device to lent peer memory"),
             ("peer_unspills", "Buffers brought back peer to device"),
             ("peer_unspill_bytes", "Bytes brought back peer to device"),
             ("peer_returns", "Buffers moved peer to host or disk: the lender took its memory back"),
             ("peer_return_bytes", "Bytes moved peer to host or disk"),
             ("demotions", "Buffers moved host to disk"),
             ("demote_bytes", "Bytes moved host to disk"),
             ("disk_reads", "Buffers read back from disk"),
             ("disk_read_bytes", "Bytes read back from disk"),
             ("spills_on_demand", "Spills forced by an allocation, acquire or prefetch"),
             ("failures", "Failed moves")]
_registered = False


class _Collector:
    """A prometheus_client collector over every worker runtime of this process."""

    def collect(self):
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
        with _states_lock:
            states = list(_states)
        stats = []
        for s in states:
            try:
                stats.append((s.address, s.runtime.stats()))
            except Exception:
                continue  # closed meanwhile
        for name, doc in _GAUGES:
            g = GaugeMetricFamily(f"spillway_{name}", doc, labels=["worker"])
            for addr, st in stats:
                g.add_metric([addr], getattr(st, name))
            yield g
        for name, doc in _COUNTERS:
            c = CounterMetricFamily(f"spillway_{name}", doc, labels=["worker"])
            for addr, st in stats:
                c.add_metric([addr], getattr(st, name))
            yield c


_register_lock = threading.Lock()  # not _states_lock: register() calls collect()


def _register_metrics() -> None:
    global _registered
    with _register_lock:
        if _registered:
            return
        try:
            import prometheus_client
        except ImportError:
            return
        prometheus_client.REGISTRY.register(_Collector())
        _registered = True


# -- serialization: through the host --------------------------------------------------------------
@dask_serialize.register(DeferrableArray)
def _serialize(a: DeferrableArray) -> Tuple[Dict[str, Any], List[Any]]:
    host = a.copy_to_host()
    header = {"shape": list(a.shape), "dtype": a.dtype.str, "order": a.order}
    return header, [np.ascontiguousarray(host).reshape(-1).view(np.uint8).data]


@dask_deserialize.register(DeferrableArray)
def _deserialize(header: Dict[str, Any], frames: List[Any]) -> Any:
    ary = np.frombuffer(bytearray(frames[0]) if len(frames) == 1 else b"".join(frames),
                        dtype=np.dtype(header["dtype"]))
    ary = ary.reshape(header["shape"], order=header["order"])
    state = None
    try:
        state = getattr(get_worker(), _ATTR, None)  # in a task
    except ValueError:
        # Data from another worker is deserialized on the event loop, where Dask does not
        # say which worker: in a worker process there is one.
        with _states_lock:
            live = [st for st in _states if st.runtime is not None and not st.runtime.closed]
        if len(live) == 1:
            state = live[0]
    return ary if state is None else DeferrableArray.from_host(state.runtime, ary)


# -- one worker per GPU ---------------------------------------------------------------------------
def _cuda_driver() -> Optional[Any]:
    """libcuda, initialized (cuInit creates no context), or None where there is no driver or
    no device."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        return lib if lib.cuInit(0) == 0 else None
    except (OSError, AttributeError):
        return None


def visible_gpus() -> List[str]:
    """The GPUs this process can give to workers, named as ``CUDA_VISIBLE_DEVICES`` names
    them: when the variable is set, its entries (ordinals or UUIDs, as written) up to the
    number of devices the driver sees through it; else the ordinals of every device the
    driver reports ("0", "1", ...). ``[]`` where there is no CUDA driver or no device. Asks
    the driver (cuInit, cuDeviceGetCount) and creates no CUDA context."""
    lib = _cuda_driver()
    count = ctypes.c_int(0)
    if lib is None or lib.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return []
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is None:
        return [str(i) for i in range(count.value)]
    return [d.strip() for d in env.split(",") if d.strip()][:count.value]


def _device_identity(ordinal: int) -> Dict[str, Optional[str]]:
    """The PCI bus id and UUID (as nvidia-smi writes them) of CUDA device `ordinal` of this
    process, through the driver (no context); None for what it does not answer."""
    out: Dict[str, Optional[str]] = {"pci_bus_id": None, "uuid": None}
    lib = _cuda_driver()
    dev = ctypes.c_int(0)
    if lib is None or lib.cuDeviceGet(ctypes.byref(dev), ctypes.c_int(ordinal)) != 0:
        return out
    bus = ctypes.create_string_buffer(64)
    if lib.cuDeviceGetPCIBusId(bus, ctypes.c_int(len(bus)), dev) == 0:
        out["pci_bus_id"] = bus.value.decode()
    raw = ctypes.create_string_buffer(16)
    get_uuid = getattr(lib, "cuDeviceGetUuid_v2", None) or getattr(lib, "cuDeviceGetUuid", None)
    if get_uuid is not None and get_uuid(raw, dev) == 0:
        h = raw.raw.hex()
        out["uuid"] = f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
    return out


def worker_device(dask_worker: Any = None) -> Dict[str, Any]:
    """Which device this worker uses (``client.run(worker_device)`` passes `dask_worker`):
    ``name``, ``address``, ``pid``, ``cuda_visible_devices`` (the worker process's variable,
    None if unset), ``backend`` and ``device`` (its Spillway runtime's; None without the
    plugin), and on the CUDA backend the device's ``pci_bus_id`` and ``uuid`` (from the
    driver: they name the physical GPU whatever ``CUDA_VISIBLE_DEVICES`` says; None on the
    host backend)."""
    worker = dask_worker if dask_worker is not None else get_worker()
    st = getattr(worker, _ATTR, None)
    rt = st.runtime if st is not None and not st.runtime.closed else None
    out: Dict[str, Any] = {
        "name": worker.name, "address": worker.address, "pid": os.getpid(),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "backend": rt.backend.name.lower() if rt is not None else None,
        "device": rt.device if rt is not None else None, "pci_bus_id": None, "uuid": None}
    if rt is not None and rt.backend == Backend.CUDA:
        out.update(_device_identity(rt.device))
    return out


def _count(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, not {value}")
    return value


def _size(name: str, value: Any) -> Any:
    """`value` checked as a Spillway size (an int or a string such as "2GiB") and > 0;
    returned as given. TypeError / ValueError (ConfigError) otherwise."""
    try:
        n = _c.parse_size(value)
    except TypeError:
        raise TypeError(f"{name} must be an int or a size string such as '2GiB', "
                        f"not {type(value).__name__}") from None
    except ValueError as e:
        raise ValueError(f"{name}: {value!r} is not a size ({e})") from None
    if n <= 0:
        raise ValueError(f"{name} must be > 0 bytes, not {value!r}")
    return value


_OWN_KEYS = frozenset({"backend", "device", "device_limit", "host_limit", "disk_limit",
                       "spill_dir", "host_device_bytes"})


def local_cuda_cluster(n_workers: Optional[int] = None, *,
                       device_limit: Union[int, str, Sequence[Union[int, str]], None] = None,
                       host_limit: Union[int, str, None] = None,
                       disk_limit: Union[int, str, None] = None,
                       spill_dir: Optional[str] = None, backend: str = "auto",
                       host_device_bytes: Union[int, str, None] = None,
                       devices: Optional[Sequence[Union[int, str]]] = None,
                       threads_per_worker: int = 1,
                       memory_limit: Union[int, str, float, None] = "auto",
                       plugin_options: Optional[Dict[str, Any]] = None,
                       worker_options: Optional[Dict[str, Any]] = None,
                       dashboard_address: Optional[str] = None,
                       silence_logs: Union[int, bool] = logging.WARN,
                       asynchronous: bool = False, name: Optional[str] = None) -> Any:
    """Starts a local cluster with one worker process per GPU, each with a Spillway runtime
    of its own (SpillwayPlugin), and returns it (a ``distributed.SpecCluster``: use it as a
    context manager or close() it; its size is fixed, scale() is not supported).

    As dask-cuda's LocalCUDACluster does, worker ``i`` runs under a Nanny that sets its
    ``CUDA_VISIBLE_DEVICES`` to the GPUs rotated by ``i`` (worker 1 of "0,1,2" gets
    "1,2,0"), so that its own GPU is device 0 there and the others stay visible, and
    ``SPILLWAY_DEVICE=0``. Worker names are 0, 1, ...

    - ``n_workers``: how many workers (default: one per GPU of `devices`); at most
      ``len(devices)`` on the CUDA backend.
    - ``devices``: the GPUs to use, as ``CUDA_VISIBLE_DEVICES`` entries (ordinals or UUIDs);
      default :func:`visible_gpus`.
    - ``backend``: ``"auto"`` (``"cuda"`` if a GPU is visible, else ``"host"``), ``"cuda"`` or
      ``"host"``. On the host backend (for CI: device memory emulated in host memory) the
      workers still get a different ``CUDA_VISIBLE_DEVICES`` each (made-up ordinals "0",
      "1", ... where there are fewer GPUs than workers), ``n_workers`` defaults to the
      number of GPUs, else 2, ``host_device_bytes`` sets the emulated device size, and
      distributed's GPU monitoring (``distributed.diagnostics.nvml``) is off in the workers
      unless ``worker_options["config"]`` turns it on.
    - ``device_limit``: each worker's device budget: one size for all, or a sequence with
      one size per worker; None takes the Dask configuration / SPILLWAY_DEVICE_LIMIT /
      Spillway's default. ``host_limit``, ``disk_limit``, ``spill_dir`` (default: each
      worker's local directory), ``host_device_bytes``: for every worker's runtime.
    - ``plugin_options``: further keywords of :class:`SpillwayPlugin` (``policy``,
      ``numba``, ``shared``, ``io``, ``log_level``, ``trace``, ...);
      ``worker_options``: further keywords of ``distributed.Nanny`` / ``Worker``.
    - ``threads_per_worker`` (default 1, as dask-cuda), ``memory_limit`` (Dask's host
      memory limit of each worker; "auto" shares the machine's memory among the workers, as
      LocalCluster does), ``dashboard_address`` (None: no dashboard), ``silence_logs``,
      ``asynchronous``, ``name``: as for LocalCluster. Scheduler and workers listen on
      127.0.0.1.

    Errors, before anything starts: TypeError for an argument of the wrong type (a count
    that is not an int, a size that is neither an int nor a string, a plugin option that
    one of the keywords above names); ValueError for a count below 1, more workers than
    GPUs on the CUDA backend, a size that does not parse or is 0, a `device_limit` sequence
    whose length is not ``n_workers``, repeated or empty `devices`, an unknown backend;
    RuntimeError for ``backend="cuda"`` where no GPU is visible. A worker whose runtime
    cannot be created (a bad plugin option, a device that fails) makes the cluster's start
    raise distributed's RuntimeError ("Nanny failed to start"), Spillway's error in the
    worker's log."""
    from distributed.worker_memory import parse_memory_limit

    if not isinstance(backend, str) or backend not in ("auto", "cuda", "host"):
        raise ValueError(f"backend must be 'auto', 'cuda' or 'host', not {backend!r}")
    if n_workers is not None:
        _count("n_workers", n_workers, 1)
    _count("threads_per_worker", threads_per_worker, 1)
    gpus = visible_gpus()
    if devices is not None:
        if isinstance(devices, (str, bytes)) or not isinstance(devices, Sequence):
            raise TypeError("devices must be a sequence of GPU ordinals or UUIDs, not "
                            f"{type(devices).__name__}")
        ids = []
        for d in devices:
            if isinstance(d, bool) or not isinstance(d, (int, str)):
                raise TypeError(f"a device is an int or a str, not {type(d).__name__}")
            name_ = str(d).strip()
            if (isinstance(d, int) and d < 0) or not name_ or "," in name_:
                raise ValueError(f"{d!r} is not a GPU ordinal or UUID")
            ids.append(name_)
        if not ids:
            raise ValueError("devices is empty")
        if len(set(ids)) != len(ids):
            raise ValueError(f"devices repeats a GPU: {ids}")
    else:
        ids = gpus
    if backend == "auto":
        backend = "cuda" if gpus else "host"
    if backend == "cuda":
        if not gpus:
            raise RuntimeError("backend='cuda' but no GPU is visible (no CUDA driver or "
                               "device, or CUDA_VISIBLE_DEVICES hides them)")
        n = len(ids) if n_workers is None else n_workers
        if n > len(ids):
            raise ValueError(f"n_workers={n} but only {len(ids)} GPUs are available "
                             f"({','.join(ids)}): one worker per GPU")
    else:
        n = n_workers if n_workers is not None else (len(ids) or 2)
        made_up = (str(i) for i in range(2 * n + len(ids)) if str(i) not in ids)
        while len(ids) < n:  # made-up ordinals: the host backend never reads them
            ids = ids + [next(made_up)]
    if isinstance(device_limit, (list, tuple)):
        if len(device_limit) != n:
            raise ValueError(f"device_limit has {len(device_limit)} sizes for {n} workers")
        limits = [_size(f"device_limit[{i}]", v) for i, v in enumerate(device_limit)]
    elif device_limit is None:
        limits = [None] * n
    else:
        limits = [_size("device_limit", device_limit)] * n
    runtime_kw: Dict[str, Any] = {"backend": backend}
    for key, v in (("host_limit", host_limit), ("disk_limit", disk_limit),
                   ("host_device_bytes", host_device_bytes)):
        if v is not None:
            runtime_kw[key] = _size(key, v)
    if spill_dir is not None:
        if not isinstance(spill_dir, (str, os.PathLike)):
            raise TypeError(f"spill_dir must be a path, not {type(spill_dir).__name__}")
        runtime_kw["spill_dir"] = os.fspath(spill_dir)
    popts = dict(plugin_options or {})
    clash = sorted(_OWN_KEYS & set(popts))
    if clash:
        raise TypeError(f"plugin_options may not set {clash}: they are keywords of "
                        "local_cuda_cluster")
    wopts = dict(worker_options or {})
    clash = sorted({"env", "plugins", "nthreads", "name"} & set(wopts))
    if clash:
        raise TypeError(f"worker_options may not set {clash}: local_cuda_cluster sets them")
    if "memory_limit" not in wopts:
        wopts["memory_limit"] = parse_memory_limit(memory_limit, 1, n, logger=log)

    if backend == "host":
        # Such a worker touches no GPU, and distributed's GPU monitor would look its first
        # CUDA_VISIBLE_DEVICES entry up through NVML: a made-up ordinal where the machine
        # has fewer GPUs than workers, which NVML refuses, failing the worker's start. The
        # caller's own setting, if any, wins. Whole: the Nanny merges its config into the
        # worker's only at the top level.
        wopts["config"] = dask.config.merge(dask.config.config,
                                            {"distributed": {"diagnostics": {"nvml": False}}},
                                            wopts.get("config") or {})
    workers = {}
    for i in range(n):
        rotated = ids[i:] + ids[:i]
        plugin = SpillwayPlugin(**popts, **runtime_kw, device_limit=limits[i])
        options = dict(wopts)
        options.update(
            nthreads=threads_per_worker, name=i, host="127.0.0.1", plugins={plugin},
            dashboard=False, silence_logs=silence_logs,
            env={"CUDA_VISIBLE_DEVICES": ",".join(rotated), "SPILLWAY_DEVICE": "0"})
        workers[i] = {"cls": Nanny, "options": options}
    scheduler = {"cls": Scheduler,
                 "options": {"host": "127.0.0.1", "dashboard_address": dashboard_address,
                             "dashboard": dashboard_address is not None}}
    return SpecCluster(workers=workers, scheduler=scheduler, asynchronous=asynchronous,
                       silence_logs=silence_logs, name=name)


# -- `dask worker --preload spillway.dask` ------------------------------------------------------
async def dask_setup(worker: Any) -> None:
    """Preload hook: installs SpillwayPlugin with the worker's configuration (spillway.* in
    the Dask config, SPILLWAY_* variables)."""
    await worker.plugin_add(plugin=SpillwayPlugin(), name=SpillwayPlugin.name)
