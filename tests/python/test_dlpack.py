# SPDX-License-Identifier: Apache-2.0
"""Lending deferrable arrays through DLPack, on the host backend: there the emulated device
memory is host memory, so a lent view is a kDLCPU tensor and numpy.from_dlpack is a real
consumer. test_allocators_gpu.py runs torch.from_dlpack and cupy.from_dlpack on a GPU."""
import ctypes

import numpy as np
import pytest

import spillway
from spillway import _spillway as _c

_capsule_name = ctypes.pythonapi.PyCapsule_GetName
_capsule_name.restype = ctypes.c_char_p
_capsule_name.argtypes = [ctypes.py_object]


@pytest.fixture
def arr(rt):
    a = spillway.DeferrableArray.from_host(rt, np.arange(24, dtype=np.float32).reshape(4, 6))
    yield a
    a.free()


def test_a_lent_view_is_a_host_tensor_on_the_host_backend(arr):
    with spillway.lend(arr) as v:
        assert v.__dlpack_device__() == (1, 0)


def test_numpy_reads_a_lent_array_zero_copy(arr):
    with spillway.lend(arr) as v:
        x = np.from_dlpack(v)
        assert x.shape == (4, 6) and x.dtype == np.float32
        assert x.ctypes.data == v.ptr
        assert (x == np.arange(24, dtype=np.float32).reshape(4, 6)).all()
        x[0, 0] = 100.0  # written through the view, into the array's buffer
        del x
    assert arr.copy_to_host()[0, 0] == 100.0


def test_a_fortran_ordered_array_keeps_its_strides(rt):
    host = np.asfortranarray(np.arange(12, dtype=np.int16).reshape(3, 4))
    a = spillway.DeferrableArray.from_host(rt, host)
    with spillway.lend(a) as v:
        x = np.from_dlpack(v)
        assert x.flags.f_contiguous and (x == host).all()
        del x
    a.free()


@pytest.mark.parametrize("dtype", ["bool", "int8", "uint16", "int64", "float16", "float64",
                                   "complex64", "complex128"])
def test_every_dtype_of_a_deferrable_array_crosses_dlpack(rt, dtype):
    host = (np.arange(10) % 3).astype(dtype)
    a = spillway.DeferrableArray.from_host(rt, host)
    with spillway.lend(a) as v:
        x = np.from_dlpack(v)
        assert x.dtype == host.dtype and (x == host).all()
        del x
    a.free()


def test_the_view_refuses_both_protocols_after_the_lend(arr):
    with spillway.lend(arr) as v:
        pass
    assert not v.live
    with pytest.raises(BufferError, match="ended"):
        v.__dlpack__()
    with pytest.raises(BufferError, match="ended"):
        v.__dlpack_device__()
    with pytest.raises(BufferError, match="ended"):
        v.__cuda_array_interface__
    with pytest.raises(BufferError):
        np.from_dlpack(v)


def test_the_lock_lasts_as_long_as_the_lend(arr):
    with spillway.lend(arr) as v:
        assert arr.lock_count == 1
        np.from_dlpack(v)
    arr.runtime.synchronize()
    arr.runtime.wait_idle()
    assert arr.lock_count == 0


def test_capsules_are_freed_whether_consumed_or_not(arr):
    before = _c._dlpack_live()
    with spillway.lend(arr) as v:
        caps = [v.__dlpack__(), v.__dlpack__(max_version=(1, 0))]
        assert _c._dlpack_live() == before + 2
        del caps  # never consumed: the capsules' destructors call the deleters
        x = np.from_dlpack(v)
        assert _c._dlpack_live() == before + 1
        del x  # consumed: numpy calls the deleter when the array goes
    assert _c._dlpack_live() == before


def test_max_version_chooses_the_versioned_capsule(arr):
    with spillway.lend(arr) as v:
        assert _capsule_name(v.__dlpack__()) == b"dltensor"
        assert _capsule_name(v.__dlpack__(max_version=(0, 8))) == b"dltensor"
        assert _capsule_name(v.__dlpack__(max_version=(1, 0))) == b"dltensor_versioned"
        assert _capsule_name(v.__dlpack__(max_version=(2, 3))) == b"dltensor_versioned"


def test_a_read_only_lend_exports_a_read_only_tensor(arr):
    with spillway.lend(arr, read=True) as v:
        x = np.from_dlpack(v)  # numpy asks for a versioned capsule, which carries the flag
        assert not x.flags.writeable
        del x


@pytest.mark.parametrize("kwargs,exc", [
    ({"copy": True}, BufferError),
    ({"dl_device": (2, 0)}, BufferError),
    ({"stream": 1}, BufferError),  # a host tensor takes no stream
    ({"stream": "1"}, TypeError),
    ({"max_version": 1}, TypeError),
    ({"max_version": (1,)}, TypeError),
    ({"max_version": ("1", 0)}, TypeError),
])
def test_what_dlpack_cannot_do_is_refused(arr, kwargs, exc):
    with spillway.lend(arr) as v:
        with pytest.raises(exc):
            v.__dlpack__(**kwargs)
    assert _c._dlpack_live() == 0


def test_copy_false_and_the_own_device_are_accepted(arr):
    with spillway.lend(arr) as v:
        assert v.__dlpack__(copy=False, dl_device=(1, 0)) is not None


def test_the_consumer_sees_the_work_queued_on_the_lend_stream(rt, stream):
    a = spillway.DeferrableArray(rt, 1 << 20, np.uint8, stream=stream)
    src = np.full(1 << 20, 7, np.uint8)
    with spillway.lend(a, stream) as v:
        rt.memcpy(v.ptr, src.ctypes.data, src.nbytes, stream, wait=False)
        x = np.from_dlpack(v)  # waits for `stream` first
        assert (x == 7).all()
        del x
    a.free()


def test_lend_refuses_what_is_not_a_deferrable_array():
    with pytest.raises(TypeError, match="DeferrableArray"):
        spillway.lend(np.zeros(3))


@pytest.mark.parametrize("args", [
    (0, (2**63,), (1,), 2, 32, 1, 0, False, False),     # a dimension past int64
    (0, (2,), (1, 1), 2, 32, 1, 0, False, False),        # strides of another rank
    (0, (2,), (1,), 2, 0, 1, 0, False, False),           # 0 bits
    (0, (2,), (1,), 2, 32, 7, 0, False, False),          # a device type we never make
    (-1, (2,), (1,), 2, 32, 1, 0, False, False),         # a negative address
    (0, (1,) * 65, (1,) * 65, 2, 32, 1, 0, False, False),  # more dimensions than DLPack's 64
])
def test_the_capsule_builder_refuses_what_dlpack_cannot_describe(args):
    with pytest.raises(spillway.InvalidArgumentError):
        _c._dlpack_capsule(*args)
    with pytest.raises(TypeError):
        _c._dlpack_capsule(0, [2], (1,), 2, 32, 1, 0, False, False)
