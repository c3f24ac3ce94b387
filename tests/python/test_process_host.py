# SPDX-License-Identifier: Apache-2.0
"""The process's shared runtimes (spillway.process), the memory lent to libraries that keep
raw pointers (the path of the CuPy allocator and the cuda.core memory resource), and the
PyTorch allocator library called through ctypes, all on the host backend.

The shared runtime of device 0 is configured here for the host backend; with a GPU the
conftest has configured it for the GPU already, and test_allocators_gpu.py runs the same
behaviours there under real CuPy, PyTorch and cuda.core, so this module is skipped."""
import ctypes
import gc
import json
import shutil
import subprocess
import threading
import time
import warnings

import numpy as np
import pytest

from conftest import HAVE_GPU

pytestmark = pytest.mark.skipif(HAVE_GPU, reason="covered under real libraries by "
                                "test_allocators_gpu (the shared runtime is the GPU's there)")

import spillway  # noqa: E402
import spillway.plot as plot  # noqa: E402
import spillway.process as P  # noqa: E402
import spillway.torch as T  # noqa: E402

MiB = 1 << 20
LIMIT = 64 * MiB


@pytest.fixture
def shared():
    P.configure(backend="host", device_limit=LIMIT, host_device_bytes=2 * LIMIT,
                ignore_env=True, log_level="error")
    yield P.device(0)
    gc.collect()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        P.reset(0)
    P.configure()


def settle(rt):
    gc.collect()
    rt.synchronize()  # the stream-ordered frees of the default stream complete
    rt.wait_idle()


def lib():
    return T._library()


# -- one runtime per device ---------------------------------------------------------------
def test_each_device_has_one_runtime_per_process(shared):
    assert P.runtime(0) is shared.runtime
    assert P.device(0) is shared
    assert P.existing(0) is shared


def test_numba_and_the_allocators_share_the_runtime(shared):
    sn = pytest.importorskip("spillway.numba")
    assert sn.runtime(0) is P.runtime(0)


def test_configure_after_the_first_use_is_refused(shared):
    with pytest.raises(RuntimeError, match="before the first use"):
        P.configure(device_limit=LIMIT)


def test_configure_takes_no_device():
    with pytest.raises(TypeError, match="no device"):
        P.configure(device=1)


@pytest.mark.parametrize("bad,exc", [("0", TypeError), (None, TypeError), (True, TypeError),
                                     (1.0, TypeError), (-1, ValueError), (2**31, ValueError)])
def test_a_device_that_is_not_an_ordinal_is_refused(bad, exc):
    with pytest.raises(exc):
        P.device(bad)
    with pytest.raises(exc):
        P.usage(bad)


def test_a_shared_runtime_refuses_to_be_closed_directly(shared):
    with pytest.raises(RuntimeError, match="reset"):
        shared.runtime.close()
    assert not shared.runtime.closed


def test_reset_closes_the_runtime_and_the_next_use_makes_a_new_one(shared):
    old = shared.runtime
    assert P.reset(0)
    assert old.closed
    assert P.existing(0) is None
    assert P.runtime(0) is not old


# -- memory lent to libraries ---------------------------------------------------------------
def test_an_allocation_counts_against_the_budget_and_in_usage(shared):
    a = P.allocate("cupy", 4 * MiB)
    s = shared.runtime.stats()
    assert s.buffers == 1 and s.locked_bytes >= 4 * MiB
    u = P.usage(0)
    assert u["cupy"] == {"live": 1, "live_bytes": 4 * MiB, "allocs": 1,
                         "alloc_bytes": 4 * MiB, "failures": 0}
    assert u["deferrable"] == {"live": 0, "live_bytes": 0}
    a.free()


def test_usage_attributes_the_rest_of_the_runtime_to_deferrable_arrays(shared):
    arr = spillway.DeferrableArray(shared.runtime, MiB, np.uint8)
    a = P.allocate("cuda.core", 2 * MiB)
    u = P.usage(0)
    assert u["cuda.core"]["live_bytes"] == 2 * MiB
    assert u["deferrable"] == {"live": 1, "live_bytes": MiB}
    a.free()
    arr.free()


