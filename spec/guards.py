"""The guards: when upstream's scheduler could issue an operation, or a client send it
(`refusal`, `enabled`), and the client requests upstream turns down unchanged (`refused`).
"""
from __future__ import annotations

from typing import Optional

from kvcheck.spec import mamba_tree, ops as O
from kvcheck.spec.state import Req, State


def _sid_in_use(s: State, sid: int) -> bool:
    return sid in s.sessions or sid in s.slots or any(r.session == sid for r in dict.values(s.reqs))


def _fits_context(s: State, input_len: int, max_new: int) -> bool:
    return input_len + max_new + 2 * (s.cfg.max_drafts + 1) + 1 <= s.cfg.max_context_len


CLIENT_ABORTS = (O.AbortQueued, O.PreAbort, O.AbortRunning)
"""The three phases of upstream's one client abort (`Scheduler.abort_request`)."""


def refused(s: State, op: O.Op) -> Optional[str]:
    """Upstream's answer to a client request it receives but turns down, changing no
    state: the outcome "refused", or None when op is not one of these. Opening a session
    id already open (`SessionController.open`: "already exist, cannot open", success
    False); closing one that is not open (`close`: "does not exist, cannot delete");
    aborting a request that is not live (`abort_request` finds no such rid: it finished
    or never came). A turn for a session that is not open is answered with an aborted
    stub instead (`_submit_turn`)."""
    kind = _REFUSABLE.get(type(op))
    if kind is None:
        return None
    if kind == "open":
        return "refused" if op.sid in s.sessions else None
    if kind == "close":
        return "refused" if op.sid not in s.sessions else None
    return "refused" if op.rid not in s.reqs else None


_REFUSABLE = {O.OpenSession: "open", O.CloseSession: "close",
              **{t: "abort" for t in CLIENT_ABORTS}}
"""The operations `refused` can answer, by exact type (the operations are final classes)."""


def refusal(s: State, op: O.Op) -> Optional[str]:
    """The guard of each operation (when upstream's scheduler could issue it, or a client
    send it: `refused`): None when op is enabled in s, else the reason the guard refuses
    it, naming the part that fails. One guard per operation (`_GUARDS`, by type: the
    explorer asks about twenty a state); an operation on a request first needs it live."""
    if refused(s, op):
        return None
    guard = _GUARDS.get(type(op))
    if guard is not None and not guard[1]:
        return guard[0](s, op)
    rid = getattr(op, "rid", None)
    req = dict.get(s.reqs, rid) if rid is not None else None      # reads: no copy-on-write
    if req is None:
        return f"request {rid} does not exist (never submitted, or already finished)"
    if guard is None:
        return f"unknown operation {op.name!r}"
    return guard[0](s, op, req)


def _open_refusal(s: State, op: O.OpenSession) -> Optional[str]:
    return f"session {op.sid} is already in use" if _sid_in_use(s, op.sid) else None


def _turn_refusal(s: State, op: O.SubmitTurn) -> Optional[str]:
    sess = dict.get(s.sessions, op.sid)
    return (_new_request_refusal(s, op.rid, op.new_tokens, op.max_new_tokens, op.priority)
            or _context_refusal(s, len(sess.checkpoint if sess else ()) + len(op.new_tokens),
                                op.max_new_tokens))


def _request_refusal(s: State, op: O.SubmitRequest) -> Optional[str]:
    return (_new_request_refusal(s, op.rid, op.tokens, op.max_new_tokens, op.priority)
            or _context_refusal(s, len(op.tokens), op.max_new_tokens))


def _close_refusal(s: State, op: O.CloseSession) -> Optional[str]:
    return None                 # a closing session's close is deferred again (`_close`)


def _evict_refusal(s: State, op: O.Evict) -> Optional[str]:
    return None if op.num_tokens >= 1 else "evict needs num_tokens >= 1"


def _schedule_refusal(s: State, op: O.Schedule, req: Req) -> Optional[str]:
    return _phase_refusal(req, ("queued",)) or mamba_tree.cow_refusal(s, req)


def _abort_queued_refusal(s: State, op: O.AbortQueued, req: Req) -> Optional[str]:
    return _phase_refusal(req, ("queued",))


def _queue_reject_refusal(s: State, op: O.QueueReject, req: Req) -> Optional[str]:
    # at the queue door: not matched since it (re-)entered the queue (over-approximated:
    # any time before its next schedule, not only at the door)
    return (_phase_refusal(req, ("queued",))
            or (f"request {op.rid} has matched a prefix since it entered the queue"
                if req.last_node is not None else None))


def _pre_abort_refusal(s: State, op: O.PreAbort, req: Req) -> Optional[str]:
    # before matching: to_finish is set when a request is created or re-queued,
    # never on one that already matched (a restored request holds the slot's row)
    return (_phase_refusal(req, ("queued",))
            or (f"request {op.rid} is already marked to finish" if req.to_finish else None)
            or (f"request {op.rid} has already matched a prefix" if req.last_node is not None
                else None))


