"""Session slots (StreamingSession, SessionSlot, SessionController): save and restore of a
turn's KV, the checkpoint `finish_req` advances, closes, `release_kv_cache`, and the accepted
findings (`Config.accept`) the spec follows instead of the fix.
"""
from __future__ import annotations

from typing import Optional

from kvcheck.spec import mamba_pool, ops as O, swa_pool
from kvcheck.spec.allocator import _free_pages, _free_row_range
from kvcheck.spec.caching import cache_finished_req_inner
from kvcheck.spec.pages import ceil_align, free_kv_aligned_pages
from kvcheck.spec.radix_cache import dec_lock_ref
from kvcheck.spec.state import Req, Session, Slot, State
from kvcheck.spec.token_arrays import (_aliases_arrays, _carry_fill, _new_fill_id,
                                       _share_token_arrays, refresh_fill)


def _is_streaming(req: Req) -> bool:
    return req.session is not None


ACCEPTED_INVARIANTS = {
    "U1": ("I20", "I26 req"),   # two turns in flight; the live turn's prompt rewritten under it
    "U2": ("I20", "I26 req", "I28"),
    "U3": ("I20",),
    "U6": ("I20",),
    "U7": (),               # the release raises: the spec stops at the same assertion
    "U8": ("I1", "I2", "I4"),   # the stub's own row and KV leak
    "U9": (),               # the release raises: the spec stops at the same error
    "M2": ("I28",),         # the aborted turn's tokens become the checkpoint
}
"""The invariants an accepted finding's known behaviour breaks on the spec itself ("ID" on
any owner, "ID KIND" on owners of that kind only: `req`, `slot`, `session`, `node`). A spec
that breaks anything else under `Config.accept` has left what the model follows (e.g.
pages owned twice after U1, whose allocation order upstream does not share; a running
turn's rewritten tokens saved into its session's slot, I26 on the slot: every later turn
of the session builds on KV of other tokens, and releases differ in which of the
rewritten lengths they keep)."""


def within_accepted(accept, violations) -> bool:
    """Whether every violation (id, owner) is one the accepted findings' behaviour breaks."""
    allowed = {i for a in accept for i in ACCEPTED_INVARIANTS.get(a, ())}
    return all(v.id in allowed or f"{v.id} {(v.owner or '').split(' ', 1)[0]}" in allowed
               for v in violations)


def accepts(s: State, finding: str) -> bool:
    """`Config.accept`: the spec takes upstream's recorded behaviour for this finding
    (docs/upstream-findings.md) instead of the fix."""
    return finding in s.cfg.accept


def _free_kv_aligned(s: State, row: int, target: int, end: int, holder=None) -> None:
    """Free row[ceil_align(target):end): the partial page stays attached."""
    r = s.rows[row]
    pages = free_kv_aligned_pages(target, end, s.cfg.page_size)
    dead = swa_pool.swa_dead_pages(s, holder, 0, end) if holder is not None else ()
    _free_pages(s, [r[k] for k in pages], full_only={r[k] for k in dead if k in pages})


def _free_tail(s: State, slot: Slot, req: Req, prefix_len: int) -> None:
    _free_kv_aligned(s, slot.row, prefix_len, slot.allocated, holder=slot)
    slot.allocated = prefix_len
    slot.committed = min(slot.committed, prefix_len)
    req.allocated = prefix_len
    req.committed = min(req.committed, prefix_len)
    swa_pool.clamp_swa_evicted(slot, prefix_len)
    swa_pool.clamp_swa_evicted(req, prefix_len)


def _trim_overshoot(s: State, req: Req, finished_len: int) -> None:
    target = swa_pool.swa_aligned_rewind(s, req, len(req.origin) + finished_len)
    _free_kv_aligned(s, req.row, target, req.allocated, holder=req)
    req.allocated = min(req.allocated, target)
    req.committed = min(req.committed, target)
    swa_pool.clamp_swa_evicted(req, target)
    del req.output[finished_len:]


def _save_from_req(slot: Slot, req: Req, is_first: bool) -> None:
    slot.row = req.row
    slot.committed = req.committed
    slot.allocated = req.allocated
    if is_first:
        slot.last_node = req.last_node
        slot.protected = req.protected
    swa_pool.save_swa_fields(slot, req, is_first)
    mamba_pool.move_mamba(slot, req, clear_src=True)
    req.row = None
    req.locked = False          # the first turn's lock now belongs to slot.last_node


def _restore_to_req(slot: Slot, req: Req) -> None:
    """The slot is not cleared (restore must be idempotent across a rejected admission)."""
    req.row = slot.row
    req.committed = slot.committed
    req.allocated = slot.allocated
    swa_pool.restore_swa_fields(slot, req)
    mamba_pool.move_mamba(req, slot, clear_src=False)


def _mark_kv_freed(req: Req) -> None:
    req.committed_freed = True
    req.overallocated_freed = True


