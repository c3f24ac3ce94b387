# SPDX-License-Identifier: Apache-2.0
"""The Numba launch extension's prepare_args, called the way numba-cuda's _Kernel.launch
calls it (per argument, with the launch stream and the `retr` list), on the host backend:
the locks a launch takes, their release after the launch, and the paths where numba never
runs `retr`."""
import gc
import pickle

import numpy as np
import pytest

pytest.importorskip("numba.cuda")

import spillway  # noqa: E402
from spillway import numba as sn  # noqa: E402

MiB = 1 << 20


def launch_args(args, stream):
    """What _Kernel.launch does before the launch: prepare every argument."""
    retr = []
    out = [sn.extension.prepare_args(getattr(a, "_numba_type_", None), a, stream=stream,
                                     retr=retr)[1] for a in args]
    return out, retr


def test_a_deferrable_argument_is_locked_on_the_launch_stream(rt, stream):
    a = spillway.DeferrableArray.from_host(rt, np.arange(8, dtype=np.float32))
    (view,), retr = launch_args([a], stream)
    assert a.lock_count == 1
    assert view.shape == (8,) and view.dtype == np.float32 and view.size == 8
    assert view._layout.strides_in_bytes == (4,) and view._layout.is_contiguous_c
    with pytest.raises(spillway.NotLockedError):
        a.buffer.release(None)  # the lock is the launch stream's
    for f in retr:
        f()
    stream.wait()
    rt.wait_idle()
    assert a.lock_count == 0


def test_the_view_points_at_the_locked_data(rt, stream):
    host = np.arange(16, dtype=np.int64)
    a = spillway.DeferrableArray.from_host(rt, host)
    (view,), retr = launch_args([a], stream)
    out = np.zeros_like(host)
    rt.memcpy(out.ctypes.data, view.ptr, host.nbytes, stream)
    np.testing.assert_array_equal(out, host)
    retr[0]()


def test_a_spilled_argument_is_brought_back_before_the_launch(rt, stream):
    host = np.arange(MiB // 8, dtype=np.float64)
    a = spillway.DeferrableArray.from_host(rt, host)
    a.spill()
    rt.wait_idle()
    (view,), retr = launch_args([a], stream)
    assert a.state == spillway.State.RESIDENT
    out = np.empty_like(host)
    rt.memcpy(out.ctypes.data, view.ptr, host.nbytes, stream)
    np.testing.assert_array_equal(out, host)
    retr[0]()


def test_release_after_the_launch_leaves_other_locks_of_the_stream(rt, stream):
    a, other = spillway.DeferrableArray(rt, 8), rt.alloc(4096)
    other.acquire(stream)
    _, retr = launch_args([a], stream)
    retr[0]()
    rt.wait_idle()
    assert a.lock_count == 0 and other.lock_count == 1
    rt.synchronize(stream)


def test_one_release_object_per_launch_for_all_its_arguments(rt, stream):
    a, b = spillway.DeferrableArray(rt, 8), spillway.DeferrableArray(rt, 8)
    _, retr = launch_args([a, 3, b, a], stream)
    assert len(retr) == 1 and retr[0].count == 3
    assert a.lock_count == 2 and b.lock_count == 1
    retr[0]()
    rt.wait_idle()
    assert a.lock_count == 0 and b.lock_count == 0


def test_other_arguments_pass_through_unchanged(rt, stream):
    host = np.zeros(3)
    retr = []
    assert sn.extension.prepare_args("ty", host, stream=stream, retr=retr) == ("ty", host)
    assert sn.extension.prepare_args(7, 7, stream=stream, retr=retr) == (7, 7)
    assert retr == []


def test_locks_are_released_when_a_later_argument_raises(rt, stream):
    a, dead = spillway.DeferrableArray(rt, 8), spillway.DeferrableArray(rt, 8)
    dead.free()

    def launch():
        launch_args([a, dead], stream)  # raises on `dead`: numba never runs retr

    with pytest.raises(spillway.FreedError):
        launch()
    gc.collect()
    rt.wait_idle()
    assert a.lock_count == 0


def test_locks_are_released_when_retr_is_dropped_without_being_called(rt, stream):
    a = spillway.DeferrableArray(rt, 8)
    _, retr = launch_args([a], stream)
    assert a.lock_count == 1
    del retr  # the launch raised before numba ran retr
    rt.wait_idle()
    assert a.lock_count == 0


def test_read_only_argument_is_acquired_for_reading(rt, stream):
    a = spillway.DeferrableArray.from_host(rt, np.ones(MiB // 8))
    a.spill()
    rt.wait_idle()
    _, retr = launch_args([sn.read_only(a)], stream)
    retr[0]()
    rt.synchronize(stream)
    a.spill()
    rt.wait_idle()
    assert rt.stats().clean_respills == 1
    (view,), retr2 = launch_args([sn.read_only(a)], stream)
    assert view.__cuda_array_interface__["data"][1] is True
    retr2[0]()
    assert not sn.read_only(a)._numba_type_.mutable
    assert a._numba_type_.mutable


def test_numba_type_of_a_deferrable_array_is_a_device_array_type(rt):
    from numba.cuda.typing.typeof import typeof
    a = spillway.DeferrableArray(rt, (4, 5), np.float32, order="F")
    t = typeof(a)
    assert t.ndim == 2 and t.layout == "F" and str(t.dtype) == "float32"


def test_stream_none_is_the_default_stream(rt):
    a = spillway.DeferrableArray(rt, 8)
    _, retr = launch_args([a], None)
    a.buffer.acquire(None)
    a.buffer.release(None)
    retr[0]()
    rt.synchronize(None)
    assert a.lock_count == 0


def test_the_extension_survives_pickling():
    ext = pickle.loads(pickle.dumps(sn.extension))
    assert isinstance(ext, sn.SpillwayExtension)


def test_jit_adds_the_extension_once():
    from numba import cuda

    def k(x):
        pass

    d = sn.jit(k, extensions=[sn.extension])
    assert d.targetoptions["extensions"].count(sn.extension) == 1
    assert isinstance(cuda.jit(k), type(d))


def test_an_array_freed_after_its_launch_keeps_its_memory_until_the_release(rt, stream):
    a = spillway.DeferrableArray(rt, MiB, np.uint8)
    _, retr = launch_args([a], stream)
    a.free()
    assert rt.stats().buffers == 1  # the launch still holds it
    retr[0]()
    rt.wait_idle()
    assert rt.stats().buffers == 0


def test_an_array_dropped_after_its_launch_is_freed_with_the_release(rt, stream):
    a = spillway.DeferrableArray(rt, MiB, np.uint8)
    views, retr = launch_args([a], stream)
    del a, views  # numba drops the launch's views once the kernel is queued
    gc.collect()
    assert rt.stats().buffers == 1
    del retr
    rt.wait_idle()
    assert rt.stats().buffers == 0
