# SPDX-License-Identifier: Apache-2.0
"""Numba on a GPU with the Spillway EMM plugin (selected by NUMBA_CUDA_MEMORY_MANAGER in
conftest) and deferrable arrays in kernels, on a small device budget (GPU_LIMIT).
Skipped without numba-cuda and a CUDA device."""
import gc
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import GPU_LIMIT, HAVE_GPU, run_python

pytestmark = pytest.mark.gpu

if HAVE_GPU:
    from numba import cuda

    import spillway
    import spillway.numba as sn

    @sn.jit
    def add(x, v):
        i = cuda.grid(1)
        if i < x.size:
            x[i] += v

    @sn.jit
    def copy_scaled(src, dst, k):
        i = cuda.grid(1)
        if i < src.size:
            dst[i] = src[i] * k

    @cuda.jit
    def add_plain(x, v):
        i = cuda.grid(1)
        if i < x.size:
            x[i] += v

MiB = 1 << 20


def launch(kernel, n, *args, stream=0):
    kernel[(n + 255) // 256, 256, stream](*args)


@pytest.fixture
def rt():
    r = sn.runtime()
    # Settle what earlier tests left: Numba memory they dropped is released in stream order.
    gc.collect()
    cuda.synchronize()
    r.wait_idle()
    yield r
    cuda.synchronize()
    r.synchronize(None)
    r.wait_idle()


def test_the_plugin_is_numbas_memory_manager():
    assert isinstance(cuda.current_context().memory_manager, sn.SpillwayNumbaManager)


def test_numba_allocations_come_out_of_the_budget(rt):
    before = rt.stats()
    d = cuda.device_array(4 * MiB, dtype=np.uint8)
    after = rt.stats()
    assert after.buffers == before.buffers + 1
    assert after.locked_bytes >= before.locked_bytes + 4 * MiB
    del d


def test_numba_memory_is_released_to_the_budget_when_numba_frees_it(rt):
    d = cuda.to_device(np.ones(MiB))
    n = rt.stats().buffers
    del d
    cuda.synchronize()
    rt.wait_idle()
    assert rt.stats().buffers == n - 1


def test_numba_arrays_work_in_plain_kernels(rt):
    host = np.arange(100000, dtype=np.float32)
    d = cuda.to_device(host)
    launch(add_plain, host.size, d, 2.0)
    np.testing.assert_array_equal(d.copy_to_host(), host + 2)


def test_numba_allocation_spills_deferrable_arrays_instead_of_failing(rt):
    chunk = GPU_LIMIT // 8
    data = [np.full(chunk // 4, i, np.int32) for i in range(7)]
    arrays = [sn.to_device(x) for x in data]  # ~7/8 of the budget, unlocked
    spills = rt.stats().spills
    d = cuda.device_array(GPU_LIMIT // 2, dtype=np.uint8)  # needs room
    assert rt.stats().spills > spills
    assert sum(a.tier != spillway.Tier.DEVICE for a in arrays) >= 3
    del d
    for a, x in zip(arrays, data):
        np.testing.assert_array_equal(a.copy_to_host(), x)


def test_numba_memory_stays_resident_under_pressure(rt):
    host = np.arange(MiB, dtype=np.float32)
    d = cuda.to_device(host)
    pressure = [sn.device_array(GPU_LIMIT // 8, np.uint8) for _ in range(20)]  # 2.5x budget
    assert rt.stats().spills > 0
    launch(add_plain, host.size, d, 1.0)
    np.testing.assert_array_equal(d.copy_to_host(), host + 1)
    del pressure


def test_synchronizing_the_default_stream_keeps_numba_memory_locked(rt):
    d = cuda.device_array(8 * MiB, dtype=np.uint8)
    locked = rt.stats().locked_bytes
    sn.synchronize(0)
    rt.release_async(None)
    rt.wait_idle()
    assert rt.stats().locked_bytes >= locked
    del d


def test_kernels_on_deferrable_arrays_three_times_the_budget(rt):
    n = GPU_LIMIT // 4 // 16  # float32 elements per array: 16 arrays = 1x the budget
    host = [np.full(n, i, np.float32) for i in range(48)]  # 3x the budget
    arrays = [sn.to_device(h) for h in host]
    for rep in range(2):
        for a in arrays:
            launch(add, n, a, 1.0)
    cuda.synchronize()
    s = rt.stats()
    assert s.spills > 0 and s.unspills > 0
    for a, h in zip(arrays, host):
        np.testing.assert_array_equal(a.copy_to_host(), h + 2)
    rt.wait_idle()
    assert all(a.lock_count == 0 for a in arrays)


def test_read_only_argument_keeps_its_clean_copy(rt):
    src = sn.to_device(np.arange(MiB, dtype=np.float32))
    dst = sn.device_array(MiB, np.float32)
    src.spill()
    rt.wait_idle()
    clean = rt.stats().clean_respills
    launch(copy_scaled, MiB, sn.read_only(src), dst, 3.0)
    cuda.synchronize()
    rt.wait_idle()
    src.spill()
    rt.wait_idle()
    assert rt.stats().clean_respills == clean + 1
    np.testing.assert_array_equal(dst.copy_to_host(), np.arange(MiB, dtype=np.float32) * 3)


@pytest.mark.parametrize("which", ["default", "user", "per_thread"])
def test_launches_on_each_kind_of_stream(rt, which):
    stream = {"default": lambda: 0, "user": cuda.stream,
              "per_thread": cuda.per_thread_default_stream}[which]()
    host = np.arange(50000, dtype=np.float32)
    a = sn.to_device(host)
    for _ in range(3):
        launch(add, host.size, a, 1.0, stream=stream)
    if stream:
        stream.synchronize()
    cuda.synchronize()
    rt.wait_idle()
    assert a.lock_count == 0
    np.testing.assert_array_equal(a.copy_to_host(stream=stream or None), host + 3)


def test_a_launch_that_raises_leaves_no_lock(rt):
    a, dead = sn.device_array(1024, np.float32), sn.device_array(1024, np.float32)
    dead.free()
    with pytest.raises(spillway.FreedError):
        launch(copy_scaled, 1024, a, dead, 1.0)  # prepare_args of `dead` raises
    gc.collect()
    rt.wait_idle()
    assert a.lock_count == 0


def test_lend_gives_a_numba_device_array_locked_for_the_block(rt):
    host = np.arange(4096, dtype=np.float64)
    a = sn.to_device(host)
    s = cuda.stream()
    with sn.lend(a, s) as d:
        assert a.lock_count == 1
        assert d.shape == host.shape and d.dtype == host.dtype
        launch(add_plain, host.size, d, 5.0, stream=s)
    s.synchronize()
    rt.wait_idle()
    assert a.lock_count == 0
    np.testing.assert_array_equal(a.copy_to_host(), host + 5)


def test_get_memory_info_reports_the_budget():
    info = cuda.current_context().get_memory_info()
    assert info.total == GPU_LIMIT and 0 <= info.free <= info.total


def test_ipc_export_without_ipc_is_refused_with_the_way_to_turn_it_on():
    d = cuda.device_array(1024)
    with pytest.raises(spillway.UnsupportedError, match="SPILLWAY_IPC=1"):
        d.get_ipc_handle()


# Run as a script (a spawned child imports `child` from it): the parent allocates through
# the plugin with SPILLWAY_IPC=1 and exports with Numba's get_ipc_handle; each child opens the
# handle with Numba's own IPC (cuIpcOpenMemHandle) and sends back what it reads. With
# SPW_CHILD_DEFAULT the children run Numba's built-in manager: the handle is CUDA's own.
_IPC_SCRIPT = """
import multiprocessing as mp, os, sys
import numpy as np
from numba import cuda

def child(handle, queue):
    with handle as darr:
        queue.put((type(cuda.current_context().memory_manager).__name__, darr.copy_to_host()))

if __name__ == "__main__":
    import spillway.numba as sn
    host = np.arange(100_000, dtype=np.float64)
    d = cuda.to_device(host)                      # 800 kB: from an arena
    small = cuda.to_device(host[:10])[3:8]        # a view into a slab's block
    parent = type(cuda.current_context().memory_manager).__name__
    if os.environ.get("SPW_CHILD_DEFAULT"):
        del os.environ["NUMBA_CUDA_MEMORY_MANAGER"]  # read by the children only now
    ctx = mp.get_context("spawn")
    for arr, expect in ((d, host), (small, host[3:8])):
        handle = arr.get_ipc_handle()
        q = ctx.Queue()
        p = ctx.Process(target=child, args=(handle, q))
        p.start()
        manager, got = q.get(timeout=120)
        p.join(60)
        assert p.exitcode == 0 and (got == expect).all(), (p.exitcode, got[:4])
    print(parent, manager)
"""


@pytest.mark.parametrize("child_default", [False, True])
def test_numba_ipc_of_plugin_memory_opens_in_a_child(tmp_path, child_default):
    script = tmp_path / "ipc_child.py"
    script.write_text(_IPC_SCRIPT)
    env = dict(os.environ, NUMBA_CUDA_MEMORY_MANAGER="spillway.numba", SPILLWAY_IPC="1")
    if child_default:
        env["SPW_CHILD_DEFAULT"] = "1"
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    parent, child = r.stdout.split()
    assert parent == "SpillwayNumbaManager"
    assert child == ("NumbaCUDAMemoryManager" if child_default else "SpillwayNumbaManager")


def test_the_environment_variable_selects_the_plugin_in_a_fresh_process():
    r = run_python(
        "import numpy as np; from numba import cuda; import spillway.numba as sn\n"
        "d = cuda.to_device(np.arange(10.0))\n"
        "print(type(cuda.current_context().memory_manager).__name__, "
        "sn.runtime().stats().buffers, d.copy_to_host().sum())",
        env={"NUMBA_CUDA_MEMORY_MANAGER": "spillway.numba"})
    assert r.returncode == 0, r.stderr
    name, buffers, total = r.stdout.split()
    assert name == "SpillwayNumbaManager" and int(buffers) >= 1 and total == "45.0"


def test_set_memory_manager_selects_the_plugin_in_a_fresh_process():
    r = run_python(
        "import numpy as np; from numba import cuda; import spillway.numba as sn\n"
        "cuda.set_memory_manager(sn.SpillwayNumbaManager)\n"
        "d = cuda.device_array(100)\n"
        "print(type(cuda.current_context().memory_manager).__name__, "
        "sn.runtime().stats().buffers)",
        env={"NUMBA_CUDA_MEMORY_MANAGER": ""})
    assert r.returncode == 0, r.stderr
    name, buffers = r.stdout.split()
    assert name == "SpillwayNumbaManager" and int(buffers) >= 1


def test_context_reset_gives_a_fresh_runtime_in_a_fresh_process():
    r = run_python(
        "import numpy as np; from numba import cuda; import spillway.numba as sn\n"
        "d = cuda.to_device(np.arange(10.0)); a = sn.to_device(np.arange(5.0))\n"
        "old = sn.runtime(); cuda.close()\n"
        "d2 = cuda.to_device(np.arange(3.0))\n"
        "print(old.closed, sn.runtime() is not old, d2.copy_to_host().sum())",
        env={"NUMBA_CUDA_MEMORY_MANAGER": "spillway.numba"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True", "True", "3.0"]
