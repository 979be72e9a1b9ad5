"""`kvcheck replay` reads like a debugger: stable raw page ids, changed values in full,
free pages by number, both sides' full states at the failure, --state and --grid."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from kvcheck.impl import faults
from kvcheck import cli
from kvcheck.render import fmt_ids, grid_lines, owner_grid, state_marks
from kvcheck.replay import run_replay, step_labels
from kvcheck.trace import load
from kvcheck.spec.abstract import canonical, diff, segments

ROOT = Path(__file__).resolve().parents[1]
REG = ROOT / "stateful_tests" / "regressions"
PLANTED = REG / "planted" / "free_tail_unaligned.json"
H3 = ROOT / "stateful_tests" / "upstream" / "h3-sglang-0.5.15.json"


def _step_block(out: str, step: int) -> str:
    """The lines of one step in replay's output."""
    start = out.index(f"step {step:3d}  ")
    nxt = out.find(f"step {step + 1:3d}  ", start)
    return out[start:nxt if nxt > 0 else len(out)]


def test_fmt_ids_lists_numbers_as_ranges_and_counts_doubles():
    assert fmt_ids((6, 7, 8, 10, 32, 9)) == "6-10, 32"
    assert fmt_ids((3, 5, 5, 6)) == "3, 5 (x2), 6"
    assert fmt_ids(()) == "none"


def test_long_tuples_show_the_differing_segment_not_a_shared_prefix():
    a = tuple(range(10, 80))
    b = a[:40] + (99,) + a[41:] + (7,)
    sa, sb = segments(a, b)
    assert sa == "(…40 same…, 50, …29 same…, 79)" or "50" in sa
    assert "99" in sb and "7" in sb and "…40 same…" in sb
    # the checker's D1 message (diff on canonical states) shows it too
    from kvcheck.spec.abstract import AbstractState
    s = AbstractState(1, 1, 1, (), (), (), (), (), (), 0, 0)
    lines = diff(replace(s, free_rows=a), replace(s, free_rows=b), "spec", "impl")
    assert len(lines) == 1 and "99" in lines[0] and "…40 same…" in lines[0]


def test_h3_step_8_has_no_phantom_renumbering(capsys):
    assert cli.main(["replay", str(H3), "--backend", "spec"]) == 0
    out = capsys.readouterr().out
    step8 = _step_block(out, 8)
    # schedule of the stub adds node [0] on page 11; nothing else is renumbered
    assert "+ node [0]" in step8 and "pages = (11,)" in step8
    assert "node [11, 12, 13, 14, 15]" not in step8 and "row_pages" not in step8
    assert "kv content of page 1:" not in step8 and "kv content of page 11 = (0,)" in step8
    # free pages by number, with what the step took
    assert "free pages: taken 1-5; 27 free: 6-32" in _step_block(out, 2)
    assert "config: {\"page_size\": 1," in out          # config printed as JSON


@pytest.fixture
def planted_run():
    with faults.planted("free_tail_unaligned"):
        yield run_replay(load(PLANTED), "impl")


def test_failing_step_records_both_states(planted_run):
    res = planted_run
    assert res.failure.id == "C1" and res.failure.step == 4
    last = res.records[-1]
    assert last.backend_state is not None and last.spec_state is not None
    assert last.backend_state.free_pages != last.spec_state.free_pages


def test_failing_step_prints_both_full_states_with_the_difference_marked(capsys):
    with faults.planted("free_tail_unaligned"):
        assert cli.main(["replay", str(PLANTED)]) == 0
    out = capsys.readouterr().out
    step4 = _step_block(out, 4)
    assert "full state after step 4, where it fails" in step4
    assert "* free_pages" in step4 and "spec: 2-14 (13)" in step4 and "impl: 1-14 (14)" in step4
    assert "req 4: row_pages" in step4 and "slot of session 2: committed" in step4
    assert "impl (* only this side):" in step4
    assert "* free pages: returned 1; 14 free: 1-14" in step4         # what only impl did
    assert "FAIL at step 4" in out


