# SPDX-License-Identifier: Apache-2.0
"""spillway.cuda_core: a cuda.core MemoryResource over the device's shared Spillway runtime.

    from cuda.core import Device
    from spillway.cuda_core import SpillwayMemoryResource
    mr = SpillwayMemoryResource(Device().device_id)
    buf = mr.allocate(1 << 20, stream=Device().default_stream)

Allocations are plain device memory counted against the budget that Numba memory, CuPy,
PyTorch and deferrable arrays share (spillway.process); when one needs room, unlocked
deferrable buffers are spilled first. A Buffer's memory stays locked (never spilled) until
it is closed, or garbage-collected, when cuda.core calls deallocate.
"""
from __future__ import annotations

import threading
from typing import Any, Dict

try:
    from cuda.core import Buffer, MemoryResource
except ImportError:  # cuda.core before 0.4 kept these in cuda.core.experimental
    from cuda.core.experimental import Buffer, MemoryResource

from . import process as _process

__all__ = ["SpillwayMemoryResource"]


class SpillwayMemoryResource(MemoryResource):
    """cuda.core MemoryResource over the shared runtime of `device_id` (default 0).

    ``allocate(size, stream)`` allocates stream-ordered on `stream` (any stream object or
    handle; None: the default stream) and returns a ``Buffer`` whose memory resource is
    this one. ``deallocate(ptr, size, stream)`` gives it back once `stream` passes that
    point (None: the stream it was allocated on); nothing blocks. A pointer this resource
    did not hand out (or hands back twice) is a ValueError. Errors of allocate: those of
    spillway.process.allocate (OutOfMemoryError names the locked bytes)."""

    def __init__(self, device_id: int = 0) -> None:
        super().__init__()
        self._device_id = _process._check_device(device_id)
        self._live: Dict[int, _process.Allocation] = {}
        self._lock = threading.Lock()

    def allocate(self, size: int, stream: Any = None) -> Any:
        a = _process.allocate("cuda.core", size, self._device_id, stream)
        with self._lock:
            self._live[a.ptr] = a
        return Buffer.from_handle(a.ptr, a.size, mr=self)

    def deallocate(self, ptr: Any, size: int, stream: Any = None) -> None:
        with self._lock:
            a = self._live.pop(int(ptr), None)
        if a is None:
            raise ValueError(f"0x{int(ptr):x} was not allocated by this memory resource, or "
                             f"was freed already")
        a.free(stream)

    @property
    def device_id(self) -> int:
        return self._device_id

    @property
    def is_device_accessible(self) -> bool:
        return True

    @property
    def is_host_accessible(self) -> bool:
        return False

    def __repr__(self) -> str:
        return f"<spillway.cuda_core.SpillwayMemoryResource device {self._device_id}>"
