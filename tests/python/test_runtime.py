# SPDX-License-Identifier: Apache-2.0
"""Runtime: configuration, limits, lifetime."""
import gc
import weakref

import pytest

import spillway

MiB = 1 << 20


def test_keyword_configuration_sets_the_limits():
    with spillway.Runtime(backend="host", device_limit="48MiB", host_limit=32 * MiB,
                          disk_limit="1GiB", ignore_env=True) as rt:
        assert rt.limits() == (48 * MiB, 32 * MiB, 1 << 30)
        assert rt.device_limit == 48 * MiB


def test_backend_is_reported_as_an_enum(rt):
    assert rt.backend is spillway.Backend.HOST


def test_environment_applies_to_fields_left_unset(monkeypatch):
    monkeypatch.setenv("SPILLWAY_DEVICE_LIMIT", "40MiB")
    with spillway.Runtime(backend="host") as rt:
        assert rt.device_limit == 40 * MiB


def test_ignore_env_ignores_spillway_variables(monkeypatch):
    monkeypatch.setenv("SPILLWAY_DEVICE_LIMIT", "40MiB")
    with spillway.Runtime(backend="host", host_device_bytes="100MiB", ignore_env=True) as rt:
        assert rt.device_limit == 80 * MiB  # 80% of the emulated device


def test_invalid_environment_value_raises_config_error_naming_it(monkeypatch):
    monkeypatch.setenv("SPILLWAY_DEVICE_LIMIT", "lots")
    with pytest.raises(spillway.ConfigError) as e:
        spillway.Runtime(backend="host")
    assert "SPILLWAY_DEVICE_LIMIT" in str(e.value)
    assert isinstance(e.value, ValueError)
    assert e.value.status == spillway._spillway.SPW_ERR_CONFIG


def test_inconsistent_watermarks_are_a_config_error():
    with pytest.raises(spillway.ConfigError, match="watermark"):
        spillway.Runtime(backend="host", high_watermark=0.5, low_watermark=0.9, ignore_env=True)


def test_unknown_keyword_value_is_a_value_error():
    with pytest.raises(ValueError, match="backend"):
        spillway.Runtime(backend="tpu")


def test_size_strings_follow_the_spillway_syntax():
    assert spillway.parse_size("1.5GiB") == 3 * (1 << 29)
    assert spillway.parse_size("512 k") == 512 * 1024
    assert spillway.parse_size(4096) == 4096
    with pytest.raises(ValueError):
        spillway.parse_size("1.5")


def test_close_is_idempotent_and_kills_the_buffers():
    rt = spillway.Runtime(backend="host", device_limit=16 * MiB, ignore_env=True)
    b = rt.alloc(4096)
    rt.close()
    rt.close()
    assert rt.closed and b.closed
    with pytest.raises(spillway.InvalidArgumentError, match="closed"):
        b.acquire()
    with pytest.raises(spillway.InvalidArgumentError, match="closed"):
        rt.alloc(10)


def test_close_releases_locks_of_its_own_streams_and_the_default_stream():
    rt = spillway.Runtime(backend="host", device_limit=16 * MiB, ignore_env=True)
    s = rt.stream()
    a, b = rt.alloc(4096), rt.alloc(4096)
    a.acquire(s)
    b.acquire(None)
    rt.close()
    assert rt.closed


def test_context_manager_closes(rt):
    with spillway.Runtime(backend="host", device_limit=16 * MiB, ignore_env=True) as r:
        pass
    assert r.closed


def test_summary_and_repr_describe_the_runtime(rt):
    b = rt.alloc(1 << 20)
    assert "1 buffers" in rt.summary() and not b.closed
    assert "host" in repr(rt)


def test_two_runtimes_are_independent():
    with spillway.Runtime(backend="host", device_limit=16 * MiB, ignore_env=True) as a, \
            spillway.Runtime(backend="host", device_limit=16 * MiB, ignore_env=True) as b:
        x = a.alloc(1 << 20)
        assert a.stats().buffers == 1 and b.stats().buffers == 0
        with pytest.raises(ValueError, match="another runtime"):
            b.acquire_n([x])


def test_a_dropped_runtime_is_destroyed_at_once():
    r = spillway.Runtime(backend="host", device_limit=16 * MiB, ignore_env=True)
    r.stream()
    r.alloc(4096)
    w = weakref.ref(r)
    del r
    assert w() is None  # no reference cycle keeps it for the cyclic collector


def test_a_runtime_in_a_reference_cycle_with_its_buffer_is_collected():
    rt = spillway.Runtime(backend="host", device_limit=16 * MiB, host_device_bytes=32 * MiB,
                          ignore_env=True)
    rt.kept = rt.alloc(4096)  # runtime -> its __dict__ -> buffer -> runtime
    gone = weakref.ref(rt)
    del rt
    gc.collect()
    assert gone() is None


def test_a_dropped_runtimes_controller_link_is_collected():
    rt = spillway.Runtime(backend="host", device_limit=16 * MiB, host_device_bytes=32 * MiB,
                          ignore_env=True)

    class Picky(spillway.Controller):
        def pressure(self, nbytes_needed, max_victims):
            return []

    rt.set_controller(Picky())  # the link's pressure callable refers back to the link
    rt.set_controller(None)
    link = weakref.ref(rt.__dict__["_spw_link"])
    del rt
    gc.collect()
    assert link() is None


def test_device_is_the_ordinal_from_the_keyword_or_the_environment(monkeypatch):
    monkeypatch.setenv("SPILLWAY_DEVICE", "3")
    for kw, want in (({"device": 2}, 2), ({}, 3), ({"ignore_env": True}, 0)):
        r = spillway.Runtime(backend="host", log_level="error", **kw)
        try:
            assert r.device == want, kw
        finally:
            r.close()


def test_host_reserve_pins_host_memory_before_the_first_spill():
    with spillway.Runtime(backend="host", device_limit=16 * MiB, host_limit=256 * MiB,
                          host_device_bytes=32 * MiB, ignore_env=True) as rt:
        assert rt.stats().host_pinned_bytes == 0
        rt.host_reserve(128 * MiB)
        assert rt.stats().host_pinned_bytes >= 128 * MiB
        assert rt.stats().host_bytes == 0


def test_host_reserve_above_the_host_limit_is_refused_and_pins_nothing():
    with spillway.Runtime(backend="host", device_limit=16 * MiB, host_limit=64 * MiB,
                          host_device_bytes=32 * MiB, ignore_env=True,
                          log_level="off") as rt:
        with pytest.raises(spillway.HostOutOfMemoryError, match="host limit"):
            rt.host_reserve(64 * MiB + 1)
        assert rt.stats().host_pinned_bytes == 0


@pytest.mark.parametrize("bad", ["64MiB", 1.5, True, None])
def test_host_reserve_takes_an_int_only(rt, bad):
    with pytest.raises(TypeError, match="nbytes"):
        rt.host_reserve(bad)


def test_host_reserve_of_a_negative_size_is_an_invalid_argument(rt):
    with pytest.raises(spillway.InvalidArgumentError, match="nbytes"):
        rt.host_reserve(-1)
