# SPDX-License-Identifier: Apache-2.0
"""Stream arguments: None, integer handles, spillway streams and foreign stream objects."""
import pytest

import spillway


class CudaStreamProtocol:  # cuda.core, recent CuPy and PyTorch
    def __init__(self, h):
        self.h = h

    def __cuda_stream__(self):
        return (0, self.h)


class TorchLike:
    def __init__(self, h):
        self.cuda_stream = h


class CupyLike:
    def __init__(self, h):
        self.ptr = h


class NumbaLike:
    def __init__(self, h):
        self.handle = h


@pytest.mark.parametrize("wrap", [int, CudaStreamProtocol, TorchLike, CupyLike, NumbaLike])
def test_stream_objects_name_the_same_stream(rt, stream, wrap):
    b = rt.alloc(4096)
    b.acquire(wrap(stream.handle))
    b.release(stream)  # the same lock map
    assert b.lock_count == 0


def test_none_is_the_default_stream(rt):
    b = rt.alloc(4096)
    b.acquire(None)
    b.release()
    assert spillway.stream_handle(None) == 0


def test_legacy_stream_handle_one_is_the_default_stream(rt):
    b = rt.alloc(4096)
    b.acquire(1)
    b.release(None)
    assert b.lock_count == 0


def test_an_object_that_is_not_a_stream_is_a_type_error(rt):
    b = rt.alloc(4096)
    with pytest.raises(TypeError, match="stream"):
        b.acquire("stream")


def test_a_destroyed_stream_is_invalid(rt):
    s = rt.stream()
    h = s.handle
    s.close()
    with pytest.raises(spillway.InvalidStreamError):
        rt.alloc(4096).acquire(h)


def test_closing_a_stream_releases_its_locks(rt):
    s = rt.stream()
    b = rt.alloc(4096)
    b.acquire(s)
    s.close()
    assert b.lock_count == 0


def test_stream_wait_keeps_the_locks(rt, stream):
    b = rt.alloc(4096)
    b.acquire(stream)
    stream.wait()
    assert b.lock_count == 1
    stream.synchronize()
    assert b.lock_count == 0


def test_registering_a_stream_is_unsupported_on_the_host_backend(rt):
    with pytest.raises(spillway.UnsupportedError):
        rt.register_stream(0x1234)
