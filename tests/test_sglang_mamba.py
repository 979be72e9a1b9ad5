"""Mamba on the borrow era (0.5.23, issue 15 item 4): the record a turn borrows carries
its Mamba refs from `take` on (spec and impl), and what the real 0.5.23 does with a Mamba
pool (adapters/sglang/hybrid.py `mamba_tree_probe`; skipped without .venv-sglang-0.5.23)."""
from __future__ import annotations

import pytest

from spec import hybrid as H
from spec import ops as O
from spec.config import Config
from spec.model import initial_state, step

BORROW = Config(page_size=1, num_pages=40, num_rows=3, mamba_slots=4, mamba_extra_buffer="eager",
                overlap=True, era="borrow")
FIRST_TURN = [O.OpenSession(1), O.SubmitTurn(1, 1, (1, 2, 3), 4), O.Schedule(1), O.Decode(1, 5)]


def test_borrow_slot_takes_the_turns_mamba_refs_at_take():
    """0.5.23 `StreamingSession.take` (session/streaming_session.py l.203-212) makes the
    turn's `ReqKvInfo` the slot's record: `slot.kv is req.kv`, Mamba refs included, from
    the first row allocation, not from the finish (the real release shows it:
    `test_real_0523_mamba_lives_on_the_shared_record_and_in_the_tree`)."""
    s = initial_state(BORROW)
    for op in FIRST_TURN:
        s, _ = step(s, op)
    assert H.mamba_refs(s.reqs[1]) == (1, 2, 3)
    assert H.mamba_refs(s.slots[1]) == (1, 2, 3)
    s, _ = step(s, O.Finish(1))
    assert H.mamba_refs(s.slots[1]) == (1, 2, 3) and s.mamba_free_slots == [4]
    s, _ = step(s, O.CloseSession(1))
    assert sorted(s.mamba_free_slots) == [1, 2, 3, 4]


def test_impl_slot_takes_the_turns_mamba_refs_at_take():
    from adapters.impl import ImplBackend
    b = ImplBackend(BORROW)
    for op in FIRST_TURN:
        b.apply(op)
    a = b.abstract()
    (req,), (slot,) = a.reqs, a.slots
    assert req.mamba and slot.mamba == req.mamba


def test_real_0523_mamba_lives_on_the_shared_record_and_in_the_tree():
    """The real 0.5.23 `UnifiedRadixCache` with the Mamba component production builds for a
    hybrid SSM model (`registry.create_unified_radix_cache`), on the CPU over a real
    `HybridReqToTokenPool` (stand-in `MambaPool`: `copy_from` recorded, nothing else
    called). What it shows is why the adapter refuses 0.5.23 Mamba configs: the tree
    keeps Mamba slots (a copy at every checkpoint, the request's own at a finish), which
    the spec does not model, so the lockstep parts at the first prefill."""
    from adapters.sglang.proxy import mamba_tree_probe, venv_python
    if not venv_python("0.5.23").exists():
        pytest.skip("no .venv-sglang-0.5.23")
    r = mamba_tree_probe(Config(page_size=1, num_pages=32, num_rows=4, era="borrow",
                                mamba_slots=6), "0.5.23")
    by_op = r["steps"]
    # schedule 1: the prefill's checkpoint copies the request's state into a tree slot
    assert by_op[1]["reqs"] == {"1": [1]} and by_op[1]["tree"] == [[5, [2], 1]]
    # finish 1: the request's own slot is donated to the new leaf, not freed
    assert by_op[3]["mamba_free"] == [3, 4, 5, 6] and [6, [1], 0] in by_op[3]["tree"]
    # schedule 3 (a first turn): take shares the record, so the slot holds the turn's state
    assert by_op[9]["slots"] == {"1": [5]} and by_op[9]["reqs"] == {"3": [5]}
    # close_session: `_free_slot_mamba` returns the slot's state; the tree keeps its copies
    assert by_op[11]["mamba_free"] == [3, 5] and by_op[11]["slots"] == {}
    assert r["copies"] == [[[1], [2]], [[3], [4]], [[5], [6]]]
    d = r["first_divergence"]
    assert (d["step"], d["op"], d["id"]) == (1, "schedule", "I44")
