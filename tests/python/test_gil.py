# SPDX-License-Identifier: Apache-2.0
"""Calls that wait on Spillway release the GIL: another Python thread runs while they wait."""
import sys
import threading

import numpy as np

import spillway

MiB = 1 << 20
DEADLINE_S = 120.0


def ran_while_inside(fn) -> bool:
    """Runs fn on a worker thread and tells whether this thread got to run while fn was
    still inside Spillway.

    The interpreter's switch interval is made longer than the deadline, so the worker gives
    the GIL up only where it blocks. This thread wakes when the worker sets `entered` and
    then waits for the GIL: it gets it inside fn if fn releases the GIL while it waits, and
    only after `done` is set if fn held the GIL throughout."""
    entered, done = threading.Event(), threading.Event()

    def worker():
        entered.set()
        fn()
        done.set()

    old = sys.getswitchinterval()
    sys.setswitchinterval(DEADLINE_S)
    try:
        t = threading.Thread(target=worker)
        t.start()
        assert entered.wait(DEADLINE_S)
        inside = not done.is_set()
    finally:
        sys.setswitchinterval(old)
    t.join(DEADLINE_S)
    assert done.is_set(), "the call did not return before the deadline"
    return inside


def test_synchronize_releases_the_gil_while_it_waits(rt, stream):
    src = np.ones(48 * MiB, dtype=np.uint8)
    b = rt.alloc(src.nbytes)
    p = b.acquire(stream)
    for _ in range(16):  # a good part of a second of copies queued on the stream's worker
        rt.memcpy(p, src.ctypes.data, src.nbytes, stream, False)
    assert ran_while_inside(lambda: rt.synchronize(stream))
    assert b.lock_count == 0


def test_wait_idle_releases_the_gil_while_it_waits(tmp_path):
    with spillway.Runtime(backend="host", device_limit=512 * MiB, host_device_bytes="1GiB",
                          spill_dir=str(tmp_path), io="posix", ignore_env=True) as rt:
        bufs = [rt.alloc(32 * MiB) for _ in range(12)]
        rt.spill(bufs, spillway.Tier.DISK)
        assert ran_while_inside(rt.wait_idle)
        assert all(b.state == spillway.State.DISK for b in bufs)


def test_acquire_from_disk_releases_the_gil_while_it_reads(tmp_path):
    with spillway.Runtime(backend="host", device_limit=512 * MiB, host_device_bytes="1GiB",
                          spill_dir=str(tmp_path), io="posix", ignore_env=True) as rt:
        bufs = [rt.alloc(64 * MiB) for _ in range(4)]
        rt.spill(bufs, spillway.Tier.DISK)
        rt.wait_idle()
        assert ran_while_inside(lambda: rt.acquire_n(bufs, None))
        assert all(b.lock_count == 1 for b in bufs)
        rt.synchronize(None)


def test_the_probe_tells_a_call_that_holds_the_gil_from_one_that_waits_without_it():
    # sum over a range runs in C with the GIL held from start to end.
    assert not ran_while_inside(lambda: sum(range(2 * 10**7)))
    assert ran_while_inside(lambda: threading.Event().wait(0.2))
