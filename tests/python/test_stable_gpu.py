# SPDX-License-Identifier: Apache-2.0
"""Address-stable deferrable arrays on a GPU (CUDA virtual memory management): the twins of
test_stable.py's host-backend tests, plus what only a device shows: a kernel launched on a
pointer taken before a spill works on the data after it comes back. Skipped without
numba-cuda and a CUDA device; skipped (with the reason) on a device or driver without
virtual memory management, where stable allocations are UnsupportedError."""
import gc

import numpy as np
import pytest

from conftest import HAVE_GPU

pytestmark = pytest.mark.gpu

if HAVE_GPU:
    from numba import cuda

    import spillway
    import spillway.numba as sn

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
    try:
        r.stable_granularity
    except spillway.UnsupportedError as e:
        pytest.skip(f"no virtual memory management here: {e}")
    gc.collect()
    cuda.synchronize()
    r.wait_idle()
    yield r
    cuda.synchronize()
    r.synchronize(None)
    r.wait_idle()


def device_pointer(a) -> int:
    with sn.lend(a) as d:
        p = d.__cuda_array_interface__["data"][0]
    sn.synchronize()  # the lend's lock goes once the stream passes the block
    return p


def round_trip(rt, a, tier) -> None:
    a.spill(tier)
    rt.wait_idle()
    assert a.tier == tier
    a.prefetch()
    rt.wait_idle()


def test_stable_granularity_is_a_power_of_two_of_at_least_64_kib(rt):
    g = rt.stable_granularity
    assert g >= 64 << 10 and g & (g - 1) == 0


def test_device_array_allocated_stable_is_stable(rt):
    assert sn.device_array(MiB, np.uint8, stable=True).is_stable


def test_device_array_stable_false_is_ordinary(rt):
    assert not sn.device_array(MiB, np.uint8, stable=False).is_stable


@pytest.mark.parametrize("tier", ["HOST", "DISK"])
@pytest.mark.parametrize("nbytes", [4096, 2 * MiB, 5 * MiB + 3])
def test_a_stable_array_keeps_its_device_pointer_across_a_spill_and_back(rt, tier, nbytes):
    a = sn.device_array(nbytes, np.uint8, stable=True)
    before = device_pointer(a)
    round_trip(rt, a, spillway.Tier[tier])
    assert device_pointer(a) == before


@pytest.mark.parametrize("tier", ["HOST", "DISK"])
def test_a_stable_array_keeps_its_data_across_a_spill_and_back(rt, tier):
    host = np.arange(MiB, dtype=np.float32)
    a = sn.to_device(host, stable=True)
    round_trip(rt, a, spillway.Tier[tier])
    np.testing.assert_array_equal(a.copy_to_host(), host)


def test_a_kernel_on_a_pointer_taken_before_a_spill_sees_the_data_after_it(rt):
    host = np.arange(MiB, dtype=np.float32)
    a = sn.to_device(host, stable=True)
    with sn.lend(a) as d:
        kept = dict(d.__cuda_array_interface__)
    sn.synchronize()
    round_trip(rt, a, spillway.Tier.HOST)
    # The kept pointer may be used only under a lock, as any buffer's.
    with a.lend_pointer():
        raw = cuda.from_cuda_array_interface(kept, sync=False)
        launch(add_plain, host.size, raw, 1.0)
    sn.synchronize()
    np.testing.assert_array_equal(a.copy_to_host(), host + 1)
