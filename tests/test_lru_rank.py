"""The LRU order of evictable leaves is part of the abstract state (as
ranks), so a stale access stamp is a divergence at the step that makes it, not at a
later eviction that happens to pick another node."""
from __future__ import annotations

from pathlib import Path

import pytest

from kvcheck.checker import run_ops
from kvcheck.trace import load
from kvcheck.spec.abstract import NodeView, with_lru_ranks
from kvcheck.spec.model import initial_state, step
from kvcheck.spec.view import abstract

ROOT = Path(__file__).resolve().parents[1]
SPLIT = ROOT / "stateful_tests/upstream/insert-split-lru-order-sglang-0.5.23.json"


def test_ranks_are_dense_and_only_on_evictable_leaves():
    nodes = [NodeView((1,), (), (1,), 0), NodeView((2,), (), (2,), 0),
             NodeView((3,), (), (3,), 0), NodeView((4,), (), (4,), 1)]
    ranked = {n.path: n.lru_rank for n in with_lru_ranks(nodes, {(1,): 7.5, (2,): 3.0, (3,): 7.5})}
    assert ranked == {(1,): 1, (2,): 0, (3,): 1, (4,): None}


@pytest.mark.parametrize("name", ["insert-split-lru-order-sglang-0.5.23.json",
                                  "insert-split-lru-order-sglang-0.5.15.json"])
def test_spec_ranks_the_lower_half_of_an_insert_split_before_the_new_leaf(name):
    tr = load(ROOT / "stateful_tests/upstream" / name)
    s = initial_state(tr.config)
    for op in tr.ops[:-1]:
        s, _ = step(s, op)
    ranks = {n.path: n.lru_rank for n in abstract(s).nodes}
    assert ranks[(1, 2, 3, 1, 9)] < ranks[(1, 2, 3, 1, 7)]


def test_a_stale_tick_diverges_at_the_step_that_makes_it(monkeypatch):
    """impl/ with the rule the borrow-era spec had (a created node keeps the walk's tick):
    the new leaf ties with the lower half; the checker reports the rank at the insert
    (step 7, finish), not the eviction at step 8."""
    from kvcheck.adapters.impl import ImplBackend
    from kvcheck.impl.radix_cache import RadixCache
    tr = load(SPLIT)
    assert run_ops(tr.config, tr.ops, ImplBackend(tr.config)).ok
    monkeypatch.setattr(RadixCache, "_creation_tick", lambda self: self.tick)
    res = run_ops(tr.config, tr.ops, ImplBackend(tr.config))
    assert not res.ok
    assert res.failure.step == 7 and "lru_rank" in res.failure.render()
