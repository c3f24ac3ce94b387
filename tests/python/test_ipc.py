# SPDX-License-Identifier: Apache-2.0
"""Device memory shared with another process (Runtime.ipc_export / Buffer.ipc_export /
ipc_open / ipc_close, spw_ipc_export_ptr / spw_ipc_export / spw_ipc_open / spw_ipc_close) on
the host backend, address-stable buffers included, where a runtime created with ipc=True
keeps its device memory in shared memory another process can map: the other process reads
what this one wrote and writes back what this one then reads.
Bad arguments and refusals are the documented exceptions."""
import multiprocessing as mp

import numpy as np
import pytest

import spillway

MiB = 1 << 20
HANDLE_BYTES = 96  # sizeof(spw_ipc_handle_t)


def host_runtime(ipc=True):
    return spillway.Runtime(backend="host", device_limit=64 * MiB, host_device_bytes=128 * MiB,
                            ipc=ipc, ignore_env=True, log_level="error")


def _child(handle, nbytes, queue):
    """Opens the handle, sends back what it reads, writes 7s over it, closes."""
    try:
        with host_runtime(ipc=False) as rt:
            ptr = rt.ipc_open(handle)
            got = np.empty(nbytes, np.uint8)
            rt.memcpy(got.ctypes.data, ptr, nbytes)
            sevens = np.full(nbytes, 7, np.uint8)
            rt.memcpy(ptr, sevens.ctypes.data, nbytes)
            rt.ipc_close(ptr)
            with pytest.raises(spillway.InvalidArgumentError):
                rt.ipc_close(ptr)
        queue.put(("ok", got))
    except BaseException as e:  # the parent reports it
        queue.put(("error", repr(e)))


def shared_with_a_child(rt, ptr, handle, data):
    """The child reads `data` through the handle and writes 7s, which this process sees."""
    assert isinstance(handle, bytes) and len(handle) == HANDLE_BYTES
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_child, args=(handle, data.size, queue))
    proc.start()
    status, got = queue.get(timeout=120)
    proc.join(60)
    assert status == "ok", got
    np.testing.assert_array_equal(got, data)
    back = np.empty(data.size, np.uint8)
    rt.memcpy(back.ctypes.data, ptr, data.size)
    assert (back == 7).all()


@pytest.mark.parametrize("nbytes", [64 << 10, 8 * MiB])  # a slab's block, an arena's
def test_another_process_reads_and_writes_an_exported_buffer(nbytes):
    with host_runtime() as rt:
        buf = rt.alloc(nbytes)
        data = np.arange(nbytes, dtype=np.uint64).astype(np.uint8)
        ptr = buf.acquire()
        rt.memcpy(ptr, data.ctypes.data, nbytes)
        shared_with_a_child(rt, ptr, rt.ipc_export(ptr, nbytes), data)
        buf.release()
        buf.free()


@pytest.mark.parametrize("nbytes", [16 << 10, 5 * MiB])  # a page's block, a range of its own
def test_another_process_reads_and_writes_an_exported_stable_buffer(nbytes):
    with host_runtime() as rt:
        buf = rt.alloc(nbytes, stable=True)
        assert buf.is_stable
        data = (np.arange(nbytes, dtype=np.uint64) * 3).astype(np.uint8)
        ptr = buf.acquire()
        rt.memcpy(ptr, data.ctypes.data, nbytes)
        handle = buf.ipc_export()
        assert buf.ipc_export() == handle  # one export per buffer
        shared_with_a_child(rt, ptr, handle, data)
        buf.release()
        buf.free()


def _child_refused(handle, queue):
    try:
        with host_runtime(ipc=False) as rt:
            try:
                rt.ipc_open(handle)
                queue.put("opened")
            except spillway.SpillwayError as e:
                queue.put(type(e).__name__)
    except BaseException as e:
        queue.put(repr(e))


def test_an_exported_stable_buffer_must_stay_locked():
    with host_runtime() as rt:
        buf = rt.alloc(64 << 10, stable=True)
        with pytest.raises(spillway.NotLockedError):
            buf.ipc_export()
        buf.acquire()
        handle = buf.ipc_export()
        buf.release()
        ctx = mp.get_context("spawn")
        queue = ctx.Queue()
        proc = ctx.Process(target=_child_refused, args=(handle, queue))
        proc.start()
        assert queue.get(timeout=120) == "NotLockedError"
        proc.join(60)
        buf.free()
        with pytest.raises(spillway.SpillwayError):
            buf.ipc_export()


def test_export_needs_a_runtime_created_with_ipc():
    with host_runtime(ipc=False) as rt:
        buf = rt.alloc(4096)
        ptr = buf.acquire()
        with pytest.raises(spillway.UnsupportedError):
            rt.ipc_export(ptr, 4096)
        assert "SPILLWAY_IPC" in rt.last_error()
        with pytest.raises(spillway.UnsupportedError, match="SPILLWAY_IPC"):
            buf.ipc_export()
        buf.release()
        stable = rt.alloc(4096, stable=True)
        stable.acquire()
        with pytest.raises(spillway.UnsupportedError, match="SPILLWAY_IPC"):
            stable.ipc_export()
        stable.release()


def test_export_refuses_memory_the_runtime_does_not_hold():
    with host_runtime() as rt:
        host = np.zeros(4096, np.uint8)
        with pytest.raises(spillway.InvalidArgumentError):
            rt.ipc_export(host.ctypes.data, 4096)
        buf = rt.alloc(4096)
        ptr = buf.acquire()
        with pytest.raises(spillway.InvalidArgumentError):
            rt.ipc_export(ptr, 1 << 40)
        with pytest.raises(spillway.InvalidArgumentError):
            rt.ipc_export(ptr, 0)
        with pytest.raises(TypeError):
            rt.ipc_export("ptr", 4096)
        with pytest.raises(TypeError):
            rt.ipc_export(ptr, 4096.0)
        buf.release()


def test_a_handle_of_this_process_is_refused():
    with host_runtime() as rt:
        buf = rt.alloc(4096)
        ptr = buf.acquire()
        handle = rt.ipc_export(ptr, 4096)
        with pytest.raises(spillway.UnsupportedError):
            rt.ipc_open(handle)
        buf.release()


def test_open_refuses_what_is_no_handle():
    with host_runtime() as rt:
        with pytest.raises(ValueError):
            rt.ipc_open(b"short")
        with pytest.raises(TypeError):
            rt.ipc_open("not bytes")
        with pytest.raises(spillway.SpillwayError):
            rt.ipc_open(bytes(HANDLE_BYTES))  # zeros: backend and size say no handle
        with pytest.raises(spillway.InvalidArgumentError):
            rt.ipc_close(12345)
        with pytest.raises(spillway.InvalidArgumentError):
            rt.ipc_close(0)


def test_a_closed_runtime_refuses_ipc_calls():
    rt = host_runtime()
    rt.close()
    with pytest.raises(spillway.SpillwayError):
        rt.ipc_export(4096, 4096)
    with pytest.raises(spillway.SpillwayError):
        rt.ipc_open(bytes(HANDLE_BYTES))
    with pytest.raises(spillway.SpillwayError):
        rt.ipc_close(4096)


@pytest.mark.parametrize("bad", ["yes", 2, 1.0])
def test_the_ipc_keyword_takes_a_bool_or_none(bad):
    with pytest.raises(TypeError, match="ipc must be a bool or None"):
        spillway.Runtime(backend="host", ipc=bad, ignore_env=True, log_level="error")
