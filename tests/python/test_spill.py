# SPDX-License-Identifier: Apache-2.0
"""Explicit spill and prefetch (single and batched), wait_idle, statistics, the disk tier."""
import numpy as np

import spillway

MiB = 1 << 20


def test_spill_moves_an_unlocked_buffer_to_host(rt):
    b = rt.alloc(MiB)
    b.spill()
    rt.wait_idle()
    assert b.state == spillway.State.HOST and b.tier == spillway.Tier.HOST
    s = rt.stats()
    assert s.spills == 1 and s.spill_bytes == MiB and s.host_bytes == MiB


def test_batched_spill_and_prefetch_move_every_buffer(rt):
    bufs = [rt.alloc(64 << 10) for _ in range(20)]
    rt.spill(bufs)
    rt.wait_idle()
    assert all(b.state == spillway.State.HOST for b in bufs)
    rt.prefetch(bufs)
    rt.wait_idle()
    assert all(b.state == spillway.State.RESIDENT for b in bufs)
    assert rt.stats().unspills == 20


def test_prefetch_of_one_buffer(rt):
    b = rt.alloc(MiB)
    rt.spill(b)
    rt.wait_idle()
    rt.prefetch(b)
    rt.wait_idle()
    assert b.state == spillway.State.RESIDENT


def test_spill_to_disk_and_back_keeps_the_data(rt, tmp_path):
    with spillway.Runtime(backend="host", device_limit=16 * MiB, spill_dir=str(tmp_path),
                          io="posix", ignore_env=True) as r:
        data = np.arange(MiB // 4, dtype=np.uint32)
        a = spillway.DeferrableArray.from_host(r, data)
        a.spill(spillway.Tier.DISK)
        r.wait_idle()
        assert a.state == spillway.State.DISK
        np.testing.assert_array_equal(a.copy_to_host(), data)
        assert r.stats().disk_reads == 1


def test_allocation_over_the_budget_spills_unlocked_buffers(rt):
    bufs = [rt.alloc(8 * MiB) for _ in range(12)]  # 96 MiB in a 64 MiB budget
    s = rt.stats()
    assert s.spills_on_demand + s.spills_background > 0
    assert s.device_bytes <= s.device_limit
    assert sum(b.tier != spillway.Tier.DEVICE for b in bufs) >= 4


def test_stats_is_a_typed_snapshot(rt):
    b = rt.alloc(MiB)
    s = rt.stats()
    assert isinstance(s, spillway.Stats)
    assert b.size == MiB and s.buffers == 1 and s.device_bytes == MiB and s.device_limit == 64 * MiB


def test_async_error_is_none_when_nothing_failed(rt):
    assert rt.async_error() is None
