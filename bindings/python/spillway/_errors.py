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

from . import _spillway as _c

__all__ = [
    "SpillwayError", "InvalidArgumentError", "InvalidHandleError", "FreedError",
    "NotLockedError", "InvalidStreamError", "OutOfMemoryError", "HostOutOfMemoryError",
    "DiskFullError", "CudaError", "IOError_", "NoDeviceError", "ConfigError", "BusyError",
    "LockedError", "WouldDeadlockError", "UnsupportedError", "NotReadyError", "SystemError_",
    "InternalError", "error_class",
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


def _make(name: str, status: int, *bases: type, doc: str) -> type:
    return type(name, (SpillwayError, *bases), {"status": status, "__doc__": doc,
                                                "__module__": "spillway"})


InvalidArgumentError = _make("InvalidArgumentError", _c.SPW_ERR_INVALID_ARG, ValueError,
                             doc="SPW_ERR_INVALID_ARG (also a ValueError).")
InvalidHandleError = _make("InvalidHandleError", _c.SPW_ERR_INVALID_HANDLE, ValueError,
                           doc="SPW_ERR_INVALID_HANDLE: not a handle of this runtime.")
FreedError = _make("FreedError", _c.SPW_ERR_FREED, ValueError,
                   doc="SPW_ERR_FREED: the buffer was freed.")
NotLockedError = _make("NotLockedError", _c.SPW_ERR_NOT_LOCKED, RuntimeError,
                       doc="SPW_ERR_NOT_LOCKED: the stream holds no lock on the buffer.")
InvalidStreamError = _make("InvalidStreamError", _c.SPW_ERR_INVALID_STREAM, ValueError,
                           doc="SPW_ERR_INVALID_STREAM: unknown or destroyed stream.")
OutOfMemoryError = _make("OutOfMemoryError", _c.SPW_ERR_OUT_OF_MEMORY, MemoryError,
                         doc="SPW_ERR_OUT_OF_MEMORY: what remains on the device is locked "
                             "(also a MemoryError).")
HostOutOfMemoryError = _make("HostOutOfMemoryError", _c.SPW_ERR_HOST_OUT_OF_MEMORY,
                             MemoryError, doc="SPW_ERR_HOST_OUT_OF_MEMORY (also a MemoryError).")
DiskFullError = _make("DiskFullError", _c.SPW_ERR_DISK_FULL, OSError,
                      doc="SPW_ERR_DISK_FULL: the spill file reached its limit or ENOSPC.")
CudaError = _make("CudaError", _c.SPW_ERR_CUDA, RuntimeError,
                  doc="SPW_ERR_CUDA: a CUDA call failed (the detail names it).")
IOError_ = _make("IOError", _c.SPW_ERR_IO, OSError, doc="SPW_ERR_IO: spill file I/O failed.")
NoDeviceError = _make("NoDeviceError", _c.SPW_ERR_NO_DEVICE, RuntimeError,
                      doc="SPW_ERR_NO_DEVICE: no usable CUDA device.")
ConfigError = _make("ConfigError", _c.SPW_ERR_CONFIG, ValueError,
                    doc="SPW_ERR_CONFIG: a configuration value (the detail names it).")
BusyError = _make("BusyError", _c.SPW_ERR_BUSY, RuntimeError,
                  doc="SPW_ERR_BUSY: buffers are still locked.")
LockedError = _make("LockedError", _c.SPW_ERR_LOCKED, RuntimeError,
                    doc="SPW_ERR_LOCKED: a locked buffer cannot be moved.")
WouldDeadlockError = _make("WouldDeadlockError", _c.SPW_ERR_WOULD_DEADLOCK, RuntimeError,
                           doc="SPW_ERR_WOULD_DEADLOCK: a waiting call from a callback.")
UnsupportedError = _make("UnsupportedError", _c.SPW_ERR_UNSUPPORTED, NotImplementedError,
                         doc="SPW_ERR_UNSUPPORTED: not supported by this backend or build.")
NotReadyError = _make("NotReadyError", _c.SPW_ERR_NOT_READY, RuntimeError,
                      doc="SPW_ERR_NOT_READY: work has not completed yet.")
SystemError_ = _make("SystemError", _c.SPW_ERR_SYSTEM, OSError,
                     doc="SPW_ERR_SYSTEM: an operating system call failed.")
InternalError = _make("InternalError", _c.SPW_ERR_INTERNAL, RuntimeError,
                      doc="SPW_ERR_INTERNAL: a bug in Spillway.")

_BY_STATUS = {cls.status: cls for cls in (
    InvalidArgumentError, InvalidHandleError, FreedError, NotLockedError, InvalidStreamError,
    OutOfMemoryError, HostOutOfMemoryError, DiskFullError, CudaError, IOError_, NoDeviceError,
    ConfigError, BusyError, LockedError, WouldDeadlockError, UnsupportedError, NotReadyError,
    SystemError_, InternalError)}


def error_class(status: int) -> type:
    """The exception class of a status code (SpillwayError for unknown codes)."""
    return _BY_STATUS.get(status, SpillwayError)


_c._set_errors(SpillwayError, _BY_STATUS)
