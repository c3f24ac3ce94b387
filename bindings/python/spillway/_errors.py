# SPDX-License-Identifier: Apache-2.0
"""One exception class per Spillway status code.

Every error raised by the package is a :class:`SpillwayError` whose message carries the
status name, its text and, where the library recorded one, ``spw_last_error``'s text
(``SPW_ERR_OUT_OF_MEMORY: device memory exhausted: the remaining buffers are locked
(device limit ... bytes: ... in use, ... of them locked, ... asked for)``). The classes
also derive from the built-in exception a Python programmer would catch: an out-of-memory
error is a :class:`MemoryError`, an invalid argument a :class:`ValueError`, and so on.
"""
from __future__ import annotations

from typing import Any, Dict, Type

from . import _spillway as _c

__all__ = [
    "SpillwayError", "InvalidArgumentError", "InvalidHandleError", "FreedError",
    "NotLockedError", "InvalidStreamError", "OutOfMemoryError", "HostOutOfMemoryError",
    "DiskFullError", "CudaError", "IOError_", "NoDeviceError", "ConfigError", "BusyError",
    "LockedError", "WouldDeadlockError", "UnsupportedError", "NotReadyError", "SystemError_",
    "InternalError", "WrongDeviceError", "error_class",
]


class SpillwayError(Exception):
    """Base of every Spillway error.

    Attributes: ``status`` (the negative ``spw_status_t``), ``name`` (``"SPW_ERR_..."``)
    and ``detail`` (``spw_last_error``'s text at the time, or ``""``)."""

    status: int = _c.SPW_ERR_INTERNAL

    def __init__(self, message: str, status: int | None = None, detail: str = "") -> None:
        super().__init__(message)
        if status is not None:
            self.status = status
        self.detail = detail

    @property
    def name(self) -> str:
        return _c.err_name(self.status)


class InvalidArgumentError(SpillwayError, ValueError):
    """SPW_ERR_INVALID_ARG (also a ValueError)."""
    status = _c.SPW_ERR_INVALID_ARG


class InvalidHandleError(SpillwayError, ValueError):
    """SPW_ERR_INVALID_HANDLE: not a handle of this runtime."""
    status = _c.SPW_ERR_INVALID_HANDLE


class FreedError(SpillwayError, ValueError):
    """SPW_ERR_FREED: the buffer was freed."""
    status = _c.SPW_ERR_FREED


class NotLockedError(SpillwayError, RuntimeError):
    """SPW_ERR_NOT_LOCKED: the stream holds no lock on the buffer."""
    status = _c.SPW_ERR_NOT_LOCKED


class InvalidStreamError(SpillwayError, ValueError):
    """SPW_ERR_INVALID_STREAM: unknown or destroyed stream."""
    status = _c.SPW_ERR_INVALID_STREAM


class OutOfMemoryError(SpillwayError, MemoryError):
    """SPW_ERR_OUT_OF_MEMORY: what remains on the device is locked  (also a MemoryError)."""
    status = _c.SPW_ERR_OUT_OF_MEMORY


class HostOutOfMemoryError(SpillwayError, MemoryError):
    """SPW_ERR_HOST_OUT_OF_MEMORY (also a MemoryError)."""
    status = _c.SPW_ERR_HOST_OUT_OF_MEMORY


class DiskFullError(SpillwayError, OSError):
    """SPW_ERR_DISK_FULL: the spill file reached its limit or ENOSPC."""
    status = _c.SPW_ERR_DISK_FULL


class CudaError(SpillwayError, RuntimeError):
    """SPW_ERR_CUDA: a CUDA call failed (the detail names it)."""
    status = _c.SPW_ERR_CUDA


class IOError_(SpillwayError, OSError):
    """SPW_ERR_IO: spill file I/O failed."""
    status = _c.SPW_ERR_IO


class NoDeviceError(SpillwayError, RuntimeError):
    """SPW_ERR_NO_DEVICE: no usable CUDA device."""
    status = _c.SPW_ERR_NO_DEVICE


