"""kvcheck explore --workers N / --ray: the same search as one process, count for count:
distinct states, transitions, levels, operation and outcome counts with their first
depths, situations reached, and each violation with its shortest trace, on every scope
of the check preset (shallower), with planted spec defects, with levels rebuilt instead of
kept, and under a state budget; Ctrl-C stops the workers and exits 130."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from kvcheck import explore as E
from kvcheck.errors import ROOT
from kvcheck.explore.parallel import _ranges
from kvcheck.explore.pools import explore_on

from spec_patch import plant
from test_explore import DEFECTS

TINY = E.PRESETS["tiny"][0]
SHALLOW = {"check-two-sessions": 6, "check-overlap": 8, "check-p1": 7, "check-spec-borrow": 8,
           "check-hybrid": 7, "check-mamba-tree": 7, "check-hybrid-borrow": 7,
           "check-p4-spec-chunk": 8, "check-mamba-tree-0515": 7, "check-rounds": 7,
           "check-priority": 7, "check-reserve": 7, "check-progress": 8}
"""Every scope of the check preset, at a depth that a test explores in about a second."""


def outcome(res) -> dict:
    """Everything a search reports but its timing."""
    return dict(states=res.states, transitions=res.transitions, levels=res.level_sizes,
                max_depth=res.max_depth, complete=res.complete_depth, exhausted=res.exhausted,
                stopped=res.stopped, op_counts=dict(res.op_counts),
                outcome_counts=dict(res.outcome_counts), op_first=res.op_first,
                outcome_first=res.outcome_first, reached=res.reached,
                rebuilt=res.rebuilt_levels, trace=[tuple(res.visited[1]), _ops_via(res)],
                violations=[(v.id, v.name, v.message, v.depth, v.ops) for v in res.violations])


def _ops_via(res) -> list:
    return [res.op_table[k] for k in res.visited[2][1:]]


def _same(sc, workers: int = 2, ray_address=None, **kw):
    one = E.explore(sc, **kw)
    many = explore_on(sc, workers=workers, ray_address=ray_address, **kw)
    assert many.workers.count == workers or sc.max_depth == 0
    assert outcome(many) == outcome(one), sc.name
    return one


def test_ranges_cover_a_level_in_order():
    assert _ranges(5, 12, 3) == [(5, 7), (7, 9), (9, 12)]
    assert _ranges(0, 1, 2) == [(0, 0), (0, 1)]


def test_every_check_scope_gives_one_workers_result():
    scopes = E.PRESETS["check"]
    assert {sc.name for sc in scopes} == set(SHALLOW), "a new check scope: give it a depth"
    for sc in scopes:
        res = _same(replace(sc, max_depth=SHALLOW[sc.name]))
        assert res.states > 500 and not res.violations


def test_three_workers_and_every_level_rebuilt():
    _same(TINY, workers=3)
    _same(TINY, frontier_states=0)
    _same(TINY, frontier_states=40)       # some levels kept, the larger ones rebuilt


def test_a_state_budget_stops_at_the_same_state():
    res = _same(TINY, max_states=500)
    assert res.states == 500 and res.stopped


@pytest.mark.parametrize("defect", sorted(DEFECTS))
def test_planted_defects_give_the_same_shortest_traces(defect, monkeypatch):
    plant(monkeypatch, *DEFECTS[defect])     # the forked workers inherit it
    sc = replace(E.PRESETS["bench"][0], max_depth=8)
    first = _same(sc)
    every = _same(sc, all_violations=True)
    assert first.violations and len(every.violations) > 1


def test_the_cli_reports_the_same_with_two_workers(capsys, tmp_path):
    from kvcheck.cli import main
    out = []
    for extra in ([], ["--workers", "2"]):
        assert main(["explore", "--preset", "tiny", "--quiet", "--out", str(tmp_path)] + extra) == 0
        out.append([line for line in capsys.readouterr().out.splitlines()
                    if "states/s" not in line])
    assert out[0] == out[1]


def test_ray_actors_give_one_workers_result():
    ray = pytest.importorskip("ray")
    try:
        _same(replace(E.PRESETS["check"][0], max_depth=5), ray_address="")
    finally:
        if ray.is_initialized():
            ray.shutdown()


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux /proc")
def test_an_interrupt_stops_the_workers_and_exits_130(tmp_path):
    p = subprocess.Popen([sys.executable, "-m", "kvcheck.cli", "explore", "--preset", "nightly",
                          "--workers", "2", "--out", str(tmp_path)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=tmp_path)
    deadline = time.monotonic() + 60
    workers: list = []
    while len(workers) < 2 and time.monotonic() < deadline:
        workers = [int(k) for t in Path(f"/proc/{p.pid}/task").iterdir()
                   for k in (t / "children").read_text().split()]
        time.sleep(0.2)
    assert len(workers) == 2
    time.sleep(2)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 130, (out, err)
    assert "Traceback" not in err and "kvcheck explore: interrupted" in out
    time.sleep(0.5)
    assert [w for w in workers if Path(f"/proc/{w}").exists()
            and "Z" not in Path(f"/proc/{w}/stat").read_text().split()[2]] == []
