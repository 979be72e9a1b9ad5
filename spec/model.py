"""The reference model: each operation is a guard (`enabled`) and an effect (`step`).

Follows DOMAIN.md section 2 and the seed (`streaming_session.py` of sglang 0.5.15) step
for step, with upstream's names; docs/semantics.md states the same in prose. The model
takes the fixed behaviour of the hazards H3, H4 and H5 (marked `FIX(Hn)`), so a system
that shows the upstream behaviour is reported as a violation.

`step(state, op)` clones the state and returns `(new_state, outcome)`; it never mutates
its argument. The helpers it calls mutate the clone they are given and are private to the
step that called them.

The step's parts live beside it, one concern each, in the order they build on each other:
`allocator` (pages, rows), `radix_cache` (the tree), `caching` (eviction for an allocation,
a request's KV into the tree), `token_arrays`, `sessions` (slots, checkpoints, release),
`finish` (finish, abort, retract), `forward` (prefill and decode), `admission` (the prefill
round) and `guards` (`enabled`). This module is the step and the names its callers use.
"""
from __future__ import annotations

from kvcheck.spec import ops as O
from kvcheck.spec.admission import _schedule, _schedule_round, resolve_logprob_start
from kvcheck.spec.finish import (ABORT_STUB_ORIGIN, _abort_queued, _abort_running, _entered, _finish,
                                 _pre_abort, _retract, enter_waiting_queue, queued_borrow_holds_mamba)
from kvcheck.spec.forward import (SAMPLED_TOKEN, _decode, _decode_round, _prefill_chunk, _spec_decode,
                                  _sync_borrowed)
from kvcheck.spec.guards import enabled, refusal, refused
from kvcheck.spec.radix_cache import evict, node_path
from kvcheck.spec.sessions import (_close_session, _maybe_close, _submit_turn, _sync_checkpoints,
                                   within_accepted)
from kvcheck.spec.state import Req, Session, State, initial_state
from kvcheck.spec.violations import ModelError

__all__ = ["initial_state", "enabled", "step", "ModelError", "SAMPLED_TOKEN", "refusal", "refused",
           "preempted_by", "within_accepted", "node_path", "resolve_logprob_start",
           "queued_borrow_holds_mamba", "ABORT_STUB_ORIGIN"]


def preempted_by(s: State, op: O.Op) -> list:
    """The running requests that `op`, a prefill round (or `schedule`) enabled in s,
    preempts (none when the step stops at an assertion)."""
    if not (s.cfg.enable_priority_scheduling and isinstance(op, (O.Schedule, O.ScheduleRound))):
        return []
    running = [rid for rid, r in dict.items(s.reqs) if r.phase == "decode"]
    if not running or not enabled(s, op):
        return []
    try:
        after, _ = step(s, op)
    except ModelError:      # the step itself reports it
        return []
    return [rid for rid in running
            if rid in after.reqs and dict.__getitem__(after.reqs, rid).phase == "queued"]


def step(s: State, op: O.Op, checked: bool = False) -> tuple[State, str]:
    """Apply an enabled op to a copy of s; returns (new state, outcome). checked: the
    caller has just asked `enabled(s, op)` (the explorer), so the guard is not re-run."""
    if not checked and not enabled(s, op):
        raise ValueError(f"{op} is not enabled in this state")
    answer = refused(s, op)
    if answer:                          # turned down by upstream: nothing changes
        return s.clone(), answer
    s = s.clone()
    req = s.reqs.get(getattr(op, "rid", None))
    if isinstance(op, O.OpenSession):
        s.sessions[op.sid] = Session(op.sid)
        out = "ok"
    elif isinstance(op, O.SubmitTurn):
        out = _submit_turn(s, op)
        _entered(s, s.reqs[op.rid], op.priority)
    elif isinstance(op, O.SubmitRequest):
        s.reqs[op.rid] = Req(op.rid, None, False, False, tuple(op.tokens), [], op.max_new_tokens,
                             logprob_start=resolve_logprob_start(op.logprob_start_len, len(op.tokens)))
        _entered(s, s.reqs[op.rid], op.priority)
        out = "ok"
    elif isinstance(op, O.Schedule):
        out = _schedule(s, req, op.admit)
    elif isinstance(op, O.ScheduleRound):
        out = _schedule_round(s, [s.reqs[r] for r in op.rids], op.limit)
    elif isinstance(op, O.DecodeRound):
        out = _decode_round(s, [s.reqs[r] for r in op.rids])
    elif isinstance(op, O.PrefillChunk):
        out = _prefill_chunk(s, req)
    elif isinstance(op, O.Decode):
        out = _decode(s, req, op.token)
    elif isinstance(op, O.SpecDecode):
        out = _spec_decode(s, req, op.drafts, op.accepted, op.token)
    elif isinstance(op, O.Finish):
        _finish(s, req)
        out = "ok"
    elif isinstance(op, (O.AbortQueued, O.QueueReject)):
        _abort_queued(s, req)
        out = "ok"
    elif isinstance(op, O.PreAbort):
        _pre_abort(req)
        out = "ok"
    elif isinstance(op, O.AbortRunning):
        _abort_running(s, req)
        out = "ok"
    elif isinstance(op, O.Retract):
        _retract(s, req)
        enter_waiting_queue(s, req)
        out = "ok"
    elif isinstance(op, O.CloseSession):
        out = _close_session(s, op.sid)
    elif isinstance(op, O.Evict):
        evict(s, op.num_tokens)
        out = "ok"
    else:  # pragma: no cover - enabled() refuses unknown ops
        raise ValueError(f"unknown op {op!r}")
    for sid in list(s.sessions):        # the scheduler loop's maybe_reap, after the round:
        _maybe_close(s, sid)            # a deferred close whose turn has ended is carried out
    if s.cfg.era == "borrow":
        _sync_borrowed(s, op.rids if hasattr(op, "rids") else (getattr(op, "rid", None),))
    if s.cfg.accept:
        _sync_checkpoints(s)
    return s, out
