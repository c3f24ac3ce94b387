# SPDX-License-Identifier: Apache-2.0
"""Calls that wait on Spillway release the GIL: another Python thread keeps running."""
import threading
import time

import numpy as np

import spillway

MiB = 1 << 20


def progress_while(fn) -> int:
    """Runs fn in a thread and counts the main thread's loop iterations while fn is inside
    Spillway (from the moment the thread signals it is about to call)."""
    started, done = threading.Event(), threading.Event()

    def worker():
        started.set()
        fn()
        done.set()

    t = threading.Thread(target=worker)
    t.start()
    started.wait()
    time.sleep(0.01)  # let the worker enter the call
    n = 0
    while not done.is_set():
        n += 1
    t.join()
    return n


def test_synchronize_releases_the_gil_while_it_waits(rt, stream):
    src = np.ones(48 * MiB, dtype=np.uint8)
    b = rt.alloc(src.nbytes)
    p = b.acquire(stream)
    for _ in range(16):  # a good part of a second of copies queued on the stream's worker
        rt.memcpy(p, src.ctypes.data, src.nbytes, stream, False)
    n = progress_while(lambda: rt.synchronize(stream))
    assert b.lock_count == 0
    assert n > 1000


def test_wait_idle_releases_the_gil_while_it_waits(tmp_path):
    with spillway.Runtime(backend="host", device_limit=512 * MiB, host_device_bytes="1GiB",
                          spill_dir=str(tmp_path), io="posix", ignore_env=True) as rt:
        bufs = [rt.alloc(32 * MiB) for _ in range(12)]
        rt.spill(bufs, spillway.Tier.DISK)
        n = progress_while(rt.wait_idle)
        assert all(b.state == spillway.State.DISK for b in bufs)
        assert n > 1000


def test_acquire_from_disk_releases_the_gil_while_it_reads(tmp_path):
    with spillway.Runtime(backend="host", device_limit=512 * MiB, host_device_bytes="1GiB",
                          spill_dir=str(tmp_path), io="posix", ignore_env=True) as rt:
        bufs = [rt.alloc(64 * MiB) for _ in range(4)]
        rt.spill(bufs, spillway.Tier.DISK)
        rt.wait_idle()
        n = progress_while(lambda: rt.acquire_n(bufs, None))
        assert all(b.lock_count == 1 for b in bufs)
        rt.synchronize(None)
        assert n > 100
