# SPDX-License-Identifier: Apache-2.0
"""spillway.Controller: RMMEP-1's central controller, in Python.

Subclass :class:`Controller`, override what you need, and install it on a runtime::

    class Quiet(spillway.Controller):
        def allocated(self, handle, nbytes): ...
        def freed(self, handle, nbytes): ...
        def state_changed(self, event): ...          # a StateEvent
        def pressure(self, nbytes_needed, max_victims):
            return [...]                             # handles (or Buffers) to spill first

    rt.set_controller(Quiet())

Where the methods run, and the rules that keep them safe (docs/python.md, "The controller"):

* ``pressure`` runs on the thread that needs device memory (an allocation, an acquire, a
  prefetch, the engine), which holds no Spillway lock, and takes the GIL there. It answers
  with victims; locked or missing ones are skipped and least-recently-used buffers make up
  the rest. Nested in another controller method on the same thread (a method that
  allocates), it is not called: least recently used decides.
* ``allocated``, ``freed`` and ``state_changed`` are queued by Spillway's threads without the
  GIL and delivered in order by one thread of the runtime ("spillway-controller"), shortly
  after the event. So the engine never waits for Python, and a buffer freed by the garbage
  collector in the middle of your code never re-enters your controller on that thread.
* Every method runs as a callback: it may spill, prefetch, query and read statistics
  (:meth:`Controller.spill`, :meth:`~Controller.prefetch`, :meth:`~Controller.info`,
  :meth:`~Controller.stats`), and allocate; a call that would wait on the runtime
  (``wait_idle``, ``synchronize``, ``close``, acquiring a buffer that is not on the device,
  :func:`flush`) raises :class:`spillway.WouldDeadlockError` instead of waiting.
* An exception raised by a method is logged on the ``spillway.controller`` logger once per
  (method, exception type) and counted in :attr:`Controller.errors`; the engine goes on.
* Replacing the controller (``rt.set_controller(other)``, also from inside a method) takes
  effect for the events queued after the call; a method already running finishes on the old
  controller. ``rt.set_controller(None)`` removes it.
* At interpreter exit (``atexit``) no method is called any more: a pressure call that is
  running is waited for (up to 5 s), later ones get least recently used, and the delivery
  threads stop, so no thread takes the GIL while the interpreter finalizes.
"""
from __future__ import annotations

import atexit
import collections
import functools
import logging
import threading
import weakref
from typing import (TYPE_CHECKING, Any, Dict, Iterable, List, NamedTuple, Optional, Tuple, Type,
                    Union)

from . import _spillway as _c
from ._errors import SpillwayError, WouldDeadlockError, error_class
from ._types import Buffer, State, Stats, StreamLike, Tier

if TYPE_CHECKING:  # for annotations only: spillway._runtime imports this module
    from ._runtime import Runtime

__all__ = ["Controller", "StateEvent", "HandleInfo", "flush"]

log = logging.getLogger("spillway.controller")

_EV_ALLOCATED, _EV_FREED, _EV_STATE, _EV_MARK = 0, 1, 2, 3
_SHUTDOWN_WAIT_S = 5.0


class StateEvent(NamedTuple):
    """A buffer moved (``spw_state_event_t``): from ``source`` to ``target`` state, or, when
    ``status`` is not 0, a move that failed (``source == target``, the buffer stayed)."""

    handle: int
    source: State
    target: State
    nbytes: int        # bytes moved (0 for a clean re-spill)
    duration_ns: int
    status: int        # 0, or the negative spw_status_t of the failure

    @property
    def ok(self) -> bool:
        return self.status == 0

    @property
    def error(self) -> Optional[Type[SpillwayError]]:
        """The exception class of a failed move (e.g. LockedError for a buffer of a batch
        spill that was locked again), or None."""
        return None if self.status == 0 else error_class(self.status)


class HandleInfo(NamedTuple):
    state: State
    tier: Tier
    lock_count: int
    nbytes: int


def _handle_of(v: Any) -> int:
    """The handle of a buffer named by its handle (an int), a Buffer, or a DeferrableArray
    (anything with a ``buffer`` that is a Buffer). TypeError for anything else."""
    if isinstance(v, int) and not isinstance(v, bool):
        return v
    if isinstance(v, Buffer):
        return v.handle
    buf = getattr(v, "buffer", None)  # DeferrableArray
    if isinstance(buf, Buffer):
        return buf.handle
    raise TypeError(f"expected a buffer handle (int), a spillway.Buffer or a DeferrableArray, "
                    f"not {type(v).__name__}")