def test_marks_tell_a_real_difference_from_a_renaming():
    res = run_replay(load(PLANTED), "spec")
    a = res.state_at("spec", 2)
    renamed = replace(a, free_pages=tuple(sorted(set(a.free_pages) - {14} | {1})),
                      reqs=tuple(replace(r, row_pages=(14,)) for r in a.reqs),
                      content=tuple((14 if p == 1 else p, c) for p, c in a.content))
    assert canonical(renamed) == canonical(a)
    marks = state_marks(a, renamed)
    assert marks and set(marks.values()) == {"~"}
    changed = replace(renamed, protected_size=renamed.protected_size + 1)
    assert state_marks(a, changed)[("protected_size", None)] == "*"


def test_state_flag_prints_one_step_and_checks_its_range(capsys):
    with faults.planted("free_tail_unaligned"):
        assert cli.main(["replay", str(PLANTED), "--state", "2"]) == 0
        out = capsys.readouterr().out
        assert "state after step 2 (schedule(rid=4, admit=True))" in out
        assert "step   0  " not in out                       # the view replaces the listing
        assert "req 4: phase" in out and "'decode'" in out
        assert cli.main(["replay", str(PLANTED), "--state", "9"]) == 2
    assert "--state 9: the run has steps 0..4" in capsys.readouterr().err


def test_grid_shows_the_page_that_is_free_and_owned(planted_run, capsys):
    lines = grid_lines(planted_run.states("impl"), step_labels(planted_run), "impl")
    row1 = next(x for x in lines if x.split()[:1] == ["1"])
    assert row1.split() == ["1", ".", ".", ".", "r", "s", "!"]
    assert "  step 4, page 1: free list + req 4 / slot of session 2" in lines
    spec_row1 = next(x for x in grid_lines(planted_run.states("spec"), step_labels(planted_run), "spec")
                     if x.split()[:1] == ["1"])
    assert spec_row1.split()[-1] == "r"
    with faults.planted("free_tail_unaligned"):
        assert cli.main(["replay", str(PLANTED), "--grid"]) == 0
    assert "page x step owners (impl)" in capsys.readouterr().out


def test_grid_kinds_for_tree_nodes_and_leaks():
    res = run_replay(load(H3), "spec")
    lines = grid_lines(res.states("spec"), step_labels(res), "spec")
    assert lines[-1].split() == ["13-32"] + ["."] * 14      # pages free throughout: one row
    assert [x.split()[0] for x in lines[3:-1]] == [str(p) for p in range(1, 13)]
    pages, cols = owner_grid(res.states("spec"))
    assert cols[3][1][0] == "node_locked"            # after schedule: the prompt under lock
    assert cols[-1][11][0] == "node"                 # the stub's node [0], unlocked
    leaked = replace(res.state_at("spec", 2), free_pages=res.state_at("spec", 2).free_pages[1:])
    _, (col,) = owner_grid([leaked])
    assert col[res.state_at("spec", 2).free_pages[0]][0] == "leak"


def test_a_file_that_cannot_be_written_is_a_usage_error(capsys):
    worked = str(REG / "worked_example_5_4.json")
    for flag in ("--html", "--itf", "--emit-pytest"):
        assert cli.main(["replay", worked, "-q", flag, "/proc/no/such/dir/x"]) == 2
        err = capsys.readouterr().err     # refused while parsing, before the replay runs
        assert err.count("\n") == 1 and f"argument {flag}: /proc/no/such/dir/x" in err


def test_a_trace_that_accepts_findings_is_not_replayed_on_impl(tmp_path, capsys):
    """impl/ implements the fixed behaviour only: an --accept trace on it would diverge
    wherever the spec follows upstream, so the replay refuses (exit 2) and says where to
    run it."""
    import json

    from kvcheck import cli
    src = ROOT / "stateful_tests" / "upstream" / "s8-reused-rid-not-req-nodes-sglang-0.5.15.json"
    t = json.loads(src.read_text())
    t["expect"] = {"result": "pass"}            # no recorded release: impl by default
    del t["#meta"]["backend"]
    path = tmp_path / "accepts.json"
    path.write_text(json.dumps(t))
    assert cli.main(["replay", str(path)]) == 2
    err = capsys.readouterr().err
    assert "accepts U1,U2,U3,M2" in err and "--backend sglang:VERSION" in err
    assert cli.main(["replay", str(path), "--backend", "spec"]) == 0
