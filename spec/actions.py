"""The specification as actions (TLA+ / Stateright style): one `Action` per operation,
its guard and its effect side by side, in `ACTIONS` (spec/ops.py's OP_NAMES order).

`guard(s, op)`: None when op is enabled in s, else the reason, naming the part that
fails. An action on a live request (`acts_on`: the phases the request `rid` names must be
in) first needs the request live and in one of those phases (`guards._phase_refusal`),
then its own `check(s, op, req)`; any other action's `check(s, op)` is its whole guard.
`effect(s, op)`: the outcome, applied to the clone `kvcheck.spec.model.step` made.

The drivers derive their operations from this table: `kvcheck.engines.gen.ARGS` has one
drawer per action and picks a request among `acts_on`'s phases, the explorer
(`kvcheck.explore.candidates`) tries every action with an `acts_on` on each live
request, the Hypothesis machine's rules for those run while a request is in one of them.
A new operation is its op class (spec/ops.py), a block here, and its argument domains in
the engines (gen.py's drawer; candidates.py's domain when it acts on a live request).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from kvcheck.spec import mamba_tree, ops as O
from kvcheck.spec.admission import _schedule, _schedule_round, resolve_logprob_start
from kvcheck.spec.finish import (_abort_queued, _abort_running, _entered, _finish, _pre_abort,
                                 _retract, calc_priority_order, enter_waiting_queue)
from kvcheck.spec.forward import _decode, _decode_round, _prefill_chunk, _spec_decode
from kvcheck.spec.guards import (_context_refusal, _new_request_refusal, _output_refusal,
                                 _phase_refusal, _sid_in_use, refused)
from kvcheck.spec.radix_cache import evict
from kvcheck.spec.sessions import _close_session, _submit_turn
from kvcheck.spec.state import Req, Session, State


@dataclass(frozen=True)
class Action:
    """One operation: its class, the phases of the live request it acts on (() when it
    names none, or a new one), its own guard and its effect."""
    op: type
    acts_on: tuple
    check: Callable
    """(s, op) -> why not enabled (None: enabled); (s, op, req) when `acts_on`."""
    effect: Callable[[State, O.Op], str]

    @property
    def name(self) -> str:
        return self.op.name

    def guard(self, s: State, op: O.Op) -> Optional[str]:
        """None when op is enabled in s, else why not (the request's liveness and phase
        first, for an action on a live request)."""
        if not self.acts_on:
            return self.check(s, op)
        req = dict.get(s.reqs, op.rid)      # reads: no copy-on-write
        if req is None:
            return _gone(op.rid)
        return _phase_refusal(req, self.acts_on) or self.check(s, op, req)


def _gone(rid) -> str:
    return f"request {rid} does not exist (never submitted, or already finished)"


def _ok(s: State, op) -> None:
    return None


def _ok_on(s: State, op, req: Req) -> None:
    return None


# -- sessions and new requests ----------------------------------------------------------

def _open_check(s: State, op: O.OpenSession) -> Optional[str]:
    return f"session {op.sid} is already in use" if _sid_in_use(s, op.sid) else None


def _open(s: State, op: O.OpenSession) -> str:
    s.sessions[op.sid] = Session(op.sid)
    return "ok"


def _turn_check(s: State, op: O.SubmitTurn) -> Optional[str]:
    sess = dict.get(s.sessions, op.sid)
    return (_new_request_refusal(s, op.rid, op.new_tokens, op.max_new_tokens, op.priority)
            or _context_refusal(s, len(sess.checkpoint if sess else ()) + len(op.new_tokens),
                                op.max_new_tokens))


def _turn(s: State, op: O.SubmitTurn) -> str:
    out = _submit_turn(s, op)
    _entered(s, s.reqs[op.rid], op.priority)
    return out


def _request_check(s: State, op: O.SubmitRequest) -> Optional[str]:
    return (_new_request_refusal(s, op.rid, op.tokens, op.max_new_tokens, op.priority)
            or _context_refusal(s, len(op.tokens), op.max_new_tokens))


def _request(s: State, op: O.SubmitRequest) -> str:
    s.reqs[op.rid] = Req(op.rid, None, False, False, tuple(op.tokens), [], op.max_new_tokens,
                         logprob_start=resolve_logprob_start(op.logprob_start_len, len(op.tokens)))
    _entered(s, s.reqs[op.rid], op.priority)
    return "ok"


def _close(s: State, op: O.CloseSession) -> str:
    # always enabled: a closing session's close is deferred again (`_close`)
    return _close_session(s, op.sid)


# -- admission and the forward passes ---------------------------------------------------

def _chunked_in_flight(s: State) -> Optional[int]:
    """The chunked request (`Scheduler.chunked_req`): the one request whose prefill is
    part done, or None."""
    return next((r.rid for r in dict.values(s.reqs) if r.phase == "prefill"), None)


def _schedule_check(s: State, op: O.Schedule, req: Req) -> Optional[str]:
    if s.cfg.admission != "pages":
        chunked = _chunked_in_flight(s)
        if chunked is not None:
            return (f"request {chunked} is the chunked request in flight: under "
                    f"config.admission {s.cfg.admission!r} the round continues it first "
                    f"(schedule_round)")
    return mamba_tree.cow_refusal(s, req)


def _schedule_effect(s: State, op: O.Schedule) -> str:
    return _schedule(s, s.reqs[op.rid], op.admit)


def _prefill_chunk_check(s: State, op: O.PrefillChunk, req: Req) -> Optional[str]:
    if s.cfg.admission != "pages":
        return (f"config.admission is {s.cfg.admission!r}: the chunked request continues in "
                f"a prefill round (schedule, schedule_round), sized by its budget")
    return mamba_tree.chunk_refusal(s, req)


def _prefill_chunk_effect(s: State, op: O.PrefillChunk) -> str:
    return _prefill_chunk(s, s.reqs[op.rid])


def _prefill_first(s: State) -> Optional[str]:
    """Under `config.admission` 'reserve' the scheduler's own order: while a chunked request
    is in flight every iteration runs its prefill round, and no decode step starts
    (`get_next_batch_to_run` takes the prefill batch first, 0.5.15 `scheduler.py`
    l.2684-2701, 0.5.23 l.3972-3990; mixed chunks are not modelled). The 'pages' rule
    lets the two interleave."""
    if s.cfg.admission == "pages":
        return None
    chunked = _chunked_in_flight(s)
    return None if chunked is None else \
        f"request {chunked} is the chunked request in flight: its prefill rounds come first"


def _decode_check(s: State, op: O.Decode, req: Req) -> Optional[str]:
    return (("config.spec_enabled is true: decode steps are spec_decode"
             if s.cfg.spec_enabled else None)
            or _prefill_first(s) or _output_refusal(req))


def _decode_effect(s: State, op: O.Decode) -> str:
    return _decode(s, s.reqs[op.rid], op.token)


def _spec_decode_check(s: State, op: O.SpecDecode, req: Req) -> Optional[str]:
    cfg = s.cfg
    return ((None if cfg.spec_enabled else "config.spec_enabled is false")
            or (None if 1 <= op.drafts <= cfg.max_drafts else
                f"drafts must be in [1, config.max_drafts={cfg.max_drafts}], got {op.drafts}")
            or (None if 0 <= op.accepted <= op.drafts else
                f"accepted must be in [0, drafts={op.drafts}], got {op.accepted}")
            or _prefill_first(s) or _output_refusal(req)
            or (None if req.committed + 2 * (op.drafts + 1) <= cfg.max_context_len else
                f"request {op.rid}'s drafts would pass config.max_context_len"))


def _spec_decode_effect(s: State, op: O.SpecDecode) -> str:
    return _spec_decode(s, s.reqs[op.rid], op.drafts, op.accepted, op.token)


def _schedule_round_check(s: State, op: O.ScheduleRound) -> Optional[str]:
    """Every request named is live and waiting, except that a round with a chunked
    request in flight continues it first (`add_chunked_req` before the waiting queue).
    With SWA or Mamba pools a round is one waiting request (their shared round budgets
    and the chunk's Mamba copy are not modelled in a round)."""
    if len(op.rids) > 1 and s.cfg.hybrid:
        return "a round of several requests is modelled without SWA and Mamba pools"
    chunked = [r.rid for r in dict.values(s.reqs) if r.phase == "prefill"]
    if chunked and s.cfg.hybrid:
        return "with SWA or Mamba pools the chunked request continues by prefill_chunk"
    for i, rid in enumerate(op.rids):
        req = dict.get(s.reqs, rid)
        if req is None:
            return _gone(rid)
        if i == 0 and chunked:
            if rid not in chunked:
                return (f"request {chunked[0]} is the chunked request in flight: the round "
                        f"continues it first")
            if op.limit == 0 and s.cfg.admission != "pages":
                return (f"config.admission is {s.cfg.admission!r}: add_chunked_req always "
                        f"continues the chunked request (limit must be >= 1)")
            why = mamba_tree.chunk_refusal(s, req)
        else:
            why = _phase_refusal(req, ("queued",)) or mamba_tree.cow_refusal(s, req)
        if why:
            return why
    return _policy_order_refusal(s, op.rids)


def _policy_order_refusal(s: State, rids) -> Optional[str]:
    """Under priority scheduling `calc_priority` sorts the waiting queue before the round
    (`calc_priority_order`), so the waiting requests a round names come in that order;
    otherwise the order is the policy's, which kvcheck leaves open (FCFS keeps the queue's,
    the cache-aware policies sort by their matches)."""
    if not s.cfg.enable_priority_scheduling:
        return None
    waiting = [s.reqs[r] for r in rids if s.reqs[r].phase == "queued"]
    order = calc_priority_order(waiting)
    if order == waiting:
        return None
    first, second = next((a, b) for a, b in zip(order, waiting) if a is not b)
    return (f"under priority scheduling calc_priority puts request {first.rid} (priority "
            f"{first.priority}, entry {first.entered}) before request {second.rid} (priority "
            f"{second.priority}, entry {second.entered})")


def _schedule_round_effect(s: State, op: O.ScheduleRound) -> str:
    return _schedule_round(s, [s.reqs[r] for r in op.rids], op.limit)


def _decode_round_check(s: State, op: O.DecodeRound) -> Optional[str]:
    """Every request named is live and decoding, below its max_new_tokens; without
    speculative decoding and hybrid pools (the round's steps for those are not modelled)."""
    if s.cfg.spec_enabled:
        return "config.spec_enabled is true: decode steps are spec_decode"
    if s.cfg.hybrid:
        return "decode_round is modelled without SWA and Mamba pools"
    why = _prefill_first(s)
    if why:
        return why
    for rid in op.rids:
        req = dict.get(s.reqs, rid)
        if req is None:
            return _gone(rid)
        why = _phase_refusal(req, ("decode",)) or _output_refusal(req)
        if why:
            return why
    return None


def _decode_round_effect(s: State, op: O.DecodeRound) -> str:
    return _decode_round(s, [s.reqs[r] for r in op.rids])


# -- finishing, aborting, retracting, evicting ------------------------------------------

def _finish_effect(s: State, op: O.Finish) -> str:
    _finish(s, s.reqs[op.rid])
    return "ok"


def _leave_queue(s: State, op) -> str:
    _abort_queued(s, s.reqs[op.rid])
    return "ok"


def _queue_reject_check(s: State, op: O.QueueReject, req: Req) -> Optional[str]:
    # at the queue door: not matched since it (re-)entered the queue (over-approximated:
    # any time before its next schedule, not only at the door)
    return (f"request {op.rid} has matched a prefix since it entered the queue"
            if req.last_node is not None else None)


def _pre_abort_check(s: State, op: O.PreAbort, req: Req) -> Optional[str]:
    # before matching: to_finish is set when a request is created or re-queued,
    # never on one that already matched (a restored request holds the slot's row)
    return ((f"request {op.rid} is already marked to finish" if req.to_finish else None)
            or (f"request {op.rid} has already matched a prefix" if req.last_node is not None
                else None))


def _pre_abort_effect(s: State, op: O.PreAbort) -> str:
    _pre_abort(s.reqs[op.rid])
    return "ok"


def _abort_running_effect(s: State, op: O.AbortRunning) -> str:
    _abort_running(s, s.reqs[op.rid])
    return "ok"


def _retract_effect(s: State, op: O.Retract) -> str:
    req = s.reqs[op.rid]
    _retract(s, req)
    enter_waiting_queue(s, req)
    return "ok"


def _evict_check(s: State, op: O.Evict) -> Optional[str]:
    return None if op.num_tokens >= 1 else "evict needs num_tokens >= 1"


def _evict_effect(s: State, op: O.Evict) -> str:
    evict(s, op.num_tokens)
    return "ok"


_TABLE = (
    # operation, the phases of its live request (acts_on), guard, effect
    Action(O.OpenSession, (), _open_check, _open),
    Action(O.SubmitTurn, (), _turn_check, _turn),
    Action(O.SubmitRequest, (), _request_check, _request),
    Action(O.Schedule, ("queued",), _schedule_check, _schedule_effect),
    Action(O.PrefillChunk, ("prefill",), _prefill_chunk_check, _prefill_chunk_effect),
    Action(O.Decode, ("decode",), _decode_check, _decode_effect),
    Action(O.SpecDecode, ("decode",), _spec_decode_check, _spec_decode_effect),
    Action(O.Finish, ("decode",), _ok_on, _finish_effect),
    Action(O.AbortQueued, ("queued",), _ok_on, _leave_queue),
    Action(O.PreAbort, ("queued",), _pre_abort_check, _pre_abort_effect),
    Action(O.AbortRunning, ("prefill", "decode"), _ok_on, _abort_running_effect),
    Action(O.Retract, ("decode",), lambda s, op, req: _prefill_first(s), _retract_effect),
    Action(O.CloseSession, (), _ok, _close),
    Action(O.Evict, (), _evict_check, _evict_effect),
    Action(O.QueueReject, ("queued",), _queue_reject_check, _leave_queue),
    Action(O.ScheduleRound, (), _schedule_round_check, _schedule_round_effect),
    Action(O.DecodeRound, (), _decode_round_check, _decode_round_effect),
)

ACTIONS: dict[str, Action] = {a.name: a for a in _TABLE}
"""op name -> its Action, in OP_NAMES order."""
assert tuple(ACTIONS) == O.OP_NAMES, "spec/actions.py needs one Action per operation of spec/ops.py"

BY_TYPE: dict = {a.op: a for a in _TABLE}
"""op class -> its Action (the operations are final classes: the guards and `step`
look an op up by its exact type)."""


def refusal(s: State, op: O.Op) -> Optional[str]:
    """The guard of each operation (when upstream's scheduler could issue it, or a client
    send it: `refused`): None when op is enabled in s, else the reason its action's guard
    refuses it, naming the part that fails (`Action.guard`, by type: the explorer asks
    about twenty a state)."""
    if refused(s, op):
        return None
    action = BY_TYPE.get(type(op))
    if action is not None:
        return action.guard(s, op)
    rid = getattr(op, "rid", None)
    if rid is None or dict.get(s.reqs, rid) is None:
        return _gone(rid)
    return f"unknown operation {op.name!r}"


def enabled(s: State, op: O.Op) -> bool:
    """Whether the guard lets op run in s (see `refusal` for why not)."""
    return refusal(s, op) is None
