"""The reference model: each operation is an action, a guard (`enabled`) and an effect
(`step`), both in spec/actions.py's `ACTIONS`.

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
round), `guards` (what the guards share) and `actions` (each operation's guard and effect).
This module is the step and the names its callers use.
"""
from __future__ import annotations

from kvcheck.spec import ops as O
from kvcheck.spec.actions import ACTIONS, BY_TYPE, enabled, refusal
from kvcheck.spec.admission import resolve_logprob_start
from kvcheck.spec.finish import ABORT_STUB_ORIGIN, preempted, queued_borrow_holds_mamba, running_batch
from kvcheck.spec.forward import SAMPLED_TOKEN, _sync_borrowed
from kvcheck.spec.guards import refused
from kvcheck.spec.radix_cache import node_path
from kvcheck.spec.sessions import _maybe_close, _sync_checkpoints, within_accepted
from kvcheck.spec.state import State, initial_state
from kvcheck.spec.violations import ModelError

__all__ = ["initial_state", "enabled", "step", "ACTIONS", "ModelError", "SAMPLED_TOKEN", "refusal",
           "refused", "preempted_by", "within_accepted", "node_path", "resolve_logprob_start",
           "queued_borrow_holds_mamba", "ABORT_STUB_ORIGIN"]


def preempted_by(s: State, op: O.Op) -> list:
    """The running requests that `op`, a prefill round (or `schedule`) enabled in s,
    preempts (none when the step stops at an assertion)."""
    if not (s.cfg.enable_priority_scheduling and isinstance(op, (O.Schedule, O.ScheduleRound))):
        return []
    if not running_batch(s) or not enabled(s, op):
        return []
    try:
        after, _ = step(s, op)
    except ModelError:      # the step itself reports it
        return []
    return preempted(s, op, after)


def step(s: State, op: O.Op, checked: bool = False) -> tuple[State, str]:
    """Apply an enabled op to a copy of s; returns (new state, outcome). checked: the
    caller has just asked `enabled(s, op)` (the explorer), so the guard is not re-run."""
    if not checked and not enabled(s, op):
        raise ValueError(f"{op} is not enabled in this state")
    answer = refused(s, op)
    if answer:                          # turned down by upstream: nothing changes
        return s.clone(), answer
    s = s.clone()
    action = BY_TYPE.get(type(op))
    if action is None:  # pragma: no cover - enabled() refuses unknown ops
        raise ValueError(f"unknown op {op!r}")
    out = action.effect(s, op)
    for sid in list(s.sessions):        # the scheduler loop's maybe_reap, after the round:
        _maybe_close(s, sid)            # a deferred close whose turn has ended is carried out
    if s.cfg.era == "borrow":
        _sync_borrowed(s, op.rids if hasattr(op, "rids") else (getattr(op, "rid", None),))
    if s.cfg.accept:
        _sync_checkpoints(s)
    return s, out
