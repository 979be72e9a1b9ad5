"""Reachability ("sometimes") goals: situations worth reaching, detected from (before, op,
outcome, after) states; and which step checks a transition needs."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from kvcheck.spec import ops as O
from kvcheck.explore.scope import Scope
from kvcheck.spec.finish import preempted
from kvcheck.spec.state import ROOT, State

# ---------------------------------------------------------------------------
# reachability goals: situations worth reaching, seen in (before, op, outcome, after)
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Situation:
    id: str
    text: str
    detect: Callable          # (cfg, before, op, outcome, after) -> bool
    applies: Callable = lambda cfg: True
    why_not: str = ""


def _restoring(b: State, op):
    """(req, sid, slot) when op is a schedule that restores from a slot holding KV."""
    if not isinstance(op, O.Schedule):
        return None
    r = b.reqs.get(op.rid)
    if r is None or r.session is None or r.to_finish:
        return None
    t = b.slots.get(r.session)
    if t is None or t.row is None:
        return None
    return r, r.session, t


def _restore_tail(cfg, b, op, a):
    """(prefix_len, slot allocated before) of a restore that cut the slot's tail."""
    x = _restoring(b, op)
    if x is None:
        return None
    r, sid, t0 = x
    t1 = a.slots.get(sid)
    if t1 is None or t1.allocated >= t0.allocated:
        return None
    return t1.allocated, t0.allocated         # _free_tail sets slot.allocated = prefix_len


def _tail_free_at_page_boundary(cfg, b, op, out, a):
    x = _restore_tail(cfg, b, op, a)
    return x is not None and x[0] % cfg.page_size == 0


def _tail_kept_mid_page(cfg, b, op, out, a):
    x = _restore_tail(cfg, b, op, a)
    return x is not None and x[0] % cfg.page_size != 0


def _split_under_lock(cfg, b, op, out, a):
    bn = dict(b.nodes)              # reads through plain snapshots: no copy-on-write
    for nid, n in dict.items(a.nodes):
        if nid in bn:
            continue
        for cid in n.children.values():
            c = bn.get(cid)
            if c is not None and c.lock_ref > 0 and c.parent != nid:
                return True
    return False


def _deferred_close_done(cfg, b, op, out, a):
    return any(x.close_pending and sid not in a.sessions for sid, x in dict.items(b.sessions))


def _retract_retry_off_by_one(cfg, b, op, out, a):
    x = _restoring(b, op)
    if x is None:
        return False
    r, sid, t0 = x
    return r.is_retracted and t0.committed >= r.seqlen


def _ephemeral_abort_slot(cfg, b, op, out, a):
    if not isinstance(op, O.AbortRunning):
        return False
    r = b.reqs[op.rid]
    return r.session is not None and r.session not in b.slots


def _eviction_under_pressure(cfg, b, op, out, a):
    return not isinstance(op, O.Evict) and any(nid not in a.nodes for nid in b.nodes)


def _admission_rejected_for_budget(cfg, b, op, out, a):
    return isinstance(op, O.Schedule) and op.admit and out == "rejected"


def _idempotent_restore_retry(cfg, b, op, out, a):
    x = _restoring(b, op)
    if x is None:
        return False
    r = x[0]
    return r.row is not None            # restored once already (a rejected admission)


def _pre_abort_detach(cfg, b, op, out, a):
    if not isinstance(op, O.Schedule):
        return False
    r = b.reqs.get(op.rid)
    return (r is not None and r.session is not None and r.to_finish
            and r.session in b.slots and b.slots[r.session].row is not None)


def _parked_turn_dropped(cfg, b, op, out, a):
    if not isinstance(op, (O.AbortQueued, O.Schedule)):
        return False
    r = b.reqs.get(op.rid)
    return (r is not None and r.is_retracted and r.session is not None
            and r.session in b.slots and r.session not in a.slots)


def _spec_overshoot(cfg, b, op, out, a):
    if not isinstance(op, O.SpecDecode) or out != "ok":
        return False
    r = b.reqs[op.rid]                  # the step's result may finish (and remove) it
    return len(r.output) + op.accepted + 1 > r.max_new_tokens


def _shared_lock(cfg, b, op, out, a):
    return any(n.lock_ref >= 2 for nid, n in dict.items(a.nodes) if nid != ROOT)


