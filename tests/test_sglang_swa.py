"""The SWA tree on sglang 0.5.15 (adapters/sglang/swa_tree.py): the wrapper-era SWA traces
of the regression corpus replay on `SWARadixCache` + `StreamingSession` over the real SWA
allocator and agree with the spec step by step; the spec's wrapper-era insert rule the
release showed (`_insert_helper`'s tombstone node below `swa_evicted_seqlen`). The release
tests skip without .venv-sglang-0.5.15 (adapters/sglang/make_env.sh 0.5.15)."""
from __future__ import annotations

from pathlib import Path

import pytest

from kvcheck.spec.config import Config
from kvcheck.spec.swa_tree import swa_tombstone_cut
from kvcheck.spec.state import initial_state

ROOT = Path(__file__).resolve().parents[1]
need_515 = pytest.mark.skipif(not (ROOT / ".venv-sglang-0.5.15/bin/python").exists(),
                              reason="no .venv-sglang-0.5.15 (adapters/sglang/make_env.sh 0.5.15)")
SWA_TRACES = ("swa_evict_past_tombstoned_leaf", "swa_match_over_tombstones",
              "swa_tombstone_internal_node")


@need_515
@pytest.mark.parametrize("name", SWA_TRACES)
def test_wrapper_era_swa_trace_agrees_on_0515(name):
    from kvcheck.replay import replay_trace
    from kvcheck.trace import load
    res, ok = replay_trace(load(ROOT / "stateful_tests/regressions" / f"{name}.json"),
                           "sglang:0.5.15", verbose=False)
    assert res.failure is None and ok, res.failure


def _state(era="wrapper", window=4):
    return initial_state(Config(page_size=2, num_pages=12, swa_window=window, era=era))


def test_insert_puts_the_window_freed_part_in_a_tombstone_node():
    s = _state()
    assert swa_tombstone_cut(s, 2, 10, 6) == 6      # [2, 6) tombstone, [6, 10) live leaf
    assert swa_tombstone_cut(s, 4, 10, 2) == 4      # cursor below the new part: one leaf
    assert swa_tombstone_cut(s, 2, 8, 8) == 8       # all of it freed: no node (caller frees)


def test_the_borrow_era_and_a_plain_run_insert_one_leaf():
    assert swa_tombstone_cut(_state(era="borrow"), 2, 10, 6) == 2
    assert swa_tombstone_cut(_state(window=0), 2, 10, 6) == 2

