"""CrossHair's verdicts are bounded by counts (paths per condition, z3 steps per query),
never by the clock; its wall-clock limit is a safety net whose stop is its own outcome,
"interrupted by the time limit", naming the flag that raises it, never a failed proof."""
from __future__ import annotations

import subprocess
import sys

from kvcheck import cli
from kvcheck.proofs import crosshair_check as X
from kvcheck.proofs import interrupted, report


def test_the_contract_run_is_bounded_by_counts(monkeypatch):
    seen = {}

    class Popen:
        def __init__(self, cmd, cwd, env, **kw):
            seen.update(cmd=cmd, env=env)
    monkeypatch.setattr(X.subprocess, "Popen", Popen)
    X._start("kvcheck.spec.pages", X.ROOT, str(X.ROOT))
    assert seen["cmd"][:4] == [sys.executable, "-m", "kvcheck.proofs.crosshair_run", str(X.ITERATIONS)]
    assert not any("timeout" in a for a in seen["cmd"])
    assert seen["env"]["CROSSHAIR_SMT_RLIMIT"] == str(X.SMT_RLIMIT)
    assert seen["env"]["PYTHONHASHSEED"] == "0"


def test_the_runner_sets_an_iteration_bound_and_no_condition_timeout(monkeypatch):
    import crosshair.main as M

    from kvcheck.proofs import crosshair_run
    got = {}

    def check(args, options, stdout, stderr):
        got["options"] = M.DEFAULT_OPTIONS.overlay(options)
        return 0
    monkeypatch.setattr(M, "check", check)
    monkeypatch.setattr("crosshair.auditwall.engage_auditwall", lambda *a: None)
    assert crosshair_run.main(["17", "kvcheck.spec.pages"]) == 0
    o = got["options"]
    assert o.max_iterations == 17 and o.per_condition_timeout == float("inf")
    assert o.get_max_uninteresting_iterations() == sys.maxsize     # no "no progress" stop
    assert o.per_path_timeout == crosshair_run.PATH_CPU_SECONDS


def test_the_mutant_is_refuted_within_the_count_budget():
    res = X.run_crosshair(only="mutant")
    assert [r.status for r in res] == ["refuted"], res


def test_a_run_stopped_by_the_time_limit_is_interrupted_not_failed(capsys, monkeypatch):
    # a CrossHair process that cannot finish within the safety net (a real one may take
    # less than the net's one-second floor on a quiet machine)
    monkeypatch.setattr(X, "_start", lambda targets, cwd, env_path: subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], stdout=subprocess.PIPE, text=True))
    res = X.run_crosshair(0.01, only="ceil_div")
    assert {r.status for r in res} == {"interrupted"}, res
    assert interrupted(res) == res
    assert all(X.TIME_LIMIT_FLAG in r.detail and "not a failed proof" in r.detail for r in res)
    text = report(res)
    assert "STOP interrupted" in text and "FAIL" not in text and "expected" not in text.split("==")[-2]
    assert "interrupted by the time limit (no verdict)" in text
    assert cli.proofs_exit(res) == 130
