"""0.5.23's Mamba tree component (config.mamba_tree, spec/mamba_tree.py): per-node states,
their own lock and LRU, the copy-on-write at a match, the checkpoint copy, the donation at
finish, eviction; the invariants I44-I46 over tree-held states; spec vs impl in lockstep."""
from __future__ import annotations

from dataclasses import replace

import pytest

from kvcheck.spec import ops as O
from kvcheck.spec.config import Config, ConfigError
from kvcheck.spec.invariants import check_state
from kvcheck.spec.model import initial_state, refusal, step
from kvcheck.spec.view import abstract

MT = Config(page_size=1, num_pages=24, num_rows=3, max_context_len=32, era="borrow",
            mamba_slots=5, mamba_tree=True)


def run(cfg, ops, s=None):
    s = initial_state(cfg) if s is None else s
    for op in ops:
        s, _ = step(s, op)
    return s


def tree(s) -> dict:
    """path -> (Mamba slot or None, Mamba lock_ref) of every node."""
    return {n.path: (n.mamba_value, n.mamba_lock_ref) for n in dict.values(s.nodes) if n.id}


def plain(rid, tokens, max_new=3):
    return [O.SubmitRequest(rid, tuple(tokens), max_new), O.Schedule(rid)]


P5 = (1, 2, 3, 4, 5)


def base_ops():
    """Request 1 leaves two states in the tree; request 2 matches one (copy-on-write) and
    decodes; a session's first turn runs; request 4 is matched and rejected (a plain
    request: its copy is freed)."""
    return plain(1, P5) + [O.Decode(1, 9), O.Finish(1)] + plain(2, P5 + (6,)) + \
        [O.OpenSession(1), O.SubmitTurn(1, 3, (7, 8), 3), O.Schedule(3)]


BASE_STATE = run(MT, base_ops())
BASE = abstract(BASE_STATE)


def test_config_refuses_what_the_tree_component_is_not_modelled_with():
    for kw, field in ((dict(page_size=2, max_context_len=32), "page_size"),
                      (dict(mamba_extra_buffer="eager"), "mamba_extra_buffer"),
                      (dict(chunk_size=4), "chunk_size"), (dict(swa_window=2), "swa_window"),
                      (dict(disable_radix_cache=True), "disable_radix_cache")):
        with pytest.raises(ConfigError, match="config.mamba_tree needs " + field):
            replace(MT, **kw)
    with pytest.raises(ConfigError, match="mamba_slots"):
        replace(MT, mamba_slots=0)
    assert "mamba_tree" not in Config().to_json() and MT.to_json()["mamba_tree"] is True


def test_prefill_checkpoint_copies_and_finish_donates():
    """The prefill's checkpoint puts a copy in a fresh slot on the prompt's node (the request
    keeps its own); the finish donates the request's own slot to the new leaf."""
    s = run(MT, plain(1, P5))
    assert s.reqs[1].mamba_pool_idx == 1 and tree(s) == {P5: (2, 1)}
    s = run(MT, [O.Decode(1, 9), O.Finish(1)], s)
    assert tree(s) == {P5: (2, 0), P5 + (1,): (1, 0)}
    assert sorted(s.mamba_free_slots) == [3, 4, 5]


def test_finish_on_a_node_with_a_state_frees_the_request_s_own():
    """`cleanup_after_caching_req`: the node kept its own (mamba_exist), so the donated
    slot goes back (`free_mamba_cache`)."""
    s = run(MT, plain(1, P5, max_new=1))       # finishes at its prefill: key = the prompt
    assert tree(s) == {P5: (1, 0)} and sorted(s.mamba_free_slots) == [2, 3, 4, 5]
    s = run(MT, plain(2, P5, max_new=1), s)     # matches [1..4]? no state there: full prefill
    assert tree(s)[P5] == (1, 0) and sorted(s.mamba_free_slots) == [2, 3, 4, 5]


def test_match_ends_at_the_deepest_node_with_a_state_and_copies_it():
    s = run(MT, plain(1, P5) + [O.Decode(1, 9), O.Finish(1)])
    s = run(MT, [O.SubmitRequest(2, P5 + (1, 9, 4), 2), O.Schedule(2, admit=False)], s)
    # node P5+(1,) has a state: the match ends there (6 tokens), the copy was freed on reject
    assert s.reqs[2].prefix_len == 6 and s.reqs[2].mamba_pool_idx is None
    # tombstone the deeper node: the match now ends at P5
    s.nodes[[n.id for n in s.nodes.values() if n.path == P5 + (1,)][0]].mamba_value = None
    s.mamba_free_slots.append(1)
    s, _ = step(s, O.Schedule(2, admit=False))
    assert s.reqs[2].prefix_len == 5


def test_admitted_match_holds_the_copy_and_a_streaming_turn_keeps_it_on_reject():
    s = run(MT, plain(1, P5, max_new=1))
    s = run(MT, [O.SubmitRequest(2, P5 + (6,), 2), O.Schedule(2)], s)
    assert s.reqs[2].mamba_pool_idx == 2            # the copy-on-write slot, then no alloc
    s = run(MT, [O.OpenSession(1), O.SubmitTurn(1, 3, P5 + (7,), 2), O.Schedule(3, admit=False)], s)
    held = s.reqs[3].mamba_pool_idx
    assert held is not None                          # kept: req.session is set
    s, _ = step(s, O.AbortQueued(3))                 # release_kv_cache(checkpoint=False)
    assert held in s.mamba_free_slots and check_state(abstract(s), MT) == []


