# SPDX-License-Identifier: Apache-2.0
"""Spillway as the allocator of CuPy, PyTorch and cuda.core, and deferrable arrays lent to
them through DLPack, on a GPU (marked ``gpu``; each test also skips without its library).

The process's shared runtime has the conftest's small budget (SPILLWAY_GPU_TEST_LIMIT,
256 MiB), so deferrable arrays 3x that size oversubscribe it, and the libraries'
allocations succeed only by spilling them. Tests that must install an allocator before the
library's first CUDA allocation (PyTorch's change_current_allocator, all three libraries in
one process) run in a fresh interpreter."""
import gc
import textwrap

import numpy as np
import pytest

from conftest import GPU_LIMIT, HAVE_GPU, run_python

pytestmark = pytest.mark.gpu

MiB = 1 << 20


def _fill(rt, n_bytes):
    """Deferrable arrays of 8 MiB holding n_bytes together, each filled with its index."""
    import spillway
    return [spillway.DeferrableArray.from_host(rt, np.full(2 * MiB, i, np.float32))
            for i in range(n_bytes // (8 * MiB))]


def _check(arrays):
    for i, a in enumerate(arrays):
        assert (a.copy_to_host() == i).all(), f"array {i} changed"


@pytest.fixture
def cupy():
    if not HAVE_GPU:
        pytest.skip("no GPU")
    return pytest.importorskip("cupy")


@pytest.fixture
def torch():
    if not HAVE_GPU:
        pytest.skip("no GPU")
    t = pytest.importorskip("torch")
    if not t.cuda.is_available():
        pytest.skip("PyTorch sees no CUDA device")
    return t


def test_cupy_allocations_succeed_by_spilling_deferrable_arrays(cupy):
    import spillway.cupy as sc
    import spillway.process as P
    dev = cupy.cuda.runtime.getDevice()
    rt = P.runtime(dev)
    arrays = _fill(rt, 3 * GPU_LIMIT)
    before = rt.stats().spills_on_demand
    with cupy.cuda.using_allocator(sc.malloc):
        n = GPU_LIMIT // 16                  # int32: a quarter of the budget each
        x = cupy.arange(n, dtype=cupy.int32)
        y = x * 2
        assert P.usage(dev)["cupy"]["live"] >= 2
        owner = rt.owner_stats(P.OWNERS["cupy"])  # the C runtime knows them as CuPy's
        assert owner["name"] == "cupy" and owner["buffers"] >= 2
        assert int(y[-1]) == 2 * (n - 1)
        assert int(y.sum(dtype=cupy.int64)) == n * (n - 1)
        del x, y
    cupy.cuda.Device().synchronize()
    assert rt.stats().spills_on_demand > before
    _check(arrays)


def test_cupy_allocations_on_a_non_blocking_stream_are_ordered_on_it(cupy):
    import spillway.cupy as sc
    import spillway.process as P
    dev = cupy.cuda.runtime.getDevice()
    s = cupy.cuda.Stream(non_blocking=True)
    live = P.usage(dev)["cupy"]["live"]
    with cupy.cuda.using_allocator(sc.malloc), s:
        for i in range(50):  # allocate, use and free on the stream, over and over
            x = cupy.full(1 << 20, i, dtype=cupy.int32)
            assert int(x.sum(dtype=cupy.int64)) == i << 20
            del x
        s.synchronize()
    assert P.usage(dev)["cupy"]["live"] == live


def test_cupy_out_of_memory_when_nothing_can_be_spilled_names_the_locked_bytes(cupy):
    import spillway.cupy as sc
    import spillway.process as P
    dev = cupy.cuda.runtime.getDevice()
    held = []
    with cupy.cuda.using_allocator(sc.malloc):
        with pytest.raises(sc.SpillwayCupyOutOfMemoryError, match="locked") as e:
            for _ in range(2 * GPU_LIMIT // (16 * MiB)):
                held.append(cupy.empty(16 * MiB, dtype=cupy.uint8))
    assert isinstance(e.value, cupy.cuda.memory.OutOfMemoryError)
    assert P.usage(dev)["cupy"]["failures"] >= 1
    del held


TORCH_POOL = textwrap.dedent("""
    import numpy as np, torch, spillway, spillway.process as P, spillway.torch as st
    P.configure(device_limit={limit})
    dev = torch.cuda.current_device()
    rt = P.runtime(dev)
    arrays = [spillway.DeferrableArray.from_host(rt, np.full(2 << 20, i, np.float32))
              for i in range(3 * {limit} // (8 << 20))]
    pool = st.mem_pool()
    before = rt.stats().spills_on_demand
    with torch.cuda.use_mem_pool(pool):            # these come from Spillway's budget
        t = torch.ones({limit} // 16, dtype=torch.int32, device="cuda")  # a quarter
        assert int(t.sum()) == {limit} // 16
        assert st.usage(dev)["live"] >= 1
        owner = rt.owner_stats(P.OWNERS["torch"])  # the C runtime knows them as PyTorch's
        assert owner["name"] == "torch" and owner["buffers"] >= 1
        assert rt.stats().spills_on_demand > before
        del t
    for i, a in enumerate(arrays):
        assert (a.copy_to_host() == i).all()
    held = []
    try:
        with torch.cuda.use_mem_pool(pool):        # nothing left to spill: PyTorch's OOM
            for _ in range(2 * {limit} // (16 << 20)):
                held.append(torch.empty(16 << 20, dtype=torch.uint8, device="cuda"))
        raise AssertionError("no out-of-memory error")
    except torch.cuda.OutOfMemoryError:
        pass
    assert st.usage(dev)["last_status"] == spillway._spillway.SPW_ERR_OUT_OF_MEMORY
    x = torch.ones(1024, device="cuda")            # PyTorch's own allocator goes on
    print("OK", P.usage(dev)["torch"])
""")


def test_torch_mem_pool_allocates_from_the_budget_and_fails_as_torch_out_of_memory(torch):
    # In a fresh process: PyTorch keeps a MemPool's freed blocks cached (allocated in
    # Spillway) for as long as the pool lives, which would shrink this process's budget.
    r = run_python(TORCH_POOL.format(limit=GPU_LIMIT), timeout=300)
    assert r.returncode == 0 and "OK" in r.stdout, r.stdout + r.stderr


TORCH_INSTALLED = textwrap.dedent("""
    import numpy as np, torch, spillway, spillway.process as P, spillway.torch as st
    P.configure(device_limit={limit})
    st.install()                                   # before PyTorch's first CUDA allocation
    rt = P.runtime(torch.cuda.current_device())
    arrays = [spillway.DeferrableArray.from_host(rt, np.full(2 << 20, i, np.float32))
              for i in range(3 * {limit} // (8 << 20))]
    before = rt.stats().spills_on_demand
    t = torch.full(({limit} // 16,), 3, dtype=torch.int32, device="cuda")  # needs room
    assert int(t.sum()) == 3 * ({limit} // 16), int(t.sum())
    assert rt.stats().spills_on_demand > before
    for i, a in enumerate(arrays):
        assert (a.copy_to_host() == i).all()
    held = []
    try:
        while True:               # nothing can be spilled: a RuntimeError with the reason
            held.append(torch.empty(16 << 20, dtype=torch.uint8, device="cuda"))
    except RuntimeError as e:
        assert "CUDA out of memory (spillway)" in str(e) and "locked" in str(e), str(e)
    assert st.usage()["last_status"] == spillway._spillway.SPW_ERR_OUT_OF_MEMORY
    del held
    t2 = torch.ones(1024, dtype=torch.int32, device="cuda")  # and PyTorch goes on
    assert int(t2.sum()) == 1024
    print("OK", P.usage(torch.cuda.current_device())["torch"])
""")


def test_torch_as_the_allocator_spills_deferrable_arrays_and_fails_cleanly(torch):
    r = run_python(TORCH_INSTALLED.format(limit=GPU_LIMIT), timeout=300)
    assert r.returncode == 0 and "OK" in r.stdout, r.stdout + r.stderr


ALL_THREE = textwrap.dedent("""
    import numpy as np, cupy, torch
    from numba import cuda
    import spillway, spillway.numba as sn, spillway.process as P, spillway.torch as st
    import spillway.cupy as sc
    P.configure(device_limit={limit})
    st.install()
    cupy.cuda.set_allocator(sc.malloc)
    dev = torch.cuda.current_device()
    rt = P.runtime(dev)
    arrays = [sn.to_device(np.full(2 << 20, i, np.float32))
              for i in range(3 * {limit} // (8 << 20))]
    # int32 elements: an eighth of the budget each. CuPy's and PyTorch's memory is locked
    # for its whole life, and torch's int32 sum makes an int64 copy (twice the bytes): with a
    # quarter each, three tensors + that copy passed the budget (H200, 2026-11-26).
    q = {limit} // 32
    n = cuda.to_device(np.ones(q, np.int32))            # Numba, through the EMM plugin
    c = cupy.full(q, 2, dtype=cupy.int32)               # CuPy
    t = torch.full((q,), 3, dtype=torch.int32, device="cuda")  # PyTorch
    s = int(t.sum()) + int(c.sum(dtype=cupy.int64)) + int(n.copy_to_host().sum(dtype=np.int64))
    assert s == 6 * q, s
    for i, a in enumerate(arrays):
        assert (a.copy_to_host() == i).all()
    u = P.usage(dev)
    assert u["numba"]["live"] >= 1 and u["cupy"]["live"] >= 1 and u["torch"]["live"] >= 1, u
    assert rt.stats().spills_on_demand > 0
    print("OK", {{k: v["live_bytes"] for k, v in u.items()}})
""")


def test_numba_cupy_and_torch_share_one_budget_in_one_process(cupy, torch):
    r = run_python(ALL_THREE.format(limit=GPU_LIMIT),
                   env={"NUMBA_CUDA_MEMORY_MANAGER": "spillway.numba"}, timeout=300)
    assert r.returncode == 0 and "OK" in r.stdout, r.stdout + r.stderr


def test_cuda_core_buffers_come_from_the_shared_budget():
    if not HAVE_GPU:
        pytest.skip("no GPU")
    core = pytest.importorskip("cuda.core")
    import spillway.process as P
    from spillway.cuda_core import SpillwayMemoryResource
    d = core.Device()
    d.set_current()
    mr = SpillwayMemoryResource(d.device_id)
    assert mr.is_device_accessible and not mr.is_host_accessible
    before = P.usage(d.device_id)["cuda.core"]["live"]
    buf = mr.allocate(MiB, stream=d.default_stream)
    assert buf.size == MiB and buf.memory_resource is mr
    assert P.usage(d.device_id)["cuda.core"]["live"] == before + 1
    owner = P.runtime(d.device_id).owner_stats(P.OWNERS["cuda.core"])
    assert owner["name"] == "cuda.core" and owner["buffers"] >= 1
    buf.close()
    gc.collect()
    assert P.usage(d.device_id)["cuda.core"]["live"] == before


def test_torch_and_cupy_read_a_lent_array_zero_copy_through_dlpack(cupy, torch):
    import spillway
    import spillway.process as P
    rt = P.runtime(torch.cuda.current_device())
    a = spillway.DeferrableArray.from_host(rt, np.arange(1024, dtype=np.float32))
    with spillway.lend(a) as v:
        assert v.__dlpack_device__() == (2, rt.device)
        t = torch.from_dlpack(v)
        assert t.data_ptr() == v.ptr
        t.mul_(2)
        c = cupy.from_dlpack(v)
        assert c.data.ptr == v.ptr
        c += 1
        torch.cuda.synchronize()
        del t, c
    assert (a.copy_to_host() == np.arange(1024, dtype=np.float32) * 2 + 1).all()
    with pytest.raises(BufferError):
        torch.from_dlpack(v)


def test_a_consumer_on_another_stream_is_ordered_after_the_lend_stream(torch):
    import spillway
    import spillway.process as P
    rt = P.runtime(torch.cuda.current_device())
    s = rt.stream()
    n = 1 << 24
    a = spillway.DeferrableArray(rt, n, np.float32, stream=s)
    src = np.full(n, 5, np.float32)
    with spillway.lend(a, s) as v:
        rt.memcpy(v.ptr, src.ctypes.data, src.nbytes, s, wait=False)  # queued on `s`
        t = torch.from_dlpack(v)  # PyTorch's stream waits for `s` (a CUDA event)
        assert float(t.sum()) == 5.0 * n
        del t
    s.synchronize()
    a.free()
