"""How a request leaves the running batch: finish, abort (queued, pre-abort, running) and
retract, with the waiting queue's entry order and the batch's remaining-output estimates the
priority scheduler reads.
"""
from __future__ import annotations

from kvcheck.spec import mamba_pool, mamba_tree, ops as O, swa_pool
from kvcheck.spec.allocator import _write_kv
from kvcheck.spec.caching import _alloc_decode
from kvcheck.spec.sessions import (_abort_req, _drop_parked_turn, _is_streaming, _release_plain,
                                   _sync_checkpoint, accepts, release_kv_cache,
                                   try_cache_finished_req)
from kvcheck.spec.state import Req, State


CLIP_MAX_NEW_TOKENS = 4096
"""`SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION`'s default: the scheduler's estimates clip
max_new_tokens there."""


def running_batch(s: State) -> list:
    """The running batch's live requests, for reading (`s.reqs[rid]` to change one): those
    decoding (a finished request still in the batch until `update_running_batch` filters
    it is in `s.unfiltered` alone)."""
    return [r for r in dict.values(s.reqs) if r.phase == "decode"]


def preempted(before: State, op, after: State) -> list:
    """The rids of the running requests that `op`, a prefill round (or `schedule`) taking
    `before` to `after`, preempted: they wait again."""
    if not isinstance(op, (O.Schedule, O.ScheduleRound)):
        return []
    return [r.rid for r in running_batch(before)
            if r.rid in after.reqs and dict.__getitem__(after.reqs, r.rid).phase == "queued"]


def counts_running_output(s: State) -> bool:
    """Whether a round's PrefillAdder reads the running batch's remaining output: under
    priority scheduling (preemption) and under `config.admission` 'reserve' (admission)."""
    return s.cfg.enable_priority_scheduling or s.cfg.admission != "pages"


def running_offset(r: Req) -> int:
    """`PrefillAdder._get_running_request_total_token_offset`: the output a running
    request may still produce (the estimate's `new_token_ratio` taken as 1)."""
    return min(r.max_new_tokens - len(r.output), CLIP_MAX_NEW_TOKENS)


def preemption_order(reqs: list) -> list:
    """`preempt_to_schedule`'s sort: the lowest priority first, then the latest to have
    entered the waiting queue."""
    return sorted(reqs, key=lambda r: (r.priority, -r.entered))


def calc_priority_order(reqs: list) -> list:
    """`SchedulePolicy.calc_priority` under priority scheduling with the FCFS policy
    (`_sort_by_priority_and_fcfs`, `schedule_low_priority_values_first` off): the highest
    priority first, then the earliest to have entered the waiting queue."""
    return sorted(reqs, key=lambda r: (-r.priority, r.entered))


def _entered(s: State, req: Req, priority: int) -> None:
    """A new request reaches `_add_request_to_queue`: its priority, then its entry."""
    req.priority = priority
    enter_waiting_queue(s, req)


def enter_waiting_queue(s: State, req: Req) -> None:
    """`_add_request_to_queue`'s `set_wait_queue_entry_time` (a new request, a retracted
    or preempted one re-entering): the latest entry. Kept as a dense rank among the live
    requests, so that two states differing only in their clocks are one state."""
    if not s.cfg.enable_priority_scheduling:
        return
    req.entered = len(s.reqs) + 1
    order = sorted((rid for rid in s.reqs if dict.__getitem__(s.reqs, rid).entered),
                   key=lambda rid: dict.__getitem__(s.reqs, rid).entered)
    for rank, rid in enumerate(order, 1):
        if dict.__getitem__(s.reqs, rid).entered != rank:
            s.reqs[rid].entered = rank


def retraction_order(reqs: list) -> list:
    """`_get_decode_retraction_order`: most-preferred to keep first (most output tokens,
    then the shortest prompt; a stable sort, reversed); `retract_decode` pops from the
    end."""
    return sorted(reqs, key=lambda r: (len(r.output), -len(r.origin)), reverse=True)


def _check_finished(s: State, req: Req) -> None:
    """`check_finished` in the step's result processing: a request whose output reaches
    max_new_tokens finishes in that same step (a stop token is the explicit `finish`)."""
    if len(req.output) >= req.max_new_tokens:
        _finish(s, req)


def _lookahead(s: State, req: Req) -> None:
    """Overlap (and speculative verify in flight): the step after the last one has
    already computed the last token's KV, so committed == seqlen at finish/retract."""
    if not (s.cfg.overlap or s.cfg.spec_enabled) or req.committed >= req.seqlen:
        return
    pos = req.committed
    if pos >= req.allocated:
        if not _alloc_decode(s, req.row, pos):
            return                      # memory short: the step was not prepared
        req.allocated = pos + 1
        if swa_pool.swa_on(s):            # a prepared decode batch: `maybe_evict_swa` too
            swa_pool.free_swa_out_of_window_slots(s, req)
            swa_pool.decode_batch_done(req)
    _write_kv(s, req.row, pos, pos + 1, req.fill_ids)
    req.committed = pos + 1


