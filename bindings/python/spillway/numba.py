# SPDX-License-Identifier: Apache-2.0
"""spillway.numba: Spillway for Numba (numba-cuda).

Two things live here:

* The EMM plugin :class:`SpillwayNumbaManager` (``NUMBA_CUDA_MEMORY_MANAGER=spillway.numba``
  or ``numba.cuda.set_memory_manager(SpillwayNumbaManager)``). Every Numba device
  allocation becomes a Spillway buffer in the device's shared runtime, so Numba memory and
  deferrable arrays share one budget: when a Numba allocation needs room, unlocked
  deferrable arrays are spilled. Numba caches device pointers and gives the plugin no
  stream, so its memory stays locked ("exposed") on a stream only this plugin uses until
  Numba frees it; no release of any other stream can unlock it.
* Deferrable arrays for kernels: :func:`device_array`, :func:`to_device`, the launch
  extension (:data:`extension`, :func:`jit`) that acquires them on the launch stream, the
  read-only marker, and :func:`lend`, which lends one as an ordinary Numba device array.

docs/python.md explains the rules (streams, GIL, what is not supported).
"""
from __future__ import annotations

import contextlib
import functools
import weakref
from typing import Any, Dict, Iterator, Optional

import numpy as np
from numba import cuda
from numba.cuda.cudadrv import devicearray as _devicearray
from numba.cuda.cudadrv.driver import (CudaAPIError, GetIpcHandleMixin,
                                       HostOnlyCUDAMemoryManager, IpcHandle, MemoryInfo,
                                       MemoryPointer)

from . import _spillway as _c
from . import process as _process
from ._errors import InvalidArgumentError, OutOfMemoryError, UnsupportedError
from ._runtime import Runtime, StreamLike
from .array import DeferrableArray, ReadOnly

try:
    from cuda.bindings import driver as _cu
except ImportError:  # older cuda-python layout
    from cuda import cuda as _cu

__all__ = ["SpillwayNumbaManager", "SpillwayExtension", "extension", "jit", "device_array",
           "device_array_like", "to_device", "lend", "read_only", "synchronize", "runtime",
           "configure", "is_deferrable", "DeferrableArray", "ReadOnly"]

# numba-cuda 0.30 reads device arrays through `_strided_memory_view_shim` when
# `__cuda_memory__` is true; LaunchView speaks that protocol (the cheapest path). On a
# numba-cuda without it, LaunchView is read through __cuda_array_interface__.
if hasattr(_devicearray, "_to_strided_memory_view") and hasattr(
        _devicearray.DeviceNDArrayBase, "_strided_memory_view_shim"):
    setattr(_c.LaunchView, "__cuda_memory__", True)


# -- the shared runtime of each device ---------------------------------------------------
# The runtimes are the process's (spillway.process), shared with the CuPy, PyTorch and
# cuda.core allocators, so that Numba memory, their memory and deferrable arrays have one
# budget.
_Device = _process.Device
_NUMBA = _process.LIBRARIES.index("numba")
_IPC_HANDLE_BYTES = 64  # cudaIpcMemHandle_t, first in spw_ipc_handle_t  # the counter of spillway.usage()


def configure(**config: Any) -> None:
    """Sets the keyword configuration (as for spillway.Runtime) of the process's shared
    runtimes (spillway.process.configure); call it before the first CUDA use. SPILLWAY_*
    variables apply to what is not set here."""
    try:
        _process.configure(**config)
    except RuntimeError:
        raise RuntimeError("spillway.numba.configure() must come before the first use") from None


def _ordinal(device: Any) -> int:
    """The ordinal of a Numba context's device: a numba Device (``.id``), or the raw
    ``CUdevice`` of a context a third party created (numba-cuda's Test3rdPartyContext)."""
    ordinal = getattr(device, "id", None)
    return int(device if ordinal is None else ordinal)


def _device(device_id: int) -> _Device:
    return _process.device(device_id)


def _current() -> _Device:
    return _device(cuda.get_current_device().id)


def runtime(device: Optional[int] = None) -> Runtime:
    """The process-wide Runtime of `device` (default: Numba's current device), shared by
    the EMM plugin and by deferrable arrays; created on first use."""
    return (_current() if device is None else _device(device)).runtime


def _reset_device(device_id: int) -> None:
    """The CUDA context of the device is about to be destroyed (numba.cuda.close()): every
    buffer of its runtime dies with it, the other libraries' memory included. Release the
    exposure locks and close the runtime; the next use creates a new one."""
    _process.reset(device_id, force=True)


