# SPDX-License-Identifier: Apache-2.0
"""Owner tags from Python (spw_alloc_ex's SPW_ALLOC_OWNER, spw_owner_name, spw_owner_stats):
Runtime.alloc(owner=...), Runtime.name_owner and Runtime.owner_stats on the host backend (on
a closed runtime and with huge ints: test_bad_input.py).
The libraries' own owners (spillway.process.OWNERS) are tested with the shared runtime in
test_process_host.py and test_plugin_host.py."""
import pytest

import spillway

KiB = 1 << 10
MiB = 1 << 20


def test_a_buffer_allocated_for_an_owner_counts_for_it_until_it_is_freed(rt):
    a = rt.alloc(4 * KiB, owner=7)
    b = rt.alloc(12 * KiB, owner=7)
    assert rt.owner_stats(7) == {"buffers": 2, "bytes": 16 * KiB, "allocs": 2,
                                 "alloc_bytes": 16 * KiB, "name": ""}
    a.free()
    assert rt.owner_stats(7)["buffers"] == 1
    assert rt.owner_stats(7)["bytes"] == 12 * KiB
    b.free()
    assert rt.owner_stats(7)["buffers"] == 0
    assert rt.owner_stats(7)["allocs"] == 2  # since the runtime was created


def test_a_buffer_without_an_owner_counts_for_none(rt):
    held = [rt.alloc(MiB), rt.alloc(MiB, owner=None), rt.alloc(MiB, owner=0)]
    assert rt.stats().buffers == len(held)
    assert all(rt.owner_stats(i)["allocs"] == 0 for i in range(1, 256))


def test_a_spilled_buffer_keeps_counting_for_its_owner(rt):
    b = rt.alloc(MiB, owner=3)
    b.spill(spillway.Tier.HOST)
    rt.wait_idle()
    assert b.state == spillway.State.HOST
    assert rt.owner_stats(3)["buffers"] == 1
    assert rt.owner_stats(3)["bytes"] == MiB


def test_a_named_owner_is_named_in_its_stats_and_the_summary(rt):
    rt.name_owner(5, "my.library")
    held = [rt.alloc(2 * MiB, owner=5), rt.alloc(KiB, owner=6)]  # a dropped Buffer is freed
    assert rt.owner_stats(5)["name"] == "my.library"
    assert "; owners: my.library 1 buffer 2.0 MiB, owner 6 1 buffer 1.0 KiB" in rt.summary()
    del held
    assert "owners" not in rt.summary()


def test_naming_again_replaces_the_name(rt):
    rt.name_owner(owner=9, name="first")
    rt.name_owner(9, "second")
    assert rt.owner_stats(owner=9)["name"] == "second"


@pytest.mark.parametrize("owner,exc", [(256, spillway.InvalidArgumentError),
                                       (-1, spillway.InvalidArgumentError),
                                       (2**64, spillway.InvalidArgumentError),
                                       ("1", TypeError), (1.0, TypeError), (True, TypeError)])
def test_an_owner_that_is_not_an_id_is_refused_by_alloc(rt, owner, exc):
    with pytest.raises(exc):
        rt.alloc(KiB, owner=owner)
    assert rt.stats().buffers == 0


@pytest.mark.parametrize("owner,exc", [(0, spillway.InvalidArgumentError),
                                       (256, spillway.InvalidArgumentError),
                                       (None, TypeError), ("cupy", TypeError)])
def test_an_owner_that_is_not_an_id_is_refused_by_stats_and_naming(rt, owner, exc):
    with pytest.raises(exc):
        rt.owner_stats(owner)
    with pytest.raises(exc):
        rt.name_owner(owner, "x")


@pytest.mark.parametrize("name", ["", "x" * 32, 'say "hi"', "back\\slash", "caf\u00e9",
                                  "new\nline", "nul\0byte"])
def test_a_name_that_is_not_short_printable_ascii_is_refused_and_changes_nothing(rt, name):
    rt.name_owner(4, "kept")
    with pytest.raises(spillway.InvalidArgumentError, match="printable ASCII"):
        rt.name_owner(4, name)
    assert rt.owner_stats(4)["name"] == "kept"


def test_a_name_that_is_not_a_str_is_a_type_error(rt):
    with pytest.raises(TypeError):
        rt.name_owner(4, b"bytes")


def test_the_longest_name_is_accepted(rt):
    rt.name_owner(255, "y" * 31)
    assert rt.owner_stats(255)["name"] == "y" * 31