def release_session(s: State, sid: int) -> None:
    """Drop the first-turn lock, free row[protected:allocated], return the row."""
    slot = s.slots.pop(sid, None)
    if slot is None:
        return
    dec_lock_ref(s, slot.last_node)
    if slot.row is not None:
        if slot.protected < slot.allocated:
            _free_row_range(s, slot.row, slot.protected, slot.allocated, holder=slot)
        s.free_rows.append(slot.row)
    mamba_pool.free_mamba(s, slot)          # `_free_slot_mamba` (H7, #23496)


def find_active_slot(s: State, req: Req):
    """A slot holding KV for this streaming request, or None; detaches a pre-aborted one."""
    if not _is_streaming(req):
        return None
    slot = s.slots.get(req.session)
    if slot is None or slot.row is None:
        return None
    if req.to_finish:
        sid = req.session
        _drop_parked_turn(s, sid, req)
        _abort_req(s, sid, req, unconditional=accepts(s, "U1"))
        req.session = None
        return None
    return slot


def _drop_parked_turn(s: State, sid: int, req: Req) -> None:
    """FIX(H4) follow-up: a retracted turn parked its partial KV in the slot without
    advancing the checkpoint; if that turn now ends unsuccessfully, the slot no longer
    matches the checkpoint the next turn is built from, so it is released."""
    sess = s.sessions.get(sid)
    if req.is_retracted and sid in s.slots and sess is not None and sess.inflight_rid == req.rid:
        release_session(s, sid)


def _abort_req(s: State, sid: int, req: Req, unconditional: bool = False) -> None:
    """`Session.abort_req`. FIX(H3): clears _inflight only for the in-flight request;
    `unconditional` is upstream's `self._inflight = False` (an accepted finding)."""
    sess = s.sessions.get(sid)
    if sess is not None and (unconditional or sess.inflight_rid == req.rid):
        sess.inflight_rid = None


def _finish_req(s: State, sid: int, req: Req) -> None:
    """`Session.finish_req`: the checkpoint advances to this request."""
    sess = s.sessions.get(sid)
    if sess is None:
        return
    if sess.inflight_rid == req.rid or accepts(s, "U1"):
        sess.inflight_rid = None        # FIX(H3); upstream: `self._inflight = False`
    sess.checkpoint = req.fill_ids
    prev = _req_nodes_request(s, sess) if accepts(s, "U2") else None
    if prev is not None:                # after an accepted U2: req_nodes' request still live
        prev.session = None             # `prev_node.req.session = None` (even req itself)
    sess.last_rid, sess.committed_origin = req.rid, req.origin
    sess.last_unfinished = req.finished_reason is None     # a retract under accepted U2
    if req.array_of is None:            # a turn built on no checkpoint has its own array
        req.array_of = req.rid
    sess.last_array = req.array_of      # req_nodes' request: the next turn extends its array
    req.req_nodes = True
    if req.fill_of is None:             # its fill array: the next turn's carry_fill
        req.fill_of = _new_fill_id(s, req.rid)
    sess.last_fill, sess.fill, sess.committed_fill_len = req.fill_of, req.fill, len(req.fill)


def _sync_checkpoints(s: State) -> None:
    """Upstream has no checkpoint copy: `create_req` reads req_nodes' request
    (`origin_input_ids[:committed_origin_len] + output_ids[:max_new_tokens]`). A request
    still live after its `finish_req` (a retract under accepted U2) moves it."""
    for sess in s.sessions.values():
        r = _req_nodes_request(s, sess)
        if r is not None:
            _sync_checkpoint(sess, r)


def _req_nodes_request(s: State, sess: Session) -> Optional[Req]:
    """req_nodes' request if it is still live (only after an accepted U2), else None. Not
    merely the live request with its rid: a client may reuse a finished request's rid
    (upstream refuses only a rid still in flight), and a new request under that rid is not
    the one `finish_req` recorded."""
    r = s.reqs.get(sess.last_rid) if sess.last_rid is not None else None
    return r if r is not None and r.req_nodes else None


def _sync_checkpoint(sess: Session, r: Req) -> None:
    """The checkpoint req_nodes' request `r` gives while its arrays are still its own."""
    if r.array_of == sess.last_array:
        sess.checkpoint = sess.committed_origin + tuple(r.output[:r.max_new_tokens])


def _close_waits(sess: Session) -> bool:
    """`SessionController._close` defers while `_inflight`, or while req_nodes' request
    has not finished (possible only after an accepted U2: a retract ran finish_req)."""
    return sess.inflight_rid is not None or sess.last_unfinished


def _maybe_close(s: State, sid: int) -> None:
    """A deferred close is carried out once the turn in flight has ended."""
    sess = dict.get(s.sessions, sid)    # a read (every step, every session): no copy-on-write
    if sess is not None and sess.close_pending and not _close_waits(sess):
        release_session(s, sid)
        del s.sessions[sid]