# -- the EMM plugin ------------------------------------------------------------------------
class SpillwayOutOfMemoryError(OutOfMemoryError, CudaAPIError):
    """Spillway could not make room for a Numba allocation: both a spillway.OutOfMemoryError
    (a MemoryError) and the CudaAPIError(CUDA_ERROR_OUT_OF_MEMORY) Numba code expects."""

    def __init__(self, message: str, status: int, detail: str = "") -> None:
        OutOfMemoryError.__init__(self, message, status, detail)
        self.code = _cu.CUresult.CUDA_ERROR_OUT_OF_MEMORY
        self.msg = message

    def __str__(self) -> str:
        return self.msg


class SpillwayNumbaManager(HostOnlyCUDAMemoryManager):
    """Numba EMM plugin: device memory from Spillway's budget (host memory as Numba's own).

    * ``memalloc`` allocates a Spillway buffer on the default stream (which Numba's
      streams wait on) and locks it on the plugin's own stream: it stays resident and in
      place while Numba holds the pointer; other buffers are spilled to make room.
    * The finalizer never blocks: the lock moves to the default stream and is released
      once that stream passes the point of the free, so kernels Numba enqueued before the
      free still run on valid memory; then the memory goes back to the budget.
    * ``defer_cleanup``: device frees are already stream-ordered and cheap, so it only
      defers Numba's host-side cleanup (HostOnlyCUDAMemoryManager's).
    * ``get_memory_info``: total = the device budget, free = the part not locked (unlocked
      buffers can be spilled to make room).
    * ``get_ipc_handle``: CUDA IPC handles Numba's IPC machinery opens in another process,
      where the runtime was created with ``ipc`` on (SPILLWAY_IPC=1); refused with
      UnsupportedError otherwise (docs/python.md, "IPC").
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # numba.cuda.set_memory_manager builds one with context=None to read the version:
        # nothing here may touch CUDA.
        super().__init__(*args, **kwargs)
        self._dev: Optional[_Device] = None

    def initialize(self) -> None:
        # Runs on every context push: only the first call does anything.
        if self._dev is None and self.context is not None:
            self._dev = _device(_ordinal(self.context.device))

    def _device_state(self) -> _Device:
        if self._dev is None or self._dev.runtime.closed:
            self._dev = None
            self.initialize()
        if self._dev is None:  # no context yet: Numba allocates only inside one
            raise RuntimeError("spillway.numba: the memory manager has no CUDA context")
        return self._dev

    def memalloc(self, size: int) -> MemoryPointer:
        ctx = weakref.proxy(self.context)
        if size <= 0:
            return MemoryPointer(ctx, _cu.CUdeviceptr(0), size)
        d = self._device_state()
        rt = d.runtime
        try:
            h, ptr = rt._numba_alloc(size, d.expose_handle, None, _NUMBA)
        except OutOfMemoryError as e:
            raise SpillwayOutOfMemoryError(str(e), e.status, e.detail) from None
        return MemoryPointer(ctx, _cu.CUdeviceptr(ptr), size,
                             finalizer=functools.partial(rt._numba_free, h, d.expose_handle,
                                                         None, _NUMBA, size))

    def get_memory_info(self) -> MemoryInfo:
        s = self._device_state().runtime.stats()
        return MemoryInfo(free=max(0, s.device_limit - s.locked_bytes), total=s.device_limit)

    def get_ipc_handle(self, memory):
        # Numba's IPC is CUDA's legacy IPC: the child opens the raw handle bytes with
        # cuIpcOpenMemHandle, which only memory from cudaMalloc can be exported for. A
        # runtime with ipc on takes its device memory from such regions; the handle names
        # the region and the offset says where this memory lies in it, as Numba's own
        # manager does for its allocations. The plugin's memory stays locked for as long as
        # Numba holds it, which is what keeps it in place for the other process.
        rt = self._device_state().runtime
        try:
            raw = rt.ipc_export(int(memory.handle), memory.size)
        except UnsupportedError:
            raise UnsupportedError(
                "SPW_ERR_UNSUPPORTED: this process's Spillway runtime cannot export memory "
                "through CUDA IPC: set SPILLWAY_IPC=1 (or spillway.numba.configure(ipc=True)) "
                "before the first CUDA use, so that its device memory comes from regions "
                "cuIpcGetMemHandle can export", _c.SPW_ERR_UNSUPPORTED, "ipc") from None
        except InvalidArgumentError:
            # Not the runtime's memory (a foreign array's): Numba's own way, which works for
            # memory that came from cudaMalloc.
            return GetIpcHandleMixin.get_ipc_handle(self, memory)
        handle = _cu.CUipcMemHandle()
        handle.reserved = raw[:_IPC_HANDLE_BYTES]
        offset = int.from_bytes(raw[_IPC_HANDLE_BYTES:_IPC_HANDLE_BYTES + 8], "little")
        source_info = self.context.device.get_device_identity()
        return IpcHandle(memory, handle, memory.size, source_info, offset=offset)

    def reset(self) -> None:
        super().reset()
        if self.context is not None:
            _reset_device(_ordinal(self.context.device))
        self._dev = None

    @contextlib.contextmanager
    def defer_cleanup(self):
        with super().defer_cleanup():
            yield

    @property
    def interface_version(self) -> int:
        return 1


#: Read by Numba when NUMBA_CUDA_MEMORY_MANAGER=spillway.numba.
_numba_memory_manager = SpillwayNumbaManager


# -- deferrable arrays ---------------------------------------------------------------------
def is_deferrable(obj: Any) -> bool:
    return isinstance(obj, (DeferrableArray, ReadOnly))


def device_array(shape, dtype=np.float64, order: str = "C", stream: StreamLike = 0,
                 stable: Optional[bool] = None) -> DeferrableArray:
    """A new deferrable array on Numba's current device (contents undefined). ``stable``:
    address-stable (True), ordinary (False) or as the runtime's stable_addresses (None)."""
    return DeferrableArray(runtime(), shape, dtype, order=order, stream=stream or None,
                           stable=stable)


