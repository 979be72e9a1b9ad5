"""What the guards are made of: the client requests upstream turns down unchanged
(`refused`) and the parts the operations' guards share (a new request's, the context
length, a request's phase, its output). Each operation's own guard is its action's
(spec/actions.py, `refusal`, `enabled`).
"""
from __future__ import annotations

from typing import Optional

from kvcheck.spec import ops as O
from kvcheck.spec.state import State


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
