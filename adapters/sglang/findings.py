"""Recorded upstream findings (docs/upstream-findings.md) as operation triggers.

A differential run against a release normally takes the recorded findings as known
behaviour (`--accept U1,U2,...`, `Config.accept`): the spec follows upstream on those
paths, so the run still drives them and reports what else goes wrong there, including
a recorded finding left out of the list. Only a run without `--accept` (the fixed
behaviour everywhere) leaves out the triggers of the release's recorded findings, which
would otherwise be rediscovered in almost every sequence; each finding stays checked by
its trace under stateful_tests/upstream/. Each trigger is a predicate on the spec state
and the next operation.
"""
from __future__ import annotations

from typing import Optional

from kvcheck.spec import ops as O
from kvcheck.spec.model import preempted_by, queued_borrow_holds_mamba, refusal, step

RELEASES = {"0.5.14": ("U1", "U2", "U3", "U8", "M2"),
            "0.5.15": ("U1", "U2", "U3", "U8", "U9", "M2"),
            "0.5.16": ("U1", "U2", "U3", "U8", "U9", "M2"),
            "0.5.17": ("U1", "U2", "U3", "U8", "U9", "M2"),
            "0.5.18": ("U1", "U2", "U3", "U8", "U9", "M2"),
            "0.5.19": ("U1", "U2", "U3", "U9", "M2"),
            "0.5.22": ("U1", "U2", "U6", "U7", "U9", "M2"),
            "0.5.23": ("U1", "U2", "U6", "U7", "U9", "M2")}
"""release -> findings present in it (0.5.14 and 0.5.16-0.5.19 as 0.5.15, 0.5.22 as 0.5.23: their
copies of those releases' traces, in stateful_tests/upstream/, all as expected there; U3 is
fixed in 0.5.22; U6 is new there, brought by that fix; U7: the borrow era's slot taken at
the first turn's allocation, scheduling rounds only; U8: its wrapper-era counterpart,
0.5.14-0.5.18 (the same abort branch), where 0.5.19-0.5.21's shared record asserts
`kv is slot.kv` instead; U9: priority scheduling, 0.5.15-0.5.19 and 0.5.22+ (0.5.14 sizes
a preemption by another rule and is not driven with priority scheduling); U4 is withdrawn: it is the
wrong-token consequence of U1/U2; M2: hybrid SSM models only)."""


def _streaming_turn(s, rid) -> bool:
    r = s.reqs.get(rid)
    return r is not None and r.session is not None and not r.rejected


def _queued_stub_of_busy_session(s, rid) -> bool:
    r = s.reqs.get(rid)
    if r is None or r.session is None or not r.rejected:
        return False
    sess = s.sessions.get(r.session)
    return sess is not None and sess.inflight_rid not in (None, rid)


def _stub_after_first_turn(s, op, era: str, finishes: bool) -> bool:
    """A prefill round of `era` that names a turn of a session with no slot (one whose first
    sampled token ends it, when `finishes`) and, after it, that session's pre-aborted stub
    (still attached: with no slot its match does not detach it)."""
    if s.cfg.era != era or not isinstance(op, O.ScheduleRound):
        return False
    first = {}
    for rid in op.rids:
        r = s.reqs.get(rid)
        if r is None or r.session is None or r.session in s.slots or r.phase != "queued":
            continue
        if r.to_finish and r.session in first:
            return True
        if not r.to_finish and (not finishes or len(r.output) + 1 >= r.max_new_tokens):
            first.setdefault(r.session, rid)
    return False


def _stub_in_first_round(s, op) -> bool:
    """U7's trigger: both admitted, the turn's `take` makes the slot, the stub's `take`
    then meets it."""
    return _stub_after_first_turn(s, op, "borrow", finishes=False)


def _stub_in_finishing_first_round(s, op) -> bool:
    """U8's trigger: the wrapper era's round where the turn finishes at its prefill and
    makes the slot, whose stub's abort then releases it."""
    return _stub_after_first_turn(s, op, "wrapper", finishes=True)


