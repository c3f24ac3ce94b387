# SPDX-License-Identifier: Apache-2.0
"""Fixtures of the Python tests.

The API tests run end to end on the host backend (device memory emulated in host memory,
streams as worker threads), so they need no GPU. Tests marked ``gpu`` need numba-cuda and a
CUDA device and are skipped cleanly without them; they run with the EMM plugin selected
through NUMBA_CUDA_MEMORY_MANAGER (set here, before Numba reads its configuration) and a
small device budget so that a few hundred MiB oversubscribe it.
"""
import os
import subprocess
import sys

import pytest

os.environ.setdefault("NUMBA_CUDA_MEMORY_MANAGER", "spillway.numba")
os.environ.setdefault("SPILLWAY_GPU_TEST_LIMIT", "256MiB")

import spillway  # noqa: E402

MiB = 1 << 20


def _gpu_available() -> bool:
    try:
        from numba import cuda
    except ImportError:
        return False
    try:
        return bool(cuda.is_available())
    except Exception:
        return False


HAVE_GPU = _gpu_available()
GPU_LIMIT = spillway.parse_size(os.environ["SPILLWAY_GPU_TEST_LIMIT"])

if HAVE_GPU:
    import spillway.numba

    # The shared runtime of the plugin and of deferrable arrays: a small budget, so that a
    # few hundred MiB oversubscribe it.
    spillway.numba.configure(device_limit=GPU_LIMIT)


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs numba-cuda and a CUDA device")


def pytest_collection_modifyitems(config, items):
    if HAVE_GPU:
        return
    skip = pytest.mark.skip(reason="no CUDA device (or numba-cuda not installed)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def rt():
    """A host-backend runtime with a 64 MiB device budget, independent of SPILLWAY_*."""
    r = spillway.Runtime(backend="host", device_limit=64 * MiB, host_device_bytes=128 * MiB,
                         ignore_env=True, log_level="error")
    yield r
    try:
        r.close()
    except spillway.BusyError:
        pass  # a test that leaves locks behind checks that itself


@pytest.fixture
def stream(rt):
    s = rt.stream()
    yield s


def run_python(code: str, env=None, timeout=120) -> subprocess.CompletedProcess:
    """Runs `code` in a fresh interpreter (for exit and environment behaviour)."""
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=e, timeout=timeout)
