"""`check`'s self-test corpus judges each planted-fault trace honestly: caught, missed,
caught by another check, or failing with the fault OFF (a defect in the tree, reported
as a finding rather than blamed on the self-test). A malformed corpus trace is a usage
error before any work."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from kvcheck.impl import faults
from kvcheck.check import load_corpus, planted_verdict
from kvcheck.errors import REGRESSIONS, UsageError
from kvcheck.trace import load

PLANTED = REGRESSIONS / "planted"
TRACE = PLANTED / "free_tail_unaligned.json"


def test_a_planted_trace_is_caught():
    assert planted_verdict(load(TRACE)) == ("caught", "")


def test_a_trace_whose_fault_changes_nothing_is_missed():
    t = load(TRACE)
    t.meta["planted_fault"] = "evict_ignores_lock"      # never reached by this trace
    verdict, text = planted_verdict(t)
    assert verdict == "missed" and "evict_ignores_lock" in text


def test_a_trace_caught_by_another_check_says_which():
    t = load(TRACE)
    t.expect = replace(t.expect, invariant="I1")
    verdict, text = planted_verdict(t)
    assert verdict == "caught differently" and "recorded I1" in text


def test_a_defect_outside_the_planted_fault_is_a_finding():
    t = load(TRACE)
    # the same defect present in the tree itself (switched on around the whole check):
    # the trace fails with its planted fault off too, so it is not the self-test's miss
    t.meta["planted_fault"] = "evict_ignores_lock"
    t.expect = replace(t.expect, invariant="I1")       # what that fault would have broken
    with faults.planted("free_tail_unaligned"):
        verdict, text = planted_verdict(t)
    assert verdict == "finding" and "fails without the planted fault" in text


def test_a_malformed_corpus_trace_is_a_usage_error(tmp_path: Path):
    (tmp_path / "ok.json").write_text(TRACE.read_text())
    (tmp_path / "bad.json").write_text('{"config": {}, "ops": [], "expected": {}}')
    with pytest.raises(UsageError, match="bad.json"):
        load_corpus([tmp_path])
    assert len(load_corpus([PLANTED])) == len(list(PLANTED.glob("*.json")))
