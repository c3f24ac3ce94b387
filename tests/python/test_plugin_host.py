# SPDX-License-Identifier: Apache-2.0
"""The EMM plugin's memory semantics, without a GPU.

Numba cannot create a CUDA context without a GPU, so these tests hand the plugin a context
object with the one attribute it reads (``device``) and run the plugin itself for real,
with Numba's own MemoryPointer, against a host-backend runtime. With a GPU,
test_numba_gpu.py runs the same behaviours under real Numba, and this module is skipped
(the plugin keeps one runtime per device per process)."""
import gc

import pytest

from conftest import HAVE_GPU

pytest.importorskip("numba.cuda")
pytestmark = pytest.mark.skipif(HAVE_GPU, reason="covered under real Numba by test_numba_gpu")

import spillway  # noqa: E402
import spillway.numba as sn  # noqa: E402

MiB = 1 << 20


class HostContext:
    """What the plugin reads of numba's Context."""

    class device:
        id = 0


@pytest.fixture
def plugin():
    sn.configure(backend="host", device_limit=64 * MiB, host_device_bytes=128 * MiB,
                 ignore_env=True, log_level="error")
    m = sn.SpillwayNumbaManager(context=HostContext())
    m.initialize()
    yield m
    gc.collect()
    m.reset()
    sn.configure()


def settle(rt):
    gc.collect()
    rt.wait_idle()


def test_initialize_is_idempotent(plugin):
    rt = sn.runtime(0)
    plugin.initialize()
    plugin.initialize()
    assert sn.runtime(0) is rt


def test_a_context_on_a_raw_cuda_device_handle_is_accepted():
    # A context made by a third party names its device by a CUdevice, which has no `.id`
    # but converts to the ordinal.
    class RawDevice:
        def __int__(self):
            return 0

    class ThirdPartyContext:
        device = RawDevice()

    sn.configure(backend="host", device_limit=64 * MiB, ignore_env=True, log_level="error")
    m = sn.SpillwayNumbaManager(context=ThirdPartyContext())
    try:
        m.initialize()
        assert m.memalloc(4096).device_ctypes_pointer.value
    finally:
        gc.collect()
        m.reset()
        sn.configure()


def test_memalloc_takes_a_locked_buffer_from_the_budget(plugin):
    p = plugin.memalloc(MiB)
    s = sn.runtime(0).stats()
    assert p.size == MiB and int(p.device_pointer) != 0
    assert s.buffers == 1 and s.locked_bytes == MiB


def test_memalloc_allocates_under_the_numba_owner(plugin):
    import spillway.process as P
    p = plugin.memalloc(MiB)
    rt = sn.runtime(0)
    o = rt.owner_stats(P.OWNERS["numba"])
    assert (o["buffers"], o["bytes"], o["name"]) == (1, MiB, "numba")
    assert "owners: numba 1 buffer 1.0 MiB" in rt.summary()
    del p
    settle(rt)
    rt.synchronize(None)  # the free is ordered on the default stream
    rt.wait_idle()
    assert rt.owner_stats(P.OWNERS["numba"])["buffers"] == 0


def test_no_release_of_another_stream_unlocks_numba_memory(plugin):
    rt = sn.runtime(0)
    p = plugin.memalloc(MiB)
    rt.synchronize(None)
    rt.release_async(None)
    rt.wait_idle()
    assert rt.stats().locked_bytes == MiB
    assert p.size == MiB


def test_numba_allocations_spill_unlocked_deferrable_arrays(plugin):
    rt = sn.runtime(0)
    arrays = [spillway.DeferrableArray(rt, 8 * MiB, "u1") for _ in range(7)]  # 56 of 64 MiB
    p = plugin.memalloc(32 * MiB)
    s = rt.stats()
    assert s.spills_on_demand >= 3 and s.device_bytes <= s.device_limit
    assert sum(a.tier != spillway.Tier.DEVICE for a in arrays) >= 3
    assert p.size == 32 * MiB


def test_numba_memory_is_never_chosen_to_spill(plugin):
    rt = sn.runtime(0)
    p = plugin.memalloc(16 * MiB)
    arrays = [spillway.DeferrableArray(rt, 8 * MiB, "u1") for _ in range(12)]  # 96 MiB more
    assert rt.stats().spills > 0
    assert rt.stats().locked_bytes == 16 * MiB
    assert len(arrays) == 12 and p.size == 16 * MiB


def test_memory_numba_frees_returns_to_the_budget_once_the_default_stream_passes(plugin):
    rt = sn.runtime(0)
    p = plugin.memalloc(MiB)
    del p
    settle(rt)
    assert rt.stats().buffers == 0 and rt.stats().locked_bytes == 0


def test_out_of_memory_is_a_memory_error_and_numbas_cuda_api_error(plugin):
    from numba.cuda.cudadrv.driver import CudaAPIError
    held = [plugin.memalloc(16 * MiB) for _ in range(4)]
    with pytest.raises(MemoryError) as e:
        plugin.memalloc(16 * MiB)
    assert isinstance(e.value, CudaAPIError) and isinstance(e.value, spillway.OutOfMemoryError)
    assert e.value.code.name == "CUDA_ERROR_OUT_OF_MEMORY"
    assert "locked" in str(e.value)
    assert len(held) == 4


def test_memory_info_is_the_budget_and_its_unlocked_part(plugin):
    p = plugin.memalloc(4 * MiB)
    info = plugin.get_memory_info()
    assert info.total == 64 * MiB and info.free == 60 * MiB
    assert p.size == 4 * MiB


def test_reset_closes_the_runtime_and_the_next_use_makes_a_new_one(plugin):
    old = sn.runtime(0)
    p = plugin.memalloc(MiB)
    plugin.reset()
    assert old.closed
    del p  # its finalizer finds the runtime closed: nothing to do
    gc.collect()
    q = plugin.memalloc(MiB)
    assert sn.runtime(0) is not old and sn.runtime(0).stats().buffers == 1
    assert q.size == MiB


def test_a_zero_byte_allocation_is_a_null_pointer(plugin):
    p = plugin.memalloc(0)
    assert int(p.device_pointer) == 0 and sn.runtime(0).stats().buffers == 0


def test_numba_allocations_are_counted_for_numba_in_usage(plugin):
    u0 = spillway.usage(0)["numba"]
    p = plugin.memalloc(MiB)
    u = spillway.usage(0)["numba"]
    assert u["live"] == u0["live"] + 1 and u["live_bytes"] == u0["live_bytes"] + MiB
    assert u["allocs"] == u0["allocs"] + 1
    p.free()
    assert spillway.usage(0)["numba"]["live"] == u0["live"]


def test_a_failed_numba_allocation_is_counted_as_a_failure(plugin):
    held = [plugin.memalloc(16 * MiB) for _ in range(4)]
    before = spillway.usage(0)["numba"]["failures"]
    with pytest.raises(MemoryError):
        plugin.memalloc(16 * MiB)
    assert spillway.usage(0)["numba"]["failures"] == before + 1
    del held
