# SPDX-License-Identifier: Apache-2.0
"""Property-based fuzzing of the whole public Python API with Hypothesis (issue 18).

Random sequences of calls, with valid and hostile arguments (wrong types, None, negative,
zero, 2**63, 2**64, freed buffers, buffers of another runtime and of a closed one, a few
threads at once, peer lends and reclaims between runtimes), against one runtime. The properties:
  * the interpreter never crashes (test_fuzz.py runs this file in a child process, so a
    crash fails that test instead of ending the run);
  * every failure is a documented exception (DOCUMENTED below, docs/python.md "Errors");
  * after every call, a good round trip works: allocate, write, spill to host, then to
    disk, read back, compare.

Run by tests/python/test_fuzz.py. By hand (any backend; SPILLWAY_BACKEND=cuda on a GPU):
    python -m pytest -q -p no:cacheprovider tests/python/fuzz_api.py --hypothesis-seed=N
Budget: SPILLWAY_FUZZ_EXAMPLES (default 50) sequences of up to SPILLWAY_FUZZ_STEPS
(default 20) calls. On a failure Hypothesis prints the seed and the smallest sequence it
found, and `@reproduce_failure(...)` to replay it exactly.
"""
from __future__ import annotations

import os
import tempfile
import threading

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import spillway

KiB, MiB = 1 << 10, 1 << 20
BACKEND = os.environ.get("SPILLWAY_BACKEND", "host")

#: What the API raises for bad input or state: Spillway's errors (one class per status, each
#: also a ValueError, MemoryError, OSError, RuntimeError or NotImplementedError), and
#: TypeError / ValueError for Python arguments of the wrong type or value.
DOCUMENTED = (spillway.SpillwayError, TypeError, ValueError)

HOSTILE_INTS = [0, -1, 1, 2**31, 2**63 - 1, 2**63, 2**64 - 1, 2**64, 2**100, -(2**64)]
hostile = st.one_of(
    st.sampled_from(HOSTILE_INTS), st.none(), st.booleans(), st.integers(-4, 4 * MiB),
    st.floats(allow_nan=True), st.text(max_size=6), st.binary(max_size=4),
    st.lists(st.integers(-2, 2), max_size=3), st.just(object()), st.just(np.int64(-1)),
    st.just(np.uint64(2**64 - 1)))
# On CUDA an integer stream handle is a cudaStream_t that the binding hands to CUDA to
# adopt (docs/python.md, Streams): a made-up one is the caller's broken promise, as a raw
# address is. There only the special handles and ints that cannot be handles are drawn.
if BACKEND == "cuda":
    hostile_streams = st.one_of(
        hostile.filter(lambda v: not isinstance(v, (int, np.integer))),
        st.sampled_from([0, 1, 2, -1, 2**64, 2**100, -(2**64), np.int64(-1)]))
else:
    hostile_streams = hostile
good_sizes = st.integers(1, 256 * KiB)
sizes = st.one_of(good_sizes, hostile)
tiers = st.one_of(st.sampled_from(list(spillway.Tier)), hostile)
dtypes = st.one_of(
    st.sampled_from([np.uint8, np.int32, np.float64, np.complex64, np.bool_]),
    st.sampled_from([object, "U3", "V4", ">f8", "<f8", "M8[s]", "(2,)i4", None, "nope", 3]))
shapes = st.one_of(st.integers(0, 64), st.tuples(st.integers(0, 16), st.integers(0, 16)),
                   st.sampled_from([(2**32, 2**32), 2**63, (-1,), (2, "3"), 2.5, None]))
size_fields = ["device_limit", "host_limit", "disk_limit", "host_device_bytes", "trace_max"]
size_values = st.one_of(
    st.sampled_from([None, 0, -1, 4096, 4 * MiB, 2**64 - 1, 2**64, 2**64 + 4096, "4MiB",
                     "16777216TiB", "1.5", " 12 k ", "x", "", 1.5, True, b"1"]))

# The process's shared runtime of device 0 (spillway.process), which the allocators of
# CuPy and cuda.core use; this file runs in a child interpreter, so it is this run's own.
import spillway.process as P  # noqa: E402

P.configure(backend=BACKEND, device_limit=2 * MiB, host_device_bytes=8 * MiB,
            ignore_env=True, log_level="off")

