# SPDX-License-Identifier: Apache-2.0
"""Spillway: deferrable device memory for CUDA programs (RMMEP-1), from Python.

Buffers are named by handles; code retrieves-and-locks a buffer on a stream before using
its device pointer, and unlocked buffers may be spilled to pinned host memory or disk and
brought back on the next lock. See docs/python.md.

    import spillway
    with spillway.Runtime(device_limit="4GiB") as rt:
        buf = rt.alloc(1 << 20)
        with buf.lock(stream=None) as ptr:   # resident and locked on the default stream
            ...                               # enqueue work that uses ptr
        rt.synchronize()

``spillway.numba`` is the Numba EMM plugin and the deferrable arrays for Numba kernels;
``spillway.cupy``, ``spillway.torch`` and ``spillway.cuda_core`` make Spillway the allocator
of CuPy, PyTorch and cuda.core, on the one runtime per device that ``spillway.process``
keeps for the whole process (``spillway.usage()`` says which library holds what);
``spillway.lend`` lends a deferrable array through ``__cuda_array_interface__`` and DLPack;
``spillway.Controller`` (spillway.controller) hears every allocation, free and move and
picks spill victims; ``spillway.dask`` gives Dask workers a runtime each; ``python -m
spillway.plot`` draws a trace (SPILLWAY_TRACE).
"""
from __future__ import annotations

import atexit as _atexit

from . import _spillway
from ._errors import *  # noqa: F401,F403
from ._errors import __all__ as _errors_all
from ._runtime import Runtime, Stream, parse_size
from ._types import Backend, Buffer, State, Stats, StreamLike, Tier
from .array import DeferrableArray, DeviceView, ReadOnly, lend
from .process import usage
from .controller import Controller, HandleInfo, StateEvent

__version__ = "%d.%d.%d" % (_spillway.VERSION_MAJOR, _spillway.VERSION_MINOR,
                            _spillway.VERSION_PATCH)
Lock = _spillway.Lock
stream_handle = _spillway.stream_handle

__all__ = ["Runtime", "Buffer", "Lock", "Stream", "Stats", "State", "Tier", "Backend",
           "DeferrableArray", "DeviceView", "ReadOnly", "StreamLike", "parse_size",
           "Controller", "StateEvent", "HandleInfo",
           "stream_handle", "lend", "usage", "__version__", *_errors_all]

# From interpreter exit on, deallocators never wait on Spillway (no thread joins, no
# synchronization) and runtimes still alive are left to the OS.
_atexit.register(_spillway._set_finalizing)
