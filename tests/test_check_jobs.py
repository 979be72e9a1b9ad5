"""`kvcheck check --jobs N`: the parts run in N worker processes with the same results as
one after another; a part that raises fails alone; Ctrl-C stops every worker and exits 130."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvcheck import check as C
from kvcheck.errors import REGRESSIONS

ROOT = Path(__file__).resolve().parent.parent


def boom(name):
    raise RuntimeError(f"{name} blew up")


def parts(tmp_path):
    return [C.Part("exhaustive exploration: tiny", C.explore_part, ("tiny", "tiny", tmp_path)),
            C.Part("fails", boom),
            C.Part("regression corpus", C.corpus_part, ((REGRESSIONS,), "spec")),
            C.Part("checker self-test corpus", C.planted_part)]


def summary(results):
    return [(r.name, r.ok, r.detail, [(c.name, c.ok, c.text) for c in r.cases],
             r.extra.get("goals")) for r in results]


def test_parts_in_two_processes_give_the_results_of_one(tmp_path):
    shown = []
    one = C.run_parts(parts(tmp_path), 1, shown.append)
    two = C.run_parts(parts(tmp_path), 2, shown.append)
    assert summary(one) == summary(two)
    assert [r.name for r in two] == [p.name for p in parts(tmp_path)]      # list order
    assert len(shown) == 8
    by = {r.name: r for r in two}
    assert not by["fails"].ok and by["fails"].detail == "RuntimeError: fails blew up"
    assert by["regression corpus"].ok and by["checker self-test corpus"].ok
    tiny = by["exhaustive exploration: tiny"]
    assert tiny.ok and "distinct states" in tiny.detail and tiny.extra["goals"]["reached"]
    assert "scope tiny:" in tiny.output          # the worker's stdout, kept for the driver


def _children(pid: int) -> list:
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        kids = (task / "children").read_text().split()
        out += [int(k) for k in kids]
    return out


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux /proc")
def test_an_interrupt_stops_every_worker_and_exits_130(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.Popen([sys.executable, "-m", "kvcheck.cli", "check", "--backend", "spec",
                          "--skip-proofs", "--jobs", "2", "--out", str(tmp_path),
                          "--json", str(tmp_path / "r.json")],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                         cwd=tmp_path)
    first = p.stdout.readline()
    assert "parts in 2 processes" in first, first
    deadline = time.monotonic() + 60
    workers: list = []
    while len(workers) < 2 and time.monotonic() < deadline:     # the pool's processes
        workers = [k for k in _children(p.pid)
                   if "spawn_main" in Path(f"/proc/{k}/cmdline").read_text(errors="replace")]
        time.sleep(0.2)
    assert len(workers) == 2
    time.sleep(2)                               # inside the exploration
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 130, (out, err)
    assert err.strip().splitlines()[-1] == "kvcheck check: interrupted"
    assert "Traceback" not in err
    # the summary of the parts done, what was written, and the --json of the parts done
    assert "kvcheck check: INTERRUPTED after " in out and "trace" in out.splitlines()[-1], out
    import json
    s = json.loads((tmp_path / "r.json").read_text())
    assert s["interrupted"] is True and s["ok"] is False and s["parts_planned"] > len(s["parts"])
    time.sleep(0.5)
    alive = [w for w in workers if Path(f"/proc/{w}").exists()
             and "Z" not in Path(f"/proc/{w}/stat").read_text().split()[2]]
    assert alive == []


def test_a_fault_planted_in_the_driver_is_planted_in_every_worker(tmp_path):
    from kvcheck.impl import faults
    part = C.Part("regression corpus", C.corpus_part, ((REGRESSIONS,), "impl"))
    clean = C.run_parts([part, part], 2, lambda r: None)
    with faults.planted("free_tail_unaligned"):
        one = C.run_parts([part], 1, lambda r: None)
        two = C.run_parts([part, part], 2, lambda r: None)
    assert all(r.ok for r in clean)
    assert not one[0].ok and summary(two) == summary(one) * 2


def spec_mode(name):
    """A part that says whether its process runs the spec compiled."""
    import kvcheck.spec.model
    from kvcheck.compiled import is_compiled
    return True, "compiled" if is_compiled(kvcheck.spec.model) else "interpreted", []


def test_workers_run_a_fresh_compiled_build_and_give_the_same_results(tmp_path):
    from kvcheck import compiled
    try:
        compiled.check_build()
    except compiled.NotBuilt as e:
        pytest.skip(str(e))
    assert C.compiled_build() is None
    ps = [C.Part("mode", spec_mode)] + parts(tmp_path)[:1]
    interp = C.run_parts(ps, 2, lambda r: None, compiled=False)
    comp = C.run_parts(ps, 2, lambda r: None, compiled=True)
    assert (interp[0].detail, comp[0].detail) == ("interpreted", "compiled")
    assert summary(interp[1:]) == summary(comp[1:])


def _check_parts(backend: str, skip_explore: bool = False) -> list:
    import argparse

    from kvcheck.check import check_parts
    args = argparse.Namespace(skip_proofs=True, skip_explore=skip_explore, backend=backend,
                              examples=10, out="/tmp/kvcheck-parts", engine="walk")
    return check_parts(args, (), ())


def _parts(backend: str, skip_explore: bool = False) -> list:
    return [p.name for p in _check_parts(backend, skip_explore)]


def test_check_explores_what_the_backend_can_be_checked_on():
    """impl: the spec's preset and every transition of check-impl on impl; a release with a
    preset: every transition of check-sglang-VERSION on it, not the spec's exploration
    (which does not depend on the backend); --skip-explore leaves both out."""
    from kvcheck.explore import PRESETS
    impl = _parts("impl")
    assert sum(n.startswith("exhaustive exploration: ") for n in impl) == len(PRESETS["check"])
    assert sum("spec vs impl" in n for n in impl) == len(PRESETS["check-impl"])
    for v in ("0.5.15", "0.5.23"):
        rel = _parts(f"sglang:{v}")
        assert not any(n.startswith("exhaustive exploration: ") for n in rel), rel
        assert [n.split(": ")[-1] for n in rel if f"spec vs sglang-{v}" in n] == \
            [sc.name for sc in PRESETS[f"check-sglang-{v}"]]
    assert sum(n.startswith("exhaustive exploration: ") for n in _parts("sglang:0.5.9")) == \
        len(PRESETS["check"])      # a release without a preset: the spec's, as before
    assert not any("exhaustive" in n for n in _parts("sglang:0.5.15", skip_explore=True))


def test_only_the_spec_exploration_judges_reachability_goals(tmp_path):
    """A differential scope explores under the backend's constraints (and judges nothing
    itself under --accept): its reachability is not the spec preset's goal."""
    from kvcheck.check import explore_part
    spec = explore_part("x", "tiny", "tiny", tmp_path, "spec")
    assert "goals" in spec[3]
    impl = explore_part("x", "check-impl", "impl-tiny", tmp_path, "impl")
    assert impl[0] and len(impl) == 3