class Controller:
    """Base class of a Python controller: every method is optional (the defaults do nothing
    and are not even called). See the module's documentation for where they run."""

    _spw_runtime: Optional["weakref.ref[Runtime]"] = None

    # -- what a controller overrides --------------------------------------------------
    def allocated(self, handle: int, nbytes: int) -> None:
        """A buffer was allocated (delivery thread)."""

    def freed(self, handle: int, nbytes: int) -> None:
        """A buffer was freed: its handle is dead (delivery thread)."""

    def state_changed(self, event: StateEvent) -> None:
        """A buffer moved between tiers, or a move failed (delivery thread)."""

    def pressure(self, nbytes_needed: int, max_victims: int) -> Iterable[Any]:
        """Device memory is short by `nbytes_needed`: return up to `max_victims` buffers
        (handles, Buffers or DeferrableArrays) to spill first (the thread that needs room)."""
        return ()

    # -- what it may call -------------------------------------------------------------
    @property
    def runtime(self) -> Runtime:
        """The runtime this controller is installed on."""
        rt = self._spw_runtime() if self._spw_runtime is not None else None
        if rt is None:
            raise RuntimeError("this controller is not installed on a live runtime")
        return rt

    def spill(self, handles: Union[Any, Iterable[Any]], tier: Tier = Tier.HOST) -> None:
        """Asks the engine to move unlocked buffers down to `tier` (one batch); never waits."""
        hs = [_handle_of(handles)] if not _iterable(handles) else [_handle_of(h) for h in handles]
        self.runtime._spill_handles(hs, int(tier))

    def prefetch(self, handles: Union[Any, Iterable[Any]], stream: StreamLike = None) -> None:
        """Starts bringing buffers back to the device (one batch); never waits."""
        hs = [_handle_of(handles)] if not _iterable(handles) else [_handle_of(h) for h in handles]
        self.runtime._prefetch_handles(hs, stream)

    def info(self, handle: Any) -> HandleInfo:
        """State, tier, locks and size of a live buffer (FreedError once it is freed)."""
        st, tier, locks, n = self.runtime._handle_info(_handle_of(handle))
        return HandleInfo(State(st), Tier(tier), locks, n)

    def stats(self) -> Stats:
        return Stats(*self.runtime._stats())

    @property
    def errors(self) -> Dict[Tuple[str, str], int]:
        """How many times each method raised each exception type."""
        return dict(self.__dict__.get("_spw_errors", {}))


def _iterable(v: Any) -> bool:
    return not isinstance(v, (int, Buffer)) and hasattr(v, "__iter__") and \
        not hasattr(v, "buffer")


def _overrides(c: Controller, name: str) -> bool:
    return getattr(type(c), name) is not getattr(Controller, name)


