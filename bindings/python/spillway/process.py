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

``usage()`` attributes the live allocations to the library that made them. The C runtime
knows it too: each library allocates under its owner id (``OWNERS``), named after it, so
the trace (SPILLWAY_TRACE), ``Runtime.summary()`` and ``Runtime.owner_stats(owner)`` name
the library.
"""
from __future__ import annotations

import threading
import warnings
from typing import Any, Dict, Optional

from . import _spillway as _c
from ._errors import BusyError
from ._runtime import Runtime, StreamLike

__all__ = ["configure", "configuration", "device", "runtime", "existing", "reset", "usage",
           "allocate", "Allocation", "LIBRARIES", "OWNERS", "Device"]

#: The libraries whose allocations usage() counts (besides deferrable arrays), as the
#: extension names them.
LIBRARIES = tuple(_c.LIBRARIES)

#: The owner id (spw_alloc_ex's SPW_ALLOC_OWNER) each library allocates under in a runtime,
#: by library name: ``runtime(0).owner_stats(OWNERS["cupy"])``. Other code that tags its own
#: buffers in a shared runtime should use other ids.
OWNERS = dict(zip(LIBRARIES, _c.LIBRARY_OWNERS))


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


def reset(device_id: int, force: bool = False) -> bool:
    """Closes the shared runtime of `device_id` (its exposure stream first, which releases
    every library's locks); the next use creates a new one. Returns True when closed.

    Without `force`, a runtime in which Numba, CuPy or cuda.core still hold memory is not
    closed: it is abandoned instead (kept alive for the rest of the process, so their
    pointers stay valid), with a RuntimeWarning, and False is returned; the next use creates
    a new runtime anyway. The Dask plugin resets this way when its worker ends. ``force``
    closes it even then (that memory is dead afterwards): Numba does so when its CUDA
    context is destroyed, which frees all of it anyway. PyTorch memory is never closed
    under PyTorch: its allocator library refuses, and the runtime is abandoned. A runtime
    with buffers still locked on other streams is abandoned too (BusyError from close)."""
    with _lock:
        d = _devices.pop(device_id, None)
    if d is None:
        return True
    if not force and not d.runtime.closed:
        held = {lib: row[0] for lib, row in zip(LIBRARIES, d.runtime._usage()) if row[0]}
        if held:
            _abandoned.append(d)
            warnings.warn(f"spillway: the shared runtime of device {device_id} is abandoned, "
                          f"not closed: libraries still hold allocations in it {held}",
                          RuntimeWarning, stacklevel=2)
            return False
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
# The counters live in C, in each runtime (allocation.c): an allocation + free is the whole
# work of an allocator hook, and Python bookkeeping around it cost more than the calls.
_KEYS = ("live", "live_bytes", "allocs", "alloc_bytes", "failures")
_LIBRARY_INDEX = {name: i for i, name in enumerate(LIBRARIES)}


#: Set by spillway.torch when it loads its library: (device) -> counts dict or None.
_torch_usage: Optional[Any] = None


def usage(device_id: int = 0) -> Dict[str, Dict[str, int]]:
    """Who holds what in the shared runtime of `device_id`, by library: for each of
    LIBRARIES a dict with ``live`` (allocations not yet freed), ``live_bytes``, ``allocs``
    and ``alloc_bytes`` (since the runtime was created; for PyTorch, since the process
    started) and ``failures`` (allocations refused, out of memory or otherwise); and
    ``"deferrable"``: the runtime's other buffers (deferrable arrays and buffers), with
    ``live`` and ``live_bytes`` only, the runtime's totals (Stats.buffers and its bytes on
    every tier) less the libraries' live memory. A library never used has all zeros.
    TypeError / ValueError for what is not a device ordinal."""
    _check_device(device_id)
    out: Dict[str, Dict[str, int]] = {lib: dict.fromkeys(_KEYS, 0) for lib in LIBRARIES}
    d = _devices.get(device_id)
    if d is not None and not d.runtime.closed:
        for lib, row in zip(LIBRARIES, d.runtime._usage()):
            out[lib] = dict(zip(_KEYS, row))
    if _torch_usage is not None:
        t = _torch_usage(device_id)
        if t is not None:
            out["torch"] = t
    live = live_bytes = 0
    if d is not None and not d.runtime.closed:
        s = d.runtime.stats()
        live = s.buffers - sum(v["live"] for v in out.values())
        live_bytes = (s.device_bytes + s.host_bytes + s.peer_bytes + s.disk_bytes
                      - sum(v["live_bytes"] for v in out.values()))
    out["deferrable"] = {"live": max(live, 0), "live_bytes": max(live_bytes, 0)}
    return out


# -- memory for libraries that keep raw pointers ------------------------------------------
#: Device memory lent to a library that keeps its raw pointer (CuPy, cuda.core): a Spillway
#: buffer of the device's shared runtime, counted against its budget, locked on the
#: exposure stream, so it stays resident and at ``ptr`` until ``free(stream=None)`` (or
#: until the object is garbage-collected). Attributes: ``ptr``, ``size``, ``stream`` (the
#: handle it was allocated on), ``device``, ``library``, ``freed``, ``runtime``. Made by
#: :func:`allocate` (written in C: spillway._spillway.Allocation).
Allocation = _c.Allocation


def allocate(library: str, nbytes: int, device_id: int = 0,
             stream: StreamLike = None) -> Any:
    """Allocates `nbytes` for `library` (one of LIBRARIES, for usage()) in the shared
    runtime of `device_id`, stream-ordered on `stream` (the memory is ready for work queued
    there after this call). If the budget is short, unlocked deferrable buffers are spilled
    first (the GIL is released meanwhile). Returns an :data:`Allocation`, whose ``free``
    gives the memory back once the allocation's stream (or the one given) passes that point,
    never blocking. Errors: ValueError for an unknown library, TypeError /
    InvalidArgumentError for a size that is not an int in [1, 2**63-1], InvalidStreamError,
    and OutOfMemoryError when what remains on the device is locked (its text has the
    numbers, locked bytes included)."""
    lib = _LIBRARY_INDEX.get(library) if isinstance(library, str) else None
    if lib is None:
        raise ValueError(f"library must be one of {LIBRARIES}, not {library!r}")
    d = _devices.get(device_id) or device(device_id)
    return d.runtime._allocate(lib, nbytes, d.expose_handle, stream, d.id)
