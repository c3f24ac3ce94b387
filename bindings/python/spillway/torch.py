# SPDX-License-Identifier: Apache-2.0
"""spillway.torch: Spillway as PyTorch's CUDA allocator.

    import torch, spillway.torch
    spillway.torch.install()                 # before any torch.cuda call

or, keeping PyTorch's caching allocator for everything else:

    pool = spillway.torch.mem_pool()         # torch.cuda.MemPool(..., use_on_oom=True)
    with torch.cuda.use_mem_pool(pool): ...  # these allocations come from Spillway

The allocator is a small C library shipped in the wheel (libspillway_torch.so, from
bindings/python/src/torch_alloc.c) that PyTorch's CUDAPluggableAllocator loads by path. It
allocates in the device's shared runtime (spillway.process), which Python registers with it
here, so PyTorch's memory counts against the budget that Numba, CuPy and deferrable arrays
share, and deferrable buffers are spilled to make room. PyTorch's memory itself is plain
device memory, locked until PyTorch frees it. A failed allocation never crashes: PyTorch
raises its out-of-memory error (torch.OutOfMemoryError through a MemPool; a RuntimeError
naming the reason after install(), see INSTALL_ALLOC_SYMBOL); ``usage()`` has the counts.

Only ``install``, ``allocator`` and ``mem_pool`` need PyTorch; ``register``, ``usage``
and the library's functions work without it (the tests call them through ctypes on the
host backend).
"""
from __future__ import annotations

import atexit
import ctypes
import os
import threading
from typing import Any, Dict, Iterable, List, Optional

from . import _spillway as _c
from . import process as _process
from ._errors import error_class

__all__ = ["library_path", "register", "install", "allocator", "mem_pool", "usage",
           "ALLOC_SYMBOL", "INSTALL_ALLOC_SYMBOL", "FREE_SYMBOL"]

#: Returns NULL on failure: for a torch.cuda.MemPool, whose caching allocator turns NULL
#: into torch.OutOfMemoryError.
ALLOC_SYMBOL = "spw_torch_alloc"
#: Throws a C++ exception on failure (PyTorch raises RuntimeError): for install(), since
#: PyTorch's swapped-in allocator does not check for NULL (torch_alloc.c says more).
INSTALL_ALLOC_SYMBOL = "spw_torch_alloc_or_throw"
FREE_SYMBOL = "spw_torch_free"
_MAX_DEVICES = 64  # torch_alloc.c's MAX_DEVICES

_lock = threading.Lock()
_lib: Optional[ctypes.CDLL] = None
_allocators: Dict[str, Any] = {}


def library_path() -> str:
    """The path of libspillway_torch.so, for ``CUDAPluggableAllocator(path, ALLOC_SYMBOL,
    FREE_SYMBOL)``."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "libspillway_torch.so")


def _raise(st: int, what: str) -> None:
    raise error_class(st)(f"{_c.err_name(st)}: {_c.strerror(st)} ({what})", st, what)


def _library() -> ctypes.CDLL:
    """Loads the allocator library once (ctypes.CDLL: calls release the GIL, so a
    registration waiting for running allocations never holds it)."""
    global _lib
    with _lock:
        if _lib is None:
            lib = ctypes.CDLL(library_path())
            lib.spw_torch_alloc.restype = ctypes.c_void_p
            lib.spw_torch_alloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
            lib.spw_torch_free.restype = None
            lib.spw_torch_free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int,
                                           ctypes.c_void_p]
            lib.spw_torch_set_runtime.restype = ctypes.c_int
            lib.spw_torch_set_runtime.argtypes = [ctypes.c_int, ctypes.c_void_p,
                                                  ctypes.c_void_p, ctypes.c_void_p]
            lib.spw_torch_usage.restype = ctypes.c_int
            lib.spw_torch_usage.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_int64)]
            lib.spw_torch_stop.restype = None
            lib.spw_torch_stop.argtypes = []
            # From interpreter exit on the runtimes are left to the OS; PyTorch may still
            # free tensors from its own destructors after that, which then do nothing.
            atexit.register(lib.spw_torch_stop)
            _process._torch_usage = _process_usage
            _process._reset_hooks.append(_unregister)
            _lib = lib
        return _lib


def _check(device: Any) -> int:
    d = _process._check_device(device)
    if d >= _MAX_DEVICES:
        raise ValueError(f"the PyTorch allocator serves devices 0 to {_MAX_DEVICES - 1}, "
                         f"not {d}")
    return d


def register(device: int = 0) -> None:
    """Registers the shared runtime of `device` (created now if needed) with the allocator
    library; PyTorch allocations on a device not registered fail (out of memory). Idempotent.
    TypeError / ValueError for a bad device."""
    d = _process.device(_check(device))
    st = _library().spw_torch_set_runtime(d.id, _c._c_api_address(), d.runtime._address(),
                                          d.expose_handle)
    if st != 0:
        _raise(st, f"registering device {d.id}")


def _unregister(device: int) -> None:
    """spillway.process.reset's hook: BusyError while PyTorch still holds memory there."""
    if 0 <= device < _MAX_DEVICES and _lib is not None:
        st = _lib.spw_torch_set_runtime(device, None, None, None)
        if st != 0:
            _raise(st, f"PyTorch still holds memory of device {device}")


