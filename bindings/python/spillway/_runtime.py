# SPDX-License-Identifier: Apache-2.0
"""The Runtime (one Spillway runtime for one device), its streams, and typed statistics.

The methods that do the work (alloc, acquire, release, synchronize, ...) are implemented
in C (``spillway._spillway.RuntimeBase`` and ``spillway.Buffer``); this module gives them
their Pythonic surface: keyword configuration, enums, a context manager, typed stats.
"""
from __future__ import annotations

import dataclasses
import enum
import re
import threading
from typing import Iterable, Optional, Union

from . import _spillway as _c
from ._errors import error_class

Buffer = _c.Buffer

#: Anything accepted where a stream is expected: ``None`` (the default stream), an integer
#: handle (``cudaStream_t``), or an object with ``__cuda_stream__`` (cuda.core, CuPy,
#: PyTorch), ``.cuda_stream`` (PyTorch), ``.ptr`` (CuPy) or ``.handle`` (Numba).
StreamLike = Union[None, int, object]


class Backend(enum.IntEnum):
    CUDA = _c.BACKEND_CUDA
    HOST = _c.BACKEND_HOST


class Tier(enum.IntEnum):
    DEVICE = 0
    HOST = 1
    DISK = 2


class State(enum.IntEnum):
    RESIDENT = 1
    SPILLING = 2
    HOST = 3
    DEMOTING = 4
    DISK = 5
    UNSPILLING = 6


_BACKENDS = {None: 0, "auto": 0, "cuda": 1, "host": 2}
_IO = {None: 0, "auto": 0, "uring": 1, "posix": 2}
_LOG = {None: 0, "off": 1, "error": 2, "warn": 3, "info": 4, "debug": 5}
_UNITS = {"": 0, "b": 0, "k": 10, "kb": 10, "kib": 10, "m": 20, "mb": 20, "mib": 20,
          "g": 30, "gb": 30, "gib": 30, "t": 40, "tb": 40, "tib": 40}
_SIZE = re.compile(r"^\s*(\d+)(?:\.(\d*))?\s*([a-zA-Z]*)\s*$")


