# SPDX-License-Identifier: Apache-2.0
"""DeferrableArray without Numba: host copies in and out, spilling, lending a pointer."""
import gc

import numpy as np
import pytest

import spillway

MiB = 1 << 20


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int8, np.complex128])
@pytest.mark.parametrize("order", ["C", "F"])
def test_round_trip_keeps_contents_shape_and_order(rt, dtype, order):
    host = (np.arange(6 * 7 * 3) % 101).astype(dtype).reshape((6, 7, 3), order=order)
    a = spillway.DeferrableArray.from_host(rt, host)
    assert a.shape == host.shape and a.dtype == host.dtype and a.order == order
    assert a.strides == host.strides and a.nbytes == host.nbytes and a.ndim == 3
    out = a.copy_to_host()
    np.testing.assert_array_equal(out, host)
    assert out.flags.f_contiguous == (order == "F")


def test_contents_survive_a_spill(rt, stream):
    host = np.random.default_rng(1).random(MiB // 8)
    a = spillway.DeferrableArray.from_host(rt, host, stream)
    a.spill()
    rt.wait_idle()
    assert a.state == spillway.State.HOST
    np.testing.assert_array_equal(a.copy_to_host(stream=stream), host)


def test_arrays_beyond_the_budget_are_spilled_and_all_come_back_intact(rt):
    rng = np.random.default_rng(7)
    data = [rng.integers(0, 1 << 30, 2 * MiB, dtype=np.int32) for _ in range(24)]  # 192 MiB
    arrays = [spillway.DeferrableArray.from_host(rt, d) for d in data]
    assert rt.stats().spills > 0
    for a, d in zip(arrays, data):
        np.testing.assert_array_equal(a.copy_to_host(), d)


def test_reading_keeps_a_clean_host_copy(rt):
    a = spillway.DeferrableArray.from_host(rt, np.ones(MiB // 8))
    a.spill()
    rt.wait_idle()
    a.copy_to_host()
    a.spill()
    rt.wait_idle()
    assert rt.stats().clean_respills == 1


def test_copy_to_host_into_a_given_array(rt):
    a = spillway.DeferrableArray.from_host(rt, np.arange(10.0))
    out = np.zeros(10)
    assert a.copy_to_host(out) is out
    np.testing.assert_array_equal(out, np.arange(10.0))
    with pytest.raises(ValueError):
        a.copy_to_host(np.zeros(11))


def test_copy_from_host_checks_the_shape(rt):
    a = spillway.DeferrableArray(rt, (4, 4), np.float32)
    with pytest.raises(ValueError, match="shape"):
        a.copy_from_host(np.zeros((4, 5)))


def test_lend_pointer_locks_for_the_block_and_describes_the_array(rt, stream):
    a = spillway.DeferrableArray.from_host(rt, np.zeros((3, 5), np.float32), stream)
    with a.lend_pointer(stream) as view:
        cai = view.__cuda_array_interface__
        assert a.lock_count == 1
        assert cai["shape"] == (3, 5) and cai["typestr"] == "<f4"
        assert cai["strides"] == (20, 4) and cai["data"][0] == view.ptr
        assert cai["stream"] == stream.handle and cai["version"] == 3
        with pytest.raises(spillway.LockedError):
            a.spill()
    stream.wait()
    rt.wait_idle()
    assert a.lock_count == 0


def test_lend_pointer_releases_when_the_block_raises(rt, stream):
    a = spillway.DeferrableArray(rt, 16)
    with pytest.raises(KeyError):
        with a.lend_pointer(stream):
            raise KeyError
    rt.synchronize(stream)
    assert a.lock_count == 0


def test_collected_array_frees_its_buffer(rt):
    a = spillway.DeferrableArray(rt, MiB, np.uint8)
    assert rt.stats().buffers == 1
    del a
    gc.collect()
    assert rt.stats().buffers == 0


def test_empty_array_round_trips(rt):
    a = spillway.DeferrableArray.from_host(rt, np.zeros((0, 3)))
    assert a.copy_to_host().shape == (0, 3)


def test_read_only_marks_the_same_array(rt):
    a = spillway.DeferrableArray(rt, 8)
    assert a.read_only.array is a and a.read_only is a.read_only