def usage(device: int = 0) -> Dict[str, int]:
    """The allocator library's counters for `device`: ``live``, ``live_bytes``,
    ``allocs``, ``alloc_bytes``, ``failures``, ``unknown_frees`` (frees of pointers it did
    not hand out, ignored), ``last_status`` (the negative status of the last failed
    allocation, 0 if none; spillway.error_class names it) and ``registered``."""
    out = (ctypes.c_int64 * 8)()
    st = _library().spw_torch_usage(_check(device), out)
    if st != 0:
        _raise(st, "usage")
    keys = ("live", "live_bytes", "allocs", "alloc_bytes", "failures", "unknown_frees",
            "last_status", "registered")
    return dict(zip(keys, (int(v) for v in out)))


def _process_usage(device: int) -> Optional[Dict[str, int]]:
    if device >= _MAX_DEVICES:
        return None
    u = usage(device)
    return {k: u[k] for k in ("live", "live_bytes", "allocs", "alloc_bytes", "failures")}


def allocator(alloc_symbol: str = ALLOC_SYMBOL) -> Any:
    """The ``torch.cuda.memory.CUDAPluggableAllocator`` over the library, one per allocation
    function: ALLOC_SYMBOL (NULL on failure, for MemPool) or INSTALL_ALLOC_SYMBOL (throws,
    for change_current_allocator). ValueError for another name; UnsupportedError if the
    library was built without the throwing one (no C++ compiler)."""
    if alloc_symbol not in (ALLOC_SYMBOL, INSTALL_ALLOC_SYMBOL):
        raise ValueError(f"alloc_symbol must be {ALLOC_SYMBOL!r} or {INSTALL_ALLOC_SYMBOL!r}")
    if not hasattr(_library(), alloc_symbol):
        st = _c.SPW_ERR_UNSUPPORTED
        _raise(st, f"{library_path()} was built without {alloc_symbol} (no C++ compiler); "
                   f"use mem_pool()")
    import torch
    with _lock:
        a = _allocators.get(alloc_symbol)
        if a is None:
            a = _allocators[alloc_symbol] = torch.cuda.memory.CUDAPluggableAllocator(
                library_path(), alloc_symbol, FREE_SYMBOL)
        return a


def _devices(devices: Optional[Iterable[int]]) -> List[int]:
    if devices is None:
        import torch
        return [torch.cuda.current_device()]
    return [_check(d) for d in devices]


def install(devices: Optional[Iterable[int]] = None) -> None:
    """Makes Spillway PyTorch's CUDA allocator (``change_current_allocator`` with the
    INSTALL_ALLOC_SYMBOL function: an allocation that fails raises RuntimeError("CUDA out of
    memory (spillway): ...") in Python, with the reason), which PyTorch accepts only before
    it initializes CUDA (any torch.cuda call that needs the device, or
    a first allocation). `devices`: the ordinals to serve (default: PyTorch's current
    device, read after the swap, since reading it first would initialize CUDA); each gets
    the process's shared runtime."""
    import torch
    wanted = None if devices is None else [_check(d) for d in devices]
    torch.cuda.memory.change_current_allocator(allocator(INSTALL_ALLOC_SYMBOL))
    for d in _devices(wanted):
        register(d)


def mem_pool(devices: Optional[Iterable[int]] = None) -> Any:
    """A ``torch.cuda.MemPool`` over Spillway's allocator, with ``use_on_oom=True``.
    Allocations made inside ``with torch.cuda.use_mem_pool(pool):`` come from Spillway
    (counted in its budget, spilling deferrable buffers to make room), with PyTorch's
    caching on top: freed blocks stay cached in the pool, and allocated in Spillway, until
    PyTorch releases them. Outside that block PyTorch keeps its own caching allocator; when
    it runs out of memory it may take a free block already cached in this pool (what
    ``use_on_oom`` does: PyTorch does not ask the pool's allocator for new memory then).
    Keep the pool while it is in use; deleting it gives its cached blocks back to Spillway.
    ``install()`` is the form that puts all of PyTorch's memory on Spillway's budget."""
    import torch
    for d in _devices(devices):
        register(d)
    return torch.cuda.MemPool(allocator(ALLOC_SYMBOL).allocator(), use_on_oom=True)
