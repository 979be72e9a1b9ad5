"""The walk engine: reproducible sequences, every operation reachable, one argument
table shared with the Hypothesis machine."""
from __future__ import annotations

from kvcheck.adapters.impl import ImplBackend
from kvcheck.engines.draw import RandomDrawer, boundary_lengths, draw_length, draw_prompt
from kvcheck.engines.gen import ARGS
from kvcheck.engines.stats import Stats
from kvcheck.engines.walk import CORE, draw_swarm, sequence_rng, walk
from kvcheck.spec.ops import OP_NAMES, OP_TYPES


def test_every_operation_has_an_argument_entry():
    """A new operation in kvcheck.spec.ops needs exactly one entry in the shared table."""
    assert set(ARGS) == set(OP_TYPES)


def test_same_seed_and_index_give_the_same_sequence():
    a = walk(7, 3, None, "spec", Stats())
    b = walk(7, 3, None, "spec", Stats())
    c = walk(7, 4, None, "spec", Stats())
    assert a.cfg == b.cfg and a.ops == b.ops and a.ops
    assert (c.cfg, c.ops) != (a.cfg, a.ops)


def test_walk_reaches_every_operation_spec_and_impl():
    stats = Stats()
    for i in range(60):
        seq = walk(1, i, ImplBackend, "impl", stats)
        assert seq.failure is None, seq.failure.render()
    missing = [n for n in OP_NAMES if not stats.coverage[n]]
    assert not missing, f"never applied: {missing}"
    assert stats.sequences == 60 and stats.steps == sum(stats.coverage.values())


def test_swarm_keeps_core_ops_and_leaves_some_out():
    left_out = set()
    for i in range(40):
        w = draw_swarm(RandomDrawer(sequence_rng(0, i)), ARGS)
        assert CORE <= set(w) and all(v > 0 for v in w.values())
        left_out |= set(ARGS) - set(w)
    assert left_out and not (left_out & CORE)


def test_lengths_are_biased_to_page_boundaries():
    d = RandomDrawer(sequence_rng(0, 0))
    draws = [draw_length(d, 4, 1, 16) for _ in range(400)]
    near = set(boundary_lengths(4, 1, 16))
    assert near == {3, 4, 5, 7, 8, 9, 11, 12, 13, 15, 16}
    assert sum(x in near for x in draws) > 0.78 * len(draws)    # 0.69 if unbiased
    assert all(1 <= x <= 16 for x in draws)


def test_prompts_share_prefixes():
    d = RandomDrawer(sequence_rng(0, 1))
    prompts = [draw_prompt(d, 2, 4, 14) for _ in range(200)]
    starts = {p[:4] for p in prompts}
    assert (1, 2, 3, 4) in starts and (5, 6, 7, 8) in starts
    assert all(4 <= len(p) <= 14 for p in prompts)
