# SPDX-License-Identifier: Apache-2.0
"""Runtime.graph_launch (spw_graph_launch, docs/python.md "CUDA graphs") on the host backend.
Its graph is the host backend's stand-in, a spw_host_graph_t {fn, user} built with ctypes,
whose fn runs on the stream's worker over pointers taken once, as a captured CUDA graph
keeps them; a real graph is tests/test_stable_graph.c's (GPU). Then every refusal:
TypeError and ValueError for the arguments Python checks, the Spillway errors of C for
the rest, nothing left locked."""
import ctypes

import numpy as np
import pytest

import spillway

N = 4096  # uint32 words per buffer
GRAPH_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class HostGraph(ctypes.Structure):
    _fields_ = [("fn", GRAPH_FN), ("user", ctypes.c_void_p)]


@pytest.fixture
def disk_rt(tmp_path):
    with spillway.Runtime(backend="host", device_limit=16 << 20, spill_dir=str(tmp_path),
                          io="posix", ignore_env=True, log_level="error") as r:
        yield r


def write(rt, b, data: np.ndarray, stream) -> None:
    p = b.acquire(stream)
    rt.memcpy(p, data.ctypes.data, data.nbytes, stream)
    rt.synchronize(stream)


def read(rt, b, stream) -> np.ndarray:
    out = np.zeros(N, dtype=np.uint32)
    p = b.acquire(stream, read=True)
    rt.memcpy(out.ctypes.data, p, out.nbytes, stream)
    rt.synchronize(stream)
    return out


class AddGraph:
    """dst[i] += src[i] over the pointers the two buffers had when it was "captured"."""

    def __init__(self, rt, dst, src, stream):
        self.dst, self.src = rt.acquire_n([dst, src], stream)
        rt.synchronize(stream)
        self.runs = 0

        def run(_user):
            d = np.ctypeslib.as_array((ctypes.c_uint32 * N).from_address(self.dst))
            s = np.ctypeslib.as_array((ctypes.c_uint32 * N).from_address(self.src))
            d += s
            self.runs += 1

        self.fn = GRAPH_FN(run)
        self.graph = HostGraph(self.fn, None)
        self.handle = ctypes.addressof(self.graph)


@pytest.fixture
def setup(disk_rt):
    rt = disk_rt
    s = rt.stream()
    dst = rt.alloc(N * 4, s, stable=True)
    src = rt.alloc(N * 4, s, stable=True)
    words = (np.arange(N, dtype=np.uint32) * 2654435761) & 0xFFFF
    write(rt, dst, np.zeros(N, dtype=np.uint32), s)
    write(rt, src, words.astype(np.uint32), s)
    return rt, s, dst, src, words


def test_replays_over_buffers_spilled_between_launches(setup):
    rt, s, dst, src, words = setup
    g = AddGraph(rt, dst, src, s)
    for r in range(9):
        if r:
            rt.spill([dst, src], spillway.Tier.DISK if r % 3 == 2 else spillway.Tier.HOST)
            rt.wait_idle()
            assert dst.tier != spillway.Tier.DEVICE and src.tier != spillway.Tier.DEVICE
        rt.graph_launch(g.handle, [dst, src], s, block=bool(r % 2))
        rt.wait_idle()
        assert dst.lock_count == 0 and src.lock_count == 0
    assert g.runs == 9
    assert np.array_equal(read(rt, dst, s), (words * 9).astype(np.uint32))


def test_read_only_launch_keeps_the_clean_copy(setup):
    rt, s, dst, src, _ = setup
    g = AddGraph(rt, dst, src, s)
    rt.spill([src])
    rt.wait_idle()
    rt.graph_launch(g.handle, [src], s, read=True, block=True)
    assert src.lock_count == 0
    before = rt.stats().clean_respills
    rt.spill([src])
    rt.wait_idle()
    assert rt.stats().clean_respills == before + 1


@pytest.mark.parametrize("bad", ["1", 1.0, None, True, b"\x01", object()])
def test_a_graph_that_is_not_an_int_is_a_type_error(setup, bad):
    rt, s, dst, src, _ = setup
    with pytest.raises(TypeError, match="graph_exec must be an int"):
        rt.graph_launch(bad, [dst, src], s)
    assert dst.lock_count == 0


@pytest.mark.parametrize("bad", [0, -1, -(1 << 70), 1 << 64, 1 << 200])
def test_a_graph_out_of_pointer_range_is_a_value_error(setup, bad):
    rt, s, dst, src, _ = setup
    with pytest.raises(ValueError, match="nonzero address"):
        rt.graph_launch(bad, [dst, src], s)
    assert dst.lock_count == 0


def test_no_buffers_is_an_invalid_argument(setup):
    rt, s, *_ = setup
    with pytest.raises(spillway.InvalidArgumentError):
        rt.graph_launch(1, [], s)


def test_buffers_not_a_sequence_of_buffers_is_a_type_error(setup):
    rt, s, dst, *_ = setup
    with pytest.raises(TypeError):
        rt.graph_launch(1, 5, s)
    with pytest.raises(TypeError):
        rt.graph_launch(1, [dst, 7], s)
    assert dst.lock_count == 0


def test_a_buffer_that_is_not_stable_is_refused_and_named(setup):
    rt, s, dst, src, _ = setup
    g = AddGraph(rt, dst, src, s)
    movable = rt.alloc(4096, s, stable=False)
    with pytest.raises(spillway.InvalidArgumentError, match="graph argument 2.*not address-stable"):
        rt.graph_launch(g.handle, [dst, src, movable], s)
    rt.wait_idle()
    assert g.runs == 0
    assert dst.lock_count == 0 and src.lock_count == 0 and movable.lock_count == 0


def test_a_freed_buffer_is_refused(setup):
    rt, s, dst, src, _ = setup
    gone = rt.alloc(4096, s, stable=True)
    gone.free()
    with pytest.raises(spillway.FreedError):
        rt.graph_launch(1, [dst, gone], s)
    assert dst.lock_count == 0


def test_a_buffer_of_another_runtime_is_refused(setup):
    rt, s, dst, src, _ = setup
    with spillway.Runtime(backend="host", ignore_env=True, log_level="error") as other:
        ob = other.alloc(4096, stable=True)
        with pytest.raises(spillway.InvalidHandleError):
            rt.graph_launch(1, [dst, ob], s)
        ob.free()
    assert dst.lock_count == 0


def test_a_stream_of_another_runtime_is_refused(setup):
    rt, s, dst, src, _ = setup
    with spillway.Runtime(backend="host", ignore_env=True, log_level="error") as other:
        os_ = other.stream()
        with pytest.raises(spillway.InvalidStreamError):
            rt.graph_launch(1, [dst, src], os_)
        os_.close()
    assert dst.lock_count == 0


def test_a_host_graph_without_a_function_is_refused(setup):
    rt, s, dst, src, _ = setup
    empty = HostGraph(GRAPH_FN(), None)
    with pytest.raises(spillway.InvalidArgumentError, match="graph launch"):
        rt.graph_launch(ctypes.addressof(empty), [dst, src], s)
    rt.wait_idle()
    assert dst.lock_count == 0 and src.lock_count == 0


def test_a_closed_runtime_is_refused(setup):
    rt, s, dst, src, _ = setup
    s.close()
    dst.free()
    src.free()
    rt.close()
    with pytest.raises(spillway.InvalidArgumentError, match="closed"):
        rt.graph_launch(1, [], None)
