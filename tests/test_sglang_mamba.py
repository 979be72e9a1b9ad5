"""Mamba on the borrow era (0.5.23): the record a turn borrows carries
its Mamba refs from `take` on (spec and impl); the disabled radix cache
(`config.disable_radix_cache`), the 0.5.23 pairing whose tree keeps no Mamba state, in
the spec, impl/ and on the real release; and what the real 0.5.23 tree does with Mamba
states when it is on (adapters/sglang/hybrid.py `mamba_tree_probe`). The real-release
tests skip without .venv-sglang-0.5.23."""
from __future__ import annotations

from dataclasses import replace

import pytest

from kvcheck.spec import mamba_pool
from kvcheck.spec import ops as O
from kvcheck.spec.config import Config, ConfigError
from kvcheck.spec.model import initial_state, step
from kvcheck.spec.view import abstract

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
    assert mamba_pool.mamba_refs(s.reqs[1]) == (1, 2, 3)
    assert mamba_pool.mamba_refs(s.slots[1]) == (1, 2, 3)
    s, _ = step(s, O.Finish(1))
    assert mamba_pool.mamba_refs(s.slots[1]) == (1, 2, 3) and s.mamba_free_slots == [4]
    s, _ = step(s, O.CloseSession(1))
    assert sorted(s.mamba_free_slots) == [1, 2, 3, 4]


def test_impl_slot_takes_the_turns_mamba_refs_at_take():
    from kvcheck.adapters.impl import ImplBackend
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
    from kvcheck.adapters.sglang.proxy import mamba_tree_probe, venv_python
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


NO_RADIX = Config(page_size=2, num_pages=24, num_rows=3, mamba_slots=4, mamba_extra_buffer="lazy",
                  overlap=True, era="borrow", disable_radix_cache=True)
SHARED_PREFIX = [O.SubmitRequest(1, (1, 2, 3, 4, 5), 3), O.Schedule(1), O.Decode(1, 9), O.Finish(1),
                 O.SubmitRequest(2, (1, 2, 3, 4, 5, 6), 2), O.Schedule(2)]
SESSION = [O.OpenSession(1), O.SubmitTurn(1, 3, (7, 8, 9), 3), O.Schedule(3), O.Decode(3, 4),
           O.Finish(3), O.SubmitTurn(1, 4, (10, 11), 3), O.Schedule(4), O.AbortRunning(4),
           O.SubmitTurn(1, 5, (12,), 2), O.Schedule(5), O.Finish(5), O.CloseSession(1)]


def test_disabled_tree_matches_and_keeps_nothing_and_frees_the_mamba_state():
    """0.5.23 `UnifiedRadixCache` with `disable` (`_match_tree`: `empty_match_result`;
    `checkpoint_into_tree` returns at once, and the MAMBA component's cleanup frees a
    finished request's state): a prefix another request finished is not matched."""
    s = initial_state(NO_RADIX)
    for op in SHARED_PREFIX:
        s, _ = step(s, op)
    a = abstract(s)
    (r2,) = a.reqs
    assert not a.nodes and r2.protected == 0 and r2.anchor == ("root",)
    # rid 1's state and track slot went back; rid 2 holds a state and a lazy buffer
    assert len(a.mamba_free) == 2 and len(r2.mamba) == 3 and r2.mamba[2] == mamba_pool.EMPTY_TRACK
    s, _ = step(s, O.Finish(2))
    assert len(s.free_pages) == NO_RADIX.num_pages and sorted(s.mamba_free_slots) == [1, 2, 3, 4]


def test_disabled_tree_is_the_borrow_eras_only():
    with pytest.raises(ConfigError, match="config.disable_radix_cache needs era='borrow'"):
        Config(disable_radix_cache=True)
    assert "disable_radix_cache" not in Config(era="borrow").to_json()


def test_spec_and_impl_agree_on_drawn_disabled_tree_mamba_configs():
    from kvcheck.adapters.impl import ImplBackend
    from kvcheck.engines.stats import Stats
    from kvcheck.engines.walk import walk
    for i in range(6):          # 48 steps each, about a second in all
        seq = walk(7, i, ImplBackend, "impl", Stats(), length=48, config_kw={
            "hybrid": True, "era": "borrow", "hybrid_kinds": ("mamba-no-radix",)})
        assert seq.cfg.disable_radix_cache and seq.cfg.mamba_slots
        assert seq.failure is None, seq.failure.render()


