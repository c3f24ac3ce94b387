# SPDX-License-Identifier: Apache-2.0
"""What the C library defines, as Python types: the tier, state and backend enumerations,
the statistics record, and the Buffer type. Values and names come from the extension
(``TIERS``, ``STATES``, ``BACKENDS``, ``STATS_FIELDS``, generated from spillway.h); the
classes below spell the members out so that type checkers and readers see them, and the
checks at the end of this module stop the import if they ever differ from C.

This module depends on the extension only, so every other module of the package can
import it without a cycle.
"""
from __future__ import annotations

import dataclasses
import enum
from typing import Union

from . import _spillway as _c

__all__ = ["Backend", "Tier", "State", "Stats", "Buffer", "StreamLike"]

Buffer = _c.Buffer

#: Anything accepted where a stream is expected: ``None`` (the default stream), an integer
#: handle (``cudaStream_t``), or an object with ``__cuda_stream__`` (cuda.core, CuPy,
#: PyTorch), ``.cuda_stream`` (PyTorch), ``.ptr`` (CuPy) or ``.handle`` (Numba).
StreamLike = Union[None, int, object]

_TIERS = dict(_c.TIERS)
_STATES = dict(_c.STATES)
BACKENDS = dict(_c.BACKENDS)      # keyword -> spw_backend_kind_t
IO_KINDS = dict(_c.IO_KINDS)      # keyword -> spw_io_kind_t
LOG_LEVELS = dict(_c.LOG_LEVELS)  # keyword -> spw_log_level_t


class Backend(enum.IntEnum):
    """The backend a runtime runs on (``spw_backend_kind_t``; never AUTO once created)."""
    CUDA = BACKENDS["cuda"]
    HOST = BACKENDS["host"]


class Tier(enum.IntEnum):
    """``spw_tier_t``: where a buffer's bytes are."""
    DEVICE = _TIERS["DEVICE"]
    HOST = _TIERS["HOST"]
    DISK = _TIERS["DISK"]
    PEER = _TIERS["PEER"]  # another runtime's device memory lent to this one (peer_lend)


class State(enum.IntEnum):
    """``spw_state_t``: a buffer's state, moves in flight included."""
    RESIDENT = _STATES["RESIDENT"]
    SPILLING = _STATES["SPILLING"]
    HOST = _STATES["HOST"]
    DEMOTING = _STATES["DEMOTING"]
    DISK = _STATES["DISK"]
    UNSPILLING = _STATES["UNSPILLING"]
    PEER = _STATES["PEER"]  # spilled into lent peer memory (tier PEER); otherwise as HOST


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
    hints_merged: int
    hints_replaced: int
    hints_pending: int
    prefetch_dropped: int
    # The peer tier (Runtime.peer_lend); peer moves are also counted in spills / unspills.
    peer_bytes: int          # bytes whose copy is in lent peer memory (not in host_bytes)
    peer_limit: int          # bytes another runtime lends this one now (0: none)
    peer_spills: int         # device -> peer
    peer_spill_bytes: int
    peer_unspills: int       # peer -> device
    peer_unspill_bytes: int
    peer_returns: int        # peer -> host or disk: the lender took its memory back
    peer_return_bytes: int
    lent_bytes: int          # this runtime's device memory lent to others now


def _check(what: str, python: object, c: object) -> None:
    if python != c:
        raise ImportError(f"spillway: {what} differ between the package and the extension "
                          f"({python!r} against {c!r}): rebuild the extension")


_check("Tier's members", {m.name: m.value for m in Tier}, _TIERS)
_check("State's members", {m.name: m.value for m in State}, _STATES)
_check("the fields of Stats", tuple(f.name for f in dataclasses.fields(Stats)), _c.STATS_FIELDS)