def device_array_like(ary, stream: StreamLike = 0,
                      stable: Optional[bool] = None) -> DeferrableArray:
    order = "F" if getattr(ary, "flags", None) is not None and ary.flags.f_contiguous \
        and not ary.flags.c_contiguous else "C"
    return device_array(ary.shape, ary.dtype, order=order, stream=stream, stable=stable)


def to_device(ary, stream: StreamLike = 0,
              stable: Optional[bool] = None) -> DeferrableArray:
    """A new deferrable array holding a copy of the host array `ary`; `stable` as for
    device_array."""
    return DeferrableArray.from_host(runtime(), ary, stream=stream or None, stable=stable)


def read_only(arr: DeferrableArray) -> ReadOnly:
    """Marks `arr` read-only for one launch: ``kernel[g, b](read_only(a), out)``."""
    return arr.read_only


@contextlib.contextmanager
def lend(arr: DeferrableArray, stream: StreamLike = 0,
         read: bool = False) -> Iterator[Any]:
    """Lends `arr` as an ordinary Numba device array for the ``with`` block, locked on
    `stream`: pass it to kernels, CuPy or PyTorch (``__cuda_array_interface__``) on that
    stream (or on streams ordered after it). The lock is released once the stream passes
    the end of the block; do not keep the device array past it."""
    with arr.lend_pointer(stream or None, read) as view:
        yield cuda.from_cuda_array_interface(view.__cuda_array_interface__, owner=view,
                                             sync=False)


def synchronize(stream: StreamLike = 0, device: Optional[int] = None) -> None:
    """syncAndUnlock: waits for `stream` and releases every lock it holds (GIL released)."""
    runtime(device).synchronize(stream or None)


# -- the launch extension --------------------------------------------------------------------
class SpillwayExtension(_c.LaunchExtensionBase):
    """numba-cuda launch extension (``@cuda.jit(extensions=[spillway.numba.extension])``):
    acquires every deferrable array argument on the launch stream before the launch (bringing
    it back if it was spilled) and releases those locks once the stream passes the launch,
    without blocking. Written in C (prepare_args); picklable, so kernels with
    ``cache=True`` and multiprocessing keep working."""

    def __init__(self) -> None:
        super().__init__(DeferrableArray, ReadOnly)

    def __reduce__(self):
        return (SpillwayExtension, ())

    def __repr__(self) -> str:
        return "spillway.numba.extension"


#: The one extension instance to pass to cuda.jit.
extension = SpillwayExtension()


def jit(func_or_sig=None, *args: Any, **kwargs: Any):
    """numba.cuda.jit with the Spillway launch extension added; same arguments."""
    ext = list(kwargs.pop("extensions", []) or [])
    if not any(isinstance(e, SpillwayExtension) for e in ext):
        ext.append(extension)
    kwargs["extensions"] = ext
    if func_or_sig is None:
        return cuda.jit(*args, **kwargs)
    return cuda.jit(func_or_sig, *args, **kwargs)