def test_an_allocation_names_its_library_device_and_stream(shared):
    a = P.allocate("cuda.core", MiB)
    assert (a.library, a.device, a.size, a.stream, a.freed) == ("cuda.core", 0, MiB, 0, False)
    assert a.runtime is shared.runtime and a.ptr
    assert "cuda.core" in repr(a)
    a.free()
    assert a.freed and "freed" in repr(a)


def test_an_allocation_cannot_be_built_from_python():
    with pytest.raises(TypeError):
        P.Allocation()


def test_reset_abandons_a_runtime_in_which_a_library_still_holds_memory(shared):
    a = P.allocate("cupy", MiB)
    with pytest.warns(RuntimeWarning, match="abandoned"):
        assert not P.reset(0)
    assert not shared.runtime.closed  # CuPy's pointer stays valid
    assert P.existing(0) is None     # the next use makes a new runtime
    a.free()


def test_a_forced_reset_closes_it_and_a_later_free_does_nothing(shared):
    a = P.allocate("cupy", MiB)
    assert P.reset(0, force=True)   # Numba's context reset: that memory is dead anyway
    assert shared.runtime.closed
    a.free()
    assert a.freed


def test_a_freed_allocation_goes_back_to_the_budget_in_stream_order(shared):
    a = P.allocate("cupy", 4 * MiB)
    a.free()
    assert a.freed
    settle(shared.runtime)
    s = shared.runtime.stats()
    assert s.buffers == 0 and s.locked_bytes == 0
    assert P.usage(0)["cupy"]["live"] == 0


def test_freeing_twice_frees_once(shared):
    a = P.allocate("cupy", MiB)
    a.free()
    a.free()
    assert P.usage(0)["cupy"]["live"] == 0


def test_a_garbage_collected_allocation_is_freed(shared):
    P.allocate("cupy", MiB)  # dropped at once
    settle(shared.runtime)
    assert shared.runtime.stats().buffers == 0
    assert P.usage(0)["cupy"]["live"] == 0


