"""Recorded upstream findings (docs/upstream-findings.md) as operation triggers.

A differential run against a release that has a recorded finding would rediscover it
in almost every sequence and hide anything new. The machine therefore skips an
operation that would trigger a recorded finding on that release; the finding itself
stays checked by its trace under stateful_tests/upstream/ (expected to fail exactly
there). Each trigger is a predicate on the spec state and the next operation.
"""
from __future__ import annotations

from typing import Optional

from spec import ops as O

# release -> finding ids present in it
RELEASES = {"0.5.15": ("U1", "U2", "U3", "U4"),
            "0.5.23": ("U1", "U2", "U4")}     # H5 (U3) is fixed in 0.5.23


def _streaming_turn(s, rid) -> bool:
    r = s.reqs.get(rid)
    return r is not None and r.session is not None and not r.rejected


def _trigger(s, op) -> Optional[str]:
    if isinstance(op, O.SubmitTurn):
        sess = s.sessions.get(op.sid)
        if sess is not None and sess.inflight_rid is not None and not sess.close_pending:
            return "U1"     # H3: the rejected stub's abort_req clears another turn's _inflight
    if isinstance(op, O.SubmitTurn) and any(
            r.streaming and not r.rejected and r.session is None
            for r in s.reqs.values()):
        return "U4"         # create_req rewrites the token array a detached live turn shares
    if isinstance(op, O.Retract) and _streaming_turn(s, op.rid):
        return "U2"         # H4: retract runs finish_req (checkpoint advances, _inflight cleared)
    if isinstance(op, O.AbortQueued) and _streaming_turn(s, op.rid):
        return "U3"         # H5: a queued abort makes no session call (_inflight stays set)
    return None


def known_trigger(version: Optional[str]):
    """A skip predicate (state, op) -> finding id or None, for the machine."""
    present = set(RELEASES.get(version or "", ()))
    if not present:
        return None

    def skip(s, op):
        f = _trigger(s, op)
        return f if f in present else None
    return skip