def test_sglang_adapter_drives_0523_mamba_only_with_the_tree_disabled():
    from kvcheck.adapters.sglang.hybrid import refusal
    assert "disable_radix_cache=True" in refusal(Config(mamba_slots=2, era="borrow"), "borrow")
    assert refusal(NO_RADIX, "borrow") is None


def _need_0523():
    _need("0.5.23")


def _need(version):
    from kvcheck.adapters.sglang.proxy import venv_python
    if not venv_python(version).exists():
        pytest.skip(f"no .venv-sglang-{version}")


@pytest.mark.parametrize("ops", [SHARED_PREFIX + [O.Finish(2)], SESSION], ids=["plain", "session"])
def test_real_0523_with_the_tree_disabled_agrees_with_the_spec(ops):
    """The real `UnifiedRadixCache` (FULL + MAMBA, disabled), `HybridReqToTokenPool`,
    `MambaSlotAllocator` and `StreamingSession` of 0.5.23, step by step beside the spec:
    the session's slot shares the turn's Mamba refs, an aborted turn's record goes back
    and is freed, `_free_slot_mamba` skips the lazy buffer's empty entry at close."""
    _need_0523()
    _assert_lockstep_on(NO_RADIX, ops)


def _assert_lockstep_on(cfg, ops, version="0.5.23"):
    """Run ops on the served release beside the spec; fail with the rendered divergence."""
    from kvcheck.adapters.sglang.proxy import SglangProxy
    from kvcheck.checker import run_ops
    b = SglangProxy(cfg, version)
    try:
        r = run_ops(cfg, ops, b, backend_name=b.name)
    finally:
        b.close()
    assert r.ok and r.beyond is None, (r.failure or r.beyond).render()


# -- the Mamba tree component on the real 0.5.23 (config.mamba_tree) ---------------------------

MAMBA_TREE = Config(page_size=1, num_pages=24, num_rows=3, max_context_len=32, era="borrow",
                    mamba_slots=4, mamba_tree=True)
TREE_OPS = SHARED_PREFIX + [O.Finish(2)] + SESSION + [
    # a plain request matched and turned down gives its copy-on-write slot back; a short
    # pool makes the next admissions evict states (internal ones only lose theirs)
    O.SubmitRequest(6, (7, 8, 9, 1, 4, 12, 5), 2), O.Schedule(6, admit=False),
    O.SubmitRequest(7, (20, 21, 22), 2), O.Schedule(7), O.SubmitRequest(8, (30, 31), 2),
    O.Schedule(8), O.Decode(7, 1), O.Finish(8), O.Evict(4)]


def test_sglang_adapter_drives_0523_mamba_with_the_tree_component():
    from kvcheck.adapters.sglang.hybrid import refusal
    assert refusal(MAMBA_TREE, "borrow") is None
    assert "mamba_tree=True" in refusal(Config(mamba_slots=2, era="borrow"), "borrow")
    assert refusal(replace(MAMBA_TREE, era="wrapper"), "flat") is None


def test_real_0523_mamba_tree_agrees_with_the_spec():
    """The real `UnifiedRadixCache` with FULL + MAMBA components (tree on), step by step
    beside the spec: states copied at checkpoints, donated at finishes (freed when the
    node had one), the copy-on-write a match takes (given back when turned down), Mamba
    eviction of internal states and whole leaves, the nodes' own Mamba locks."""
    _need_0523()
    s = initial_state(MAMBA_TREE)
    for op in TREE_OPS:
        s, _ = step(s, op)
    assert any(n.mamba_value for n in s.nodes.values())
    _assert_lockstep_on(MAMBA_TREE, TREE_OPS)


def test_real_0523_mamba_tree_lockstep_on_drawn_configs():
    """Six drawn mamba-tree sequences of 48 steps on the real release (about 20 s)."""
    _assert_drawn_mamba_tree_lockstep("0.5.23", "borrow", 6)


