# SPDX-License-Identifier: Apache-2.0
"""DeferrableArray: an n-dimensional array (shape, dtype, strides) over one Spillway buffer.

The array is spillable whenever no one holds a lock on it. It never exposes a device
pointer outside a lock: kernels get it through the Numba launch extension
(``spillway.numba``), other code through :meth:`DeferrableArray.lend_pointer` (a view with
``__cuda_array_interface__`` that is valid until the ``with`` block exits). This module does
not need Numba, so everything but kernel launches works on the host backend.
"""
from __future__ import annotations

import contextlib
import operator
import weakref
from typing import Iterator, Optional, Sequence, Tuple, Union

import numpy as np

from . import _spillway as _c
from ._errors import InvalidArgumentError
from ._runtime import Backend, Buffer, Runtime, State, StreamLike, Tier

__all__ = ["DeferrableArray", "ReadOnly", "DeviceView", "lend"]


class _Layout:
    """Strides and contiguity, in the shape numba-cuda's launch path reads them."""

    __slots__ = ("strides_in_bytes", "is_contiguous_c", "is_contiguous_f",
                 "is_contiguous_any")

    def __init__(self, strides: Tuple[int, ...], c: bool, f: bool) -> None:
        self.strides_in_bytes = strides
        self.is_contiguous_c = c
        self.is_contiguous_f = f
        self.is_contiguous_any = c or f


#: The kinds of dtype a deferrable array holds: booleans, signed and unsigned integers,
#: floats and complex numbers, in native byte order (docs/python.md). Their bytes mean the
#: same wherever they are copied; an object array's bytes are PyObject pointers, which a
#: copy would hand back dangling, and structured, string and datetime dtypes are not what
#: a kernel takes.
_KINDS = "biufc"
_MAX_BYTES = (1 << 63) - 1  # the largest allocation Spillway's sizes (and NumPy's) can name


def _checked_dtype(dtype) -> np.dtype:
    dt = np.dtype(dtype)  # TypeError for what is not a dtype at all
    if dt.kind not in _KINDS or not dt.isnative or dt.fields is not None or dt.subdtype:
        raise TypeError(f"a DeferrableArray holds bool, integer, float or complex numbers in "
                        f"native byte order, not {dt!r}")
    return dt


def _normalize_shape(shape: Union[int, Sequence[int]]) -> Tuple[int, ...]:
    try:
        dims: Tuple[int, ...] = (operator.index(shape),)  # type: ignore[arg-type]
    except TypeError:
        if not isinstance(shape, (tuple, list)):
            raise TypeError(f"a shape is an int or a tuple of ints, not "
                            f"{type(shape).__name__}") from None
        dims = tuple(operator.index(n) for n in shape)
    if any(n < 0 for n in dims):
        raise ValueError(f"negative dimension in shape {dims}")
    return dims


def _nbytes(shape: Tuple[int, ...], itemsize: int) -> int:
    n = itemsize
    for d in shape:  # Python ints: a product that does not fit 64 bits is seen, not wrapped
        n *= d
    if n > _MAX_BYTES:
        st = _c.SPW_ERR_INVALID_ARG
        raise InvalidArgumentError(f"{_c.err_name(st)}: {_c.strerror(st)} (shape {shape} of "
                                   f"{itemsize}-byte items is {n} bytes)", st, "")
    return n


def _strides_for(shape: Tuple[int, ...], itemsize: int, order: str) -> Tuple[int, ...]:
    strides = [0] * len(shape)
    step = itemsize
    dims = range(len(shape) - 1, -1, -1) if order == "C" else range(len(shape))
    for i in dims:
        strides[i] = step
        step *= max(shape[i], 1)
    return tuple(strides)


_numba_types: dict = {}


def _numba_array_type(dtype: np.dtype, ndim: int, layout: str, readonly: bool):
    key = (dtype, ndim, layout, readonly)
    t = _numba_types.get(key)
    if t is None:
        from numba.cuda import types
        from numba.cuda.np.numpy_support import from_dtype
        t = types.Array(from_dtype(dtype), ndim, layout, readonly=readonly)
        _numba_types[key] = t
    return t