def test_split_leaves_the_state_on_the_lower_half():
    s = run(MT, plain(1, P5, max_new=1))
    s = run(MT, plain(2, (1, 2, 3, 7), max_new=1), s)
    t = tree(s)
    assert t[(1, 2, 3)] == (None, 0) and t[P5] == (1, 0)   # the upper half is a tombstone


def test_eviction_drops_internal_states_and_deletes_leaves():
    """An allocation short of Mamba slots evicts least recent unlocked states: an internal
    node keeps its KV, a leaf goes whole."""
    cfg = replace(MT, mamba_slots=4)
    s = run(cfg, plain(1, P5) + [O.Decode(1, 9), O.Finish(1)])     # P5: 2, P5+1: 1
    s = run(cfg, plain(2, (8, 9, 10), max_new=1), s)     # its own 3 goes to (8, 9, 10)
    assert tree(s)[(8, 9, 10)] == (3, 0) and s.mamba_free_slots == [4]
    s = run(cfg, plain(3, (11, 12), max_new=2), s)      # holds 4; the copy evicts one state:
    t = tree(s)                                         # the least recent, P5, is internal
    assert t[P5] == (None, 0) and t[P5 + (1,)] == (1, 0) and t[(11, 12)] == (2, 1)
    s = run(cfg, plain(4, (13, 14), max_new=2), s)      # its slot and its copy: two leaves go
    t = tree(s)
    assert P5 + (1,) not in t and (8, 9, 10) not in t and t[P5] == (None, 0)
    assert check_state(abstract(s), cfg) == []


def test_base_state_is_clean_and_exercises_the_tree():
    assert check_state(BASE, MT) == []
    assert any(n.mamba for n in BASE.nodes) and any(n.mamba_lock_ref for n in BASE.nodes)
    assert BASE.slots and BASE.slots[0].mamba


def _node(path):
    return [n for n in BASE.nodes if n.path == path][0]


def mamba_tree_corruptions():
    """id -> a corrupted copy of BASE that breaks it (config MT)."""
    held = [n for n in BASE.nodes if n.mamba][0]
    locked = [n for n in BASE.nodes if n.mamba_lock_ref][0]
    nodes = lambda n, **kw: tuple(replace(x, **kw) if x is n else x for x in BASE.nodes)  # noqa: E731
    return {
        "I44": replace(BASE, mamba_free=tuple(sorted(BASE.mamba_free + held.mamba))),
        "I45": replace(BASE, nodes=nodes(held, mamba=())),
        "I46": replace(BASE, nodes=nodes(locked, mamba_lock_ref=locked.mamba_lock_ref + 1)),
    }


@pytest.mark.parametrize("inv_id", sorted(mamba_tree_corruptions()))
def test_each_mamba_tree_invariant_fires(inv_id, assert_invariant_fires):
    assert_invariant_fires(mamba_tree_corruptions()[inv_id], MT, inv_id)


def test_a_lock_above_the_full_lock_is_reported():
    n = BASE.nodes[0]
    a = replace(BASE, nodes=tuple(replace(x, mamba_lock_ref=n.lock_ref + 1) if x is n else x
                                  for x in BASE.nodes))
    assert any("> full lock_ref" in v.message for v in check_state(a, MT) if v.id == "I46")


def test_cow_guard_refuses_a_schedule_that_could_assert():
    cfg = replace(MT, mamba_slots=2)
    s = run(cfg, plain(1, P5, max_new=1))              # tree holds 1; free: 2
    s = run(cfg, [O.SubmitRequest(2, (9, 9), 3), O.Schedule(2)], s)    # holds 2; evicts? no
    s = run(cfg, [O.SubmitRequest(3, P5 + (6,), 2)], s)
    why = refusal(s, O.Schedule(3))
    assert s.mamba_free_slots == [] and why and "copy-on-write" in why


# -- spec vs impl ------------------------------------------------------------------------------

@pytest.mark.parametrize("era", ["borrow", "wrapper"])
def test_spec_and_impl_agree_on_drawn_mamba_tree_configs(era):
    """0.5.23's component (borrow) and 0.5.15's MambaRadixCache (wrapper)."""
    from kvcheck.adapters.impl import ImplBackend
    from kvcheck.engines.stats import Stats
    from kvcheck.engines.walk import walk
    stats = Stats()
    for i in range(30):
        seq = walk(13, i, ImplBackend, "impl", stats, config_kw={
            "hybrid": True, "era": era, "hybrid_kinds": ("mamba-tree",)})
        assert seq.cfg.mamba_tree and seq.cfg.era == era and seq.failure is None, \
            seq.failure and seq.failure.render()


def test_impl_keeps_states_on_its_nodes_like_the_spec():
    from kvcheck.adapters.impl import ImplBackend
    from kvcheck.checker import run_ops
    res = run_ops(MT, base_ops(), ImplBackend(MT))
    assert res.ok, res.failure.render()