def _decode_round_retracts_turn(s, op) -> bool:
    """A decode round whose `retract_decode` retracts (or aborts) a streaming turn: U2's
    retract path."""
    if not isinstance(op, O.DecodeRound) or not any(_streaming_turn(s, r) for r in op.rids):
        return False
    if refusal(s, op) is not None:
        return False
    after, _ = step(s, op)
    return any(_streaming_turn(s, r) and (r not in after.reqs or after.reqs[r].is_retracted)
               for r in op.rids)


def _round_preempts_turn(s, op) -> bool:
    """A prefill round whose priority preemption (`preempt_to_schedule` -> `release_req`)
    takes a streaming turn: U2's retract path."""
    return any(_streaming_turn(s, rid) for rid in preempted_by(s, op))


def _trigger(s, op) -> Optional[str]:
    if isinstance(op, O.SubmitTurn):
        sess = s.sessions.get(op.sid)
        if sess is not None and sess.inflight_rid is not None and not sess.close_pending:
            return "U1"     # H3: the rejected stub's abort_req clears another turn's _inflight
    if isinstance(op, O.Retract) and _streaming_turn(s, op.rid):
        return "U2"         # H4: retract runs finish_req (checkpoint advances, _inflight cleared)
    if _decode_round_retracts_turn(s, op) or _round_preempts_turn(s, op):
        return "U2"
    if _stub_in_first_round(s, op):
        return "U7"         # the stub's take meets the slot its session's turn just took
    if _stub_in_finishing_first_round(s, op):
        return "U8"         # the stub's abort releases the slot its session's turn just made
    if isinstance(op, O.AbortQueued) and op.rid in s.reqs and \
            queued_borrow_holds_mamba(s, s.reqs[op.rid]):
        return "M2"         # the queued turn on its slot's Mamba record is finished
    if isinstance(op, (O.AbortQueued, O.QueueReject)) and _streaming_turn(s, op.rid):
        return "U3"         # H5: a queued abort makes no session call (_inflight stays set)
    if isinstance(op, (O.AbortQueued, O.QueueReject)) and _queued_stub_of_busy_session(s, op.rid):
        return "U6"         # 0.5.23 _release_aborted_request: the stub's abort_req() clears it
    return None


def known_trigger(version: Optional[str], accept=()):
    """A skip predicate (state, op) -> finding id or None, for the machine: the findings
    recorded for this release, for a run that accepts none (None with `--accept`)."""
    present = set(RELEASES.get(version or "", ()))
    if accept or not present:
        return None

    def skip(s, op):
        f = _trigger(s, op)
        return f if f in present else None
    return skip


def leaves_one_turn_per_session(s, op) -> Optional[str]:
    """Whether op would end "one live turn per session, which its session outlives" on a
    spec that accepts U1, U2, U3 or U6 (each clears `_inflight` while a turn of the session
    still lives): a turn submitted, or the session closed, while an earlier turn of it is
    queued, running or retracted and the session is not in flight; a stub whose
    `abort_req()` clears a running turn's mark (U1 at its schedule, U6 at its queue drop)
    while a close waits for that turn; a prefill round that preempts a streaming turn
    (U2: its `finish_req` clears the mark while the turn waits again). Past these the spec soon breaks an invariant
    outside the accepted findings' model (I4, I22: two turns on one row, a session
    released under its turn) and the lockstep stops comparing (`checker.Beyond`); the
    walk leaves them out of one sequence in two (`walk.draw_findings`)."""
    if isinstance(op, (O.SubmitTurn, O.CloseSession)):
        sess = s.sessions.get(op.sid)
        if sess is None or sess.inflight_rid is not None:
            return None
        for r in dict.values(s.reqs):
            if r.session == op.sid and not r.rejected:
                return "one turn per session"
        return None
    if isinstance(op, (O.Schedule, O.ScheduleRound, O.AbortQueued, O.QueueReject)) and \
            any(_queued_stub_of_busy_session(s, rid) and s.sessions[s.reqs[rid].session].close_pending
                for rid in O.acting_rids(op)):
        return "one turn per session"
    if "U2" in s.cfg.accept and _round_preempts_turn(s, op):
        return "one turn per session"   # U2: the preempted turn's finish_req clears _inflight
    return None