class DeferrableArray:
    """An array in a deferrable Spillway buffer (spilled to host or disk when unlocked).

    ``DeferrableArray(runtime, shape, dtype, order="C", stream=None, stable=None)``
    allocates it (contents undefined); :meth:`from_host` copies a NumPy array in.
    ``stable=True`` makes it address-stable (its device pointer is the same for its whole
    life, across spills; docs/python.md "Address-stable arrays"), ``False`` an ordinary
    array even on a runtime with ``stable_addresses=True``; None follows the runtime. Attributes follow
    NumPy / Numba device arrays: ``shape``, ``dtype``, ``strides``, ``ndim``, ``size``,
    ``nbytes``, ``itemsize``. The buffer is freed by :meth:`free` (or ``with``), or when the
    array is garbage-collected; a launch still using it keeps the memory until its lock
    goes.
    """

    # _numba_type_ is a slot filled on first use (by __getattr__): numba's dispatcher reads
    # it for every argument of every launch, and a slot is the cheapest attribute there is.
    __slots__ = ("_buffer", "shape", "dtype", "strides", "order", "_launch", "_readonly",
                 "_numba_type_", "__weakref__")

    def __init__(self, runtime: Runtime, shape: Union[int, Sequence[int]], dtype=np.float64,
                 order: str = "C", stream: StreamLike = None,
                 stable: Optional[bool] = None) -> None:
        if not isinstance(runtime, _c.RuntimeBase):
            raise TypeError(f"expected a spillway.Runtime, not {type(runtime).__name__}")
        dt = _checked_dtype(dtype)
        if order not in ("C", "F"):
            raise ValueError(f"order must be 'C' or 'F', not {order!r}")
        dims = _normalize_shape(shape)
        nbytes = _nbytes(dims, dt.itemsize)
        buf = runtime.alloc(max(nbytes, 1), stream, stable)
        self._setup(buf, dims, dt, order)

    def _setup(self, buf: Buffer, shape: Tuple[int, ...], dtype: np.dtype, order: str) -> None:
        self._buffer = buf
        self.shape = shape
        self.dtype = dtype
        self.order = order
        self.strides = _strides_for(shape, dtype.itemsize, order)
        c = order == "C" or len(shape) <= 1
        f = order == "F" or len(shape) <= 1
        size = 1
        for d in shape:
            size *= d
        # What the launch extension (C) reads for every launch, in one attribute.
        self._launch = (buf, shape, dtype, size, _Layout(self.strides, c, f), self.strides, buf)
        self._readonly: Optional[ReadOnly] = None

    @classmethod
    def from_host(cls, runtime: Runtime, ary, stream: StreamLike = None,
                  stable: Optional[bool] = None) -> "DeferrableArray":
        """A new deferrable array holding a copy of `ary` (anything np.asarray accepts that
        gives one of the accepted dtypes; TypeError otherwise); `stable` as for the
        constructor."""
        ary = np.asarray(ary)
        order = "F" if ary.flags.f_contiguous and not ary.flags.c_contiguous else "C"
        self = cls(runtime, ary.shape, ary.dtype, order=order, stream=stream, stable=stable)
        self.copy_from_host(ary, stream)
        return self

    # -- metadata -------------------------------------------------------------------
    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return self._launch[3]

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    @property
    def buffer(self) -> Buffer:
        return self._buffer

    @property
    def runtime(self) -> Runtime:
        return self._buffer.runtime

    @property
    def state(self) -> State:
        return State(self._buffer.state)

    @property
    def tier(self) -> Tier:
        return Tier(self._buffer.tier)

    @property
    def lock_count(self) -> int:
        return self._buffer.lock_count

    @property
    def is_stable(self) -> bool:
        """True if the array's device pointer is the same for its whole life."""
        return self._buffer.is_stable

    def __getattr__(self, name: str):
        if name == "_numba_type_":  # first use: numba is imported only now
            t = _numba_array_type(self.dtype, self.ndim, self.order, False)
            self._numba_type_ = t
            return t
        raise AttributeError(name)

    @property
    def read_only(self) -> "ReadOnly":
        """This array marked read-only for kernel launches: it is acquired with
        SPW_ACQUIRE_READ, so a clean host copy survives and re-spilling it moves no bytes;
        the kernel sees a read-only array type (writes fail to compile)."""
        if self._readonly is None:
            self._readonly = ReadOnly(self)
        return self._readonly

    # -- data -----------------------------------------------------------------------
    def copy_from_host(self, ary, stream: StreamLike = None) -> None:
        """Copies a host array of the same shape in; returns once the copy is done."""
        ary = np.asarray(ary, dtype=self.dtype)
        if ary.shape != self.shape:
            raise ValueError(f"shape {ary.shape} does not match {self.shape}")
        ary = np.ascontiguousarray(ary) if self.order == "C" else np.asfortranarray(ary)
        if self.nbytes == 0:
            return
        buf = self._buffer
        ptr = buf.acquire(stream)
        try:
            buf.runtime.memcpy(ptr, ary.ctypes.data, self.nbytes, stream, True)
        finally:
            buf.release(stream)  # the copy has completed

    def copy_to_host(self, ary: Optional[np.ndarray] = None,
                     stream: StreamLike = None) -> np.ndarray:
        """Copies the contents into `ary` (or a new array) and returns it once done. Reading
        does not dirty the buffer: a clean host copy is kept if it came back from host."""
        if ary is None:
            ary = np.empty(self.shape, self.dtype, order="F" if self.order == "F" else "C")
        elif not isinstance(ary, np.ndarray):
            raise TypeError(f"ary must be a numpy.ndarray, not {type(ary).__name__}")
        elif not ary.flags.writeable:
            raise ValueError("ary is read-only")
        elif (ary.shape != self.shape or ary.dtype != self.dtype or
              not (ary.flags.c_contiguous if self.order == "C" else ary.flags.f_contiguous)):
            raise ValueError("ary must match the array's shape, dtype and order")
        if self.nbytes == 0:
            return ary
        buf = self._buffer
        ptr = buf.acquire(stream, read=True)
        try:
            buf.runtime.memcpy(ary.ctypes.data, ptr, self.nbytes, stream, True)
        finally:
            buf.release(stream)
        return ary

    def spill(self, tier: Tier = Tier.HOST) -> None:
        """Asks the engine to move the (unlocked) array down to `tier`; returns at once."""
        self._buffer.spill(tier)

    def prefetch(self, stream: StreamLike = None) -> None:
        """Starts bringing the array back to the device without locking it."""
        self._buffer.prefetch(stream)

    @contextlib.contextmanager
    def lend_pointer(self, stream: StreamLike = None, read: bool = False
                     ) -> Iterator["DeviceView"]:
        """Locks the array on `stream` for the ``with`` block and yields a DeviceView with
        ``__cuda_array_interface__`` (for CuPy, PyTorch, ...). Work enqueued on `stream`
        inside the block may use it; the lock is released once the stream passes the end
        of the block. The view also speaks DLPack (``torch.from_dlpack(view)``,
        ``cupy.from_dlpack(view)``), see :class:`DeviceView`; after the block it refuses
        both protocols. ``spillway.numba.lend`` yields a Numba device array instead.
        ``lend`` is the same method."""
        buf = self._buffer
        ptr = buf.acquire(stream, read=read)
        view = DeviceView(self, ptr, stream, read)
        try:
            yield view
        finally:
            view._end()
            buf.release_async(stream)

    lend = lend_pointer

    # -- lifetime -------------------------------------------------------------------
    def free(self) -> None:
        """Frees the buffer now (idempotent); work still holding a lock keeps the memory
        until its lock goes."""
        self._buffer.free()

    close = free

    @property
    def closed(self) -> bool:
        return self._buffer.closed

    def __enter__(self) -> "DeferrableArray":
        return self

    def __exit__(self, *exc) -> None:
        self.free()

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d array")
        return self.shape[0]

    def __repr__(self) -> str:
        where = "freed" if self.closed else self.state.name.lower()
        return (f"<spillway.DeferrableArray shape={self.shape} dtype={self.dtype} "
                f"order={self.order} {where}>")