def _assert_drawn_mamba_tree_lockstep(version, era, n):
    _need(version)
    from kvcheck.adapters.sglang.proxy import SglangProxy
    from kvcheck.backends import config_kw, known_findings
    from kvcheck.engines.stats import Stats
    from kvcheck.engines.walk import walk
    kw = {**config_kw(f"sglang:{version}"), "hybrid": True, "hybrid_kinds": ("mamba-tree",)}
    assert kw["era"] == era
    for i in range(n):
        seq = walk(3, i, lambda cfg: SglangProxy(cfg, version), f"sglang:{version}", Stats(),
                   length=48, skip=known_findings(f"sglang:{version}"), config_kw=kw)
        assert seq.cfg.mamba_tree and seq.failure is None, seq.failure.render()


# -- 0.5.15's MambaRadixCache under the StreamingSession wrapper (config.mamba_tree, wrapper era)

def test_real_0515_mamba_radix_cache_agrees_with_the_spec():
    """The real `StreamingSession(MambaRadixCache)` of 0.5.15 step by step beside the
    spec's wrapper-era Mamba tree rules (spec/mamba_tree.py): the same operations as on
    0.5.23, with 0.5.15's eviction before every alloc and its path-wide Mamba LRU."""
    _need("0.5.15")
    _assert_lockstep_on(replace(MAMBA_TREE, era="wrapper"), TREE_OPS, "0.5.15")


def test_real_0515_mamba_radix_cache_lockstep_on_drawn_configs():
    """Twenty drawn wrapper-era mamba-tree sequences of 48 steps on the real 0.5.15."""
    _assert_drawn_mamba_tree_lockstep("0.5.15", "wrapper", 20)


@pytest.mark.parametrize("name", ["alloc_req_slots_evicts", "mamba_evict_cascade", "evict_full_cascade",
                                  "chunk_alloc_req_slots_evicts",
                                  "match_touches_path", "insert_touches_walk",
                                  "split_touches_lower"])
def test_real_0515_mamba_tree_regressions_pass(name):
    """Each wrapper-era Mamba tree rule's regression trace passes on the real 0.5.15 (the
    corpus test replays it on impl/; without the rule the spec parts from both)."""
    _need("0.5.15")
    from pathlib import Path
    from kvcheck.trace import load
    t = load(Path(__file__).parents[1] / "stateful_tests" / "regressions" /
             f"mamba_tree_0515_{name}.json")
    _assert_lockstep_on(t.config, t.ops, "0.5.15")


@pytest.mark.parametrize("tree", [True, False], ids=["mamba_tree", "plain_tree"])
def test_real_0515_queued_abort_of_a_restored_turn_finishes_it(tree):
    """M2's path on 0.5.15, outside the lockstep: the restored queued turn holds the
    slot's row and Mamba state, so
    `abort_request`'s `release_kv_cache(is_insert=False)` reaches the wrapper's
    `try_cache_finished_req` -> `finish_req`, with `MambaRadixCache` and with a plain
    tree alike; `_inflight` is cleared on the way (finish_req), which hides H5 there."""
    _need("0.5.15")
    from kvcheck.adapters.sglang.proxy import queued_borrowed_abort_probe
    cfg = Config(page_size=1, num_pages=32, num_rows=3, max_context_len=32, era="wrapper",
                 mamba_slots=6, mamba_tree=tree)
    r = queued_borrowed_abort_probe(cfg, "0.5.15")
    assert r["borrowed"] and r["holds_kv"] and r["holds_mamba"] and r["slot_kept"]
    assert r["req_nodes_before"] == ["1"] and r["req_nodes_after"] == ["2"]
    assert not r["inflight"] and r["next_prompt"] == [1, 2, 3, 1, 7, 4, 5, 6]


@pytest.mark.parametrize("tree", [True, False], ids=["mamba_tree", "tree_off"])
def test_real_0523_queued_abort_of_a_borrowed_turn_finishes_it(tree):
    """Finding M2: on 0.5.23 a queued turn that borrowed its slot's record and is aborted
    by the client is finished through `release_kv_cache(checkpoint=False)` ->
    `try_cache_finished_req` -> `finish_req`: the session's checkpoint becomes the aborted
    turn, whose never-prefilled tokens (4, 5) the next turn's prompt then carries."""
    _need_0523()
    from kvcheck.adapters.sglang.proxy import queued_borrowed_abort_probe
    cfg = Config(page_size=1, num_pages=32, num_rows=3, max_context_len=32, era="borrow",
                 mamba_slots=6, mamba_tree=tree, disable_radix_cache=not tree)
    r = queued_borrowed_abort_probe(cfg, "0.5.23")
    assert r["borrowed"] and r["holds_kv"] and r["holds_mamba"] and r["slot_kept"]
    assert r["req_nodes_before"] == ["1"] and r["req_nodes_after"] == ["2"]
    assert r["next_prompt"] == [1, 2, 3, 1, 7, 4, 5, 6]


