"""mutmut's test command: the fast parts of `kvcheck check` against impl/ (the regression
corpus, the planted-fault corpus with each fault off, and a fixed-count differential
run, the exhaustive differential of the check-impl preset). A mutant of impl/ is killed
when one of them fails. Not in `make test`'s
testpaths: `python -m kvcheck.mutation` runs it under mutmut.

KVCHECK_MUTATION_EXAMPLES: the differential run's sequences (default 60)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from kvcheck.check import CHECK_SEED
from kvcheck.errors import REGRESSIONS
from kvcheck.trace import load

EXAMPLES = int(os.environ.get("KVCHECK_MUTATION_EXAMPLES", "60"))
CORPUS = sorted(REGRESSIONS.glob("*.json")) + sorted((REGRESSIONS / "planted").glob("*.json"))


@pytest.mark.parametrize("path", CORPUS, ids=lambda p: p.parent.name + "/" + p.stem)
def test_corpus_trace(path: Path):
    """A regression trace replays as expected; a planted-fault trace passes with its
    fault off and is caught with it on (kvcheck check's corpus parts)."""
    from kvcheck.check import planted_verdict
    from kvcheck.replay import replay_trace
    trace = load(path)
    if "planted_fault" in trace.meta:
        verdict, text = planted_verdict(trace)
        assert verdict == "caught", text
        return
    res, ok = replay_trace(trace, "impl", verbose=False)
    assert ok, res.failure.render() if res.failure else "unexpected pass"


def test_differential(tmp_path):
    """kvcheck check's differential part: fixed seed and count, first failure fails."""
    from kvcheck.fuzz import Console, fuzz
    rep = fuzz(None, CHECK_SEED, "impl", tmp_path, rounds=EXAMPLES, stop_on_first=True,
               console=Console(quiet=True), shrink_replays=0)
    assert not rep.found, rep.found[0].summary if rep.found else ""


def _check_impl_scopes():
    from kvcheck import explore as X
    from kvcheck.check import CHECK_IMPL_PRESET
    return X.PRESETS[CHECK_IMPL_PRESET]


@pytest.mark.parametrize("scope", _check_impl_scopes(), ids=lambda sc: sc.name)
def test_exhaustive_differential(scope):
    """kvcheck check's exhaustive differential: every transition of the scope on the spec
    and impl side by side."""
    from kvcheck import explore as X
    from kvcheck.engines.exhaustive import check_transitions
    rep = check_transitions(X.explore(scope))
    assert rep.failure is None, rep.line()
