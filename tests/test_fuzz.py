"""Fuzz campaigns: count budget and byte-identical failure files, the first report
before shrinking, the shrink budget in replays, root-cause deduplication, and SIGINT
at any moment (exit 130, every written trace listed, unshrunk ones marked)."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvcheck.fuzz import Interrupts, fuzz, root_cause
from kvcheck.shrink import shrink
from kvcheck.trace import load
from kvcheck.spec import ops as O

ROOT = Path(__file__).resolve().parents[1]
FAULT = "free_no_page_dedup"

# The command line with a planted fault switched on (and, for the interrupt test, each
# shrink replay slowed down so that an interrupt lands inside the shrink).
RUNNER = """
import sys, time
from kvcheck.impl import faults
if {fault!r}:
    faults.ACTIVE.add({fault!r})
if {slow!r}:
    import kvcheck.fuzz as F
    real = F.run_ops
    def slow(*a, **k):
        time.sleep({slow!r})
        return real(*a, **k)
    F.run_ops = slow
from kvcheck import cli
sys.exit(cli.main(sys.argv[1:]))
"""


def cli_cmd(*args, fault=FAULT, slow=0.0):
    return [sys.executable, "-c", RUNNER.format(fault=fault, slow=slow), *args]


def env():
    return {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}


def test_same_seed_and_rounds_give_byte_identical_failure_files(tmp_path):
    outs = []
    for k in range(2):
        out = tmp_path / f"run{k}"
        p = subprocess.run(cli_cmd("fuzz", "--seed", "5", "--rounds", "12", "--out", str(out)),
                           capture_output=True, text=True, cwd=ROOT, env=env(), timeout=300)
        assert p.returncode == 1, p.stdout + p.stderr
        outs.append({f.name: f.read_bytes() for f in sorted(out.iterdir())})
    assert outs[0] and outs[0] == outs[1]
    for data in outs[0].values():
        assert b"seconds" not in data and b'"shrunk": false' not in data


def test_first_report_names_the_unshrunk_trace_before_shrinking(tmp_path, capsys):
    from kvcheck.impl import faults
    with faults.planted(FAULT):
        rep = fuzz(None, 5, out_dir=tmp_path, rounds=12, stop_on_first=True)
    err = capsys.readouterr().err
    f = rep.found[0]
    first, shrunk = err.index("FOUND " + f.id), err.index("shrunk ")
    assert first < err.index("unshrunk trace") < shrunk
    assert str(f.path) in err and f.shrunk and f.length <= f.original_length
    assert f.seconds_generated <= f.seconds_to_find <= f.seconds_to_shrunk
    assert load(f.path).expect.invariant == f.id


def test_every_written_trace_gets_its_html_report_beside_it(tmp_path, capsys):
    from kvcheck.impl import faults
    with faults.planted(FAULT):
        rep = fuzz(None, 5, out_dir=tmp_path, rounds=12, stop_on_first=True)
    f = rep.found[0]
    assert f.html == f.path.with_suffix(".html") and f.html.exists()
    page = f.html.read_text()
    assert re.search(rf'"id": ?"{f.id}"', page) and "<script src" not in page  # self-contained
    err = capsys.readouterr().err
    assert err.count(f"report: {f.html}") == 2                  # unshrunk, then shrunk
    assert f"report: {f.html}" in rep.render()


def test_count_budget_runs_exactly_that_many_sequences(tmp_path):
    rep = fuzz(None, 3, "spec", tmp_path, rounds=7, quiet=True)
    assert rep.sequences == 7 and not rep.found and not rep.interrupted


def test_shrink_budget_is_counted_in_replays():
    ops = [O.OpenSession(i) for i in range(1, 30)]
    calls = []

    def fails(c):
        calls.append(1)
        return O.OpenSession(7) in c

    out = shrink(ops, fails, max_replays=5)
    assert len(calls) == 5 and O.OpenSession(7) in out
    calls.clear()
    assert shrink(ops, fails, max_replays=1000) == [O.OpenSession(7)]


def test_root_cause_names_id_side_operation_and_owner_kind():
    from kvcheck.checker import Failure
    from kvcheck.spec.violations import Violation
    v = Violation("I2", "page exclusivity", "page 3 twice", "req 12", 3)
    a = Failure(4, O.Finish(12), "I2", "impl", [v])
    b = Failure(9, O.Finish(30), "I2", "impl", [Violation("I2", "x", "y", "req 30", 5)])
    c = Failure(9, O.Retract(30), "I2", "impl", [v])
    assert root_cause(a) == root_cause(b) == ("I2", "impl", "finish", "req")
    assert root_cause(c) != root_cause(a)


def test_interrupt_inside_a_write_is_taken_after_it():
    ints = Interrupts()
    done = []
    with ints.installed(), pytest.raises(KeyboardInterrupt):
        with ints.deferred():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
            done.append("written")
    assert done == ["written"]


def test_a_swallowed_interrupt_still_stops_the_campaign():
    ints = Interrupts()
    try:
        ints.handler(signal.SIGINT, None)       # e.g. raised inside a gc callback and lost
    except KeyboardInterrupt:
        pass
    with pytest.raises(KeyboardInterrupt):
        ints.check()


def _interrupt_when(tmp_path, marker, *, fault=FAULT, slow=0.0, extra=()):
    """Start a fuzz run, send SIGINT once `marker` appears on stderr (None: after 2 s)."""
    p = subprocess.Popen(cli_cmd("fuzz", "--seed", "5", "--seconds", "120", "--out", str(tmp_path),
                                 *extra, fault=fault, slow=slow),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env())
    err = []
    deadline = time.monotonic() + 120
    if marker is None:
        time.sleep(2.0)
    else:
        for line in p.stderr:
            err.append(line)
            if marker in line or time.monotonic() > deadline:
                break
    p.send_signal(signal.SIGINT)
    out, rest = p.communicate(timeout=120)
    return p.returncode, out, "".join(err) + rest


def test_sigint_while_generating_exits_130_without_a_finding(tmp_path):
    rc, out, err = _interrupt_when(tmp_path, "kvcheck fuzz:", fault="close_not_deferred", slow=0.0,
                                   extra=("--backend", "spec"))
    assert rc == 130, out + err
    assert "INTERRUPTED" in out and "no failure found before the interrupt" in out
    assert "Traceback" not in err


def test_sigint_while_shrinking_lists_the_unshrunk_trace(tmp_path):
    rc, out, err = _interrupt_when(tmp_path, "unshrunk trace", slow=0.2)
    assert rc == 130, out + err
    assert "no failure found" not in out and "UNSHRUNK" in out
    written = list(tmp_path.glob("*.json"))
    assert len(written) == 1 and f"{written[0]} (unshrunk)" in out
    assert load(written[0]).meta["shrunk"] is False
    assert "Traceback" not in err


def test_sigint_after_a_shrunk_failure_lists_it(tmp_path):
    rc, out, err = _interrupt_when(tmp_path, "  shrunk ")
    assert rc == 130, out + err
    written = list(tmp_path.glob("*.json"))
    assert written and all(str(w) in out for w in written)
    assert "no failure found" not in out and "Traceback" not in err


def test_selftest_reports_each_fault_as_found_and_counts_rounds(tmp_path):
    p = subprocess.run(cli_cmd("selftest", "free_no_page_dedup", "save_keeps_row", "--rounds", "40",
                               "--out", str(tmp_path), fault=None),
                       capture_output=True, text=True, cwd=ROOT, env=env(), timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "caught 2/2" in p.stdout and "free_no_page_dedup: FOUND" in p.stderr
    assert len(list(tmp_path.glob("*/*.json"))) == 2


def test_selftest_interrupted_while_shrinking_exits_130_and_lists_the_trace(tmp_path):
    p = subprocess.Popen(cli_cmd("selftest", "free_no_page_dedup", "save_keeps_row", "--rounds", "40",
                                 "--out", str(tmp_path), fault=None, slow=0.2),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env())
    for line in p.stderr:
        if "unshrunk trace" in line:
            break
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 130, out + err
    written = list(tmp_path.glob("*/*.json"))
    assert len(written) == 1 and f"{written[0]} (unshrunk)" in out and "INTERRUPTED" in out
    assert "Traceback" not in err


@pytest.mark.parametrize("bad", ["file", "readonly"])
def test_unwritable_out_is_a_usage_error_before_any_work(tmp_path, bad):
    target = tmp_path / "f"
    if bad == "file":
        target.write_text("x")
    else:
        target.mkdir()
        target.chmod(0o500)
        if os.access(target, os.W_OK):      # root ignores the mode bits
            pytest.skip("running as root: a read-only folder is writable")
    p = subprocess.run(cli_cmd("fuzz", "--rounds", "3", "--out", str(target)),
                       capture_output=True, text=True, cwd=ROOT, env=env(), timeout=300)
    assert p.returncode == 2 and "--out" in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert "kvcheck fuzz: backend" not in p.stderr


def test_hypothesis_engine_finds_and_kvcheck_shrinks(tmp_path, capsys):
    from kvcheck.impl import faults
    with faults.planted(FAULT):
        rep = fuzz(None, 5, out_dir=tmp_path, rounds=60, engine="hypothesis", stop_on_first=True)
    assert rep.found and rep.engine == "hypothesis", rep.render()
    f = rep.found[0]
    assert f.shrunk and f.length <= f.original_length and "FOUND" in capsys.readouterr().err
    assert load(f.path).meta["engine"] == "hypothesis"


def test_check_reports_the_differential_failure_before_its_part_ends(tmp_path):
    p = subprocess.run(cli_cmd("check", "--skip-explore", "--skip-proofs", "--examples", "60",
                               "--out", str(tmp_path), fault="free_tail_unaligned"),
                       capture_output=True, text=True, cwd=ROOT, env={**env(), "PYTHONUNBUFFERED": "1"},
                       timeout=600)
    assert p.returncode == 1, p.stdout + p.stderr
    err_found = p.stderr.index("FOUND ")
    assert "unshrunk trace" in p.stderr[err_found:] and "  shrunk " in p.stderr[err_found:]
    trace = next(tmp_path.glob("*.json"))
    assert f"trace: {trace}" in p.stdout and load(trace).meta.get("shrunk") is None
