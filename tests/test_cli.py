"""The command line: help, replay verdicts, clear errors on bad input, fuzz output."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvcheck import cli
from kvcheck.replay import replay_trace
from kvcheck.trace import TraceError, load, parse

ROOT = Path(__file__).resolve().parents[1]
REG = ROOT / "stateful_tests" / "regressions"


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "kvcheck.cli", *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=300)


def test_help_lists_subcommands():
    p = run_cli("--help")
    assert p.returncode == 0
    for cmd in ("check", "fuzz", "replay", "explore", "prove", "selftest"):
        assert cmd in p.stdout


def test_replay_scenario_passes(capsys):
    rc = cli.main(["replay", str(REG / "worked_example_5_4.json")])
    out = capsys.readouterr().out
    assert rc == 0 and "PASS" in out and "as expected" in out
    assert "step   0  open_session(sid=1)" in out and "free pages:" in out   # state changes shown


def test_replay_planted_trace_without_its_fault_is_not_as_expected(capsys):
    from kvcheck.impl import faults
    t = load(REG / "planted" / "free_tail_unaligned.json")
    res, ok = replay_trace(t, "impl", verbose=False)
    assert not ok and res.failure is None
    with faults.planted("free_tail_unaligned"):
        assert replay_trace(t, "impl", verbose=False)[1]


def test_replay_reports_violation_with_fault(capsys):
    from kvcheck.impl import faults
    with faults.planted("free_tail_unaligned"):
        rc = cli.main(["replay", str(REG / "planted" / "free_tail_unaligned.json")])
    out = capsys.readouterr().out
    assert rc == 0 and "FAIL at step" in out and "page" in out


@pytest.mark.parametrize("content,needle", [
    ("not json", "not JSON"),
    ("[]", "must be a JSON object"),
    ('{"config": {"page_size": 0}, "ops": [], "expect": {"result": "pass"}}',
     "config.page_size must be an integer in [1, 64], got 0"),
    ('{"config": {"page_size": 2, "max_context_len": 7}, "ops": [], "expect": {"result": "pass"}}',
     "multiple of page_size"),
    ('{"config": {"bogus": 1}, "ops": [], "expect": {"result": "pass"}}', "config: unknown field(s)"),
    ('{"config": {}, "ops": [{"op": "teleport"}], "expect": {"result": "pass"}}',
     "ops[0].op must be one of"),
    ('{"config": {}, "ops": [{"op": "decode"}], "expect": {"result": "pass"}}', "missing 'rid'"),
    ('{"config": {}, "ops": [{"op": "decode", "rid": "x"}], "expect": {"result": "pass"}}',
     "must be an integer"),
    ('{"config": {}, "expect": {"result": "pass"}}', "missing 'ops'"),
    ('{"config": {}, "ops": []}', "missing 'expect'"),
    ('{"config": {}, "ops": [], "expect": {"result": "maybe"}}', "expect.result must be one of"),
])
def test_malformed_trace_gets_a_clear_error(tmp_path, content, needle):
    f = tmp_path / "t.json"
    f.write_text(content)
    p = run_cli("replay", str(f))
    assert p.returncode == 2, p.stdout + p.stderr
    assert needle in p.stderr and "Traceback" not in p.stderr, p.stderr


def test_missing_file_and_unknown_backend():
    p = run_cli("replay", "/nonexistent.json")
    assert p.returncode == 2 and "no such file" in p.stderr and "Traceback" not in p.stderr
    p = run_cli("replay", str(REG / "worked_example_5_4.json"), "--backend", "nope")
    assert p.returncode == 2 and "unknown backend" in p.stderr


def test_disabled_op_in_trace_is_reported(tmp_path):
    f = tmp_path / "t.json"
    f.write_text(json.dumps({"config": {}, "ops": [{"op": "decode", "rid": 3}],
                             "expect": {"result": "pass"}}))
    p = run_cli("replay", str(f), "--backend", "spec")
    assert p.returncode == 1 and "X1" in p.stdout and "not enabled" in p.stdout
    assert "request 3 does not exist" in p.stdout


def test_trace_round_trip():
    t = load(REG / "worked_example_5_4.json")
    again = parse(json.loads(t.dumps()))
    assert again.ops == t.ops and again.config == t.config and again.expect == t.expect


def test_fuzz_finds_planted_fault_and_writes_replayable_trace(tmp_path):
    from kvcheck.impl import faults
    from kvcheck.fuzz import fuzz
    with faults.planted("free_no_page_dedup"):
        rep = fuzz(20, seed=3, out_dir=tmp_path, stop_on_first=True, quiet=True)
    assert rep.found, rep.render()
    f = rep.found[0]
    assert f.path.exists() and f.length <= f.original_length
    text = rep.render()
    assert f"kvcheck replay {f.path}" in text and "steps/s" in text
    t = load(f.path)
    assert t.expect.invariant == f.id
    with faults.planted("free_no_page_dedup"):
        res, ok = replay_trace(t, "impl", verbose=False)
    assert ok


def test_fuzz_clean_run_reports_coverage(tmp_path):
    from kvcheck.fuzz import fuzz
    rep = fuzz(4, seed=5, out_dir=tmp_path, quiet=True)
    assert not rep.found and rep.steps > 0 and rep.sequences > 0
    assert "operation coverage" in rep.render() and not list(tmp_path.iterdir())