def try_cache_finished_req(s: State, req: Req, *, checkpoint: bool = True) -> None:
    """`StreamingSession.try_cache_finished_req` for an attached streaming request.
    checkpoint=False is the retract path: FIX(H4) parks the KV without `finish_req`."""
    sid = req.session
    slot = s.slots.get(sid)
    if req.finished_reason == "abort":
        if slot is not None and slot.row != req.row and \
                (s.cfg.era == "borrow" or not accepts(s, "U8")):
            # FIX(U8): an aborted turn that never ran on its session's slot (a rejected
            # stub matched in the round whose other turn then created the slot) leaves the
            # slot to that turn and is released like any request. 0.5.15 releases the
            # session's slot in its place and leaks the stub's own row and KV; 0.5.23
            # asserts "does not run on its slot" (`try_cache_finished_req`)
            _abort_req(s, sid, req, unconditional=accepts(s, "U1"))
            req.session = None
            _release_plain(s, req, is_insert=True)
            return
        if s.cfg.era == "borrow":
            if slot is not None:
                dec_lock_ref(s, slot.last_node)
                del s.slots[sid]
            _abort_req(s, sid, req, unconditional=accepts(s, "U1"))
            req.session = None
            _release_plain(s, req, is_insert=True)
            return
        if slot is None:                # first-turn mid-abort: ephemeral slot
            slot = Slot(row=req.row, allocated=req.allocated, last_node=req.last_node,
                        protected=req.protected, swa_uuid_for_lock=req.swa_uuid_for_lock)
            mamba_pool.move_mamba(slot, req, clear_src=True)
            s.slots[sid] = slot
        slot.allocated = max(slot.allocated, req.allocated)
        req.locked = False              # the lock goes with the slot
        release_session(s, sid)
        req.row = None
        _abort_req(s, sid, req, unconditional=accepts(s, "U1"))
        _mark_kv_freed(req)
        return
    is_first = slot is None
    if is_first:
        slot = Slot()
        s.slots[sid] = slot
    finished_len = req.finished_len if req.finished_len is not None else len(req.output)
    target = len(req.origin) + finished_len
    _trim_overshoot(s, req, finished_len)
    req.swa_branching_seqlen = None
    _save_from_req(slot, req, is_first)
    slot.committed = min(target, slot.allocated)
    if s.cfg.era == "borrow":
        slot.publishes = False          # the turn hands the record back (finish or retract)
    if checkpoint:
        _finish_req(s, sid, req)
    _mark_kv_freed(req)


def _release_plain(s: State, req: Req, is_insert: bool) -> None:
    """`release_kv_cache` for a request the streaming wrapper does not handle:
    cache_finished_req, then the overallocation [ceil_align(committed), allocated), then
    the row."""
    if s.cfg.era == "borrow" and req.finished_len is not None:
        # 0.5.22+ `owned_kv_len`: KV past the finished output (a speculative overshoot)
        # is never keyed; it falls into the overallocated range and is freed. Never below
        # the tree-owned prefix (a re-prefilled retracted request published past it).
        req.committed = min(req.committed, max(req.protected, len(req.origin) + req.finished_len))
    if s.cfg.era == "borrow" and is_insert:
        refresh_fill(s, req)            # "the fill-id array lags output_ids": refreshed first
    cache_finished_req_inner(s, req, is_insert)
    start = ceil_align(req.committed, s.cfg.page_size)
    if start < req.allocated:
        _free_row_range(s, req.row, start, req.allocated, holder=req)
    req.overallocated_freed = True
    mamba_pool.free_mamba(s, req)           # `free_mamba_cache`: the tree keeps no Mamba state
    s.free_rows.append(req.row)
    req.row = None


def release_kv_cache(s: State, req: Req, is_insert: bool = True) -> None:
    if _is_streaming(req):
        try_cache_finished_req(s, req)
    else:
        _release_plain(s, req, is_insert)


def _submit_turn(s: State, op: O.SubmitTurn) -> str:
    sess = s.sessions.get(op.sid)
    # handle_generate_request: a session not open ("session id ... does not exist") or
    # closing ("close was requested") gets a plain aborted request
    if sess is None or sess.close_pending:
        s.reqs[op.rid] = Req(op.rid, None, False, True, (0,), [], op.max_new_tokens, to_finish=True)
        return "stub"
    if sess.inflight_rid is not None:
        s.reqs[op.rid] = Req(op.rid, op.sid, True, True, (0,), [], op.max_new_tokens,
                             to_finish=True)
        return "stub"
    origin = sess.checkpoint + tuple(op.new_tokens)
    array = sess.last_array if sess.checkpoint else None
    fill, fill_of = _carry_fill(s, sess, tuple(op.new_tokens)) if sess.checkpoint else ((), None)
    if array is not None and _aliases_arrays(s):
        _share_token_arrays(s, array, origin)
    s.reqs[op.rid] = Req(op.rid, op.sid, True, False, origin, [], op.max_new_tokens,
                         array_of=array, fill=fill, fill_of=fill_of)
    sess.inflight_rid = op.rid
    return "ok"


def _close_session(s: State, sid: int) -> str:
    sess = s.sessions[sid]
    if _close_waits(sess):
        sess.close_pending = True
        return "deferred"
    release_session(s, sid)
    del s.sessions[sid]
    return "ok"
