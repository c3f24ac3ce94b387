# SPDX-License-Identifier: Apache-2.0
"""Interpreter exit with Spillway objects alive: no hang, no crash, no Python call from a
Spillway thread after finalization starts."""
from conftest import run_python

SETUP = """
import spillway, numpy as np
rt = spillway.Runtime(backend='host', device_limit='32MiB', ignore_env=True)
s = rt.stream()
bufs = [rt.alloc(1 << 20) for _ in range(40)]
arr = spillway.DeferrableArray.from_host(rt, np.arange(1000))
"""


def test_exit_with_locked_buffers_and_pending_releases_is_clean():
    r = run_python(SETUP + """
for b in bufs[:5]:
    b.acquire(s)
rt.release_async(s)
bufs[6].acquire(None)
rt.spill(bufs[10:20])
print('exiting')
""", timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "exiting" and "Fatal" not in r.stderr


def test_exit_with_a_runtime_in_a_reference_cycle_is_clean():
    r = run_python(SETUP + """
rt.cycle = rt
del rt, s, bufs, arr
""", timeout=60)
    assert r.returncode == 0, r.stderr


def test_deallocation_during_finalization_does_not_wait():
    r = run_python(SETUP + """
import spillway._spillway as c
c._set_finalizing()
b = bufs[0]
b.acquire(s)
del rt, s, bufs, b, arr
import gc; gc.collect()
print('done')
""", timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "done"
