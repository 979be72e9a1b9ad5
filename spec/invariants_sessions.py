"""Invariants of streaming sessions: one turn in flight, and a session's slot and borrowed row
alive while a turn uses them (I5, I20, I22, I24)."""
from __future__ import annotations

from kvcheck.spec.abstract import AbstractState
from kvcheck.spec.config import Config
from kvcheck.spec.invariants_base import _req, _slot, _v, invariant


@invariant("I5", "a queued request holds a row only as its session slot's borrower")
def queued_row(s: AbstractState, cfg: Config):
    slots = {t.sid: t for t in s.slots}
    out = []
    for r in s.reqs:
        if r.phase == "queued" and r.row is not None:
            sid = r.anchor[1] if r.anchor and r.anchor[0] == "virtual" else None
            t = slots.get(sid)
            if t is None or t.row != r.row:
                out.append(_v(queued_row, f"queued request holds row {r.row} that no slot of its "
                              f"session lends it (anchor {r.anchor})", _req(r)))
    return out


@invariant("I20", "at most one in-flight turn per session, and _inflight says so")
def single_inflight(s: AbstractState, cfg: Config):
    out = []
    live: dict = {}
    for r in s.reqs:
        if r.session is not None and r.streaming and not r.rejected:
            live.setdefault(r.session, []).append(r.rid)
    for x in s.sessions:
        turns = live.get(x.sid, [])
        if len(turns) > 1:
            out.append(_v(single_inflight, f"{len(turns)} turns in flight: reqs {turns}",
                          f"session {x.sid}"))
        if x.inflight != bool(turns):
            what = (f"turn req {turns[0]} is in flight" if turns else "no turn is in flight")
            out.append(_v(single_inflight, f"_inflight={x.inflight} but {what}", f"session {x.sid}"))
    return out


@invariant("I22", "a running turn's session and borrowed slot are never released under it")
def borrowed_slot_alive(s: AbstractState, cfg: Config):
    slots = {t.sid: t for t in s.slots}
    sessions = {x.sid for x in s.sessions}
    out = []
    for r in s.reqs:
        if r.anchor and r.anchor[0] == "virtual" and r.row is not None:
            t = slots.get(r.anchor[1])
            if t is None or t.row != r.row:
                out.append(_v(borrowed_slot_alive, f"borrows row {r.row} of session {r.anchor[1]}'s "
                              f"slot, which {'is gone' if t is None else f'holds row {t.row}'}", _req(r)))
        if r.session is not None and r.streaming and not r.rejected and r.session not in sessions:
            out.append(_v(borrowed_slot_alive, f"session {r.session} was closed while this turn "
                          "is in flight", _req(r)))
    return out


@invariant("I24", "a slot present holds KV")
def slot_holds_kv(s: AbstractState, cfg: Config):
    return [_v(slot_holds_kv, "slot exists with req_pool_idx None", _slot(t)) for t in s.slots if t.row is None]
