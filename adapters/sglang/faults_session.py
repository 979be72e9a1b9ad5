"""Planted faults in upstream's session code: StreamingSession and SessionSlot
(sglang.srt.session.streaming_session) and SessionController._close."""
from __future__ import annotations

from kvcheck.adapters.sglang.faults_patch import _patch

SS = "sglang.srt.session.streaming_session"


def _page_size(session) -> int:
    """StreamingSession's page size: 0.5.15 forwards it to the inner cache, 0.5.23 keeps
    the owning UnifiedRadixCache as `cache`."""
    cache = getattr(session, "cache", None)
    return cache.page_size if cache is not None else session.page_size


def _free_tail_noop(version: str) -> None:
    # before PR #22862: try_match_prefix restored the slot without freeing the orphaned
    # tail [prefix_len, kv_allocated_len) that alloc_for_extend then overwrites
    _patch(SS, "StreamingSession", "_free_tail", lambda orig: lambda self, *a, **k: None)


def _preabort_restores_slot(version: str) -> None:
    # before PR #22273: find_active_slot did not look at to_finish, so a pre-aborted
    # request (input too long) restored the slot and its release overwrote session KV
    def make(orig):
        def find_active_slot(self, req):
            hidden, req.to_finish = req.to_finish, None
            try:
                return orig(self, req)
            finally:
                req.to_finish = hidden
        return find_active_slot
    _patch(SS, "StreamingSession", "find_active_slot", make)