@pytest.mark.parametrize("version,name", [("0.5.23", "m2_queued_borrowed_abort_tree"),
                                          ("0.5.23", "m2_queued_borrowed_abort_tree_off"),
                                          ("0.5.15", "m2_0515_queued_restored_abort_tree"),
                                          ("0.5.15", "m2_0515_queued_restored_abort_plain_tree")])
def test_real_release_runs_m2_in_lockstep_only_when_accepted(version, name):
    """Finding M2 in lockstep: with `--accept M2` the spec follows 0.5.23 (the aborted
    queued turn's tokens become the checkpoint, the next turn is built on them) and the
    run agrees to the end; without it the same operations break I28 on the release at
    the abort (the recorded finding), and a run without the switch leaves that abort out
    (`findings.known_trigger`)."""
    _need(version)
    from pathlib import Path
    from kvcheck.adapters.sglang.findings import known_trigger
    from kvcheck.trace import load
    from kvcheck.spec.model import initial_state, step
    t = load(Path(__file__).parents[1] / "stateful_tests" / "regressions" / f"{name}.json")
    assert t.config.accept == ("M2",) and isinstance(t.ops[6], O.AbortQueued)
    _assert_lockstep_on(t.config, t.ops, version)
    from kvcheck.adapters.impl import ImplBackend
    from kvcheck.checker import run_ops
    r = run_ops(t.config, t.ops, ImplBackend(t.config), keep_records=True)
    # compared to the end: the I28 the spec breaks at the abort is M2's own (an accepted
    # finding's other violations stop the comparison, `within_accepted`)
    assert r.ok and r.beyond is None, (r.failure or r.beyond).render()
    from kvcheck.adapters.sglang.proxy import SglangProxy
    fixed = replace(t.config, accept=())
    b = SglangProxy(fixed, version)
    try:
        r = run_ops(fixed, t.ops, b, backend_name=b.name)
    finally:
        b.close()
    assert (r.failure.id, r.failure.step, r.failure.side) == ("I28", 6, f"sglang-{version}")
    s = initial_state(fixed)
    for op in t.ops[:6]:
        s, _ = step(s, op)
    assert known_trigger(version)(s, t.ops[6]) == "M2"
    assert known_trigger(version, accept=("M2",)) is None


def test_real_0515_u3_queued_abort_still_frees_a_copy_on_write_state():
    """Under U3 (0.5.15: a queued abort makes no session call) the waiting-queue branch
    still releases a first turn's copy-on-write state held without a row (scheduler.py
    l.3905-3910); the spec frees it too and the run is compared to the end (a spec that
    leaked it would leave what the model follows and stop comparing)."""
    _need("0.5.15")
    from kvcheck.adapters.sglang.proxy import SglangProxy
    from kvcheck.checker import run_ops
    cfg = replace(MAMBA_TREE, era="wrapper", accept=("U3",))
    ops = [O.SubmitRequest(1, (1, 2, 3), 3), O.Schedule(1), O.Decode(1, 9), O.Finish(1),
           O.OpenSession(1), O.SubmitTurn(1, 2, (1, 2, 3, 4), 2), O.Schedule(2, admit=False),
           O.AbortQueued(2), O.SubmitRequest(3, (5, 6), 2), O.Schedule(3)]
    s = initial_state(cfg)
    for op in ops[:7]:
        s, _ = step(s, op)
    assert s.reqs[2].mamba_pool_idx is not None and s.reqs[2].row is None
    b = SglangProxy(cfg, "0.5.15")      # (impl/ follows no U* finding: the fixed design)
    r = run_ops(cfg, ops, b, backend_name=b.name)
    assert r.ok and r.beyond is None, (r.failure or r.beyond).render()