def test_an_allocation_stays_resident_while_deferrable_arrays_spill_around_it(shared):
    rt = shared.runtime
    a = P.allocate("cupy", 16 * MiB)
    ctypes.memset(a.ptr, 0x5A, a.size)  # host backend: the "device" pointer is host memory
    arrays = [spillway.DeferrableArray.from_host(rt, np.full(MiB, i, np.uint32))
              for i in range(3 * LIMIT // (4 * MiB))]  # 3x the budget in deferrable arrays
    assert rt.stats().spills > 0
    assert ctypes.string_at(a.ptr, 64) == b"\x5a" * 64
    for i, arr in enumerate(arrays):
        assert (arr.copy_to_host() == i).all()
    a.free()


def test_an_allocation_that_needs_room_spills_deferrable_arrays(shared):
    rt = shared.runtime
    arrays = [spillway.DeferrableArray.from_host(rt, np.full(MiB, i, np.uint32))
              for i in range(LIMIT // (4 * MiB))]  # the whole budget
    before = rt.stats().spills_on_demand
    a = P.allocate("cupy", LIMIT // 2)
    assert rt.stats().spills_on_demand > before
    a.free()
    for i, arr in enumerate(arrays):
        assert (arr.copy_to_host() == i).all()


def test_out_of_memory_when_everything_is_locked_names_the_locked_bytes(shared):
    held = [P.allocate("cupy", 16 * MiB) for _ in range(LIMIT // (16 * MiB))]
    with pytest.raises(spillway.OutOfMemoryError, match="locked") as e:
        P.allocate("cupy", 16 * MiB)
    assert isinstance(e.value, MemoryError)
    assert str(LIMIT) in str(e.value)  # "67108864 of them locked"
    assert P.usage(0)["cupy"]["failures"] == 1
    for a in held:
        a.free()


def test_many_threads_allocate_and_free_at_once_and_the_counts_add_up(shared):
    errors = []
    before = P.usage(0)["cupy"]["allocs"]

    def work():
        try:
            for n in range(300):
                a = P.allocate("cupy", (n % 5 + 1) * 4096)
                if n % 2:
                    a.free()
                del a  # the other half: freed by garbage collection
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    u = P.usage(0)["cupy"]
    assert u["live"] == 0 and u["live_bytes"] == 0 and u["allocs"] == before + 2400
    settle(shared.runtime)
    assert shared.runtime.stats().buffers == 0


def test_a_free_on_something_that_is_not_a_stream_is_a_type_error(shared):
    a = P.allocate("cupy", MiB)
    with pytest.raises(TypeError):
        a.free("stream")
    with pytest.raises(TypeError):
        a.free(None, None)
    assert not a.freed
    a.free()


def test_an_unknown_library_is_a_value_error(shared):
    with pytest.raises(ValueError, match="library"):
        P.allocate("tensorflow", MiB)


@pytest.mark.parametrize("size,exc", [(0, spillway.InvalidArgumentError),
                                      (-1, spillway.InvalidArgumentError),
                                      (2**64, spillway.InvalidArgumentError),
                                      (1.5, TypeError), ("1", TypeError), (None, TypeError)])
def test_a_size_that_is_not_a_positive_int_is_refused(shared, size, exc):
    with pytest.raises(exc):
        P.allocate("cupy", size)
    assert P.usage(0)["cupy"]["live"] == 0


def test_an_allocation_on_a_stream_of_the_runtime_is_ordered_there(shared):
    s = shared.runtime.stream()
    a = P.allocate("cuda.core", MiB, 0, s)
    assert a.stream == s.handle
    a.free()
    s.synchronize()
    settle(shared.runtime)
    assert shared.runtime.stats().buffers == 0


def test_a_stream_the_runtime_does_not_know_is_refused(shared):
    with pytest.raises(spillway.InvalidStreamError):
        P.allocate("cupy", MiB, 0, 12345)  # host backend: only its own streams exist
    assert P.usage(0)["cupy"]["live"] == 0


# -- owners: the C runtime knows which library allocated what ------------------------------
def test_each_library_allocates_under_its_own_named_owner(shared):
    rt = shared.runtime
    held = [P.allocate(lib, (i + 1) * MiB) for i, lib in enumerate(P.LIBRARIES)]
    for i, lib in enumerate(P.LIBRARIES):
        assert rt.owner_stats(P.OWNERS[lib]) == {"buffers": 1, "bytes": (i + 1) * MiB,
                                                 "allocs": 1, "alloc_bytes": (i + 1) * MiB,
                                                 "name": lib}
    assert ("; owners: numba 1 buffer 1.0 MiB, cupy 1 buffer 2.0 MiB, torch 1 buffer 3.0 MiB, "
            "cuda.core 1 buffer 4.0 MiB") in rt.summary()
    for a in held:
        a.free()
    settle(rt)
    assert [rt.owner_stats(P.OWNERS[lib])["buffers"] for lib in P.LIBRARIES] == [0, 0, 0, 0]


def test_the_owners_and_usage_agree(shared):
    held = [P.allocate("cupy", MiB) for _ in range(3)] + [P.allocate("cuda.core", 2 * MiB)]
    held[0].free()
    settle(shared.runtime)
    u = P.usage(0)
    for lib in ("cupy", "cuda.core"):
        o = shared.runtime.owner_stats(P.OWNERS[lib])
        assert (o["buffers"], o["bytes"]) == (u[lib]["live"], u[lib]["live_bytes"])
        assert (o["allocs"], o["alloc_bytes"]) == (u[lib]["allocs"], u[lib]["alloc_bytes"])
    for a in held:
        a.free()


def test_memory_lent_without_a_library_has_no_owner(shared):
    rt = shared.runtime
    h, _ = rt._expose_alloc(MiB, shared.expose_handle)  # library=None: uncounted
    assert all(rt.owner_stats(i)["allocs"] == 0 for i in range(1, 256))
    rt._expose_free(h, shared.expose_handle)


def test_the_trace_names_each_library_and_draws_its_device_bytes(tmp_path):
    path = tmp_path / "trace.json"
    P.configure(backend="host", device_limit=LIMIT, host_device_bytes=2 * LIMIT,
                ignore_env=True, log_level="error", trace=str(path))
    libs = ("numba", "cupy", "cuda.core")
    want = {f"device ({lib})": (i + 1) * MiB for i, lib in enumerate(libs)}
    try:
        P.device(0)
        held = [P.allocate(lib, (i + 1) * MiB) for i, lib in enumerate(libs)]
        # The trace's writer samples each owner's bytes on the device every few ms.
        deadline = time.monotonic() + 10
        while True:
            last = {e["name"]: e["args"]["bytes"] for e in plot.load(str(path))
                    if e.get("ph") == "C"}
            if all(last.get(k) == v for k, v in want.items()):
                break
            assert time.monotonic() < deadline, last
            time.sleep(0.005)
        for a in held:
            a.free()
    finally:
        gc.collect()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            P.reset(0)
        P.configure()
    events = json.loads(path.read_text())  # closed with the runtime: one JSON array
    counters = {e["name"] for e in events if e.get("ph") == "C"}
    assert set(want) <= counters


# -- the PyTorch allocator library, through ctypes ----------------------------------------
@pytest.fixture
def torch_dev(shared):
    T.register(0)
    yield shared


def test_the_torch_library_allocates_in_the_shared_runtime(torch_dev):
    p = lib().spw_torch_alloc(4 * MiB, 0, None)
    assert p
    assert torch_dev.runtime.stats().locked_bytes >= 4 * MiB
    assert P.usage(0)["torch"]["live_bytes"] == 4 * MiB
    lib().spw_torch_free(p, 4 * MiB, 0, None)
    settle(torch_dev.runtime)
    assert torch_dev.runtime.stats().buffers == 0
    assert T.usage(0)["live"] == 0


def test_the_torch_library_allocates_under_the_torch_owner(torch_dev):
    rt = torch_dev.runtime
    assert rt.owner_stats(P.OWNERS["torch"])["name"] == "torch"  # named when registered
    p = lib().spw_torch_alloc(2 * MiB, 0, None)
    o = rt.owner_stats(P.OWNERS["torch"])
    assert (o["buffers"], o["bytes"], o["allocs"]) == (1, 2 * MiB, 1)
    lib().spw_torch_free(p, 2 * MiB, 0, None)
    settle(rt)
    assert rt.owner_stats(P.OWNERS["torch"])["buffers"] == 0


def test_the_torch_library_ignores_frees_of_pointers_it_did_not_hand_out(torch_dev):
    p = lib().spw_torch_alloc(MiB, 0, None)
    before = T.usage(0)["unknown_frees"]
    lib().spw_torch_free(p, MiB, 0, None)
    lib().spw_torch_free(p, MiB, 0, None)  # twice
    lib().spw_torch_free(0xDEAD0000, 16, 0, None)  # never allocated
    lib().spw_torch_free(None, 0, 0, None)  # NULL: nothing
    assert T.usage(0)["unknown_frees"] == before + 2
    assert T.usage(0)["live"] == 0


@pytest.mark.parametrize("size,device", [(0, 0), (-5, 0), (MiB, -1), (MiB, 64), (MiB, 1)])
def test_the_torch_library_returns_null_for_what_it_cannot_serve(torch_dev, size, device):
    assert not lib().spw_torch_alloc(size, device, None)
    assert T.usage(0)["live"] == 0


def test_the_torch_library_returns_null_when_everything_is_locked(torch_dev):
    held = [lib().spw_torch_alloc(16 * MiB, 0, None) for _ in range(LIMIT // (16 * MiB))]
    assert all(held)
    failures = T.usage(0)["failures"]
    assert not lib().spw_torch_alloc(16 * MiB, 0, None)
    u = T.usage(0)
    assert u["failures"] == failures + 1
    assert u["last_status"] == spillway._spillway.SPW_ERR_OUT_OF_MEMORY
    for p in held:
        lib().spw_torch_free(p, 16 * MiB, 0, None)


def test_the_torch_library_spills_deferrable_arrays_to_make_room(torch_dev):
    rt = torch_dev.runtime
    arrays = [spillway.DeferrableArray.from_host(rt, np.full(MiB, i, np.uint32))
              for i in range(3 * LIMIT // (4 * MiB))]
    p = lib().spw_torch_alloc(LIMIT // 2, 0, None)
    assert p
    lib().spw_torch_free(p, LIMIT // 2, 0, None)
    for i, arr in enumerate(arrays):
        assert (arr.copy_to_host() == i).all()


def test_the_torch_library_serves_many_threads_at_once(torch_dev):
    errors = []
    before = T.usage(0)  # the library's counters are the process's

    def work():
        try:
            for n in range(200):
                size = (n % 7 + 1) * 4096
                p = lib().spw_torch_alloc(size, 0, None)
                assert p
                lib().spw_torch_free(p, size, 0, None)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    u = T.usage(0)
    assert u["live"] == 0 and u["allocs"] - before["allocs"] == 1600
    assert u["unknown_frees"] == before["unknown_frees"]


def test_reset_is_refused_while_pytorch_holds_memory(torch_dev):
    p = lib().spw_torch_alloc(MiB, 0, None)
    with pytest.warns(RuntimeWarning, match="abandoned"):
        assert not P.reset(0)
    assert not torch_dev.runtime.closed  # kept alive: PyTorch's pointer stays valid
    lib().spw_torch_free(p, MiB, 0, None)  # still served by the abandoned runtime
    assert T.usage(0)["live"] == 0
    assert T._library().spw_torch_set_runtime(0, None, None, None) == 0


def test_register_refuses_a_device_the_library_cannot_serve():
    with pytest.raises(ValueError):
        T.register(64)
    with pytest.raises(TypeError):
        T.register("0")
    with pytest.raises(ValueError):
        T.usage(-1)


THROW_PROBE = r"""
#include <dlfcn.h>
#include <cstdio>
#include <stdexcept>
#include <sys/types.h>
int main(int argc, char **argv) {
  void *lib = dlopen(argv[1], RTLD_NOW);
  if (!lib) { std::printf("dlopen: %s\n", dlerror()); return 2; }
  auto f = (void *(*)(ssize_t, int, void *))dlsym(lib, "spw_torch_alloc_or_throw");
  if (!f) return 3;
  if (f(0, 5, nullptr) != nullptr) return 4;  // 0 bytes: NULL, no exception
  try {
    f(4096, 5, nullptr);                      // no runtime registered for device 5
  } catch (const std::exception &e) {
    std::printf("caught: %s\n", e.what());
    return 0;
  }
  return 5;
}
"""


def test_the_install_allocation_function_throws_a_cpp_exception_naming_the_reason(tmp_path):
    # PyTorch's swapped-in allocator does not check for NULL; the function install() gives
    # it throws instead, and PyTorch turns the exception into a RuntimeError. ctypes cannot
    # catch a C++ exception, so a small C++ program calls it, as PyTorch would.
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    src = tmp_path / "probe.cpp"
    src.write_text(THROW_PROBE)
    exe = tmp_path / "probe"
    subprocess.run([cxx, str(src), "-o", str(exe), "-ldl"], check=True)
    r = subprocess.run([str(exe), T.library_path()], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)
    assert "caught: CUDA out of memory (spillway): 4096 bytes on device 5" in r.stdout
    assert "no Spillway runtime is registered for device 5" in r.stdout


def test_the_allocator_of_each_form_is_chosen_by_its_symbol():
    with pytest.raises(ValueError):
        T.allocator("malloc")
