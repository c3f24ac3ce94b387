# SPDX-License-Identifier: Apache-2.0
"""spillway.process: one Spillway runtime per device per process, shared by every library.

The Numba EMM plugin (spillway.numba), the CuPy allocator (spillway.cupy), the PyTorch
allocator (spillway.torch), the cuda.core memory resource (spillway.cuda_core), deferrable
arrays made through them and, by default, the Dask worker plugin all take their device's
runtime from here, so the whole process has one device budget: when any of them needs
room, unlocked deferrable buffers of all of them are spilled.

Each device has, besides its runtime, an *exposure* stream: memory handed to a library
that keeps raw pointers (Numba, CuPy, PyTorch, cuda.core) stays locked on it until the
library frees it. Only these allocators use that stream, so no synchronize or release of
any other stream can unlock memory a library still points at.

``usage()`` attributes the live allocations to the library that made them.
"""
from __future__ import annotations

import threading
import warnings
from typing import Any, Dict, Optional

from . import _spillway as _c
from ._errors import BusyError
from ._runtime import Runtime, StreamLike

__all__ = ["configure", "configuration", "device", "runtime", "existing", "reset", "usage", "allocate",
           "Allocation", "LIBRARIES", "Device"]

#: The libraries whose allocations usage() counts (besides deferrable arrays).
LIBRARIES = ("numba", "cupy", "torch", "cuda.core")


class Device:
    """The shared runtime of one device and the stream that holds the libraries' locks."""

    __slots__ = ("id", "runtime", "expose", "expose_handle", "__weakref__")

    def __init__(self, device_id: int, config: Dict[str, Any]) -> None:
        self.id = device_id
        self.runtime = Runtime(device=device_id, **config)
        # Libraries hold raw pointers into it (the PyTorch allocator library holds the
        # runtime itself): only reset() may close it (Runtime.close refuses).
        self.runtime._shared = True
        self.expose = self.runtime.stream()
        self.expose_handle = self.expose.handle

    def __repr__(self) -> str:
        return f"<spillway.process.Device {self.id}: {self.runtime!r}>"


_devices: Dict[int, Device] = {}
_lock = threading.Lock()
_config: Dict[str, Any] = {}
#: Hooks run (with the device id) before a device's runtime is closed by reset(): the
#: PyTorch allocator unregisters the runtime from its library there.
_reset_hooks: list = []
#: Runtimes that reset() could not close while a library still held memory in them: kept
#: alive for the rest of the process, since that memory would otherwise be freed under it.
_abandoned: list = []


def _check_device(device_id: Any) -> int:
    if isinstance(device_id, bool) or not isinstance(device_id, int):
        raise TypeError(f"a device is an int, not {type(device_id).__name__}")
    if not 0 <= device_id < 1 << 31:
        raise ValueError(f"a device ordinal is between 0 and 2**31-1, not {device_id}")
    return device_id


def configure(**config: Any) -> None:
    """Sets the keyword configuration (those of spillway.Runtime, less ``device``) of the
    runtimes this module creates. Call it before the first use: RuntimeError once a shared
    runtime exists. SPILLWAY_* variables apply to what is not set here. ``configure()``
    with no keywords goes back to the variables alone."""
    if "device" in config:
        raise TypeError("configure() takes no device: each device gets its own runtime")
    with _lock:
        if _devices:
            raise RuntimeError("spillway.process.configure() must come before the first use "
                               "of a shared runtime")
        _config.clear()
        _config.update(config)


def configuration() -> Dict[str, Any]:
    """A copy of the keywords configure() set (empty: the SPILLWAY_* variables alone)."""
    with _lock:
        return dict(_config)


def device(device_id: int = 0) -> Device:
    """The shared state of `device_id` (runtime and exposure stream), created on first use
    from the configuration. TypeError / ValueError for what is not a device ordinal."""
    d = _devices.get(device_id)
    if d is None:
        _check_device(device_id)
        with _lock:
            d = _devices.get(device_id)
            if d is None:
                d = _devices[device_id] = Device(device_id, _config)
    return d


def runtime(device_id: int = 0) -> Runtime:
    """The process-wide Runtime of `device_id`, created on first use."""
    return device(device_id).runtime


def existing(device_id: int) -> Optional[Device]:
    """The shared state of `device_id` if it was created, else None (creates nothing)."""
    return _devices.get(device_id)


def reset(device_id: int) -> bool:
    """Closes the shared runtime of `device_id` (its exposure stream first, which releases
    every library's locks); the next use creates a new one. Numba calls it when its CUDA
    context is destroyed, the Dask plugin when its worker that owned it ends. Memory that a
    library still holds in it is dead afterwards. Returns False, with a RuntimeWarning, if
    the runtime could not be closed (buffers locked on other streams, or PyTorch memory
    still allocated): it is abandoned then, and the next use creates a new one anyway."""
    with _lock:
        d = _devices.pop(device_id, None)
    if d is None:
        return True
    for hook in list(_reset_hooks):
        try:
            hook(device_id)
        except BusyError as e:
            _abandoned.append(d)
            warnings.warn(f"spillway: the shared runtime of device {device_id} is abandoned: "
                          f"{e}", RuntimeWarning, stacklevel=2)
            return False
    try:
        d.runtime._shared = False
        d.runtime.close()
    except BusyError as e:
        warnings.warn(f"spillway: the runtime of device {device_id} still has locked buffers; "
                      f"it is abandoned ({e})", RuntimeWarning, stacklevel=2)
        return False
    return True


# -- attribution -------------------------------------------------------------------------
class _Counts:
    __slots__ = ("live", "live_bytes", "allocs", "alloc_bytes", "failures")

    def __init__(self) -> None:
        self.live = self.live_bytes = self.allocs = self.alloc_bytes = self.failures = 0

    def as_dict(self) -> Dict[str, int]:
        return {k: getattr(self, k) for k in self.__slots__}