def _slot_lends_row(cfg, b, op, out, a):
    return isinstance(op, O.Schedule) and out == "ok" and _restoring(b, op) is not None


def _swa_window_freed(cfg, b, op, out, a):
    """A decode step moved a request's SWA window cursor (spec/swa_pool.py)."""
    r, q = b.reqs.get(getattr(op, "rid", None)), a.reqs.get(getattr(op, "rid", None))
    return r is not None and q is not None and q.swa_evicted_seqlen > max(r.swa_evicted_seqlen,
                                                                            r.protected)


def _swa_cursor_restored(cfg, b, op, out, a):
    x = _restoring(b, op)
    return x is not None and x[2].swa_evicted_seqlen > 0


def _mamba_pool_short(cfg, b, op, out, a):
    from kvcheck.spec.mamba_pool import mamba_short
    r = b.reqs.get(getattr(op, "rid", None))
    return isinstance(op, O.Schedule) and op.admit and out == "rejected" and r is not None \
        and mamba_short(b, r)


def _mamba_back_from_slot(cfg, b, op, out, a):
    return any(t.mamba_pool_idx is not None and sid not in a.slots
               for sid, t in dict.items(b.slots))


def _admitted(b: State, op, a: State) -> list:
    """The waiting requests a prefill round admitted (they left the queue)."""
    if not isinstance(op, O.ScheduleRound):
        return []
    return [r for r in op.rids if b.reqs[r].phase == "queued"
            and (r not in a.reqs or a.reqs[r].phase != "queued")]


def _round_admits_several(cfg, b, op, out, a):
    return len(_admitted(b, op, a)) >= 2


def _round_turn_beside_stub(cfg, b, op, out, a):
    """A session's turn and its rejected stub admitted in one round (U7's interleaving)."""
    got = [b.reqs[r] for r in _admitted(b, op, a)]
    return any(x.session is not None and x.rejected and
               any(y.session == x.session and not y.rejected for y in got) for x in got)


def _round_budget_cut(cfg, b, op, out, a):
    """A round admitted some requests and the shared budget refused a later one."""
    return out == "rejected" and len(_admitted(b, op, a)) >= 1


def _round_chunk_beside_new(cfg, b, op, out, a):
    return isinstance(op, O.ScheduleRound) and b.reqs[op.rids[0]].phase == "prefill" \
        and len(_admitted(b, op, a)) >= 1


def _preemption(cfg, b, op, out, a):
    return bool(preempted(b, op, a))


def _preemption_admits(cfg, b, op, out, a):
    """A preemption after which the request it was for is admitted."""
    return bool(preempted(b, op, a)) and any(
        r in a.reqs and dict.__getitem__(a.reqs, r).phase != "queued" or r not in a.reqs
        for r in O.acting_rids(op) if dict.__getitem__(b.reqs, r).phase == "queued")


def _preemption_beside_finished(cfg, b, op, out, a):
    """A preemption while a finished request is still in the running batch."""
    return bool(b.unfiltered) and bool(preempted(b, op, a))


def _decode_round_retracts(cfg, b, op, out, a):
    return isinstance(op, O.DecodeRound) and \
        any(r not in a.reqs or a.reqs[r].phase == "queued" for r in op.rids)


ROUND_SITUATIONS: tuple = (
    Situation("round_admits_several", "a prefill round admits two or more requests",
              _round_admits_several),
    Situation("round_turn_beside_stub", "a session's turn and its rejected stub in one round",
              _round_turn_beside_stub, lambda c: c.era == "borrow", "wrapper era"),
    Situation("round_budget_cut", "a round's shared budget refuses a request after others",
              _round_budget_cut),
    Situation("round_chunk_beside_new", "a round continues the chunked request beside new ones",
              _round_chunk_beside_new, lambda c: c.chunk_size is not None, "no chunk size"),
    Situation("decode_round_retracts", "a decode round short of pages retracts a request",
              _decode_round_retracts),
)
"""Interleavings only a round produces (goals of a scope with `rounds`)."""