def parse_size(value: Union[int, str, None]) -> int:
    """Bytes from an int or a size string with the SPILLWAY_* syntax (``"1.5GiB"``, ``"512M"``;
    every unit binary). None gives 0 (unset)."""
    if value is None:
        return 0
    if isinstance(value, bool):
        raise TypeError("a size must be an int or a string, not bool")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"a size cannot be negative: {value}")
        return value
    m = _SIZE.match(str(value))
    unit = m and m.group(3).lower()
    if not m or unit not in _UNITS or (_UNITS[unit] == 0 and (m.group(2) or "").strip("0")):
        raise ValueError(f"{value!r}: expected bytes, e.g. 4GiB, 512MiB or 1048576")
    frac = m.group(2) or ""
    mult = 1 << _UNITS[unit]
    return int(m.group(1)) * mult + (int(frac) * mult // 10 ** len(frac) if frac else 0)


def _keyword(table: dict, name: str, value: Optional[str]) -> int:
    key = value.lower() if isinstance(value, str) else value
    if key not in table:
        choices = ", ".join(repr(k) for k in table if k is not None)
        raise ValueError(f"{name}={value!r}: expected one of {choices}")
    return table[key]


@dataclasses.dataclass(frozen=True)
class Stats:
    """A snapshot of ``spw_get_stats`` (docs/api.md, Statistics). Counters are read without
    a lock, so the fields are not one atomic snapshot."""

    buffers: int
    device_bytes: int
    host_bytes: int
    disk_bytes: int
    locked_bytes: int
    device_limit: int
    host_pinned_bytes: int
    spills: int
    spill_bytes: int
    unspills: int
    unspill_bytes: int
    demotions: int
    demote_bytes: int
    disk_reads: int
    disk_read_bytes: int
    disk_writes: int
    disk_write_bytes: int
    spills_on_demand: int
    spills_background: int
    spills_abandoned: int
    clean_respills: int
    failures: int
    spill_ns: int
    unspill_ns: int
    demote_ns: int
    disk_read_ns: int
    disk_requests: int


assert tuple(f.name for f in dataclasses.fields(Stats)) == _c.STATS_FIELDS


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
    size cap (SPILLWAY_TRACE_MAX).

    Use it as a context manager, or call :meth:`close`. Every method is thread-safe except
    :meth:`close`; calls that can wait release the GIL.
    """

    def __init__(self, *, device: Optional[int] = None, backend: Optional[str] = None,
                 device_limit: Union[int, str, None] = None,
                 host_limit: Union[int, str, None] = None,
                 disk_limit: Union[int, str, None] = None, spill_dir: Optional[str] = None,
                 io: Optional[str] = None, high_watermark: Optional[float] = None,
                 low_watermark: Optional[float] = None, log_level: Optional[str] = None,
                 host_device_bytes: Union[int, str, None] = None,
                 ignore_env: bool = False, trace: Optional[str] = None,
                 trace_max: Union[int, str, None] = None) -> None:
        # Handles of the streams this runtime created and not yet destroyed (ints, not the
        # Stream objects: a Stream refers to its runtime, and a cycle would keep a dropped
        # runtime alive until the cyclic collector runs).
        self._streams_lock = threading.Lock()
        self._streams: set = set()
        super().__init__(int(device or 0), _keyword(_BACKENDS, "backend", backend),
                         parse_size(device_limit), parse_size(host_limit),
                         parse_size(disk_limit), None if spill_dir is None else str(spill_dir),
                         _keyword(_IO, "io", io), float(high_watermark or 0.0),
                         float(low_watermark or 0.0), _keyword(_LOG, "log_level", log_level),
                         parse_size(host_device_bytes), bool(ignore_env),
                         None if trace is None else str(trace), parse_size(trace_max))

    # -- properties ------------------------------------------------------------------
    @property
    def backend(self) -> Backend:
        return Backend(self._backend)

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
    # alloc(nbytes, stream=None) -> Buffer, acquire_n, release_n_async, synchronize,
    # release_async, wait_idle, register_stream, unregister_stream: implemented in C.

    def spill(self, buffers: Union[Buffer, Iterable[Buffer]], tier: Tier = Tier.HOST) -> None:
        """Asks the engine to move unlocked buffers down to `tier`, as one batch. Returns at
        once; wait_idle() waits for the moves."""
        if isinstance(buffers, Buffer):
            buffers.spill(int(tier))
        else:
            self.spill_n(list(buffers), int(tier))

    def prefetch(self, buffers: Union[Buffer, Iterable[Buffer]],
                 stream: StreamLike = None) -> None:
        """Starts bringing buffers back to the device, as one batch, without locking them."""
        if isinstance(buffers, Buffer):
            buffers.prefetch(stream)
        else:
            self.prefetch_n(list(buffers), stream)

    def stats(self) -> Stats:
        return Stats(*self._stats())

    def async_error(self) -> Optional[Exception]:
        """The first error of background work since the last call (cleared), as an
        exception instance, or None."""
        st = self._async_error()
        if st == 0:
            return None
        cls = error_class(st)
        return cls(f"{_c.err_name(st)}: {_c.strerror(st)} (background work)", st, "")

    # -- controller ------------------------------------------------------------------
    def set_controller(self, controller) -> None:
        """Installs a :class:`spillway.Controller` (None removes it). Its methods are told
        of every allocation, free and move, and it chooses the victims when device memory is
        short; see spillway.controller for the rules."""
        from .controller import _install
        _install(self, controller)

    @property
    def controller(self):
        """The installed :class:`spillway.Controller`, or None."""
        from .controller import _installed
        return _installed(self)

    # -- lifetime --------------------------------------------------------------------
    def close(self) -> None:
        """Destroys the streams this runtime created (each is synchronized first, which
        releases its locks), synchronizes the default stream, then destroys the runtime
        with the GIL released. Raises BusyError (and destroys nothing more) if buffers are
        still locked on other streams. Buffers of a closed runtime are dead. Idempotent."""
        if self.closed:
            return
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
