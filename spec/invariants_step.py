"""Step invariants, on (before, op, outcome, after): what one state cannot show (I10, I16,
I25, I28)."""
from __future__ import annotations

from kvcheck.spec import ops as O
from kvcheck.spec.abstract import AbstractState
from kvcheck.spec.invariants_base import _req, _slot, _v, invariant


def _publishes_chunk(op, t, u, a: AbstractState, cfg) -> bool:
    """Borrow era only: a first turn's chunk checkpoint publishes the prompt through the
    slot it runs on (`try_checkpoint` while `publishes_prompt`), so the slot's protected
    prefix grows and its lock moves deeper. Never happens in the wrapper era, where a
    streaming chunk checkpoint is a snapshot."""
    if cfg is None or cfg.era != "borrow":
        return False
    if not isinstance(op, (O.PrefillChunk, O.ScheduleRound)) or t.protected < u.protected:
        return False
    # judged on the state before the step: the turn may finish (and leave) in it
    acting = O.acting_rids(op)
    return any(r.rid in acting and (isinstance(op, O.PrefillChunk) or r.phase == "prefill")
               and r.session == t.sid
               and r.anchor == ("virtual", t.sid) for r in a.reqs)


@invariant("I10", "a slot's cache_protected_len and last_node are fixed for its life")
def slot_fixed(a: AbstractState, op, outcome, b: AbstractState, cfg=None):
    before = {t.sid: t for t in a.slots}
    out = []
    for t in b.slots:
        u = before.get(t.sid)
        if u is not None and (u.protected, u.last_node) != (t.protected, t.last_node) \
                and not _publishes_chunk(op, t, u, a, cfg):
            out.append(_v(slot_fixed, f"cache_protected_len {u.protected} -> {t.protected}, last_node "
                          f"{u.last_node} -> {t.last_node} by {op}", _slot(t)))
    return out


@invariant("I16", "no locked node is evicted")
def locked_not_evicted(a: AbstractState, op, outcome, b: AbstractState, cfg=None):
    after = {n.path for n in b.nodes}
    released = _round_released_locks(a, op, b)
    return [_v(locked_not_evicted, f"node with lock_ref {n.lock_ref} vanished by {op}", f"node {list(n.path)}")
            for n in a.nodes if n.lock_ref > 0 and n.path not in after
            and released(n.path) < n.lock_ref]


def _round_released_locks(a: AbstractState, op, b: AbstractState):
    """A round releases locks before it evicts (`retract_decode` then
    `check_decode_mem`; a prefill round's preemption before its allocation): for a node
    path, how many of its locks were held by the round's requests, or the running
    requests it preempted, that hold none after it (0 outside rounds)."""
    if not isinstance(op, (*O.ROUNDS, O.Schedule)):
        return lambda path: 0
    requeued = {r.rid for r in b.reqs if r.phase == "queued"}
    acting = set(O.acting_rids(op)) | {r.rid for r in a.reqs
                                        if r.phase == "decode" and r.rid in requeued}
    still = {r.rid for r in b.reqs if r.locked}
    gone = [r.anchor[1] for r in a.reqs
            if r.rid in acting and r.locked and r.rid not in still
            and r.anchor and r.anchor[0] == "node"]
    return lambda path: sum(1 for p in gone if p[:len(path)] == path)


@invariant("I25", "a rejected admission retried restores idempotently")
def idempotent_restore(a: AbstractState, op, outcome, b: AbstractState, cfg=None):
    if not isinstance(op, (O.Schedule, O.ScheduleRound)) or outcome != "rejected" or \
            len(O.acting_rids(op)) != 1:
        return []           # a round of several allocates for the others it admits
    rid, = O.acting_rids(op)
    r = next((x for x in a.reqs if x.rid == rid), None)
    if r is None or r.phase != "queued" or r.row is None or \
            not (r.anchor and r.anchor[0] == "virtual"):
        return []           # (a chunked request's round checkpoints its chunk first)
    sid = r.anchor[1]
    ta = next((t for t in a.slots if t.sid == sid), None)
    tb = next((t for t in b.slots if t.sid == sid), None)
    out = []
    if ta != tb:
        out.append(_v(idempotent_restore, f"second restore changed the slot: {ta} -> {tb}", f"slot of session {sid}"))
    after = {x.rid: x for x in b.reqs}
    preempted = any(x.phase == "decode" and x.rid in after and after[x.rid].phase == "queued"
                    for x in a.reqs)    # priority scheduling: the victims' release frees pages
    if len(a.free_pages) != len(b.free_pages) and not preempted:
        out.append(_v(idempotent_restore, f"second restore freed {len(b.free_pages) - len(a.free_pages)} "
                      "page(s)", _req(r)))
    return out


FINISHING_STEPS = (O.Schedule, O.PrefillChunk, O.Decode, O.SpecDecode, *O.ROUNDS)
"""Steps whose result can reach max_new_tokens and finish a request (`check_finished`)."""


@invariant("I28", "a session's checkpoint advances only on a successful finish")
def checkpoint_advance(a: AbstractState, op, outcome, b: AbstractState, cfg=None):
    before = {x.sid: x for x in a.sessions}
    reqs = {r.rid: r for r in a.reqs}
    out = []
    for x in b.sessions:
        u = before.get(x.sid)
        if u is None or u.checkpoint == x.checkpoint:
            continue
        after = {q.rid for q in b.reqs}
        # a finish: the Finish op (a stop token), or a step whose result reaches
        # max_new_tokens (check_finished), after which the turn is gone
        ok = any(r is not None and r.session == x.sid and not r.rejected and not r.to_finish
                 and (isinstance(op, O.Finish)
                      or (isinstance(op, FINISHING_STEPS) and r.rid not in after))
                 for r in map(reqs.get, O.acting_rids(op)))
        if not ok:
            out.append(_v(checkpoint_advance, f"checkpoint {len(u.checkpoint)} -> {len(x.checkpoint)} "
                          f"tokens by {op}", f"session {x.sid}"))
    return out
