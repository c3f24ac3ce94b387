# SPDX-License-Identifier: Apache-2.0
"""The Runtime (one Spillway runtime for one device), its streams, and typed statistics.

The methods that do the work (alloc, acquire, release, synchronize, ...) are implemented
in C (``spillway._spillway.RuntimeBase`` and ``spillway.Buffer``); this module gives them
their Pythonic surface: keyword configuration, enums, a context manager, typed stats.
"""
from __future__ import annotations

import inspect
import os
import threading
from typing import Iterable, Optional, Union

from . import _spillway as _c
from ._errors import error_class
from ._types import Backend, Buffer, State, Stats, StreamLike, Tier
from .controller import Controller, _install, _installed

__all__ = ["Runtime", "Stream", "parse_size", "Backend", "Buffer", "State", "Stats",
           "StreamLike", "Tier"]

#: Bytes from None (0, unset), an int in [0, 2**64-1] or a string in the SPILLWAY_* size
#: syntax ("1.5GiB", "512 k"): spw_parse_size itself. ConfigError (a ValueError) for a
#: value out of range or a string it rejects, TypeError for another type.
parse_size = _c.parse_size


class Stream:
    """A stream created by a Runtime (``Runtime.stream()``): a non-blocking CUDA stream, or a
    worker thread on the host backend. Accepted wherever a stream is (it speaks the CUDA
    stream protocol, ``__cuda_stream__``); ``int(stream)`` is its handle."""

    __slots__ = ("_runtime", "_handle", "__weakref__")

    def __init__(self, runtime: "Runtime", handle: int) -> None:
        self._runtime = runtime
        self._handle = handle

    @property
    def handle(self) -> int:
        return self._handle

    def __int__(self) -> int:
        return self._handle

    __index__ = __int__

    def __cuda_stream__(self) -> tuple:
        return (0, self._handle)

    def synchronize(self) -> None:
        """Waits for the stream's work and releases every lock it holds (syncAndUnlock)."""
        self._runtime.synchronize(self._handle)

    def release_async(self) -> None:
        """Releases every lock the stream holds once its work so far completes."""
        self._runtime.release_async(self._handle)

    def wait(self) -> None:
        """Waits for the stream's work so far, leaving its locks alone (GIL released)."""
        self._runtime.wait_stream(self._handle)

    def close(self) -> None:
        """Synchronizes the stream, releases its locks and destroys it (idempotent)."""
        if self._handle is not None and self._runtime._forget_stream(self):
            self._runtime._destroy_stream(self._handle)

    def __enter__(self) -> "Stream":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<spillway.Stream 0x{self._handle:x}>"