class ReadOnly:
    """A deferrable array passed to a kernel for reading only (``arr.read_only``).

    The array caches its marker, so the marker refers to the array weakly: references both
    ways would make a cycle, and an array in a cycle (its buffer with it) outlives its last
    user until Python's cyclic collector happens to run, which in an idle Dask worker can be
    minutes (issue 17). A launch needs only ``_launch``, which holds the buffer."""

    __slots__ = ("_array", "_order", "_launch", "_numba_type_")

    def __init__(self, array: DeferrableArray) -> None:
        self._array = weakref.ref(array)
        self._order = array.order
        self._launch = array._launch

    @property
    def array(self) -> Optional[DeferrableArray]:
        """The array marked; None once it is gone (only the marker was kept)."""
        return self._array()

    def __getattr__(self, name: str):
        if name == "_numba_type_":
            launch = self._launch  # (buffer, shape, dtype, ...)
            t = _numba_array_type(launch[2], len(launch[1]), self._order, True)
            self._numba_type_ = t
            return t
        raise AttributeError(name)

    def __repr__(self) -> str:
        return f"<read-only {self.array!r}>"


#: DLPack's codes (DLDataTypeCode) for the NumPy kinds a deferrable array holds.
_DLPACK_CODES = {"i": 0, "u": 1, "f": 2, "c": 5, "b": 6}
_KDLCPU, _KDLCUDA = 1, 2


