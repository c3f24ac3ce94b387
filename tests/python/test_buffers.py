# SPDX-License-Identifier: Apache-2.0
"""Buffers: allocation, queries, free (explicit, with, garbage collection)."""
import gc

import pytest

import spillway


def test_alloc_gives_a_resident_unlocked_buffer_of_that_size(rt):
    b = rt.alloc(12345)
    assert b.size == 12345
    assert b.state == spillway.State.RESIDENT
    assert b.tier == spillway.Tier.DEVICE
    assert b.lock_count == 0
    assert b.handle != 0
    assert b.runtime is rt


def test_alloc_of_zero_bytes_is_a_value_error(rt):
    with pytest.raises(ValueError):
        rt.alloc(0)


def test_alloc_on_an_unknown_stream_is_an_invalid_stream_error(rt):
    with pytest.raises(spillway.InvalidStreamError):
        rt.alloc(100, 0xdead000)


def test_free_kills_the_handle(rt):
    b = rt.alloc(4096)
    b.free()
    assert b.closed
    with pytest.raises(spillway.FreedError):
        b.acquire()
    with pytest.raises(spillway.FreedError):
        b.state
    b.free()  # idempotent


def test_with_block_frees_the_buffer(rt):
    with rt.alloc(4096) as b:
        assert rt.stats().buffers == 1
    assert b.closed and rt.stats().buffers == 0


def test_garbage_collected_buffer_is_freed(rt):
    b = rt.alloc(1 << 20)
    assert rt.stats().device_bytes >= 1 << 20
    del b
    gc.collect()
    assert rt.stats().buffers == 0


def test_freeing_a_locked_buffer_keeps_the_memory_until_its_lock_is_released(rt):
    b = rt.alloc(1 << 20)
    b.acquire()
    b.free()
    assert rt.stats().buffers == 1  # the memory waits for the lock
    b.release()
    assert rt.stats().buffers == 0


def test_a_buffer_keeps_its_runtime_alive():
    rt = spillway.Runtime(backend="host", device_limit=16 << 20, ignore_env=True)
    b = rt.alloc(4096)
    del rt
    gc.collect()
    assert b.runtime.stats().buffers == 1
    b.runtime.close()