def _prefill_chunk_refusal(s: State, op: O.PrefillChunk, req: Req) -> Optional[str]:
    return _phase_refusal(req, ("prefill",)) or mamba_tree.chunk_refusal(s, req)


def _abort_running_refusal(s: State, op: O.AbortRunning, req: Req) -> Optional[str]:
    return _phase_refusal(req, ("prefill", "decode"))


def _decode_refusal(s: State, op: O.Decode, req: Req) -> Optional[str]:
    return (_phase_refusal(req, ("decode",))
            or ("config.spec_enabled is true: decode steps are spec_decode"
                if s.cfg.spec_enabled else None)
            or _output_refusal(req))


def _spec_decode_refusal(s: State, op: O.SpecDecode, req: Req) -> Optional[str]:
    cfg = s.cfg
    return (_phase_refusal(req, ("decode",))
            or (None if cfg.spec_enabled else "config.spec_enabled is false")
            or (None if 1 <= op.drafts <= cfg.max_drafts else
                f"drafts must be in [1, config.max_drafts={cfg.max_drafts}], got {op.drafts}")
            or (None if 0 <= op.accepted <= op.drafts else
                f"accepted must be in [0, drafts={op.drafts}], got {op.accepted}")
            or _output_refusal(req)
            or (None if req.committed + 2 * (op.drafts + 1) <= cfg.max_context_len else
                f"request {op.rid}'s drafts would pass config.max_context_len"))


def _schedule_round_refusal(s: State, op: O.ScheduleRound) -> Optional[str]:
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
            return f"request {rid} does not exist (never submitted, or already finished)"
        if i == 0 and chunked:
            if rid not in chunked:
                return (f"request {chunked[0]} is the chunked request in flight: the round "
                        f"continues it first")
            why = mamba_tree.chunk_refusal(s, req)
        else:
            why = _phase_refusal(req, ("queued",)) or mamba_tree.cow_refusal(s, req)
        if why:
            return why
    return None


def _decode_round_refusal(s: State, op: O.DecodeRound) -> Optional[str]:
    """Every request named is live and decoding, below its max_new_tokens; without
    speculative decoding and hybrid pools (the round's steps for those are not modelled)."""
    if s.cfg.spec_enabled:
        return "config.spec_enabled is true: decode steps are spec_decode"
    if s.cfg.hybrid:
        return "decode_round is modelled without SWA and Mamba pools"
    for rid in op.rids:
        req = dict.get(s.reqs, rid)
        if req is None:
            return f"request {rid} does not exist (never submitted, or already finished)"
        why = _phase_refusal(req, ("decode",)) or _output_refusal(req)
        if why:
            return why
    return None


def _decoding_refusal(s: State, op, req: Req) -> Optional[str]:
    return _phase_refusal(req, ("decode",))


_GUARDS = {
    # operation -> (guard, whether it acts on a live request: then guard(s, op, req))
    O.OpenSession: (_open_refusal, False), O.SubmitTurn: (_turn_refusal, False),
    O.SubmitRequest: (_request_refusal, False), O.CloseSession: (_close_refusal, False),
    O.Evict: (_evict_refusal, False),
    O.ScheduleRound: (_schedule_round_refusal, False),
    O.DecodeRound: (_decode_round_refusal, False),
    O.Schedule: (_schedule_refusal, True), O.AbortQueued: (_abort_queued_refusal, True),
    O.QueueReject: (_queue_reject_refusal, True), O.PreAbort: (_pre_abort_refusal, True),
    O.PrefillChunk: (_prefill_chunk_refusal, True),
    O.AbortRunning: (_abort_running_refusal, True), O.Decode: (_decode_refusal, True),
    O.SpecDecode: (_spec_decode_refusal, True), O.Finish: (_decoding_refusal, True),
    O.Retract: (_decoding_refusal, True),
}


def _new_request_refusal(s: State, rid: int, tokens, max_new: int, priority: int) -> Optional[str]:
    if rid in s.reqs:
        return f"request {rid} already exists"
    if priority and not s.cfg.enable_priority_scheduling:
        return ("a priority needs config.enable_priority_scheduling (without it upstream "
                "aborts the request as it enters the queue: queue_reject)")
    if len(tokens) < 1:
        return "a request needs at least one token"
    return None if max_new >= 1 else "max_new_tokens must be >= 1"


def _context_refusal(s: State, input_len: int, max_new: int) -> Optional[str]:
    if _fits_context(s, input_len, max_new):
        return None
    return (f"{input_len} input + {max_new} new tokens (+ draft room) do not fit "
            f"config.max_context_len={s.cfg.max_context_len}")


def _phase_refusal(req, phases: tuple) -> Optional[str]:
    if req.phase in phases:
        return None
    return f"request {req.rid} is {req.phase}, this operation needs it {' or '.join(phases)}"


def _output_refusal(req) -> Optional[str]:
    if len(req.output) < req.max_new_tokens:
        return None
    return f"request {req.rid} already has max_new_tokens={req.max_new_tokens} output tokens"


def enabled(s: State, op: O.Op) -> bool:
    """Whether the guard lets op run in s (see `refusal` for why not)."""
    return refusal(s, op) is None
