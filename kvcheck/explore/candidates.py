"""The operations tried in a state: drawn from the scope's bounded argument domains and
filtered by the spec's own guard (`kvcheck.spec.model.enabled`)."""
from __future__ import annotations

import functools
import itertools

from kvcheck.spec import model as M
from kvcheck.spec import ops as O
from kvcheck.spec.actions import ACTIONS
from kvcheck.spec.state import State
from kvcheck.explore.scope import Scope

# ---------------------------------------------------------------------------
# enabled operations over the scope's domains
# ---------------------------------------------------------------------------

def _fresh_rid(s: State, taken: set) -> int:
    rid = 1
    while rid in taken:
        rid += 1
    return rid


_OP_TABLES: dict = {}


def _ops_of(sc: Scope, key: tuple) -> tuple:
    """The scope's candidate operations for `key` (("open", sid), ("close", sid),
    ("turn", sid, rid), ("plain", rid), ("req", rid), ("evict",), `_round_keys`'), built
    once per scope:
    operations are immutable values, and building them was a tenth of the guards' cost."""
    got = _OP_TABLES.get(id(sc))
    if got is None or got[0] is not sc:
        got = _OP_TABLES[id(sc)] = (sc, {})
    table = got[1]
    ops = table.get(key)
    if ops is None:
        ops = table[key] = _build_ops(sc, key)
    return ops


def _build_ops(sc: Scope, key: tuple) -> tuple:
    kind = key[0]
    if kind == "open":
        return (O.OpenSession(key[1]),)
    if kind == "close":
        return (O.CloseSession(key[1]),)
    if kind == "turn":
        return tuple(O.SubmitTurn(key[1], key[2], tuple(toks), mn, priority=pr)
                     for toks in sc.turns for mn in sc.max_new for pr in sc.priorities)
    if kind == "plain":
        return tuple(O.SubmitRequest(key[1], tuple(toks), mn, priority=pr)
                     for toks in sc.prompts for mn in sc.max_new for pr in sc.priorities)
    if kind == "evict":
        return tuple(O.Evict(n) for n in sc.evict)
    if kind == "prefill_round":       # key[1]: the chunked request (or None), key[2]: waiting
        head = () if key[1] is None else (key[1],)
        return tuple(O.ScheduleRound(head + order) for order in itertools.permutations(key[2]))
    if kind == "decode_round":
        return tuple(O.DecodeRound(order) for order in itertools.permutations(key[1]))
    rid = key[1]
    return tuple(op for name in _REQ_OPS for op in _REQ_ARGS[name](sc, rid))


def _schedule_args(sc: Scope, rid: int) -> tuple:
    if sc.reject:
        return (O.Schedule(rid, True), O.Schedule(rid, False))
    return (O.Schedule(rid, True),)


def _decode_args(sc: Scope, rid: int) -> tuple:
    return () if sc.cfg.spec_enabled else tuple(O.Decode(rid, t) for t in sc.decode_tokens)


def _spec_decode_args(sc: Scope, rid: int) -> tuple:
    cfg = sc.cfg
    if not cfg.spec_enabled:
        return ()
    return tuple(O.SpecDecode(rid, d, a, t) for d in range(1, cfg.max_drafts + 1)
                 for a in range(d + 1) for t in sc.decode_tokens)


def _rid_only(sc: Scope, rid: int, name: str) -> tuple:
    return (ACTIONS[name].op(rid),)


_REQ_ARGS: dict = {
    "schedule": _schedule_args,
    "decode": _decode_args,
    "spec_decode": _spec_decode_args,
}
"""The scope's argument domains of the actions on a live request that take more than
its rid (any other one of them: the rid alone)."""
for _name, _action in ACTIONS.items():
    if _action.acts_on and _name not in _REQ_ARGS:
        _REQ_ARGS[_name] = functools.partial(_rid_only, name=_name)
assert set(_REQ_ARGS) == {n for n, a in ACTIONS.items() if a.acts_on}, \
    "candidates._REQ_ARGS: a domain for an operation that acts on no live request"

_TOKEN_DOMAINS = ("decode", "spec_decode")
"""Tried after the others on a request (one candidate per token, and per draft count)."""
_REQ_OPS = tuple([n for n, a in ACTIONS.items() if a.acts_on and n not in _TOKEN_DOMAINS]
                 + [n for n in ACTIONS if n in _TOKEN_DOMAINS])
"""The actions on a live request (`acts_on`), in the order each request's candidates are
tried: ACTIONS' order, the decode steps last."""


def candidate_ops(s: State, sc: Scope, symmetric: bool = True) -> list:
    """Every operation of the scope's domains that `kvcheck.spec.model.enabled` allows here.
    With symmetry, a new request takes the lowest free rid and a new session the lowest
    unused sid (any other choice gives an isomorphic state); without, every one."""
    enabled, refused = M.enabled, M.refused
    ops: list = []
    live = len(s.reqs)
    s_reqs, s_sessions = dict(s.reqs), dict(s.sessions)     # reads: no copy-on-write
    sids = range(1, sc.sessions + 1)
    for sid in sids:        # a refused request (M.refused) changes nothing: not explored
        op, = _ops_of(sc, ("open", sid))
        if enabled(s, op) and not refused(s, op):
            ops.append(op)
            if symmetric:
                break
    for sid in sids:
        op, = _ops_of(sc, ("close", sid))
        if enabled(s, op) and not refused(s, op):
            ops.append(op)
    if live < sc.max_live:
        taken = set(s_reqs) | {x.inflight_rid for x in s_sessions.values()}
        if symmetric:
            new_rids = [_fresh_rid(s, taken)]
        else:
            new_rids = [r for r in range(1, sc.max_live + 1) if r not in taken]
        for rid in new_rids:
            for sid in sids:
                if sid in s_sessions:
                    ops.extend(op for op in _ops_of(sc, ("turn", sid, rid)) if enabled(s, op))
            nplain = sum(1 for r in s_reqs.values() if not r.streaming)
            if nplain < sc.plain:
                ops.extend(op for op in _ops_of(sc, ("plain", rid)) if enabled(s, op))
    for rid in sorted(s_reqs):
        ops.extend(op for op in _ops_of(sc, ("req", rid)) if enabled(s, op))
    ops.extend(op for op in _ops_of(sc, ("evict",)) if enabled(s, op))
    if sc.rounds:
        ops.extend(op for key in _round_keys(s_reqs) for op in _ops_of(sc, key) if enabled(s, op))
    return ops


def _round_keys(reqs: dict) -> list:
    """The rounds worth trying here, as `_ops_of` keys: a prefill round over the waiting
    requests (after the chunked one, if any) when it names two or more, in every order
    (the policy's); a decode round over two or more decoding requests, in every batch
    order. A round of one is the scope's `schedule`."""
    waiting = tuple(sorted(r for r, x in reqs.items() if x.phase == "queued"))
    chunked = sorted(r for r, x in reqs.items() if x.phase == "prefill")
    decoding = tuple(sorted(r for r, x in reqs.items() if x.phase == "decode"))
    keys = []
    if len(waiting) + len(chunked[:1]) >= 2:
        keys.append(("prefill_round", chunked[0] if chunked else None, waiting))
    if len(decoding) >= 2:
        keys.append(("decode_round", decoding))
    return keys
