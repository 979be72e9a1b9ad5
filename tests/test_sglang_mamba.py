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