def test_spare_cores_go_to_the_largest_scopes_as_search_workers(tmp_path):
    """More cores than parts: the spec's exploration parts, largest first, get the spare
    cores as `explore --workers`, with the same result."""
    explore = [C.Part(f"exhaustive exploration: {n}", C.explore_part, ("check", n, tmp_path))
               for n in ("check-rounds", "check-p1")]
    other = C.Part("regression corpus", C.corpus_part, ((REGRESSIONS,), "spec"), quick=True)
    parts = explore + [other]
    assert C.spread_spare_cores(parts, 3) == parts
    workers = lambda cores: [p.args[5] if len(p.args) > 3 else 1
                             for p in C.spread_spare_cores(parts, cores)[:2]]
    assert workers(4) == [2, 1] and workers(5) == [2, 2] and workers(6) == [3, 2]
    tiny = C.Part("exhaustive exploration: tiny", C.explore_part, ("tiny", "tiny", tmp_path))
    one, two = (C.run_part(p, True) for p in [tiny, C.spread_spare_cores([tiny], 2)[0]])
    assert two.ok and two.detail == one.detail and two.extra == one.extra


def nap(name, seconds):
    time.sleep(seconds)
    return True, f"slept {seconds} s", []


def test_the_quick_parts_start_first_one_at_a_time_beside_the_long_ones():
    """The quick parts (differential, corpus, planted faults) go first, one after another
    in one process, while the long ones run in the others: the first finding comes within
    seconds, and the long parts are not held back."""
    ps = [C.Part("long a", nap, (4,)), C.Part("long b", nap, (4,)),
          C.Part("quick 1", nap, (0.5,), quick=True), C.Part("quick 2", nap, (0.5,), quick=True)]
    assert [ps[i].name for i in C.schedule(ps)] == ["quick 1", "quick 2", "long a", "long b"]
    shown = []
    res = C.run_parts(ps, 2, shown.append)
    assert [r.name for r in res] == [p.name for p in ps]            # list order kept
    assert [r.name for r in shown][:2] == ["quick 1", "quick 2"]      # finished first
    by = {r.name: r for r in res}
    assert by["quick 2"].finished < by["long a"].finished
    # quick 1 and quick 2 ran one after the other beside long a; long b after both
    assert by["long b"].finished - by["quick 2"].finished > 3


def test_check_parts_mark_the_defect_finders_quick():
    quick = [p.name for p in _check_parts("impl") if p.quick]
    assert [n.split(" (")[0] for n in quick] == [
        "differential state machine", "regression corpus", "checker self-test corpus"]

