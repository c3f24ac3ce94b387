# SPDX-License-Identifier: Apache-2.0
"""Address-stable buffers and arrays (docs/python.md "Address-stable arrays") on the host
backend, which emulates them with a 64 KiB granularity: the device pointer of a stable
buffer is the same across spills to host or disk and back; the runtime's
stable_addresses sets the default that alloc(stable=...) overrides."""
import numpy as np
import pytest

import spillway
from conftest import run_python

KiB = 1 << 10
MiB = 1 << 20


def pointer(b: spillway.Buffer) -> int:
    p = b.acquire()
    b.release()
    return p


def round_trip(rt: spillway.Runtime, b, tier: spillway.Tier) -> None:
    """Spills `b` (a Buffer or DeferrableArray) to `tier` and brings it back."""
    b.spill(tier)
    rt.wait_idle()
    assert b.tier == tier
    b.prefetch()
    rt.wait_idle()
    assert b.tier == spillway.Tier.DEVICE


@pytest.fixture
def disk_rt(tmp_path):
    with spillway.Runtime(backend="host", device_limit=16 * MiB, spill_dir=str(tmp_path),
                          io="posix", ignore_env=True, log_level="error") as r:
        yield r


def test_stable_granularity_is_64_kib_on_the_host_backend(rt):
    assert rt.stable_granularity == 64 * KiB


def test_stable_granularity_of_a_closed_runtime_is_an_invalid_argument(rt):
    rt.close()
    with pytest.raises(spillway.InvalidArgumentError, match="closed"):
        rt.stable_granularity


def test_a_buffer_allocated_stable_is_stable(rt):
    assert rt.alloc(MiB, stable=True).is_stable is True


def test_buffers_are_not_stable_by_default(rt):
    assert rt.alloc(MiB).is_stable is False


@pytest.mark.parametrize("nbytes", [100, 64 * KiB, MiB + 1])
def test_a_stable_buffer_keeps_its_pointer_across_a_spill_to_host_and_back(rt, nbytes):
    b = rt.alloc(nbytes, stable=True)
    before = pointer(b)
    round_trip(rt, b, spillway.Tier.HOST)
    assert pointer(b) == before


@pytest.mark.parametrize("nbytes", [100, 64 * KiB, MiB + 1])
def test_a_stable_buffer_keeps_its_pointer_across_a_spill_to_disk_and_back(disk_rt, nbytes):
    b = disk_rt.alloc(nbytes, stable=True)
    before = pointer(b)
    round_trip(disk_rt, b, spillway.Tier.DISK)
    assert pointer(b) == before


def test_a_stable_buffer_acquired_while_spilled_comes_back_at_its_address(rt):
    b = rt.alloc(MiB, stable=True)
    before = pointer(b)
    b.spill()
    rt.wait_idle()
    assert b.tier == spillway.Tier.HOST
    assert pointer(b) == before  # the acquire itself unspills


def test_a_stable_array_keeps_its_interface_pointer_and_data_across_host_and_disk(disk_rt):
    data = np.arange(MiB // 4, dtype=np.uint32)
    a = spillway.DeferrableArray.from_host(disk_rt, data, stable=True)
    assert a.is_stable
    with a.lend_pointer() as view:
        before = view.__cuda_array_interface__["data"][0]
    for tier in (spillway.Tier.HOST, spillway.Tier.DISK):
        disk_rt.synchronize()  # a lend's lock goes only once its stream passes the block
        round_trip(disk_rt, a, tier)
        with a.lend_pointer() as view:
            assert view.__cuda_array_interface__["data"][0] == before
    np.testing.assert_array_equal(a.copy_to_host(), data)


def test_small_stable_buffers_sharing_pages_keep_distinct_pointers(rt):
    bufs = [rt.alloc(4 * KiB, stable=True) for _ in range(8)]
    before = [pointer(b) for b in bufs]
    assert len(set(before)) == len(bufs)
    rt.spill(bufs[::2])
    rt.wait_idle()
    assert [pointer(b) for b in bufs] == before


def test_stable_addresses_true_makes_every_allocation_stable():
    with spillway.Runtime(backend="host", ignore_env=True, log_level="error",
                          stable_addresses=True) as r:
        assert r.alloc(4 * KiB).is_stable
        assert spillway.DeferrableArray(r, 16).is_stable


def test_stable_false_on_a_stable_runtime_gives_an_ordinary_buffer():
    with spillway.Runtime(backend="host", ignore_env=True, log_level="error",
                          stable_addresses=True) as r:
        assert r.alloc(4 * KiB, stable=False).is_stable is False
        assert spillway.DeferrableArray(r, 16, stable=False).is_stable is False


def test_stable_addresses_false_keeps_allocations_ordinary():
    with spillway.Runtime(backend="host", ignore_env=True, log_level="error",
                          stable_addresses=False) as r:
        assert r.alloc(4 * KiB).is_stable is False


def test_stable_addresses_unset_follows_the_environment_variable():
    code = ("import spillway\n"
            "with spillway.Runtime(backend='host', log_level='error') as r:\n"
            "    print(r.alloc(4096).is_stable)\n")
    p = run_python(code, env={"SPILLWAY_STABLE_ADDRESSES": "on"})
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "True"


def test_stable_addresses_false_overrides_the_environment_variable():
    code = ("import spillway\n"
            "with spillway.Runtime(backend='host', log_level='error',\n"
            "                      stable_addresses=False) as r:\n"
            "    print(r.alloc(4096).is_stable)\n")
    p = run_python(code, env={"SPILLWAY_STABLE_ADDRESSES": "on"})
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "False"


def test_is_stable_of_a_freed_buffer_is_a_freed_error(rt):
    b = rt.alloc(4 * KiB, stable=True)
    b.free()
    with pytest.raises(spillway.FreedError):
        b.is_stable


def test_a_stable_buffer_counts_against_the_device_limit_by_its_size(rt):
    b = rt.alloc(100, stable=True)  # not rounded up to the 64 KiB granularity
    assert rt.stats().device_bytes == b.size == 100
