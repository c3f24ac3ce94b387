# SPDX-License-Identifier: Apache-2.0
"""Retrieve-and-lock from Python: acquire/release, the lock context manager, batches, and
the three ways a stream's locks go."""
import pytest

import spillway


def test_acquire_returns_a_pointer_and_takes_a_lock(rt, stream):
    b = rt.alloc(4096)
    p = b.acquire(stream)
    assert isinstance(p, int) and p != 0
    assert b.lock_count == 1
    b.release(stream)
    assert b.lock_count == 0


def test_locks_nest_and_the_pointer_stays(rt, stream):
    b = rt.alloc(4096)
    assert b.acquire(stream) == b.acquire(stream)
    assert b.lock_count == 2
    b.release(stream)
    b.release(stream)
    assert b.lock_count == 0


def test_release_without_a_lock_is_not_locked_error(rt, stream):
    b = rt.alloc(4096)
    with pytest.raises(spillway.NotLockedError):
        b.release(stream)


def test_a_lock_belongs_to_its_stream(rt, stream):
    b = rt.alloc(4096)
    b.acquire(stream)
    with pytest.raises(spillway.NotLockedError):
        b.release(None)
    b.release(stream)


def test_lock_context_manager_releases_once_the_stream_passes_the_block(rt, stream):
    b = rt.alloc(4096)
    with b.lock(stream) as p:
        assert p != 0 and b.lock_count == 1
    stream.wait()
    rt.wait_idle()
    assert b.lock_count == 0


def test_lock_context_manager_read_flag_keeps_a_clean_host_copy(rt, stream):
    b = rt.alloc(1 << 20)
    b.spill()
    rt.wait_idle()
    with b.lock(stream, read=True):
        pass
    rt.synchronize(stream)
    b.spill()
    rt.wait_idle()
    assert rt.stats().clean_respills == 1


def test_synchronize_releases_every_lock_of_the_stream(rt, stream):
    a, b = rt.alloc(4096), rt.alloc(4096)
    a.acquire(stream)
    b.acquire(stream)
    b.acquire(stream)
    rt.synchronize(stream)
    assert a.lock_count == 0 and b.lock_count == 0


def test_release_async_releases_after_the_work(rt, stream):
    b = rt.alloc(4096)
    b.acquire(stream)
    rt.release_async(stream)
    rt.wait_idle()  # waits for pending stream completions
    assert b.lock_count == 0


def test_release_n_async_leaves_other_locks_on_the_stream(rt, stream):
    a, b = rt.alloc(4096), rt.alloc(4096)
    a.acquire(stream)
    b.acquire(stream)
    rt.release_n_async([a], stream)
    rt.wait_idle()
    assert a.lock_count == 0 and b.lock_count == 1
    rt.synchronize(stream)


def test_acquire_n_locks_all_and_returns_their_pointers(rt, stream):
    bufs = [rt.alloc(4096) for _ in range(3)]
    ptrs = rt.acquire_n(bufs, stream)
    assert len(set(ptrs)) == 3
    assert [b.lock_count for b in bufs] == [1, 1, 1]
    rt.synchronize(stream)


def test_acquire_n_is_all_or_nothing(rt, stream):
    a, b = rt.alloc(4096), rt.alloc(4096)
    b.free()
    with pytest.raises(spillway.FreedError):
        rt.acquire_n([a, b], stream)
    assert a.lock_count == 0


def test_acquire_brings_a_spilled_buffer_back(rt, stream):
    b = rt.alloc(1 << 20)
    b.spill()
    rt.wait_idle()
    assert b.state == spillway.State.HOST
    b.acquire(stream)
    assert b.state == spillway.State.RESIDENT
    rt.synchronize(stream)


def test_a_locked_buffer_cannot_be_spilled(rt, stream):
    b = rt.alloc(4096)
    b.acquire(stream)
    with pytest.raises(spillway.LockedError):
        b.spill()
    rt.synchronize(stream)


def test_close_with_a_lock_on_a_foreign_stream_is_busy():
    rt = spillway.Runtime(backend="host", device_limit=16 << 20, ignore_env=True)
    s = rt._create_stream()  # a raw stream the Runtime object does not track
    b = rt.alloc(4096)
    b.acquire(s)
    with pytest.raises(spillway.BusyError):
        rt.close()
    assert not rt.closed
    rt.synchronize(s)
    rt.close()
