"""StreamingSession (upstream session/streaming_session.py, wrapper era V1 + the seed's
committed clamp on save), with an era switch for the borrow-era mid-abort."""
from __future__ import annotations

from typing import Optional

import torch

from kvcheck.impl import faults
from kvcheck.impl.common import free_kv_row
from kvcheck.impl.schedule_batch import FINISH_ABORT, Req

I64 = torch.int64


def ceil_align(x: int, p: int) -> int:
    return -(-x // p) * p


class _VirtualNode:
    """Sentinel lock anchor of a session slot; lock calls on it are no-ops."""

    def __init__(self, session_id=None):
        self.session_id = session_id


class SessionSlot:
    def __init__(self, session_id=None, req_pool_idx: Optional[int] = None, kv_committed_len: int = 0,
                 kv_allocated_len: int = 0, last_node=None, cache_protected_len: int = 0):
        self.virtual_node = _VirtualNode(session_id)
        self.req_pool_idx = req_pool_idx
        self.kv_committed_len = kv_committed_len
        self.kv_allocated_len = kv_allocated_len
        self.last_node = last_node
        self.cache_protected_len = cache_protected_len
        self.publishes = False      # borrow era: publishes_prompt (taken, not handed back yet)
        # hybrid models
        self.swa_uuid_for_lock = None
        self.swa_evicted_seqlen = 0
        self.swa_evict_floor = 0
        self.mamba_pool_idx = None
        self.mamba_ping_pong_track_buffer = None

    @property
    def is_holding_kv(self) -> bool:
        return self.req_pool_idx is not None

    def save_from_req(self, req: Req, is_first: bool) -> None:
        self.req_pool_idx = req.req_pool_idx
        self.kv_committed_len = req.kv_committed_len
        self.kv_allocated_len = req.kv_allocated_len
        self.swa_evicted_seqlen = req.swa_evicted_seqlen
        self.swa_evict_floor = req.swa_evict_floor
        if is_first:
            self.last_node = req.last_node
            self.cache_protected_len = req.cache_protected_len
            self.swa_uuid_for_lock = req.swa_uuid_for_lock
        self.mamba_pool_idx = req.mamba_pool_idx
        self.mamba_ping_pong_track_buffer = req.mamba_ping_pong_track_buffer
        if "save_keeps_row" not in faults.ACTIVE:
            req.req_pool_idx = None
        req.mamba_pool_idx = None
        req.mamba_ping_pong_track_buffer = None
        req.lock_held = False

    def restore_to_req(self, req: Req) -> None:
        req.req_pool_idx = self.req_pool_idx
        req.kv_committed_len = self.kv_committed_len
        req.kv_allocated_len = self.kv_allocated_len
        if "restore_drops_swa_cursor" not in faults.ACTIVE:
            req.swa_evicted_seqlen = self.swa_evicted_seqlen
        req.swa_evict_floor = self.swa_evict_floor
        req.swa_uuid_for_lock = self.swa_uuid_for_lock
        req.mamba_pool_idx = self.mamba_pool_idx
        req.mamba_ping_pong_track_buffer = self.mamba_ping_pong_track_buffer
        if "restore_clears_slot" in faults.ACTIVE:
            self.req_pool_idx = None


def _is_streaming(req: Optional[Req]) -> bool:
    return req is not None and req.session is not None and req.session.streaming


class StreamingSession:
    def __init__(self, inner, era: str = "wrapper", evict_shortfall: bool = False):
        self.inner = inner                     # RadixCache
        self.era = era
        self.evict_shortfall = evict_shortfall     # wrapper era: 0.5.17+'s eviction
        self.slots: dict = {}
        inner.split_at_prompt = era == "borrow"
        inner.segment_frees = era == "borrow"

    @property
    def req_to_token_pool(self):
        return self.inner.req_to_token_pool

    @property
    def token_to_kv_pool_allocator(self):
        return self.inner.token_to_kv_pool_allocator

    @property
    def page_size(self) -> int:
        return self.inner.page_size

    def any_holding_kv(self) -> bool:
        return any(s.is_holding_kv for s in self.slots.values())

    def find_active_slot(self, req: Req) -> Optional[SessionSlot]:
        if not _is_streaming(req):
            return None
        slot = self.slots.get(req.session.session_id)
        if slot is None or slot.req_pool_idx is None:
            return None
        if req.to_finish is not None and "preabort_no_detach" not in faults.ACTIVE:
            self.drop_parked_turn(req)
            req.session.abort_req(req)
            req.session = None
            return None
        return slot

    def drop_parked_turn(self, req: Req) -> None:
        """FIX(H4) follow-up: a retracted in-flight turn parked its partial KV in the slot
        without advancing the checkpoint; when that turn ends unsuccessfully (queued
        abort, or pre-abort detach) the slot no longer matches the checkpoint the next
        turn is built from, so the session's KV is released."""
        session = req.session
        if req.is_retracted and session is not None and session._inflight is req \
                and session.session_id in self.slots:
            self.release_session(session.session_id)

    # -- match ---------------------------------------------------------------------
    def try_match_prefix(self, req: Req, key) -> Optional[tuple]:
        """(device_indices, last_node, cache_protected_len) when the request restores its
        session slot; None to fall back to the radix match."""
        slot = self.find_active_slot(req)
        if slot is None:
            return None
        slot.restore_to_req(req)
        prefix_len = min(req.kv_committed_len, len(key))
        assert prefix_len >= slot.cache_protected_len, (
            f"streaming session prefix shrank: prefix_len={prefix_len} < "
            f"slot.cache_protected_len={slot.cache_protected_len}")
        prefix_len = self._swa_aligned_rewind(req, prefix_len)
        self._free_tail(slot, req, prefix_len)
        req.swa_branching_seqlen = None     # the slot's MatchResult carries none
        device_indices = self.req_to_token_pool.req_to_token[req.req_pool_idx, :prefix_len].to(I64)
        return device_indices, slot.virtual_node, slot.cache_protected_len

    def match_prefix(self, req: Req, key) -> tuple:
        res = self.try_match_prefix(req, key)
        if res is not None:
            return res
        idx, node = self.inner.match_prefix(key)
        if hasattr(self.inner, "finalize_match_result_in_tree_core"):
            self.inner.finalize_match_result_in_tree_core(req, len(idx))
        if getattr(self.inner, "mamba", None) is not None:
            self.inner.mamba.finalize_match_result_in_cache(req, node)
        return idx, node, len(idx)

    # -- finish ------------------------------------------------------------------------
    def try_cache_finished_req(self, req: Req, is_insert: bool = True, retract: bool = False) -> bool:
        if not _is_streaming(req):
            return False
        if self.era == "borrow" and req.finished_reason == FINISH_ABORT:
            return self._borrow_abort(req)
        session = req.session
        session_id = session.session_id
        slot = self.slots.get(session_id)
        is_first = slot is None

        if req.finished_reason == FINISH_ABORT:
            if slot is not None and slot.req_pool_idx != req.req_pool_idx \
                    and "round_stub_nukes_slot" not in faults.ACTIVE:
                # FIX(U8): a request that never ran on its session's slot (a rejected stub
                # matched before its session's turn created the slot in the same round)
                # leaves the slot alone and is released like any request
                session.abort_req(req)
                req.session = None
                return False
            if slot is None:
                slot = SessionSlot(session_id, req_pool_idx=req.req_pool_idx,
                                   kv_allocated_len=req.kv_allocated_len,
                                   last_node=req.last_node, cache_protected_len=req.cache_protected_len)
                slot.swa_uuid_for_lock = req.swa_uuid_for_lock
                if "ephemeral_slot_no_mamba" not in faults.ACTIVE:
                    slot.mamba_pool_idx = req.mamba_pool_idx
                    slot.mamba_ping_pong_track_buffer = req.mamba_ping_pong_track_buffer
                req.mamba_pool_idx = None       # the slot owns it: no double free later
                req.mamba_ping_pong_track_buffer = None
                if "ephemeral_slot_no_lock_node" in faults.ACTIVE:
                    slot.last_node = None
                self.slots[session_id] = slot
            if "midabort_allocated_not_maxed" not in faults.ACTIVE:
                slot.kv_allocated_len = max(slot.kv_allocated_len, req.kv_allocated_len)
            self.release_session(session_id)
            req.req_pool_idx = None
            req.lock_held = False
            session.abort_req(req)
            self._mark_kv_freed(req)
            return True

        if is_first:
            slot = SessionSlot(session_id)
            self.slots[session_id] = slot
        finished_len = req.finished_len if req.finished_len is not None else len(req.output_ids)
        target = len(req.origin_input_ids) + finished_len
        if "trim_overshoot_missing" not in faults.ACTIVE:
            self._trim_overshoot(req, finished_len)
        req.swa_branching_seqlen = None
        slot.save_from_req(req, is_first=is_first)
        if "save_commit_unclamped" in faults.ACTIVE:
            slot.kv_committed_len = target
        else:
            slot.kv_committed_len = min(target, slot.kv_allocated_len)
        if self.era == "borrow":
            slot.publishes = False     # the turn hands the record back (finish or retract)
        if not retract or "retract_advances_checkpoint" in faults.ACTIVE:
            session.finish_req(req)
        self._mark_kv_freed(req)
        return True

    def _borrow_abort(self, req: Req) -> bool:
        """Borrow era (0.5.22+) mid-abort: drop the slot's lock and remove the slot
        without freeing; the request is then released like any request (the caller's
        raw path: insert, duplicate and tail frees, overallocation, row). A request that
        never ran on its session's slot (a pre-aborted stub matched before its session's
        turn took the slot in the same round) leaves the slot alone."""
        session = req.session
        slot = self.slots.get(session.session_id)
        if slot is not None and (slot.req_pool_idx == req.req_pool_idx
                                 or "round_stub_drops_slot" in faults.ACTIVE):
            del self.slots[session.session_id]      # only the slot the request runs on
            if slot.last_node is not None:
                self.inner.dec_lock_ref(slot.last_node)
        session.abort_req(req)
        req.session = None
        return False

    def cache_finished_req(self, req: Req, is_insert: bool = True, retract: bool = False) -> None:
        if self.try_cache_finished_req(req, is_insert=is_insert, retract=retract):
            return
        self.inner.cache_finished_req(req, is_insert=is_insert)

    # -- unfinished ----------------------------------------------------------------------
    def take(self, req: Req) -> None:
        """Borrow era StreamingSession.take: a streaming turn's first row allocation
        hands its record and admission lock to a new slot that publishes the prompt."""
        if not _is_streaming(req) or req.session.session_id in self.slots:
            return
        sid = req.session.session_id
        slot = SessionSlot(sid, req_pool_idx=req.req_pool_idx, kv_committed_len=req.kv_committed_len,
                           kv_allocated_len=req.kv_allocated_len,
                           last_node=req.last_node if req.lock_held else None,
                           cache_protected_len=req.cache_protected_len)
        slot.publishes = True
        slot.swa_uuid_for_lock = req.swa_uuid_for_lock if req.lock_held else None
        slot.swa_evict_floor = req.swa_evict_floor      # one record: the floor too
        slot.mamba_pool_idx = req.mamba_pool_idx        # one record: the Mamba refs too
        slot.mamba_ping_pong_track_buffer = req.mamba_ping_pong_track_buffer
        self.slots[sid] = slot
        req.lock_held = False
        req.last_node = slot.virtual_node

    def sync_borrowed(self, reqs) -> None:
        """Borrow era: a turn runs on its slot's record, so the slot's lengths are the
        turn's while it borrows it."""
        for req in reqs:
            if not _is_streaming(req):
                continue
            slot = self.slots.get(req.session.session_id)
            if slot is not None and req.req_pool_idx is not None \
                    and req.req_pool_idx == slot.req_pool_idx and req.last_node is slot.virtual_node:
                slot.kv_committed_len = req.kv_committed_len
                slot.kv_allocated_len = req.kv_allocated_len
                slot.cache_protected_len = req.cache_protected_len
                slot.swa_evicted_seqlen = req.swa_evicted_seqlen    # component_evicted_seqlens
                slot.swa_evict_floor = req.swa_evict_floor

    def _checkpoint_borrow(self, req: Req, chunked: bool) -> bool:
        """Borrow era checkpoint_kv_cache for a streaming turn: while its slot publishes
        the prompt, the slot's lock goes to the insert and comes back moved."""
        slot = self.slots.get(req.session.session_id)
        if slot is None:
            return False
        if slot.publishes:
            req.last_node, req.lock_held = slot.last_node, slot.last_node is not None
            slot.last_node = None
            self.inner.cache_unfinished_req(req, chunked=chunked)
            slot.last_node, req.lock_held = req.last_node, False
            slot.swa_uuid_for_lock = getattr(req, "swa_uuid_for_lock", None)  # moves with the lock
            req.last_node = slot.virtual_node
            slot.cache_protected_len = req.cache_protected_len
        elif chunked:
            req.prefix_indices = self.req_to_token_pool.req_to_token[req.req_pool_idx, :req.extend_end].to(I64).clone()
        return True

    def try_cache_unfinished_req(self, req: Req, chunked: bool = False) -> bool:
        if not _is_streaming(req):
            return False
        if self.era == "borrow":
            return self._checkpoint_borrow(req, chunked)
        if chunked:
            req.prefix_indices = self.req_to_token_pool.req_to_token[req.req_pool_idx, :req.extend_end].to(I64).clone()
            return True
        if req.session.session_id in self.slots:
            return True
        return False

    def cache_unfinished_req(self, req: Req, chunked: bool = False) -> None:
        if self.try_cache_unfinished_req(req, chunked=chunked):
            return
        self.inner.cache_unfinished_req(req, chunked=chunked)

    # -- pass-through ------------------------------------------------------------------
    def inc_lock_ref(self, node) -> None:
        if isinstance(node, _VirtualNode):
            return
        self.inner.inc_lock_ref(node)

    def dec_lock_ref(self, node) -> None:
        if isinstance(node, _VirtualNode):
            return
        self.inner.dec_lock_ref(node)

    def evict(self, num_tokens: int) -> int:
        return self.inner.evict(num_tokens)

    def evictable_size(self) -> int:
        return self.inner.evictable_size()

    def protected_size(self) -> int:
        return self.inner.protected_size()

    # -- session lifecycle ---------------------------------------------------------------
    def release_session(self, session_id) -> None:
        slot = self.slots.pop(session_id, None)
        if slot is None:
            return
        if slot.last_node is not None and "close_skips_dec_lock" not in faults.ACTIVE:
            self.inner.dec_lock_ref(slot.last_node)
        if slot.is_holding_kv:
            start, end = slot.cache_protected_len, slot.kv_allocated_len
            if self.era == "borrow":        # 0.5.22+: free_kv_row, even an empty range
                free_kv_row(self.req_to_token_pool, self.token_to_kv_pool_allocator,
                            slot.req_pool_idx, [(start, end)], kv=slot)
            elif start < end:
                kv = self.req_to_token_pool.req_to_token[slot.req_pool_idx, start:end]
                self.token_to_kv_pool_allocator.free(kv)
            self.req_to_token_pool.free_slots.append(slot.req_pool_idx)
        if "release_session_keeps_mamba" not in faults.ACTIVE:
            self._free_slot_mamba(slot)

    def _free_slot_mamba(self, slot: SessionSlot) -> None:
        """Return a slot's Mamba state and track entries (0.5.23's form: only allocated
        entries of the track buffer; 0.5.15 frees the whole buffer, -1 included)."""
        mamba_allocator = getattr(self.req_to_token_pool, "mamba_allocator", None)
        if mamba_allocator is None:
            return
        if slot.mamba_pool_idx is not None:
            mamba_allocator.free(slot.mamba_pool_idx.unsqueeze(0))
            slot.mamba_pool_idx = None
        if slot.mamba_ping_pong_track_buffer is not None:
            buf = slot.mamba_ping_pong_track_buffer
            if "lazy_track_frees_sentinel" not in faults.ACTIVE:
                buf = buf[buf != -1]
            mamba_allocator.free(buf)
            slot.mamba_ping_pong_track_buffer = None

    def session_held_tokens(self, active_pool_idxs: Optional[set] = None) -> int:
        total = 0
        for slot in self.slots.values():
            in_batch = active_pool_idxs is not None and slot.req_pool_idx in active_pool_idxs
            if "session_held_counts_borrowed" in faults.ACTIVE:
                in_batch = False
            if slot.is_holding_kv and not in_batch:
                total += ceil_align(slot.kv_allocated_len, self.page_size) - slot.cache_protected_len
        return total

    def session_held_req_count(self, active_pool_idxs: Optional[set] = None) -> int:
        if "session_held_req_count_counts_borrowed" in faults.ACTIVE:
            active_pool_idxs = None
        return sum(1 for s in self.slots.values()
                   if s.is_holding_kv and not (active_pool_idxs is not None and s.req_pool_idx in active_pool_idxs))

    # -- internal helpers ----------------------------------------------------------------
    def _free_tail(self, slot: SessionSlot, req: Req, prefix_len: int) -> None:
        self._free_kv_aligned(slot.req_pool_idx, prefix_len, slot.kv_allocated_len, kv=slot)
        if "free_tail_slot_untouched" not in faults.ACTIVE:
            slot.kv_allocated_len = prefix_len
            slot.kv_committed_len = min(slot.kv_committed_len, prefix_len)
        req.kv_allocated_len = prefix_len
        req.kv_committed_len = min(req.kv_committed_len, prefix_len)
        slot.swa_evicted_seqlen = min(slot.swa_evicted_seqlen, prefix_len)
        req.swa_evicted_seqlen = min(req.swa_evicted_seqlen, prefix_len)

    def _swa_aligned_rewind(self, req: Req, n: int) -> int:
        """FIX (0.5.23): a rewind below the SWA cursor lands on a page boundary."""
        P = self.page_size
        if P > 1 and req.swa_evicted_seqlen > n:
            return (n // P) * P
        return n

    def _trim_overshoot(self, req: Req, finished_len: int) -> None:
        target = self._swa_aligned_rewind(req, len(req.origin_input_ids) + finished_len)
        self._free_kv_aligned(req.req_pool_idx, target, req.kv_allocated_len, kv=req)
        req.kv_allocated_len = min(req.kv_allocated_len, target)
        req.kv_committed_len = min(req.kv_committed_len, target)
        req.swa_evicted_seqlen = min(req.swa_evicted_seqlen, target)
        req.output_ids = req.output_ids[:finished_len]

    def _free_kv_aligned(self, pool_idx: int, target: int, end: int, kv=None) -> None:
        if end <= target:
            return
        start = target
        if self.page_size > 1 and "free_tail_unaligned" not in faults.ACTIVE:
            start = ceil_align(start, self.page_size)
        if start < end and self.era == "borrow":
            free_kv_row(self.req_to_token_pool, self.token_to_kv_pool_allocator, pool_idx,
                        [(start, end)], kv=kv)
        elif start < end:
            self.token_to_kv_pool_allocator.free(self.req_to_token_pool.req_to_token[pool_idx, start:end])

    @staticmethod
    def _mark_kv_freed(req: Req) -> None:
        if not req.kv_committed_freed:
            req.pop_committed_kv_cache()
        if not req.kv_overallocated_freed:
            req.pop_overallocated_kv_cache()