EXAMPLES = int(os.environ.get("SPILLWAY_FUZZ_EXAMPLES", "50"))
STEPS = int(os.environ.get("SPILLWAY_FUZZ_STEPS", "20"))


def make_runtime(**kw) -> spillway.Runtime:
    config = dict(backend=BACKEND, device_limit=2 * MiB, host_device_bytes=8 * MiB,
                  ignore_env=True, log_level="off")
    config.update(kw)
    return spillway.Runtime(**config)


def call(fn, *args, **kwargs):
    """Calls fn; a documented failure is an answer, anything else fails the property."""
    try:
        return fn(*args, **kwargs)
    except DOCUMENTED:
        return None


class ApiMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.TemporaryDirectory(prefix="spw-fuzz-")
        self.rt = make_runtime(spill_dir=self.dir.name)
        self.streams = [None, self.rt.stream()]
        self.other = make_runtime(spill_dir=self.dir.name)
        self.closed = make_runtime(spill_dir=self.dir.name)
        dead = self.closed.alloc(4096)
        self.closed.close()
        freed = self.rt.alloc(4096)
        freed.free()
        # The pool the rules draw buffers from: this runtime's, a freed one, another live
        # runtime's and a closed runtime's.
        self.buffers = [self.rt.alloc(4096), freed, self.other.alloc(4096), dead]
        self.controller = spillway.Controller()
        self.rt.set_controller(self.controller)

    def teardown(self) -> None:
        try:
            self.rt.set_controller(None)
            for s in self.streams[1:]:
                call(s.synchronize)
            self.rt.synchronize()
            self.rt.close()
            self.other.synchronize()
            self.other.close()
        finally:
            self.dir.cleanup()

    # -- what rules draw -------------------------------------------------------------------
    def buffer(self, data) -> object:
        return data.draw(st.one_of(st.sampled_from(self.buffers), hostile), label="buffer")

    def stream(self, data) -> object:
        return data.draw(st.one_of(st.sampled_from(self.streams), hostile_streams),
                         label="stream")

    def buffer_list(self, data) -> object:
        return data.draw(st.one_of(st.lists(st.sampled_from(self.buffers), max_size=4),
                                   hostile), label="buffers")

    # -- the rules -----------------------------------------------------------------------------
    @rule(data=st.data(), nbytes=sizes,
          stable=st.one_of(st.sampled_from([None, True, False]), hostile))
    def alloc(self, data, nbytes, stable):
        b = call(self.rt.alloc, nbytes, self.stream(data), stable)
        if b is not None:
            self.buffers.append(b)
            call(lambda: b.is_stable)

    @rule(data=st.data())
    def free(self, data):
        # Unbound, so that a non-buffer reaches the C method as `self` (TypeError).
        call(spillway.Buffer.free, self.buffer(data))

    @rule(data=st.data(), read=st.booleans(), release=st.sampled_from(["now", "async", "no"]))
    def acquire(self, data, read, release):
        b, s = self.buffer(data), self.stream(data)
        if not isinstance(b, spillway.Buffer):
            return
        if call(b.acquire, s, read) is None:
            return
        if release == "now":
            call(b.release, s)
        elif release == "async":
            call(b.release_async, s)

    @rule(data=st.data())
    def release(self, data):
        b = self.buffer(data)
        call(spillway.Buffer.release, b, self.stream(data))
        call(spillway.Buffer.release_async, b, self.stream(data))

    @rule(data=st.data())
    def lock_block(self, data):
        b = self.buffer(data)
        if isinstance(b, spillway.Buffer):
            lock = call(b.lock, self.stream(data), data.draw(st.booleans()))
            if lock is not None:
                try:
                    with lock:
                        pass
                except DOCUMENTED:
                    pass

    @rule(data=st.data(), tier=tiers, form=st.sampled_from(["runtime", "buffer", "list"]))
    def spill(self, data, tier, form):
        if form == "list":
            call(self.rt.spill, self.buffer_list(data), tier)
            return
        b = self.buffer(data)
        if form == "runtime":
            call(self.rt.spill, b, tier)
        elif isinstance(b, spillway.Buffer):
            call(b.spill, tier)

    @rule(data=st.data(), form=st.sampled_from(["runtime", "buffer", "list"]))
    def prefetch(self, data, form):
        s = self.stream(data)
        if form == "list":
            call(self.rt.prefetch, self.buffer_list(data), s)
        elif form == "runtime":
            call(self.rt.prefetch, self.buffer(data), s)
        else:
            b = self.buffer(data)
            if isinstance(b, spillway.Buffer):
                call(b.prefetch, s)

    @rule(data=st.data(), read=st.booleans())
    def acquire_n_release_n(self, data, read):
        bufs, s = self.buffer_list(data), self.stream(data)
        if call(self.rt.acquire_n, bufs, s, read) is not None:
            call(self.rt.release_n_async, bufs, s)

    @rule(data=st.data(), which=st.sampled_from(["synchronize", "wait_stream", "release_async",
                                                 "register_stream", "unregister_stream"]))
    def stream_call(self, data, which):
        call(getattr(self.rt, which), self.stream(data))

    @rule(which=st.sampled_from(["wait_idle", "stats", "summary", "limits", "last_error",
                                 "async_error", "__repr__"]))
    def query(self, which):
        call(getattr(self.rt, which))

    @rule(data=st.data())
    def buffer_properties(self, data):
        b = self.buffer(data)
        if isinstance(b, spillway.Buffer):
            for name in ("state", "tier", "lock_count", "size", "handle", "closed", "runtime"):
                call(getattr, b, name)
            repr(b)

    @rule(data=st.data(), dst=hostile, src=hostile, nbytes=hostile)
    def memcpy(self, data, dst, src, nbytes):
        # Raw addresses are the caller's promise (docs/api.md): only arguments that cannot
        # be addresses or counts are fuzzed; a copy between real memory checks the rest.
        if all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v > 0
               for v in (dst, src, nbytes)):
            host = np.zeros(64, np.uint8)
            b = self.rt.alloc(64)
            p = call(b.acquire)
            if p is not None:
                call(self.rt.memcpy, p, host.ctypes.data, 64)
                b.release()
            b.free()
            return
        call(self.rt.memcpy, dst, src, nbytes, self.stream(data))

    @rule(data=st.data(), shape=shapes, dtype=dtypes, order=st.sampled_from(["C", "F", "X", 1]))
    def deferrable_array(self, data, shape, dtype, order):
        rt = data.draw(st.sampled_from([self.rt, self.other, self.closed, None, 3]))
        a = call(spillway.DeferrableArray, rt, shape, dtype, order)
        if a is None:
            return
        host = np.ones(a.shape, a.dtype, order=a.order)
        call(a.copy_from_host, host)
        out = data.draw(st.sampled_from(["new", "readonly", "list", "wrong"]))
        target = {"new": None, "readonly": np.frombuffer(bytes(max(a.nbytes, 1)), np.uint8),
                  "list": [0] * a.size, "wrong": np.zeros(a.size + 1, a.dtype)}[out]
        call(a.copy_to_host, target)
        call(a.spill, data.draw(tiers))
        call(a.prefetch, self.stream(data))
        a.free()

    @rule(data=st.data(), value=st.one_of(hostile, st.just(np.array([object()])),
                                          st.lists(st.floats(), max_size=4)))
    def from_host(self, data, value):
        a = call(spillway.DeferrableArray.from_host, self.rt, value, self.stream(data))
        if a is not None:
            call(a.copy_to_host)
            a.free()

    @rule(data=st.data(), read=st.booleans(),
          stream=st.one_of(st.none(), hostile), max_version=st.one_of(
              st.none(), st.tuples(st.integers(-1, 3), st.integers(-1, 3)), hostile),
          dl_device=st.one_of(st.none(), st.tuples(st.integers(0, 3), st.integers(0, 2)),
                              hostile),
          copy=st.one_of(st.none(), st.booleans(), hostile))
    def lend_through_dlpack(self, data, read, stream, max_version, dl_device, copy):
        """A lent view's DLPack export with hostile arguments: a documented error or a
        capsule; every capsule's deleter runs (consumed or not); after the lend, every
        protocol is BufferError."""
        a = call(spillway.DeferrableArray.from_host, self.rt,
                 np.arange(data.draw(st.integers(0, 64)), dtype=np.int32))
        if a is None:
            return
        before = spillway._spillway._dlpack_live()
        view = None
        lend_stream = data.draw(st.sampled_from(self.streams), label="lend stream")
        with a.lend(lend_stream, read) as view:  # hostile streams: the acquire rules
            try:
                cap = view.__dlpack__(stream=stream, max_version=max_version,
                                      dl_device=dl_device, copy=copy)
            except DOCUMENTED + (BufferError,):
                cap = None
            del cap
            if BACKEND == "host":
                x = np.from_dlpack(view)
                assert x.ctypes.data == view.ptr and x.flags.writeable != read
                del x
        assert spillway._spillway._dlpack_live() == before
        for f in (view.__dlpack__, view.__dlpack_device__):
            try:
                f()
                raise AssertionError("a view used after its lend was not refused")
            except BufferError:
                pass
        a.free()

    @rule(data=st.data(), library=st.one_of(st.sampled_from(P.LIBRARIES), hostile),
          nbytes=sizes, how=st.sampled_from(["free", "free-stream", "drop", "twice"]))
    def lend_memory_to_a_library(self, data, library, nbytes, how):
        """process.allocate with hostile arguments, then each way of giving it back; the
        library's count of live allocations returns to what it was."""
        before = {k: v["live"] for k, v in P.usage(0).items()}
        a = call(P.allocate, library, nbytes, 0,
                 data.draw(st.one_of(st.none(), hostile_streams), label="stream"))
        if a is not None:
            if how == "free-stream":
                call(a.free, data.draw(st.one_of(st.none(), hostile_streams), label="free on"))
            if how == "twice":
                a.free()
            if how != "drop":
                a.free()
            del a
            P.runtime(0).synchronize()
        after = {k: v["live"] for k, v in P.usage(0).items()}
        assert after["cupy"] == before["cupy"] and after["cuda.core"] == before["cuda.core"]

    @rule(data=st.data())
    def controller_calls(self, data):
        c = self.controller
        target = data.draw(st.one_of(st.sampled_from(self.buffers), hostile,
                                     st.lists(st.sampled_from(self.buffers), max_size=3)))
        call(c.info, target)
        call(c.spill, target, data.draw(tiers))
        call(c.prefetch, target, self.stream(data))
        call(c.stats)

    @rule(field=st.sampled_from(size_fields), value=size_values,
          keyword=st.sampled_from(["backend", "io", "log_level"]),
          word=st.one_of(st.sampled_from(["host", "posix", "off", "HOST", "auto"]), hostile),
          stable=st.one_of(st.sampled_from([None, True, False]), hostile))
    def runtime_config(self, field, value, keyword, word, stable):
        kw = {field: value}
        if field == "host_device_bytes" and isinstance(value, int) and value > 64 * MiB:
            kw[field] = 64 * MiB  # a real allocation of that size is not the point here
        rt = call(make_runtime, **kw)
        if rt is not None:
            rt.close()
        rt = call(make_runtime, **{keyword: word})
        if rt is not None:
            rt.close()
        rt = call(make_runtime, stable_addresses=stable)
        if rt is not None:
            call(lambda: rt.stable_granularity)
            rt.close()

    @rule(value=hostile)
    def module_functions(self, value):
        call(spillway.parse_size, value)
        call(spillway.stream_handle, value)
        call(spillway.error_class, value)

    @rule(name=st.sampled_from(["Buffer", "Lock", "LaunchLocks", "LaunchView", "RuntimeBase",
                                "ControllerLink", "LaunchExtensionBase"]), arg=hostile)
    def build_extension_types(self, name, arg):
        cls = getattr(spillway._spillway, name)
        obj = call(cls)
        call(cls, arg)
        bare = call(cls.__new__, cls)  # never initialized: every method must still be safe
        if bare is not None:
            for attr in ("prepare_args", "close", "take", "alloc", "limits"):
                fn = getattr(bare, attr, None)
                if fn is not None:
                    call(fn, None, arg, stream=None, retr=[]) if attr == "prepare_args" \
                        else call(fn)
        if obj is not None:  # one that may be built: every call on it is refused or works
            for attr in ("close", "stats", "_stats", "limits", "alloc", "take", "summary"):
                fn = getattr(obj, attr, None)
                if fn is not None:
                    call(fn)
            del obj

    @rule()
    def streams_come_and_go(self):
        s = self.rt.stream()
        s.close()
        if BACKEND != "cuda":  # on CUDA a destroyed cudaStream_t is a dangling pointer
            call(self.rt.synchronize, s)
        s.close()

    @precondition(lambda self: len(self.buffers) < 64)
    @rule(data=st.data(), n=st.integers(2, 4))
    def threads(self, data, n):
        """A few threads at once, each with its own random calls on shared buffers."""
        plans = [[(data.draw(st.sampled_from(["alloc", "acquire", "spill", "prefetch", "free",
                                                "stats", "sync"])), self.buffer(data),
                   data.draw(sizes)) for _ in range(4)] for _ in range(n)]
        failures: list = []
        s = self.streams[1]

        def run(plan):
            try:
                for op, b, nbytes in plan:
                    is_buf = isinstance(b, spillway.Buffer)
                    if op == "alloc":
                        nb = call(self.rt.alloc, nbytes)
                        if nb is not None:
                            nb.free()
                    elif op == "acquire" and is_buf:
                        if call(b.acquire, s) is not None:
                            call(b.release_async, s)
                    elif op == "spill":
                        call(self.rt.spill, b)
                    elif op == "prefetch":
                        call(self.rt.prefetch, b, s)
                    elif op == "free":
                        call(spillway.Buffer.free, b)
                    elif op == "stats":
                        self.rt.stats()
                    elif op == "sync":
                        call(self.rt.release_async, s)
            except BaseException as e:  # noqa: B902 (reported below, on the main thread)
                failures.append(e)

        ts = [threading.Thread(target=run, args=(p,)) for p in plans]
        for t in ts:
            t.start()
        for t in ts:
            t.join(60)
        assert not any(t.is_alive() for t in ts), "a thread did not finish"
        if failures:
            raise failures[0]

    @rule(data=st.data(), nbytes=st.one_of(st.integers(MiB - 1, 2 * MiB + 1), hostile),
          way=st.sampled_from(["lend", "reclaim"]))
    def peer_tier(self, data, nbytes, way):
        """Lends and reclaims between this runtime, the other, a closed one and hostile
        objects; the round trip below then spills to HOST or, where memory is lent to
        this runtime, PEER."""
        runtimes = [self.rt, self.other, self.closed]
        lender = data.draw(st.sampled_from(runtimes), label="lender")
        borrower = data.draw(st.one_of(st.sampled_from(runtimes), hostile), label="borrower")
        if way == "lend":
            call(lender.peer_lend, borrower, nbytes)
        else:
            call(lender.peer_reclaim, borrower)

    @rule()
    def replace_the_other_runtime(self):
        """The other runtime's buffers become a closed runtime's."""
        self.other.synchronize()
        self.other.close()
        self.other = make_runtime(spill_dir=self.dir.name)
        self.buffers.append(self.other.alloc(4096))

    # -- the property every call must leave true --------------------------------------------------
    @invariant()
    def a_good_round_trip_works(self):
        # A good citizen first lets go of every lock the random calls left behind.
        for s in self.streams[1:]:
            s.synchronize()
        self.rt.synchronize()
        if BACKEND == "cuda":  # the per-thread default stream, which rules may have named
            self.rt.synchronize(2)
        self.rt.async_error()  # what background work said about earlier hostile calls
        pattern = np.arange(16 * KiB, dtype=np.uint32)
        a = spillway.DeferrableArray.from_host(self.rt, pattern)
        a.spill(spillway.Tier.HOST)
        self.rt.wait_idle()
        assert a.tier in (spillway.Tier.HOST, spillway.Tier.PEER)  # PEER where lent to
        a.spill(spillway.Tier.DISK)
        self.rt.wait_idle()
        assert a.tier == spillway.Tier.DISK
        np.testing.assert_array_equal(a.copy_to_host(), pattern)
        a.free()


ApiMachine.TestCase.settings = settings(
    max_examples=EXAMPLES, stateful_step_count=STEPS, deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                           HealthCheck.filter_too_much])
test_api_machine = ApiMachine.TestCase
