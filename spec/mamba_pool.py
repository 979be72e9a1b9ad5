"""Hybrid SSM models: the Mamba state pool, its slots held by request rows and session slots.

Mamba (`HybridReqToTokenPool`, `MambaSlotAllocator`): one state slot per request row
(slot 0 is the reserved dummy), plus the ping-pong track buffer when enabled; the
session slot takes them on save and returns them on close (`_free_slot_mamba`).
"""
from __future__ import annotations

from kvcheck.spec import mamba_tree
from kvcheck.spec.state import Req, State


EMPTY_TRACK = -1
"""The sentinel a lazily allocated ping-pong buffer holds in its unallocated entry."""


def mamba_on(s: State) -> bool:
    return s.cfg.mamba_slots > 0


def track_buffer_size(s: State) -> int:
    """`mamba_ping_pong_track_buffer_size`: 2 under the overlap scheduler, else 1."""
    return 2 if s.cfg.overlap else 1


def mamba_needed(s: State, req: Req) -> int:
    """Slots `HybridReqToTokenPool.alloc` takes for req: its state unless it has one
    (a restored or continuing request), and the track buffer when enabled and absent."""
    if not mamba_on(s):
        return 0
    n = 1 if req.mamba_pool_idx is None else 0
    if s.cfg.mamba_extra_buffer != "off" and req.mamba_ping_pong_track_buffer is None:
        n += 1 if s.cfg.mamba_extra_buffer == "lazy" else track_buffer_size(s)
    return n


def mamba_short(s: State, req: Req) -> bool:
    """Admission is refused when the Mamba pool cannot give req its slots (under the
    Mamba tree: `mamba_tree.admission_short`, evictable states counted)."""
    if s.cfg.mamba_tree:
        return mamba_tree.admission_short(s, mamba_needed(s, req))
    return mamba_needed(s, req) > len(s.mamba_free_slots)


def _mamba_alloc(s: State, n: int) -> list:
    taken, s.mamba_free_slots = s.mamba_free_slots[:n], s.mamba_free_slots[n:]
    return taken


def alloc_mamba(s: State, req: Req) -> None:
    """`HybridReqToTokenPool.alloc` (+ `_alloc_ping_pong_buffer`)."""
    if not mamba_on(s):
        return
    if req.mamba_pool_idx is None:
        req.mamba_pool_idx = _mamba_alloc(s, 1)[0]
    mode = s.cfg.mamba_extra_buffer
    if mode != "off" and req.mamba_ping_pong_track_buffer is None:
        size = track_buffer_size(s)
        got = _mamba_alloc(s, 1 if mode == "lazy" else size)
        req.mamba_ping_pong_track_buffer = tuple(got) + (EMPTY_TRACK,) * (size - len(got))


def mamba_ping_pong_empty(holder) -> list:
    """0.5.23 `ReqKvInfo.mamba_ping_pong_empty`: per track-buffer entry, True where it holds
    no slot (the spec keeps 0.5.15's -1 in the entry and derives the flags)."""
    buf = holder.mamba_ping_pong_track_buffer
    return None if buf is None else [m == EMPTY_TRACK for m in buf]


def mamba_refs(holder) -> tuple:
    """The Mamba pool entries a request or slot holds: its state, then its track buffer."""
    out = () if holder.mamba_pool_idx is None else (holder.mamba_pool_idx,)
    return out + tuple(holder.mamba_ping_pong_track_buffer or ())


def move_mamba(dst, src, clear_src: bool) -> None:
    """`save_from_req` / `restore_to_req` / the ephemeral slot: the Mamba references go
    with the KV; on a save (and the ephemeral slot) the request's are nulled."""
    dst.mamba_pool_idx = src.mamba_pool_idx
    dst.mamba_ping_pong_track_buffer = src.mamba_ping_pong_track_buffer
    if clear_src:
        src.mamba_pool_idx = None
        src.mamba_ping_pong_track_buffer = None


def free_mamba(s: State, holder) -> None:
    """`free_mamba_cache` (a request) / `_free_slot_mamba` (a slot): the state and the
    allocated track entries return to the pool. FIX (0.5.23 `mamba_ping_pong_empty`):
    a lazy buffer's -1 entry is skipped; 0.5.15's `_free_slot_mamba` frees it too."""
    if holder.mamba_pool_idx is not None:
        s.mamba_free_slots.append(holder.mamba_pool_idx)
    buf = holder.mamba_ping_pong_track_buffer or ()
    for m, empty in zip(buf, mamba_ping_pong_empty(holder) or ()):
        if not empty:
            s.mamba_free_slots.append(m)
    holder.mamba_pool_idx = None
    holder.mamba_ping_pong_track_buffer = None