class _Link:
    """The Python half of one runtime's ControllerLink: the delivery thread, the controller
    of each generation, and the failure log."""

    def __init__(self, rt: Runtime) -> None:
        self.c = _c.ControllerLink()
        self.rt = weakref.ref(rt)
        self.lock = threading.Lock()
        self.gen = 0
        self.targets: Dict[int, Optional[Controller]] = {}
        self.flushes: Dict[int, threading.Event] = {}
        self.installed: Optional[Controller] = None
        # The delivery thread runs while a controller is installed or a marker waits to be
        # delivered, and ends once neither holds: a runtime that outlives its controller
        # (Numba's, after a Dask worker leaves) keeps no idle thread.
        self.thread: Optional[threading.Thread] = None
        _links.add(self)

    def _start_delivery(self) -> None:
        """With self.lock held."""
        if self.thread is None:
            self.thread = threading.Thread(target=self._deliver, name="spillway-controller",
                                           daemon=True)
            self.thread.start()

    # -- installing -------------------------------------------------------------------
    def install(self, rt: Runtime, controller: Optional[Controller]) -> None:
        # Under the lock from start to end, so that two threads installing at once leave
        # the C table, the delivery target and `installed` all naming the same controller.
        # Nothing in here waits: _ctl_install and mark never block.
        with self.lock:
            old = self.installed
            if controller is not None and controller is not old:
                bound = controller._spw_runtime() if controller._spw_runtime else None
                if bound is not None and bound is not rt:
                    raise ValueError("this controller is installed on another runtime")
            self.gen += 1
            gen = self.gen
            self.targets[gen] = controller
            # The marker goes first: what the new table reports is queued after it.
            self.c.mark(gen)
            self._start_delivery()
            if controller is None:
                rt._ctl_install(None, None, False, False, False)
            else:
                pressure = (functools.partial(self._pressure, controller)
                            if _overrides(controller, "pressure") else None)
                rt._ctl_install(self.c, pressure, _overrides(controller, "allocated"),
                                _overrides(controller, "freed"),
                                _overrides(controller, "state_changed"))
            self.installed = controller
            if old is not None and old is not controller:
                old._spw_runtime = None
            if controller is not None:
                controller._spw_runtime = self.rt

    def flush(self, timeout: Optional[float]) -> bool:
        ev = threading.Event()
        with self.lock:
            self.gen += 1
            gen = self.gen
            self.flushes[gen] = ev
            self.c.mark(gen)
            self._start_delivery()
        return ev.wait(timeout)

    # -- calling the controller ---------------------------------------------------------
    def _failed(self, target: Controller, method: str, exc: BaseException) -> None:
        errors = target.__dict__.setdefault("_spw_errors", collections.Counter())
        key = (method, type(exc).__name__)
        errors[key] += 1
        if errors[key] == 1:  # once per kind: a failing method may be called very often
            log.error("spillway: %s.%s raised %s (logged once; Spillway goes on without its "
                      "answer)", type(target).__name__, method, type(exc).__name__,
                      exc_info=(type(exc), exc, exc.__traceback__))

    def _pressure(self, target: Controller, needed: int, max_victims: int) -> List[int]:
        """Called by the C trampoline with the GIL, on the thread that needs room."""
        try:
            got = target.pressure(needed, max_victims)
            out: List[int] = []
            if got:
                for v in got:
                    if len(out) >= max_victims:
                        break
                    out.append(_handle_of(v))
            return out
        except BaseException as e:  # noqa: B902 (a thread of Spillway must go on)
            self._failed(target, "pressure", e)
            return []

    def _deliver(self) -> None:
        _c._enter_callback_thread()
        target: Optional[Controller] = None
        take = self.c.take
        while True:
            evs = take(1024, 0.5)
            if evs is None:
                break
            if not evs:
                with self.lock:
                    # Nothing installed and every marker delivered (so `target` is None):
                    # nothing is left to deliver. install() and flush() mark and start a
                    # thread under this lock, so none is lost between the check and the end.
                    if self.installed is None and not self.targets and not self.flushes:
                        self.thread = None
                        return
                continue
            for ev in evs:
                kind = ev[0]
                if kind == _EV_MARK:
                    with self.lock:
                        done = self.flushes.pop(ev[1], None)
                        if done is None and ev[1] in self.targets:
                            target = self.targets.pop(ev[1])
                    if done is not None:
                        done.set()
                    continue
                if target is None:
                    continue
                try:
                    if kind == _EV_ALLOCATED:
                        target.allocated(ev[1], ev[2])
                    elif kind == _EV_FREED:
                        target.freed(ev[1], ev[2])
                    else:
                        target.state_changed(StateEvent(ev[1], State(ev[2]), State(ev[3]),
                                                        ev[4], ev[5], ev[6]))
                except BaseException as e:  # noqa: B902
                    name = ("allocated", "freed", "state_changed")[kind]
                    self._failed(target, name, e)
        with self.lock:  # closed: nobody waits for a flush that cannot come
            for done in self.flushes.values():
                done.set()
            self.flushes.clear()
            self.thread = None


_links: "weakref.WeakSet[_Link]" = weakref.WeakSet()
_install_lock = threading.Lock()
_shut_down = False


def _install(rt: Runtime, controller: Optional[Controller]) -> None:
    if controller is not None and not isinstance(controller, Controller):
        raise TypeError(f"expected a spillway.Controller or None, not {type(controller)!r}")
    if rt.closed:
        st = _c.SPW_ERR_INVALID_ARG
        raise error_class(st)(f"{_c.err_name(st)}: {_c.strerror(st)} (the runtime is closed)",
                              st, "the runtime is closed")
    with _install_lock:
        if _shut_down and controller is not None:
            raise RuntimeError("the interpreter is exiting: no controller can be installed")
        link = rt.__dict__.get("_spw_link")
        if link is None:
            if controller is None:
                return
            link = rt.__dict__["_spw_link"] = _Link(rt)
    link.install(rt, controller)


def _installed(rt: Runtime) -> Optional[Controller]:
    link = rt.__dict__.get("_spw_link")
    return link.installed if link is not None else None


def flush(runtime: Runtime, timeout: Optional[float] = 10.0) -> bool:
    """Waits until the controller of `runtime` has been handed every event queued before this
    call (allocated, freed, state_changed). Returns False on timeout. Raises
    WouldDeadlockError from a controller method (the delivery thread would wait on itself)."""
    if _c._in_callback():
        raise WouldDeadlockError(
            "SPW_ERR_WOULD_DEADLOCK: flush() from a controller method would wait on itself",
            _c.SPW_ERR_WOULD_DEADLOCK, "")
    link = runtime.__dict__.get("_spw_link")
    return True if link is None else link.flush(timeout)


def _shutdown() -> None:
    """atexit: no controller method runs from here on (see the module's documentation)."""
    global _shut_down
    with _install_lock:
        _shut_down = True
    left = _c._controller_shutdown(_SHUTDOWN_WAIT_S)
    if left:
        log.warning("spillway: %d controller pressure call(s) still running at exit", left)
    links = list(_links)
    for link in links:
        link.c.close()
    me = threading.current_thread()
    for link in links:
        t = link.thread
        if t is not None and t is not me:
            t.join(_SHUTDOWN_WAIT_S)


atexit.register(_shutdown)
