"""spec/actions.py: one action per operation, and the drivers derived from it."""
from __future__ import annotations

from kvcheck.engines import hypothesis_machine as H
from kvcheck.engines.gen import ARGS
from kvcheck.explore import candidates as C
from kvcheck.spec import ops as O
from kvcheck.spec.actions import ACTIONS
from kvcheck.spec.config import Config
from kvcheck.spec.model import initial_state, refusal, step


def _on(action, rid: int):
    """The action's operation on request `rid` (spec_decode's smallest arguments)."""
    return O.SpecDecode(rid, 1, 0) if action.op is O.SpecDecode else action.op(rid)


def test_one_action_per_operation_in_op_names_order():
    assert tuple(ACTIONS) == O.OP_NAMES
    assert all(a.op is O.OP_TYPES[n] for n, a in ACTIONS.items())


def test_the_drivers_derive_from_the_actions():
    on_request = {n for n, a in ACTIONS.items() if a.acts_on}
    assert set(ARGS) == set(ACTIONS)
    assert set(C._REQ_OPS) == on_request
    assert all(n in vars(H.KVMachine) for n in ACTIONS)


def test_an_action_on_a_request_needs_it_live_and_in_its_phases():
    cfg = Config(page_size=1, num_pages=8, num_rows=2, max_context_len=32, spec_enabled=True,
                 max_drafts=2)
    s, _ = step(initial_state(cfg), O.SubmitRequest(1, (1, 2), 2))        # queued
    for name, action in ACTIONS.items():
        if not action.acts_on:
            continue
        assert refusal(s, _on(action, 7)) in (None, f"request 7 does not exist (never submitted, "
                                                     f"or already finished)"), name
        why = refusal(s, _on(action, 1))
        if "queued" in action.acts_on:
            assert why is None or "is queued" not in why, name
        else:
            needs = " or ".join(action.acts_on)
            assert why == f"request 1 is queued, this operation needs it {needs}", name
