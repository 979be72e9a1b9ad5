"""`Config.evict_shortfall`: the wrapper era's eviction rule. sglang 0.5.14-0.5.16's
`evict_from_tree_cache` asks the tree for the allocation's whole need, 0.5.17+ for the
shortfall only (docs/upstream-findings.md, "Releases between"). kvcheck found the change
as a D1 at step 5 of this trace against 0.5.17 (the scope sglang-tiny): a pre-aborted
request's admission on a pool whose only cached node is the one it matched."""
from __future__ import annotations

import pytest

from kvcheck.adapters.impl import ImplBackend
from kvcheck.backends import config_kw, release_config, release_refusal
from kvcheck.checker import run_ops
from kvcheck.spec import ops as O
from kvcheck.spec.config import Config
from kvcheck.spec.model import initial_state, step
from kvcheck.spec.state import ROOT

OPS = (O.SubmitRequest(rid=1, tokens=(2, 2, 3), max_new_tokens=2, logprob_start_len=None),
       O.Schedule(rid=1, admit=True), O.Finish(rid=1),
       O.SubmitRequest(rid=1, tokens=(2, 2, 3), max_new_tokens=2, logprob_start_len=None),
       O.PreAbort(rid=1), O.Schedule(rid=1, admit=True))


def _cfg(rule: bool, era: str = "wrapper") -> Config:
    return Config(page_size=2, num_pages=3, num_rows=2, max_context_len=16, overlap=True,
                  era=era, evict_shortfall=rule)


def _spec_after(cfg):
    s = initial_state(cfg)
    for op in OPS:
        s, _ = step(s, op)
    return s


def test_the_whole_need_evicts_the_cached_prefix_the_shortfall_keeps_it():
    whole, short = _spec_after(_cfg(False)), _spec_after(_cfg(True))
    # the admission runs short by less than the cached node [2, 2]: asking for the whole
    # need evicts it, asking for the shortfall finds enough before it
    assert len(whole.free_pages) == 3 and set(whole.nodes) == {ROOT}
    assert len(short.free_pages) == 2 and len(short.nodes) == 2
    assert short.evictable_size == 2 and whole.evictable_size == 0


@pytest.mark.parametrize("rule", [False, True])
def test_impl_follows_each_rule_in_lockstep(rule):
    res = run_ops(_cfg(rule), OPS, ImplBackend(_cfg(rule)), backend_name="impl")
    assert res.ok, res.failure.render()


def test_the_borrow_era_always_evicts_the_shortfall():
    assert set(_spec_after(_cfg(False, "borrow")).nodes) == set(_spec_after(_cfg(True, "borrow")).nodes)


def test_each_release_runs_its_own_rule():
    assert "evict_shortfall" not in config_kw("spec")
    assert config_kw("sglang:0.5.16")["evict_shortfall"] is False
    assert config_kw("sglang:0.5.17")["evict_shortfall"] is True
    assert "evict_shortfall" not in config_kw("sglang:0.5.23")     # borrow: not a choice
    why = release_refusal(_cfg(False), "sglang:0.5.17")
    assert why and "evict_shortfall=True" in why, why
    assert "evict_shortfall=False" in (release_refusal(_cfg(True), "sglang:0.5.15") or "")
    assert release_refusal(_cfg(True), "sglang:0.5.18") is None
    # the regression corpus runs a wrapper-era trace with the release's rule
    assert release_config(_cfg(False), "sglang:0.5.17").evict_shortfall is True
    assert release_config(_cfg(True), "sglang:0.5.16").evict_shortfall is False
    same = _cfg(False)
    assert release_config(same, "sglang:0.5.15") is same and release_config(same, "impl") is same