class ConfigError(SpillwayError, ValueError):
    """SPW_ERR_CONFIG: a configuration value (the detail names it)."""
    status = _c.SPW_ERR_CONFIG


class BusyError(SpillwayError, RuntimeError):
    """SPW_ERR_BUSY: buffers are still locked."""
    status = _c.SPW_ERR_BUSY


class LockedError(SpillwayError, RuntimeError):
    """SPW_ERR_LOCKED: a locked buffer cannot be moved."""
    status = _c.SPW_ERR_LOCKED


class WouldDeadlockError(SpillwayError, RuntimeError):
    """SPW_ERR_WOULD_DEADLOCK: a waiting call from a callback."""
    status = _c.SPW_ERR_WOULD_DEADLOCK


class UnsupportedError(SpillwayError, NotImplementedError):
    """SPW_ERR_UNSUPPORTED: not supported by this backend or build."""
    status = _c.SPW_ERR_UNSUPPORTED


class NotReadyError(SpillwayError, RuntimeError):
    """SPW_ERR_NOT_READY: work has not completed yet."""
    status = _c.SPW_ERR_NOT_READY


class SystemError_(SpillwayError, OSError):
    """SPW_ERR_SYSTEM: an operating system call failed."""
    status = _c.SPW_ERR_SYSTEM


class InternalError(SpillwayError, RuntimeError):
    """SPW_ERR_INTERNAL: a bug in Spillway."""
    status = _c.SPW_ERR_INTERNAL


class WrongDeviceError(SpillwayError, ValueError):
    """SPW_ERR_WRONG_DEVICE: a stream of another device (the detail names both)."""
    status = _c.SPW_ERR_WRONG_DEVICE


# The names Python shows are spillway.X; IOError and SystemError keep their status names
# though the package exports them with a trailing underscore (the built-ins' names).
IOError_.__name__ = IOError_.__qualname__ = "IOError"
SystemError_.__name__ = SystemError_.__qualname__ = "SystemError"

_BY_STATUS: Dict[int, Type[SpillwayError]] = {cls.status: cls for cls in (
    InvalidArgumentError, InvalidHandleError, FreedError, NotLockedError, InvalidStreamError,
    OutOfMemoryError, HostOutOfMemoryError, DiskFullError, CudaError, IOError_, NoDeviceError,
    ConfigError, BusyError, LockedError, WouldDeadlockError, UnsupportedError, NotReadyError,
    SystemError_, InternalError, WrongDeviceError)}


def error_class(status: int) -> Type[SpillwayError]:
    """The exception class of a status code (SpillwayError for unknown codes)."""
    return _BY_STATUS.get(status, SpillwayError)


for _type in (SpillwayError, *_BY_STATUS.values()):
    _type.__module__ = "spillway"

_c._set_errors(SpillwayError, _BY_STATUS)


def _library_oom_class(base: type, name: str, module: str, doc: str) -> Any:
    """A class both OutOfMemoryError and `base`, another library's out-of-memory error (what
    that library's code catches). Its __init__ calls BaseException's alone: the cooperative
    chain would reach `base`'s own __init__, whose arguments differ (CuPy's takes (size,
    total, limit)). ``Cls(message, status, detail, size)``; it pickles by those."""

    def __init__(self: Any, message: str, status: int = _c.SPW_ERR_OUT_OF_MEMORY,
                 detail: str = "", size: int = 0) -> None:
        BaseException.__init__(self, message)
        self.status = status
        self.detail = detail
        self.msg = message
        self._size, self._total, self._limit = size, 0, 0  # the fields CuPy's class keeps

    def __str__(self: Any) -> str:
        return self.msg

    def __reduce__(self: Any) -> Any:
        return (type(self), (self.msg, self.status, self.detail, self._size))

    return type(name, (OutOfMemoryError, base), {
        "__init__": __init__, "__str__": __str__, "__reduce__": __reduce__, "__doc__": doc,
        "__module__": module, "__qualname__": name})
