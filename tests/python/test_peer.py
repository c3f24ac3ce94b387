# SPDX-License-Identifier: Apache-2.0
"""The peer tier from Python (Runtime.peer_lend / peer_reclaim, spw_peer_lend /
spw_peer_reclaim) on the host backend: two runtimes in one process, one lending device
memory to the other. Buffers and arrays spill into lent memory first (State.PEER), the
statistics count it, a reclaim moves them on to host memory intact; bad arguments are the
documented exceptions; either runtime may be closed first; a lender referenced only by its
borrower lives until the borrower is gone."""
import gc
import threading
import weakref

import numpy as np
import pytest

import spillway
from spillway import State, Tier
from spillway.controller import flush

MiB = 1 << 20


def host_runtime(limit):
    return spillway.Runtime(backend="host", device_limit=limit, host_device_bytes=128 * MiB,
                            ignore_env=True, log_level="error")


@pytest.fixture
def pair():
    """(lender with 64 MiB, borrower with 16 MiB); closed borrower first afterwards."""
    lender, borrower = host_runtime(64 * MiB), host_runtime(16 * MiB)
    yield lender, borrower
    borrower.close()
    lender.close()


def arrays(rt, n, nbytes=2 * MiB):
    data = [np.arange(nbytes // 4, dtype=np.uint32) + i for i in range(n)]
    return data, [spillway.DeferrableArray.from_host(rt, d) for d in data]


def test_a_lend_shows_in_both_runtimes_stats(pair):
    lender, borrower = pair
    lender.peer_lend(borrower, 32 * MiB)
    assert borrower.stats().peer_limit == 32 * MiB
    assert lender.stats().lent_bytes == 32 * MiB
    assert borrower.stats().lent_bytes == 0 and lender.stats().peer_limit == 0


def test_spilled_buffers_go_to_lent_memory_first(pair):
    lender, borrower = pair
    lender.peer_lend(borrower, 32 * MiB)
    bufs = [borrower.alloc(2 * MiB) for _ in range(4)]
    borrower.spill(bufs)
    borrower.wait_idle()
    assert all(b.state == State.PEER and b.tier == Tier.PEER for b in bufs)
    s = borrower.stats()
    assert s.peer_bytes == 8 * MiB and s.host_bytes == 0
    assert s.peer_spills == 4 and s.peer_spill_bytes == 8 * MiB and s.spills == 4


def test_arrays_come_back_intact_from_lent_memory(pair):
    lender, borrower = pair
    lender.peer_lend(borrower, 32 * MiB)
    data, arrs = arrays(borrower, 3)
    for a in arrs:
        a.spill()
    borrower.wait_idle()
    assert all(a.state == State.PEER for a in arrs)
    for d, a in zip(data, arrs):
        np.testing.assert_array_equal(a.copy_to_host(), d)
    s = borrower.stats()
    assert s.peer_unspills == 3 and s.peer_unspill_bytes == 6 * MiB


def test_a_full_peer_tier_falls_back_to_host(pair):
    lender, borrower = pair
    lender.peer_lend(borrower, 4 * MiB)
    bufs = [borrower.alloc(2 * MiB) for _ in range(4)]
    borrower.spill(bufs)
    borrower.wait_idle()
    states = sorted(State(b.state).name for b in bufs)
    assert states == ["HOST", "HOST", "PEER", "PEER"]
    s = borrower.stats()
    assert s.peer_bytes == 4 * MiB and s.host_bytes == 4 * MiB


def test_reclaim_moves_buffers_to_host_with_their_data(pair):
    lender, borrower = pair
    lender.peer_lend(borrower, 32 * MiB)
    data, arrs = arrays(borrower, 4)
    for a in arrs:
        a.spill()
    borrower.wait_idle()
    lender.peer_reclaim(borrower)
    assert all(a.state == State.HOST and a.tier == Tier.HOST for a in arrs)
    s = borrower.stats()
    assert s.peer_bytes == 0 and s.peer_limit == 0 and s.host_bytes == 8 * MiB
    assert s.peer_returns == 4 and s.peer_return_bytes == 8 * MiB
    assert lender.stats().lent_bytes == 0
    for d, a in zip(data, arrs):
        np.testing.assert_array_equal(a.copy_to_host(), d)
    # The memory is back: it may be lent again.
    lender.peer_lend(borrower, 32 * MiB)
    assert borrower.stats().peer_limit == 32 * MiB


def test_controller_events_name_the_peer_state(pair):
    lender, borrower = pair
    events = []

    class Recorder(spillway.Controller):
        def state_changed(self, event):
            events.append((event.source, event.target))

    borrower.set_controller(Recorder())
    lender.peer_lend(borrower, 8 * MiB)
    b = borrower.alloc(MiB)
    b.spill()
    borrower.wait_idle()
    assert borrower.controller.info(b.handle).tier == Tier.PEER
    lender.peer_reclaim(borrower)
    assert flush(borrower)
    assert (State.RESIDENT, State.PEER) in events and (State.PEER, State.HOST) in events
    borrower.set_controller(None)


@pytest.mark.parametrize("borrower,exc", [("rt", TypeError), (None, TypeError),
                                          (object(), TypeError), (3, TypeError)])
def test_a_borrower_that_is_no_runtime_is_a_type_error(pair, borrower, exc):
    lender, _ = pair
    with pytest.raises(exc):
        lender.peer_lend(borrower, 8 * MiB)
    with pytest.raises(exc):
        lender.peer_reclaim(borrower)


@pytest.mark.parametrize("nbytes,exc", [
    (-1, spillway.InvalidArgumentError), (0, spillway.InvalidArgumentError),
    (MiB - 1, spillway.InvalidArgumentError),      # under 1 MiB
    (65 * MiB, spillway.InvalidArgumentError),     # over the lender's device limit
    (2**64 - 1, spillway.InvalidArgumentError), (2**64, spillway.InvalidArgumentError),
    (-2**70, spillway.InvalidArgumentError),
    (1.5 * MiB, TypeError), ("8MiB", TypeError), (None, TypeError), (True, TypeError)])
def test_bad_sizes_are_refused(pair, nbytes, exc):
    lender, borrower = pair
    with pytest.raises(exc):
        lender.peer_lend(borrower, nbytes)
    assert borrower.stats().peer_limit == 0 and lender.stats().lent_bytes == 0


def test_lending_to_itself_is_refused(pair):
    lender, _ = pair
    with pytest.raises(spillway.InvalidArgumentError, match="itself"):
        lender.peer_lend(lender, 8 * MiB)
    with pytest.raises(spillway.InvalidArgumentError):
        lender.peer_reclaim(lender)


def test_reclaim_with_nothing_lent_is_an_invalid_argument(pair):
    lender, borrower = pair
    with pytest.raises(spillway.InvalidArgumentError, match="nothing is lent"):
        lender.peer_reclaim(borrower)
    lender.peer_lend(borrower, 8 * MiB)
    with pytest.raises(spillway.InvalidArgumentError, match="nothing is lent"):
        borrower.peer_reclaim(lender)  # the wrong way round
    lender.peer_reclaim(borrower)
    with pytest.raises(spillway.InvalidArgumentError, match="nothing is lent"):
        lender.peer_reclaim(borrower)


def test_a_second_lender_and_a_lend_back_are_busy(pair):
    lender, borrower = pair
    other = host_runtime(64 * MiB)
    try:
        lender.peer_lend(borrower, 8 * MiB)
        with pytest.raises(spillway.BusyError):
            other.peer_lend(borrower, 8 * MiB)
        with pytest.raises(spillway.BusyError):
            borrower.peer_lend(lender, 8 * MiB)
        assert borrower.stats().peer_limit == 8 * MiB
    finally:
        other.close()


def test_closed_runtimes_are_refused(pair):
    lender, borrower = pair
    closed = host_runtime(16 * MiB)
    closed.close()
    with pytest.raises(spillway.InvalidArgumentError, match="closed"):
        lender.peer_lend(closed, 8 * MiB)
    with pytest.raises(spillway.InvalidArgumentError, match="closed"):
        closed.peer_lend(borrower, 8 * MiB)
    with pytest.raises(spillway.InvalidArgumentError, match="closed"):
        lender.peer_reclaim(closed)
    with pytest.raises(spillway.InvalidArgumentError, match="closed"):
        closed.peer_reclaim(borrower)


def test_a_spill_to_the_peer_tier_by_name_is_refused(pair):
    lender, borrower = pair
    lender.peer_lend(borrower, 8 * MiB)
    b = borrower.alloc(MiB)
    with pytest.raises(spillway.InvalidArgumentError, match="Tier.HOST"):
        b.spill(Tier.PEER)
    with pytest.raises(spillway.InvalidArgumentError):
        borrower.spill([b], Tier.PEER)
    assert b.state == State.RESIDENT


def test_closing_the_borrower_first_gives_the_memory_back(pair):
    lender, borrower = pair
    lender.peer_lend(borrower, 32 * MiB)
    _, arrs = arrays(borrower, 3)
    for a in arrs:
        a.spill()
    borrower.wait_idle()
    del arrs
    borrower.close()
    assert lender.stats().lent_bytes == 0
    lender.alloc(60 * MiB).free()  # the whole budget is the lender's again


def test_closing_the_lender_first_moves_the_borrowers_buffers_to_host(pair):
    lender, borrower = pair
    lender.peer_lend(borrower, 32 * MiB)
    data, arrs = arrays(borrower, 3)
    for a in arrs:
        a.spill()
    borrower.wait_idle()
    lender.close()
    assert all(a.state == State.HOST for a in arrs)
    s = borrower.stats()
    assert s.peer_limit == 0 and s.peer_bytes == 0 and s.peer_returns == 3
    for d, a in zip(data, arrs):
        np.testing.assert_array_equal(a.copy_to_host(), d)
    with pytest.raises(spillway.InvalidArgumentError, match="closed"):
        lender.peer_reclaim(borrower)


def test_a_lender_referenced_only_by_its_borrower_outlives_it():
    lender, borrower = host_runtime(64 * MiB), host_runtime(16 * MiB)
    lender.peer_lend(borrower, 32 * MiB)
    gone = weakref.ref(lender)
    del lender
    gc.collect()
    assert gone() is not None  # the borrower keeps it
    data, arrs = arrays(borrower, 3)
    for a in arrs:
        a.spill()
    borrower.wait_idle()
    assert all(a.state == State.PEER for a in arrs)
    for d, a in zip(data, arrs):
        np.testing.assert_array_equal(a.copy_to_host(), d)
    del arrs, a
    del borrower  # destroyed first: its memory goes back to the lender, still alive
    gc.collect()
    assert gone() is None


def test_a_reclaim_drops_the_borrowers_reference():
    lender, borrower = host_runtime(64 * MiB), host_runtime(16 * MiB)
    lender.peer_lend(borrower, 8 * MiB)
    gone = weakref.ref(lender)
    lender.peer_reclaim(borrower)
    del lender
    gc.collect()
    assert gone() is None
    borrower.close()


def test_a_borrower_and_lender_in_a_cycle_are_collected():
    lender, borrower = host_runtime(64 * MiB), host_runtime(16 * MiB)
    lender.peer_lend(borrower, 8 * MiB)
    lender.friend = borrower  # a cycle: borrower -> lender (C) -> borrower (__dict__)
    b = borrower.alloc(MiB)
    b.spill()
    borrower.wait_idle()
    assert b.state == State.PEER
    gone = weakref.ref(lender), weakref.ref(borrower)
    del lender, borrower, b
    gc.collect()
    assert gone[0]() is None and gone[1]() is None


def test_closing_lender_and_borrower_from_two_threads_at_once():
    for _ in range(10):
        lender, borrower = host_runtime(64 * MiB), host_runtime(16 * MiB)
        lender.peer_lend(borrower, 8 * MiB)
        bufs = [borrower.alloc(MiB) for _ in range(4)]
        borrower.spill(bufs)
        borrower.wait_idle()
        del bufs
        go = threading.Barrier(2)
        errors = []

        def close(r):
            go.wait()
            try:
                r.close()
            except Exception as e:  # pragma: no cover - reported below
                errors.append(e)

        threads = [threading.Thread(target=close, args=(r,)) for r in (lender, borrower)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == [] and lender.closed and borrower.closed


def test_lend_and_reclaim_race_with_close():
    for _ in range(10):
        lender, borrower = host_runtime(64 * MiB), host_runtime(16 * MiB)
        go = threading.Barrier(2)
        seen = []

        def lend():
            go.wait()
            for _ in range(20):
                try:
                    lender.peer_lend(borrower, 4 * MiB)
                    lender.peer_reclaim(borrower)
                except spillway.InvalidArgumentError as e:
                    seen.append(str(e))  # the borrower was closed meanwhile

        t = threading.Thread(target=lend)
        t.start()
        go.wait()
        borrower.close()
        t.join()
        assert all("closed" in s or "nothing is lent" in s for s in seen), seen
        assert lender.stats().lent_bytes == 0
        lender.close()


def test_stats_fields_match_the_extension():
    import dataclasses
    names = [f.name for f in dataclasses.fields(spillway.Stats)]
    for f in ("peer_bytes", "peer_limit", "peer_spills", "peer_spill_bytes", "peer_unspills",
              "peer_unspill_bytes", "peer_returns", "peer_return_bytes", "lent_bytes"):
        assert f in names