def _free_kv_aligned_floor(version: str) -> None:
    # _free_kv_aligned's docstring: the free starts at ceil_align(target) "because
    # PagedTokenToKVPoolAllocator.free returns whole pages, so partial-page free would
    # corrupt pages still holding committed tokens". Align target down instead.
    def make(orig):
        def _free_kv_aligned(self, where, target, end):
            P = _page_size(self)
            return orig(self, where, (target // P) * P, end)
        return _free_kv_aligned
    _patch(SS, "StreamingSession", "_free_kv_aligned", make)


def _trim_overshoot_noop(version: str) -> None:
    # before PR #22897: a finishing turn kept the speculative KV past max_new_tokens (and
    # its output_ids past finished_len) in the slot: token/KV mismatch next turn
    _patch(SS, "StreamingSession", "_trim_overshoot", lambda orig: lambda self, *a, **k: None)


def _put_back(cls: str, method: str, field: str) -> None:
    """Patch SS.cls.method(self, req, ...) to give `req.<field>` its value from before the
    call back after it: the request keeps a reference the method hands over."""
    def make(orig):
        def wrapper(self, req, *args, **kwargs):
            kept = getattr(req, field)
            out = orig(self, req, *args, **kwargs)
            setattr(req, field, kept)
            return out
        wrapper.__name__ = method
        return wrapper
    _patch(SS, cls, method, make)


def _finish_keeps_req_row(version: str) -> None:
    # save_from_req (0.5.15) / req.detach_kv() (0.5.23): "Ownership has transferred to the
    # slot. Null *all* of the req's references"; release_kv_cache's early return keys on
    # it. Put the request's reference back after the session saved the turn (0.5.23: the
    # abort and non-streaming paths leave req.kv as it was, so putting it back is a no-op
    # there).
    if version == "0.5.15":
        _put_back("SessionSlot", "save_from_req", "req_pool_idx")
    else:
        _put_back("StreamingSession", "try_cache_finished_req", "kv")


def _close_keeps_tree_lock(version: str) -> None:
    # release_session drops the first turn's tree lock (0.5.15 dec_lock_ref on
    # slot.last_node, "for dec_lock_ref on session close"; 0.5.23 cache.unlock(slot.lock)).
    # Hide the lock from it: the prompt stays locked after the session is gone.
    field = "last_node" if version == "0.5.15" else "lock"

    def make(orig):
        def release_session(self, session_id):
            slot = self.slots.get(session_id)
            if slot is not None:
                setattr(slot, field, None)
            return orig(self, session_id)
        return release_session
    _patch(SS, "StreamingSession", "release_session", make)


def _lock_not_handed_over(version: str) -> None:
    # 0.5.23 _lock_to_slot: `slot.lock, req.lock = req.lock, None`, the one hand-over of the
    # admission lock to the session (take, try_checkpoint). Leave the request its copy:
    # two holders of one lock reference, released twice.
    _put_back("StreamingSession", "_lock_to_slot", "lock")


def _session_held_counts_borrowed(version: str) -> None:
    # PR #22213 (busy double count): session_held_tokens skips slots whose row a running
    # request borrows (active_pool_idxs), which the busy check counts as uncached. Drop it.
    def make(orig):
        def session_held_tokens(self, active_pool_idxs=None):
            return orig(self, None)
        return session_held_tokens
    _patch(SS, "StreamingSession", "session_held_tokens", make)


def _restore_clears_slot(version: str) -> None:
    # 0.5.15 SessionSlot.restore_to_req's NOTE: "req_pool_idx and mamba_pool_idx are
    # intentionally NOT cleared from the slot ... Each retry calls match_prefix ->
    # restore_to_req again, so the slot must remain intact for idempotent restoration".
    # Clear the slot's row after the restore: a rejected admission's retry finds no slot.
    def make(orig):
        def restore_to_req(self, req):
            out = orig(self, req)
            self.req_pool_idx = None
            return out
        return restore_to_req
    _patch(SS, "SessionSlot", "restore_to_req", make)


def _free_tail_slot_untouched(version: str) -> None:
    # 0.5.15 _free_tail trims the slot as well as the request (kv_allocated_len =
    # prefix_len): a rejected admission's retry restores the trimmed slot. Keep the slot's
    # lengths as they were: the retry frees the same tail again.
    def make(orig):
        def _free_tail(self, slot, req, prefix_len):
            # the allocated length: on the slot (0.5.14-0.5.15), in its copy of the
            # turn's ReqKvInfo (0.5.16-0.5.18, `slot.kv`, which _free_tail trims in place)
            rec = slot.kv if getattr(slot, "kv", None) is not None else slot
            kept = (rec.kv_allocated_len, slot.kv_committed_len)
            out = orig(self, slot, req, prefix_len)
            rec.kv_allocated_len, slot.kv_committed_len = kept
            return out
        return _free_tail
    _patch(SS, "StreamingSession", "_free_tail", make)


def _close_keeps_row(version: str) -> None:
    # 0.5.15 release_session ends with `req_to_token_pool.free_slots.append(
    # slot.req_pool_idx)`: the slot's row goes back to the pool. Take it back out: the row
    # leaks with the session.
    def make(orig):
        def release_session(self, session_id):
            slot = self.slots.get(session_id)
            row = slot.req_pool_idx if slot is not None else None
            out = orig(self, session_id)
            free = self.req_to_token_pool.free_slots
            if row is not None and row in free:
                free.remove(row)
            return out
        return release_session
    _patch(SS, "StreamingSession", "release_session", make)


def _close_keeps_mamba(version: str) -> None:
    # PR #23496 (mamba leak on close): release_session ends with _free_slot_mamba(slot),
    # which gives the slot's mamba state (and its ping-pong track slots) back to the mamba
    # allocator. Skip it: the state leaks with the session.
    _patch(SS, "StreamingSession", "_free_slot_mamba", lambda orig: lambda self, slot: None)


def _ephemeral_slot_no_mamba(version: str) -> None:
    # 0.5.15 try_cache_finished_req, a first turn aborted mid-processing: the ephemeral
    # slot that release_session cleans up takes the request's mamba refs ("Also carry the
    # mamba refs over so _free_slot_mamba can return the ... slots to the mamba pool;
    # otherwise the abort orphans them"). Hide them from it: the abort orphans them.
    from sglang.srt.managers.schedule_batch import FINISH_ABORT

    def make(orig):
        def try_cache_finished_req(self, req, *args, **kwargs):
            session = getattr(req, "session", None)
            if (session is not None and session.streaming
                    and isinstance(req.finished_reason, FINISH_ABORT)
                    and session.session_id not in self.slots):
                req.mamba_pool_idx = None
                req.mamba_ping_pong_track_buffer = None
            return orig(self, req, *args, **kwargs)
        return try_cache_finished_req
    _patch(SS, "StreamingSession", "try_cache_finished_req", make)


def _close_not_deferred(version: str) -> None:
    # PR #21875 (close deferral): SessionController._close defers a streaming session's
    # close while a turn is in flight or its last request is unfinished ("An in-flight
    # request is still decoding on this session's KV memory. Freeing now would corrupt
    # the scheduler"). Hide both from it there: the session is released at once, under
    # the running turn.
    def make(orig):
        def _close(self, session_id):
            session = self.sessions[session_id]
            nodes = session.req_nodes
            busy = session.streaming and (session._inflight or any(
                not n.req.finished() for n in nodes.values()))
            if not busy:
                return orig(self, session_id)
            inflight = session._inflight
            session._inflight, session.req_nodes = False, {}
            try:
                return orig(self, session_id)
            finally:
                session._inflight, session.req_nodes = inflight, nodes
        return _close
    _patch("sglang.srt.session.session_controller", "SessionController", "_close", make)
