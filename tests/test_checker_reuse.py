"""kvcheck/checker.py: taking the spec's invariant verdict over for a backend step whose
states equal the spec's changes no outcome: every planted-fault and regression trace, and
a set of walk sequences, fail (or pass) at the same step with the same findings either way."""
from __future__ import annotations

import pytest

from kvcheck.impl import faults
from kvcheck import checker
from kvcheck.errors import REGRESSIONS
from kvcheck.replay import run_replay
from kvcheck.trace import load


def _outcome(trace):
    fault = trace.meta.get("planted_fault")
    if fault:
        with faults.planted(fault):
            res = run_replay(trace, "impl")
    else:
        res = run_replay(trace, "impl")
    f = res.failure
    return None if f is None else (f.step, f.id, f.side, [(v.id, v.owner, v.message) for v in f.violations],
                                   f.details)


TRACES = sorted(REGRESSIONS.glob("*.json")) + sorted((REGRESSIONS / "planted").glob("*.json"))


@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.stem)
def test_same_findings_with_and_without_reuse(path, monkeypatch):
    trace = load(path)
    reused = _outcome(trace)
    monkeypatch.setattr(checker, "REUSE_EQUAL_VERDICT", False)
    assert _outcome(trace) == reused


def test_walks_agree_with_and_without_reuse(monkeypatch):
    from kvcheck.adapters.impl import ImplBackend
    from kvcheck.engines.stats import Stats
    from kvcheck.engines.walk import walk

    def run():
        out = []
        for i in range(12):
            seq = walk(5, i, ImplBackend, "impl", Stats())
            f = seq.failure
            out.append((len(seq.ops), None if f is None else (f.step, f.id, f.side)))
        return out
    reused = run()
    monkeypatch.setattr(checker, "REUSE_EQUAL_VERDICT", False)
    assert run() == reused