def _finish(s: State, req: Req) -> None:
    _lookahead(s, req)
    decoding = req.phase == "decode"
    _finished(s, req, "length")
    req.finished_len = min(len(req.output), req.max_new_tokens)
    release_kv_cache(s, req)
    _stays_in_batch(s, req, decoding)
    del s.reqs[req.rid]


def _stays_in_batch(s: State, req: Req, decoding: bool) -> None:
    """The two-phase finish: a decoding request that finishes is released at once
    (`process_batch_result`) but stays in the running batch, its remaining output still
    counted by the next PrefillAdder (under priority scheduling or `config.admission`
    'reserve', which read it), until `update_running_batch` filters it. Read after the
    release, as the next round reads it: a streaming turn's `_trim_overshoot` has cut its
    output at `finished_len` (a plain request's speculative overshoot stays, and counts
    below zero)."""
    if counts_running_output(s) and decoding:
        s.unfiltered = tuple(sorted(s.unfiltered + (running_offset(req),)))


def update_running_batch(s: State) -> None:
    """A decode step begins: `filter_batch` drops the finished requests."""
    s.unfiltered = ()


def _finished(s: State, req: Req, reason: str) -> None:
    """`finished_reason` is set; a session whose req_nodes' request it is (still live only
    after an accepted U2) no longer waits for it to close, and keeps the checkpoint the
    request's last output gives (a turn detached by a second `finish_req` finishes as a
    plain request, but req_nodes still reads its arrays)."""
    req.finished_reason = reason
    for sess in s.sessions.values():
        if req.req_nodes and sess.last_rid == req.rid:
            sess.last_unfinished = False
            if accepts(s, "U2"):        # req_nodes' request is live only after a U2 retract
                _sync_checkpoint(sess, req)


def _abort_running(s: State, req: Req) -> None:
    decoding = req.phase == "decode"
    _finished(s, req, "abort")
    release_kv_cache(s, req)
    _stays_in_batch(s, req, decoding)
    del s.reqs[req.rid]


def _abort_queued(s: State, req: Req) -> None:
    """FIX(H5): a queued streaming turn clears the in-flight mark; a retracted one
    also drops the partial turn parked in its slot (FIX(H4) follow-up)."""
    if _is_streaming(req):
        sid = req.session
        if not (s.cfg.era == "wrapper" and accepts(s, "U3")):  # U3: 0.5.15 makes no session call
            _drop_parked_turn(s, sid, req)
            _abort_req(s, sid, req, unconditional=s.cfg.era == "borrow" and accepts(s, "U6"))
        if accepts(s, "M2") and queued_borrow_holds_mamba(s, req):
            try_cache_finished_req(s, req)      # M2: release_kv_cache -> finish_req
            del s.reqs[req.rid]
            return
    if mamba_tree.on(s) and req.row is None and req.mamba_pool_idx is not None:
        mamba_pool.free_mamba(s, req)       # `abort_request`: release_kv_cache(checkpoint=False)
    del s.reqs[req.rid]


def queued_borrow_holds_mamba(s: State, req: Req) -> bool:
    """Finding M2's trigger (docs/upstream-findings.md): a queued streaming turn runs on
    its slot's record (matched: it holds the slot's row) and that record holds a Mamba
    state, so `abort_request`'s "For mamba radix cache" branch calls `release_kv_cache`
    (0.5.23 scheduler.py l.5716-5721, `checkpoint=False`, whose `claim_kv_row` reaches
    `try_cache_finished_req`; 0.5.15 l.3905-3910, `is_insert=False`, the wrapper's
    `cache_finished_req`) with no FINISH_ABORT set: the finish path."""
    return _is_streaming(req) and req.row is not None and req.mamba_pool_idx is not None


ABORT_STUB_ORIGIN = (0,)
"""`Req.set_finish_with_abort` rebinds origin_input_ids to `array("q", [0])`."""


def _pre_abort(req: Req) -> None:
    """FINISH_ABORT on a queued request that has not been matched. A fresh request
    (never run) is aborted by upstream only through `Req.set_finish_with_abort`
    (validation in `handle_generate_request`, the grammar queue), which rebinds
    origin_input_ids to a private one-token array; a retracted turn aborted by the
    client in the iteration that retracted it (abort method 3: `to_finish` only, then
    `retract_decode`) keeps its arrays."""
    req.to_finish = True
    if not req.is_retracted:
        req.origin = ABORT_STUB_ORIGIN
        req.array_of = None


def _retract(s: State, req: Req) -> None:
    """`release_req` + `reset_for_retract`."""
    _lookahead(s, req)
    if _is_streaming(req):
        req.finished_len = len(req.output)
        try_cache_finished_req(s, req, checkpoint=accepts(s, "U2"))
        req.finished_len = None
    else:
        _release_plain(s, req, is_insert=False)
    req.committed = req.allocated = req.protected = req.prefix_len = req.extend_end = 0
    req.last_node = None
    req.locked = False
    req.committed_freed = req.overallocated_freed = False
    swa_pool.reset_for_retract(req)
    req.is_retracted = True
    req.phase = "queued"