# (library, device) -> counts. A lock, not the GIL, makes the updates atomic: `+=` on an
# attribute is several bytecodes, and the allocators run on many threads.
_counts: Dict[tuple, _Counts] = {}
_counts_lock = threading.Lock()


def _counter(library: str, device_id: int) -> _Counts:
    c = _counts.get((library, device_id))
    if c is None:
        with _counts_lock:
            c = _counts.setdefault((library, device_id), _Counts())
    return c


def _allocated(library: str, device_id: int, nbytes: int) -> None:
    c = _counter(library, device_id)
    with _counts_lock:
        c.live += 1
        c.live_bytes += nbytes
        c.allocs += 1
        c.alloc_bytes += nbytes


def _freed(library: str, device_id: int, nbytes: int) -> None:
    c = _counter(library, device_id)
    with _counts_lock:
        c.live -= 1
        c.live_bytes -= nbytes


def _failed(library: str, device_id: int) -> None:
    c = _counter(library, device_id)
    with _counts_lock:
        c.failures += 1


#: Set by spillway.torch when it loads its library: (device) -> counts dict or None.
_torch_usage: Optional[Any] = None


def usage(device_id: int = 0) -> Dict[str, Dict[str, int]]:
    """Who holds what in the shared runtime of `device_id`, by library: for each of
    LIBRARIES a dict with ``live`` (allocations not yet freed), ``live_bytes``, ``allocs``
    and ``alloc_bytes`` (since the process started) and ``failures`` (allocations refused,
    out of memory or otherwise); and ``"deferrable"``: the runtime's other buffers
    (deferrable arrays and buffers), with ``live`` and ``live_bytes`` only, the runtime's
    totals (Stats.buffers and its bytes on every tier) less the libraries' live memory.
    A library never used has all zeros. ValueError/TypeError for a bad device."""
    _check_device(device_id)
    out: Dict[str, Dict[str, int]] = {}
    for lib in LIBRARIES:
        out[lib] = _Counts().as_dict()
    with _counts_lock:
        for (lib, dev), c in _counts.items():
            if dev == device_id:
                out[lib] = c.as_dict()
    if _torch_usage is not None:
        t = _torch_usage(device_id)
        if t is not None:
            out["torch"] = t
    d = _devices.get(device_id)
    live = live_bytes = 0
    if d is not None and not d.runtime.closed:
        s = d.runtime.stats()
        live = s.buffers - sum(v["live"] for v in out.values())
        live_bytes = (s.device_bytes + s.host_bytes + s.disk_bytes
                      - sum(v["live_bytes"] for v in out.values()))
    out["deferrable"] = {"live": max(live, 0), "live_bytes": max(live_bytes, 0)}
    return out


# -- memory for libraries that keep raw pointers ------------------------------------------
class Allocation:
    """Device memory lent to a library that keeps its raw pointer (CuPy, cuda.core): a
    Spillway buffer of the device's shared runtime, counted against its budget, locked on
    the exposure stream, so it stays resident and at ``ptr`` until :meth:`free` (or until
    the object is garbage-collected). Made by :func:`allocate`."""

    __slots__ = ("library", "device", "ptr", "size", "stream", "_rt", "_expose", "_handle",
                 "__weakref__")

    def __init__(self, library: str, d: Device, handle: int, ptr: int, size: int,
                 stream: int) -> None:
        self.library = library
        self.device = d.id
        self.ptr = ptr
        self.size = size
        self.stream = stream
        self._rt = d.runtime
        self._expose = d.expose_handle
        # A one-element list: pop() hands the handle to exactly one caller, even when two
        # threads free at once.
        self._handle = [handle]

    @property
    def freed(self) -> bool:
        return not self._handle

    def free(self, stream: StreamLike = None) -> None:
        """Gives the memory back once `stream` (default: the stream it was allocated on)
        passes this point: work the library queued there before the free still runs on
        valid memory. Never blocks; idempotent."""
        try:
            h = self._handle.pop()
        except IndexError:
            return
        s = self.stream if stream is None else _c.stream_handle(stream)
        _freed(self.library, self.device, self.size)
        self._rt._expose_free(h, self._expose, s or None)

    def __del__(self) -> None:
        if self._handle:
            try:
                self.free()
            except Exception:  # noqa: BLE001 - at interpreter exit the module may be gone
                pass

    def __repr__(self) -> str:
        state = "freed" if self.freed else f"0x{self.ptr:x}"
        return f"<spillway.process.Allocation {self.library} {self.size} bytes {state}>"


def allocate(library: str, nbytes: int, device_id: int = 0,
             stream: StreamLike = None) -> Allocation:
    """Allocates `nbytes` for `library` (one of LIBRARIES, for usage()) in the shared
    runtime of `device_id`, stream-ordered on `stream` (the memory is ready for work queued
    there after this call). If the budget is short, unlocked deferrable buffers are spilled
    first (the GIL is released meanwhile). Errors: ValueError for an unknown library,
    TypeError / InvalidArgumentError for a size that is not an int in [1, 2**63-1],
    InvalidStreamError, and OutOfMemoryError when what remains on the device is locked (its
    detail has the numbers, locked bytes included)."""
    if library not in LIBRARIES:
        raise ValueError(f"library must be one of {LIBRARIES}, not {library!r}")
    d = device(device_id)
    s = _c.stream_handle(stream)
    try:
        h, ptr = d.runtime._expose_alloc(nbytes, d.expose_handle, s or None)
    except MemoryError:
        _failed(library, d.id)
        raise
    _allocated(library, d.id, nbytes)
    return Allocation(library, d, h, ptr, nbytes, s)