class DeviceView:
    """A locked deferrable array, valid inside its lend's block only (``lend_pointer``,
    ``spillway.lend``). Consumers read it through ``__cuda_array_interface__`` (Numba,
    CuPy, PyTorch) or the DLPack protocol (``torch.from_dlpack``, ``cupy.from_dlpack``,
    ``numpy.from_dlpack`` on the host backend). Once the block has ended, each of them
    raises BufferError: the lock is gone, and the array may be spilled or moved."""

    __slots__ = ("array", "ptr", "stream", "readonly", "_live")

    def __init__(self, array: DeferrableArray, ptr: int, stream: StreamLike,
                 readonly: bool) -> None:
        self.array = array
        self.ptr = ptr
        self.stream = _c.stream_handle(stream)
        self.readonly = readonly
        self._live = True

    @property
    def live(self) -> bool:
        """True until the lend's block ends."""
        return self._live

    def _check_live(self) -> None:
        if not self._live:
            raise BufferError("the lend of this array has ended: its lock is released and "
                              "it may be spilled or moved; lend it again")

    @property
    def __cuda_array_interface__(self) -> dict:
        self._check_live()
        a = self.array
        # Version 3: the consumer orders its work after `stream`; 0 is not allowed there
        # and the default stream is the legacy one (1).
        return {"shape": a.shape, "typestr": a.dtype.str, "data": (self.ptr, self.readonly),
                "strides": a.strides, "version": 3, "stream": self.stream or 1}

    def __dlpack_device__(self) -> Tuple[int, int]:
        """(kDLCUDA, device) on the CUDA backend; (kDLCPU, 0) on the host backend, whose
        device memory is host memory."""
        self._check_live()
        rt = self.array.runtime
        if rt.backend == Backend.CUDA:
            return (_KDLCUDA, rt.device)
        return (_KDLCPU, 0)

    def __dlpack__(self, *, stream: Optional[int] = None,
                   max_version: Optional[Tuple[int, int]] = None,
                   dl_device: Optional[Tuple[int, int]] = None,
                   copy: Optional[bool] = None) -> object:
        """A DLPack capsule of the locked array, zero-copy (the DLPack protocol, as the
        Python array API specifies it). `stream` is the consumer's: on CUDA None or 1 is
        the legacy default stream, 2 the per-thread default stream, another int a
        cudaStream_t, -1 no ordering; 0 is refused (ambiguous). Unless it is the lend's own
        stream (or -1), the consumer's stream is made to wait for the work queued on the
        lend's stream so far (a CUDA event; the host does not wait). On the host backend
        `stream` must be None, and the call waits for the lend's stream (its streams are
        threads). `max_version` (major, minor) with major >= 1
        gives a versioned capsule (DLManagedTensorVersioned, read-only flag set for a
        read-only lend), else the legacy one. `dl_device` other than __dlpack_device__()
        and ``copy=True`` raise BufferError (no copies are made here). The capsule holds no
        lock: its memory is valid until the lend's block ends, whatever the consumer
        does with it after that (docs/python.md)."""
        self._check_live()
        dev = self.__dlpack_device__()
        if copy:
            raise BufferError("a lent deferrable array is exported without copying; "
                              "copy=True is not supported")
        if dl_device is not None and tuple(dl_device) != dev:
            raise BufferError(f"the array is on DLPack device {dev}, not {tuple(dl_device)}")
        versioned = False
        if max_version is not None:
            if (not isinstance(max_version, tuple) or len(max_version) != 2 or
                    not all(isinstance(v, int) and not isinstance(v, bool)
                            for v in max_version)):
                raise TypeError(f"max_version must be a (major, minor) tuple of ints, not "
                                f"{max_version!r}")
            versioned = max_version[0] >= 1
        mine = self.stream or 1  # the lend's stream; 0 (default) is the legacy one
        if stream is not None:
            if isinstance(stream, bool):
                raise TypeError("stream must be an int or None, not bool")
            stream = operator.index(stream)  # TypeError for what is not an int
        rt = self.array.runtime
        if dev[0] == _KDLCPU:
            if stream is not None:
                raise BufferError("stream must be None for a host (kDLCPU) array")
            rt._order_streams(None, self.stream or None, dev[1])  # waits: streams are threads
        elif stream == 0:
            raise BufferError("stream 0 is ambiguous in DLPack: pass 1 (legacy default) or "
                              "2 (per-thread default)")
        elif stream != -1 and (1 if stream is None else stream) != mine:
            rt._order_streams(1 if stream is None else stream, mine, dev[1])
        a = self.array
        item = a.dtype.itemsize
        return _c._dlpack_capsule(self.ptr, a.shape, tuple(st // item for st in a.strides),
                                  _DLPACK_CODES[a.dtype.kind], item * 8, dev[0], dev[1],
                                  self.readonly, versioned)

    def _end(self) -> None:
        self._live = False


def lend(arr: DeferrableArray, stream: StreamLike = None,
         read: bool = False) -> "contextlib.AbstractContextManager[DeviceView]":
    """``with spillway.lend(arr, stream) as view:``: `arr` locked on `stream` for the block,
    as a :class:`DeviceView` that CuPy, PyTorch and Numba read through
    ``__cuda_array_interface__`` or DLPack. TypeError for what is not a DeferrableArray."""
    if not isinstance(arr, DeferrableArray):
        raise TypeError(f"expected a spillway.DeferrableArray, not {type(arr).__name__}")
    return arr.lend_pointer(stream, read)
