"""0.5.23's `UnifiedRadixCache` FULL + SWA component on the CPU (adapters/sglang/swa_unified.py):
built through `registry.create_unified_radix_cache` as production builds it for a
sliding-window model, over the real `SWATokenToKVPoolAllocator`, driven by the adapter and
read back (node SWA values and locks, the holders' cursors, the SWA lock boundary) beside
the spec. Since the spec follows the release's SWA rules (docs/semantics.md, "The 0.5.23 SWA
tree against the spec"), the adapter runs swa_window on 0.5.23 and refuses only
prefill-aware SWA on this tree (W1) and SWA beside a Mamba pool or a disabled tree. The
release tests skip without .venv-sglang-0.5.23 (adapters/sglang/make_env.sh 0.5.23)."""
from __future__ import annotations

import pytest

from kvcheck.spec.config import Config

CFG = Config(page_size=2, num_pages=24, num_rows=4, swa_window=4, era="borrow")


def _need_0523():
    from kvcheck.adapters.sglang.proxy import venv_python
    if not venv_python("0.5.23").exists():
        pytest.skip("no .venv-sglang-0.5.23")


def test_sglang_adapter_runs_swa_on_0523_but_not_prefill_aware():
    """The refusal is lifted for the sliding-window tree; prefill-aware SWA on it (W1: no
    production pairing) and SWA beside a Mamba pool or a disabled tree stay refused."""
    from dataclasses import replace
    from kvcheck.adapters.sglang.hybrid import refusal
    assert refusal(CFG, "borrow") is None
    assert "PureSWARadixCache" in refusal(replace(CFG, prefill_aware_swa=True), "borrow")
    assert "sliding-window model only" in refusal(replace(CFG, disable_radix_cache=True), "borrow")


@pytest.fixture(scope="module")
def probe():
    _need_0523()
    from kvcheck.adapters.sglang.proxy import swa_unified_probe
    return swa_unified_probe(CFG, "0.5.23")


def test_first_prefill_checkpoint_frees_out_of_window_swa_and_caps_the_leaf(probe):
    """`checkpoint_into_tree` of a 12-token prompt (window 4, P = 2): the SWA component's
    `free_out_of_window_slots` runs before the insert (cursor 6 = floor(11 - 4)), the
    insert keeps `[0, 6)` as an SWA tombstone node (`_clip_to_window`) and caps the live
    leaf at one page-aligned window (`_maybe_split_leaf_for_swa_lock`: `[6, 8)` + `[8, 12)`),
    whose SWA lock covers the leaf only; C6 (upstream's `sanity_check`) and C7 hold."""
    step = probe["plain"]["steps"][1]
    assert step["op"] == "schedule"
    assert step["tree"] == [[6, 6, None, 0, 1], [8, 2, [8, 9], 0, 1], [12, 4, [10, 11, 12, 13], 1, 1]]
    assert step["reqs"] == {"1": [12, 12, 6, 0]}       # committed, protected, cursor, floor
    assert step["concrete"] == []
    # the second decode batch raises the cursor to swa_dead_lo = cache_protected_len
    assert probe["plain"]["steps"][3]["reqs"] == {"1": [14, 12, 12, 0]}


def test_the_spec_follows_0523_at_that_checkpoint(probe):
    """Every probe sequence runs in lockstep with the release: the spec's borrow era frees
    out-of-window SWA at the checkpoint, keeps the part below the cursor as a tombstone
    node and caps the live leaf at one page-aligned window, as the release does (before
    those rules every sequence parted at its first prefill)."""
    for name, r in probe.items():
        assert r["first_divergence"] is None, (name, r["first_divergence"])
        assert all(not s["concrete"] for s in r["steps"]), name


def test_session_slot_lock_boundary_reads_back(probe):
    """The first turn's lock (taken by the slot) carries the SWA boundary uuid of the capped
    leaf; close_session releases it (SWA lock_ref 0 everywhere) and the leaf stays cached."""
    steps = probe["session"]["steps"]
    assert steps[2]["slots"]["1"][3] == ["node", list(range(1, 13))]
    assert steps[-1]["op"] == "close_session" and steps[-1]["slots"] == {}
    assert all(n[3] == 0 and n[4] == 0 for n in steps[-1]["tree"])


def test_evicting_everything_returns_both_pools(probe):
    steps = probe["evict"]["steps"]
    assert steps[-1]["op"] == "evict" and steps[-1]["tree"] == [] and steps[-1]["swa_free"] == 24


WIDE = Config(page_size=2, num_pages=24, num_rows=4, swa_window=32, era="borrow")


def test_a_window_wider_than_every_sequence_agrees_with_0523():
    """With a window no sequence outgrows, nothing is window-freed, tombstoned or capped:
    every probe sequence runs in lockstep with the real FULL + SWA tree, including the
    retried request whose finish 0.5.23 does not split at the prompt (the spec's
    `prompt_split_on`: `checkpoint_into_tree` splits a FULL-only tree only)."""
    _need_0523()
    from kvcheck.adapters.sglang.proxy import swa_unified_probe
    r = swa_unified_probe(WIDE, "0.5.23")
    assert {k: v["first_divergence"] for k, v in r.items()} == {k: None for k in r}
    last = r["retract_evict"]["steps"][-1]
    assert [n[:2] for n in last["tree"]] == [[16, 16], [18, 2]]     # no node ends at 12


def test_prompt_split_only_for_a_full_only_tree():
    from kvcheck.spec.swa_tree import prompt_split_on
    from kvcheck.spec.state import initial_state
    assert prompt_split_on(initial_state(Config(era="borrow")))
    assert not prompt_split_on(initial_state(WIDE))
    assert not prompt_split_on(initial_state(Config(era="borrow", mamba_slots=2)))
    assert not prompt_split_on(initial_state(Config(swa_window=4)))      # wrapper era


def test_slot_lock_boundary_follows_the_checkpoint_on_spec_and_impl(probe):
    """0.5.23 `acquire_component_lock`: the boundary is the first node up from the locked
    one covering the window; `try_checkpoint` moves the slot's lock (and so its boundary)
    to the node the first turn's prompt insert ends on. The spec and impl take the same
    anchor the release reads back, and the probe's divergence no longer names it."""
    from kvcheck.adapters.impl import ImplBackend
    from kvcheck.adapters.sglang.swa_unified import probe_ops
    from kvcheck.checker import run_ops
    ops = probe_ops()["session"][:3]
    r = run_ops(CFG, ops, ImplBackend(CFG), keep_records=True)
    assert r.failure is None, r.failure.render()
    from kvcheck.spec.model import initial_state, step
    from kvcheck.spec.view import abstract
    s = initial_state(CFG)
    for op in ops:
        s, _ = step(s, op)
    (slot,) = abstract(s).slots
    want = ("node", tuple(range(1, 13)))
    assert slot.swa_uuid_for_lock == want
    assert tuple(map(lambda x: tuple(x) if isinstance(x, list) else x,
                     probe["session"]["steps"][2]["slots"]["1"][3])) == want
    assert probe["session"]["first_divergence"] is None
