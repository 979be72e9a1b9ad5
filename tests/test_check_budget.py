"""`check`'s differential run reaches the retry of a retracted request
(plain and from a session slot) with the budget `make check` gives it, not only through
a corpus trace; and it fails, naming the path, when a path is not reached."""
from __future__ import annotations

import pytest

from kvcheck import cli
from kvcheck.check import MIN_EXAMPLES, differential_part
from kvcheck.engines import stats


def test_make_checks_budget_reaches_every_path(tmp_path):
    args = cli.build_parser().parse_args(["check", "--out", str(tmp_path)])   # make check's
    ok, detail = differential_part(args.backend, args.out, args.examples, args.engine)
    assert ok, detail
    for path in stats.PATHS:
        assert f"{path} " in detail
    steps = int(detail.split(" steps")[0].split(", ")[-1])
    assert steps / args.examples >= 50, detail       # longer sequences than the old ~16-44


def test_a_path_not_reached_fails_the_part(tmp_path, monkeypatch):
    monkeypatch.setitem(stats.PATHS, "never", lambda state, op: False)
    ok, detail = differential_part("impl", tmp_path, 2, "walk")
    assert not ok and "NOT REACHED" in detail and "'never'" in detail


@pytest.mark.parametrize("engine", sorted(MIN_EXAMPLES))
def test_the_examples_floor_reaches_every_operation(tmp_path, engine):
    """`check --examples` below MIN_EXAMPLES is a usage error: at the floor the run from
    the fixed seed reaches every operation and path, so no count check accepts is
    reported as a finding for being small."""
    ok, detail = differential_part("spec", tmp_path, MIN_EXAMPLES[engine], engine)
    assert ok, detail


def test_every_engine_has_a_floor():
    from kvcheck.engines import ENGINES
    assert set(ENGINES) == set(MIN_EXAMPLES)
