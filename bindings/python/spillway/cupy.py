# SPDX-License-Identifier: Apache-2.0
"""spillway.cupy: Spillway as CuPy's allocator.

    import cupy, spillway.cupy
    cupy.cuda.set_allocator(spillway.cupy.malloc)        # or: with cupy.cuda.using_allocator(...)

Every CuPy device allocation becomes a buffer of the device's shared runtime
(spillway.process), so it counts against the budget that Numba memory and deferrable arrays
share; when it needs room, unlocked deferrable buffers are spilled first. The memory itself
is plain device memory: CuPy keeps raw pointers, so it stays locked (never spilled) until
CuPy frees it. docs/python.md explains the streams.
"""
from __future__ import annotations

from typing import Any

import cupy

from . import process as _process
from ._errors import OutOfMemoryError, _library_oom_class

__all__ = ["malloc", "SpillwayCupyOutOfMemoryError"]

_CupyOOM: Any = cupy.cuda.memory.OutOfMemoryError


#: Spillway could not make room for a CuPy allocation: both a spillway.OutOfMemoryError (its
#: text names the locked bytes) and the cupy.cuda.memory.OutOfMemoryError that CuPy code
#: catches.
SpillwayCupyOutOfMemoryError = _library_oom_class(
    _CupyOOM, "SpillwayCupyOutOfMemoryError", __name__,
    "Spillway could not make room for a CuPy allocation: a spillway.OutOfMemoryError and a "
    "cupy.cuda.memory.OutOfMemoryError.")


def malloc(size: int) -> Any:
    """The allocator function for ``cupy.cuda.set_allocator`` / ``using_allocator``:
    `size` bytes on CuPy's current device, stream-ordered on CuPy's current stream (CuPy
    passes no stream; its documentation says to use the current one), returned as a
    ``cupy.cuda.memory.MemoryPointer``. When CuPy drops the memory, it is freed in order on that
    same stream, as CuPy's own pool does. Raises SpillwayCupyOutOfMemoryError when what
    remains of the budget is locked, TypeError for a size that is not an int,
    InvalidArgumentError for a negative one."""
    if size == 0 and isinstance(size, int) and not isinstance(size, bool):
        return cupy.cuda.memory.MemoryPointer(cupy.cuda.memory.Memory(0), 0)
    dev = cupy.cuda.runtime.getDevice()
    stream = cupy.cuda.get_current_stream()
    try:
        a = _process.allocate("cupy", size, dev, stream.ptr)
    except OutOfMemoryError as e:
        raise SpillwayCupyOutOfMemoryError(str(e), e.status, e.detail, size) from None
    # The Allocation is the owner: CuPy keeps it while any array uses the memory, and its
    # release frees the buffer.
    mem = cupy.cuda.memory.UnownedMemory(a.ptr, a.size, a, dev)
    return cupy.cuda.memory.MemoryPointer(mem, 0)