PRIORITY_SITUATIONS: tuple = (
    Situation("preemption", "a prefill round preempts a running request", _preemption,
              lambda c: c.enable_priority_scheduling, "no priority scheduling"),
    Situation("preemption_admits", "the request a preemption was for is admitted",
              _preemption_admits, lambda c: c.enable_priority_scheduling,
              "no priority scheduling"),
    Situation("preemption_beside_finished", "a preemption while a finished request is still "
              "in the running batch (the two-phase finish)", _preemption_beside_finished,
              lambda c: c.enable_priority_scheduling and not c.filter_before_prefill,
              "no priority scheduling, or the batch filtered before each round"),
)
"""Priority scheduling's preemption (goals of a scope with it)."""
ROUND_OPS = frozenset({O.ScheduleRound.name, O.DecodeRound.name})


HYBRID_SITUATIONS: tuple = (
    Situation("swa_window_freed", "an out-of-window SWA free (a decode moves swa_evicted_seqlen)",
              _swa_window_freed, lambda c: c.swa_window > 0, "no SWA"),
    Situation("swa_cursor_restored", "a restore hands the slot's SWA window cursor to the next turn",
              _swa_cursor_restored, lambda c: c.swa_window > 0, "no SWA"),
    Situation("mamba_pool_short", "an admission refused because the Mamba pool is short",
              _mamba_pool_short, lambda c: c.mamba_slots > 0, "no Mamba"),
    Situation("mamba_back_from_slot", "a slot's Mamba state returned (close or abort)",
              _mamba_back_from_slot, lambda c: c.mamba_slots > 0, "no Mamba"),
)


SITUATIONS: tuple = (
    Situation("tail_free_at_page_boundary", "a page-boundary tail free (a restore cuts the "
              "slot's tail at a page boundary: the page past it is freed)",
              _tail_free_at_page_boundary),
    Situation("tail_kept_mid_page", "a mid-page tail cut (a restore cuts the slot's tail inside "
              "a page: the partial page stays attached)", _tail_kept_mid_page,
              lambda c: c.page_size > 1, "page_size 1"),
    Situation("split_under_lock", "a node split under a lock (the locked node gets a new parent)",
              _split_under_lock),
    Situation("deferred_close_done", "a deferred close carried out when the turn ended",
              _deferred_close_done),
    Situation("retract_retry_off_by_one", "a retract retry with the overlap off-by-one "
              "(slot committed == seqlen, restore prefix = seqlen - 1)", _retract_retry_off_by_one,
              lambda c: c.overlap or c.spec_enabled, "neither overlap nor spec"),
    Situation("ephemeral_abort_slot", "an ephemeral abort slot (first-turn mid-abort, wrapper era)",
              _ephemeral_abort_slot, lambda c: c.era == "wrapper", "era borrow"),
    Situation("eviction_under_pressure", "eviction under pressure (an allocation evicts a node)",
              _eviction_under_pressure),
    Situation("admission_rejected_for_budget", "an admission rejected for rows/KV budget",
              _admission_rejected_for_budget),
    Situation("idempotent_restore_retry", "a second restore after a rejected admission",
              _idempotent_restore_retry),
    Situation("pre_abort_detach", "a pre-aborted turn detached from its slot at schedule",
              _pre_abort_detach),
    Situation("parked_turn_dropped", "a retracted turn's parked KV released when it ends unsuccessfully",
              _parked_turn_dropped),
    Situation("spec_overshoot", "a speculative step accepts past max_new_tokens (trimmed at "
              "finish)", _spec_overshoot, lambda c: c.spec_enabled, "spec off"),
    Situation("shared_lock", "a tree node locked by two holders", _shared_lock),
    Situation("slot_lends_row", "a later turn admitted on its slot's row", _slot_lends_row),
) + HYBRID_SITUATIONS + ROUND_SITUATIONS + PRIORITY_SITUATIONS


def _op_applies(name: str, sc: Scope) -> Optional[str]:
    """Why an operation cannot happen in the scope ("n/a ..."), or None."""
    cfg = sc.cfg
    if name in ROUND_OPS and not sc.rounds:
        return "no rounds in scope"
    if name == "decode" and cfg.spec_enabled:
        return "spec on"
    if name == "spec_decode" and not cfg.spec_enabled:
        return "spec off"
    if name == "prefill_chunk" and cfg.chunk_size is None:
        return "no chunk size"
    return None


def situation_applies(x: Situation, sc: Scope) -> Optional[str]:
    """Why a situation cannot be reached in the scope ("n/a ..."), or None."""
    if not x.applies(sc.cfg):
        return x.why_not
    if x in ROUND_SITUATIONS and not sc.rounds:
        return "no rounds in scope"
    return None