class Runtime(_c.RuntimeBase):
    """One Spillway runtime: a device budget, buffers, streams and a spill engine.

    Keyword arguments set ``spw_config_t`` fields; one left out (or None) takes its
    ``SPILLWAY_*`` environment variable, else the default (docs/config.md). Sizes are ints
    or strings such as ``"4GiB"``. ``backend`` is ``"auto"``, ``"cuda"`` or ``"host"``;
    ``io`` is ``"auto"``, ``"uring"`` or ``"posix"``; ``log_level`` one of ``"off"``,
    ``"error"``, ``"warn"``, ``"info"``, ``"debug"``. ``ignore_env=True`` ignores every
    ``SPILLWAY_*`` variable. ``trace`` is a path for a Chrome trace-event file of the spill
    engine's work (SPILLWAY_TRACE; ``python -m spillway.plot`` draws it), ``trace_max`` its
    size cap (SPILLWAY_TRACE_MAX). ``stable_addresses=True`` makes every allocation
    address-stable unless it passes ``stable=False`` (SPILLWAY_STABLE_ADDRESSES; default
    off; docs/python.md "Address-stable arrays"). ``ipc=True`` takes device memory from
    regions CUDA IPC can export (SPILLWAY_IPC; default off; :meth:`ipc_export`).

    Use it as a context manager, or call :meth:`close`. Every method is thread-safe except
    :meth:`close`; calls that can wait release the GIL.
    """

    #: True for a device's shared runtime (spillway.process), which only reset() closes.
    _shared: bool = False

    def __init__(self, *, device: Optional[int] = None, backend: Optional[str] = None,
                 device_limit: Union[int, str, None] = None,
                 host_limit: Union[int, str, None] = None,
                 disk_limit: Union[int, str, None] = None, spill_dir: Optional[str] = None,
                 io: Optional[str] = None, high_watermark: Optional[float] = None,
                 low_watermark: Optional[float] = None, log_level: Optional[str] = None,
                 host_device_bytes: Union[int, str, None] = None,
                 ignore_env: bool = False, trace: Optional[str] = None,
                 trace_max: Union[int, str, None] = None,
                 stable_addresses: Optional[bool] = None,
                 ipc: Optional[bool] = None) -> None:
        # Handles of the streams this runtime created and not yet destroyed (ints, not the
        # Stream objects: a Stream refers to its runtime, and a cycle would keep a dropped
        # runtime alive until the cyclic collector runs).
        self._streams_lock = threading.Lock()
        self._streams: set = set()
        # Every parameter is a configuration field, handed to C by name (CONFIG_FIELDS).
        config = {name: value for name, value in locals().items() if name in _CONFIG}
        super().__init__(**config)
        # The ordinal as C resolved it (0 means unset there): what DLPack names as the
        # device. The variable was validated by the creation that just succeeded.
        env = "" if ignore_env else os.environ.get("SPILLWAY_DEVICE", "")
        self._device = device or int(env or 0)

    # -- properties ------------------------------------------------------------------
    @property
    def backend(self) -> Backend:
        return Backend(self._backend)

    @property
    def device(self) -> int:
        """The CUDA device ordinal (0 on the host backend unless one was configured)."""
        return self._device

    @property
    def device_limit(self) -> int:
        return self.limits()[0]

    @property
    def host_limit(self) -> int:
        return self.limits()[1]

    @property
    def disk_limit(self) -> int:
        """0 means no limit beyond the file system's free space."""
        return self.limits()[2]

    @property
    def stable_granularity(self) -> int:
        """Bytes to which an address-stable buffer's reserved range is rounded (2 MiB on
        current GPUs, 64 KiB on the host backend); UnsupportedError where the device or
        driver has no virtual memory management."""
        return self._stable_granularity()

    # -- streams ---------------------------------------------------------------------
    def stream(self) -> Stream:
        """Creates a stream owned by this runtime (destroyed by its close() or with the
        runtime)."""
        s = Stream(self, self._create_stream())
        with self._streams_lock:
            self._streams.add(s._handle)
        return s

    def _forget_stream(self, s: Stream) -> bool:
        with self._streams_lock:
            if s._handle not in self._streams:
                return False
            self._streams.discard(s._handle)
            return True

    # -- buffers ---------------------------------------------------------------------
    # alloc(nbytes, stream=None, stable=None, owner=None) -> Buffer, acquire_n, release_n_async,
    # synchronize, release_async, wait_idle, register_stream, unregister_stream, and the
    # owners' name_owner(owner, name) and owner_stats(owner) -> dict: implemented in C.

    def spill(self, buffers: Union[Buffer, Iterable[Buffer]], tier: Tier = Tier.HOST) -> None:
        """Asks the engine to move unlocked buffers down to `tier`, as one batch. Returns at
        once; wait_idle() waits for the moves. One buffer is `buffer.spill(tier)` (a locked
        one is LockedError; a batch skips it), after the same check of its runtime."""
        if isinstance(buffers, Buffer):
            self._own(buffers).spill(tier)
        else:
            self.spill_n(list(buffers), tier)

    def prefetch(self, buffers: Union[Buffer, Iterable[Buffer]],
                 stream: StreamLike = None) -> None:
        """Starts bringing buffers back to the device, as one batch, without locking them."""
        if isinstance(buffers, Buffer):
            self._own(buffers).prefetch(stream)
        else:
            self.prefetch_n(list(buffers), stream)

    def _own(self, b: Buffer) -> Buffer:
        """`b` if it is this runtime's; else the InvalidHandleError that the list forms
        raise (C's spwpy_buffer_handle), so that both forms refuse it alike."""
        if b.runtime is not self:
            st = _c.SPW_ERR_INVALID_HANDLE
            detail = "the buffer belongs to another runtime"
            raise error_class(st)(f"{_c.err_name(st)}: {_c.strerror(st)} ({detail})", st,
                                  detail)
        return b

    # -- the peer tier ----------------------------------------------------------------
    def host_reserve(self, nbytes: int) -> None:
        """Pins `nbytes` of host memory for spilled buffers now and keeps at least that much
        pinned (``spw_host_reserve``): the pinned memory otherwise grows a slab at a time as
        spills need it, about a third of a second per GiB paid while transfers run. A later
        call replaces the reservation; 0 drops it. Blocks while it pins (GIL released).
        ``stats().host_pinned_bytes`` shows what is pinned.

        Errors: TypeError (`nbytes` not an int); InvalidArgumentError (a closed runtime,
        `nbytes` negative or above 2**64-1); HostOutOfMemoryError (above the host limit:
        nothing changes); SystemError_ / CudaError (the memory could not be pinned: what
        was pinned before stays reserved); WouldDeadlockError (from a controller method)."""
        super().host_reserve(nbytes)

    def peer_lend(self, borrower: _c.RuntimeBase, nbytes: int) -> None:
        """Lends `nbytes` of this runtime's device memory to `borrower` as its peer tier
        (``spw_peer_lend``): the borrower spills there first (``State.PEER``, ``Tier.PEER``)
        and falls back to host memory when it is full. The bytes count against this
        runtime's device limit (its unlocked buffers may be spilled to make room; the GIL is
        released meanwhile). Until the memory is reclaimed, or the borrower is destroyed,
        the borrower holds a strong reference to this runtime, so that garbage collection
        can never destroy a lender before its borrower gives the memory back. Closing this
        runtime first is fine: its close takes the memory back (the borrower's buffers move
        on to its host memory or disk).

        Errors: TypeError (`borrower` is not a Runtime, `nbytes` not an int);
        InvalidArgumentError (a closed runtime, `borrower` is this runtime, the two run on
        different backends, `nbytes` under 1 MiB or over this runtime's device limit);
        BusyError (`borrower` already has a lender, or lends to this runtime);
        UnsupportedError (no peer access between the devices); OutOfMemoryError (no such
        room here); WouldDeadlockError (from a controller method)."""
        super().peer_lend(borrower, nbytes)

    def peer_reclaim(self, borrower: _c.RuntimeBase) -> None:
        """Takes back what this runtime lent to `borrower` (``spw_peer_reclaim``): the
        borrower's buffers in it move on to its host memory (or disk when that is full),
        intact, then the memory returns to this runtime's budget. Blocks until done (GIL
        released). Drops the borrower's reference to this runtime.

        Errors: TypeError (`borrower` is not a Runtime); InvalidArgumentError (a closed
        runtime, `borrower` is this runtime, nothing is lent to it);
        HostOutOfMemoryError, DiskFullError, IOError_ or BusyError when buffers could not
        move on (the memory then stays lent, the buffers intact in it: call again once
        there is room); WouldDeadlockError (from a controller method)."""
        super().peer_reclaim(borrower)

    # -- sharing memory with other processes -------------------------------------------
    def ipc_export(self, ptr: int, nbytes: int) -> bytes:
        """Exports the device memory ``[ptr, ptr + nbytes)`` of this runtime
        (``spw_ipc_export_ptr``): bytes that :meth:`ipc_open` in another process turns into
        a pointer to the same memory. The runtime must have been created with ``ipc=True``;
        the memory must stay locked here (an acquired buffer, or memory lent to a library)
        for as long as another process has it open.

        Errors: TypeError (not ints); InvalidArgumentError (a closed runtime, a range outside
        this runtime's IPC memory); UnsupportedError (``ipc`` off)."""
        return super().ipc_export(ptr, nbytes)

    def ipc_open(self, handle: bytes) -> int:
        """Opens what :meth:`ipc_export` gave in another process (``spw_ipc_open``) and
        returns a device pointer to that memory, on this runtime's device. The memory is the
        exporter's: it does not count here and never spills. Close it with
        :meth:`ipc_close` before the exporter lets it go.

        Errors: TypeError (not bytes); ValueError (the wrong length); InvalidArgumentError
        (a handle of the other backend, or forged); UnsupportedError (a handle of this
        process); CudaError (the exporter or its memory is gone)."""
        return super().ipc_open(handle)

    def ipc_close(self, ptr: int) -> None:
        """Closes a pointer :meth:`ipc_open` returned (``spw_ipc_close``).

        Errors: InvalidArgumentError (not such a pointer, or closed already)."""
        super().ipc_close(ptr)

    def stats(self) -> Stats:
        return Stats(*self._stats())

    def async_error(self) -> Optional[Exception]:
        """The first error of background work since the last call (cleared), as an
        exception instance, or None."""
        st = self._async_error()
        if st == 0:
            return None
        cls = error_class(st)
        return cls(f"{_c.err_name(st)}: {_c.strerror(st)} (background work)", st,
                   "background work")

    # -- controller ------------------------------------------------------------------
    def set_controller(self, controller: Optional[Controller]) -> None:
        """Installs a :class:`spillway.Controller` (None removes it). Its methods are told
        of every allocation, free and move, and it chooses the victims when device memory is
        short; see spillway.controller for the rules."""
        _install(self, controller)

    @property
    def controller(self) -> Optional[Controller]:
        """The installed :class:`spillway.Controller`, or None."""
        return _installed(self)

    # -- lifetime --------------------------------------------------------------------
    def close(self) -> None:
        """Destroys the streams this runtime created (each is synchronized first, which
        releases its locks), synchronizes the default stream, then destroys the runtime
        with the GIL released. Raises BusyError (and destroys nothing more) if buffers are
        still locked on other streams, and RuntimeError for a device's shared runtime
        (spillway.process.reset closes those). Buffers of a closed runtime are dead.
        Idempotent."""
        if self.closed:
            return
        if self._shared:
            raise RuntimeError("this is a device's shared runtime (spillway.process): libraries "
                               "hold pointers into it; spillway.process.reset(device) closes it")
        with self._streams_lock:
            streams, self._streams = list(self._streams), set()
        for h in streams:
            self._destroy_stream(h)
        self.synchronize(None)
        super().close()

    def __enter__(self) -> "Runtime":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        if self.closed:
            return "<spillway.Runtime closed>"
        return f"<spillway.Runtime {self.backend.name.lower()}: {self.summary()}>"


# The keywords of Runtime(...) are the configuration fields the extension reads, no more.
_CONFIG = frozenset(_c.CONFIG_FIELDS)
if tuple(inspect.signature(Runtime.__init__).parameters)[1:] != _c.CONFIG_FIELDS:
    raise ImportError("spillway: Runtime's keywords differ from the extension's CONFIG_FIELDS "
                      "(rebuild the extension)")
