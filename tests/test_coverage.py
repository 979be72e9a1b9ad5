"""`kvcheck coverage`: the branches `make check`'s runs reach in impl/ never shrink (a
recorded baseline), the report's arithmetic and listing, the usage errors, and (with a
built release) coverage measured inside the sglang server process."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvcheck.coverage import BASELINE, CoverageReport, file_coverage, reached, sglang_report

ROOT = Path(__file__).resolve().parents[1]
QUICK = ["--examples", "30", "--rounds", "0", "--no-exhaustive", "--brief"]
"""The baseline's plan: both corpora and a 30-sequence differential run (about 10 s).
`kvcheck coverage`'s exhaustive differential (check-impl, every transition: 36 of the 44 s
the plan took with it) reaches no baseline branch the others miss (715 of 715 without it),
so it is left out. Rewrite the baseline after a deliberate change with `kvcheck coverage
--examples 30 --rounds 0 --no-exhaustive --brief --reached tests/coverage_baseline.json`."""


def kvcheck(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "kvcheck.cli", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def test_check_still_reaches_every_baseline_branch(tmp_path):
    out = tmp_path / "reached.json"
    r = kvcheck("coverage", *QUICK, "--reached", str(out))
    assert r.returncode == 0, r.stderr[-2000:]
    now = set(json.loads(out.read_text()))
    lost = sorted(set(json.loads(BASELINE.read_text())) - now)
    assert not lost, ("branches of impl/ the check reached before and no longer reaches "
                      f"(generation or impl changed; see docs/coverage.md): {lost}")
    assert "TOTAL" in r.stdout and "branch%" in r.stdout


ENTRY = {
    "summary": {"num_statements": 10, "missing_lines": 2, "num_branches": 4},
    "missing_branches": [[3, 4], [7, -1]],
    "executed_branches": [[3, 5], [7, 8]],
    "functions": {
        "A.f": {"summary": {"num_statements": 6, "missing_lines": 1, "num_branches": 2},
                "missing_branches": [[3, 4]], "executed_branches": [[3, 5]]},
        "g": {"summary": {"num_statements": 4, "missing_lines": 1, "num_branches": 2},
              "missing_branches": [[7, -1]], "executed_branches": [[7, 8]]},
    },
}


def test_file_coverage_counts_and_lists_each_missing_branch_with_its_line(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("\n".join(f"line{i}" for i in range(1, 11)))
    fc = file_coverage("m.py", src, ENTRY)
    assert (fc.statements, fc.missing_lines, fc.branches) == (10, 2, 4)
    assert fc.missing == [(3, 4, "line3"), (7, -1, "line7")]
    assert fc.branch_pct == 50.0 and fc.line_pct == 80.0
    only = file_coverage("m.py", src, ENTRY, functions=("A.*",))
    assert (only.statements, only.branches, only.missing) == (6, 2, [(3, 4, "line3")])
    assert file_coverage("m.py", src, ENTRY, functions=("nothing",)) is None
    text = CoverageReport("impl", [fc]).render()
    assert "m.py:3->4  line3" in text and "m.py:7->exit  line7" in text
    assert "TOTAL" in text and "50.0%" in text


def test_reached_names_branches_by_source_text_not_line_number(tmp_path):
    src = tmp_path / "impl" / "x.py"
    src.parent.mkdir()
    lines = ["def f(x):", "    if x:", "        return 1", "    if x:", "        return 1", "    return 2"]
    entry = {"executed_branches": [[2, 3], [4, 5], [6, -1]],
             "functions": {"f": {"executed_branches": [[2, 3], [4, 5], [6, -1]]},
                           "": {"executed_branches": []}}}
    src.write_text("\n".join(lines) + "\n")
    keys = reached({"files": {str(src): entry}}, root=tmp_path)
    assert keys == {"impl/x.py:f: if x: -> return 1", "impl/x.py:f: if x: -> return 1 #2",
                    "impl/x.py:f: return 2 -> exit"}
    src.write_text("\n".join(["# moved down", *lines]) + "\n")
    moved = {"f": {"executed_branches": [[3, 4], [5, 6], [7, -1]]}}
    assert reached({"files": {str(src): {"functions": moved}}}, root=tmp_path) == keys


def test_sglang_report_keeps_only_the_driven_modules_and_functions(tmp_path):
    base = tmp_path / "site-packages" / "sglang" / "srt"
    for rel in ("session/streaming_session.py", "managers/schedule_batch.py",
                "managers/scheduler.py"):
        (base / rel).parent.mkdir(parents=True, exist_ok=True)
        (base / rel).write_text("\n".join(f"l{i}" for i in range(1, 11)))
    sb = dict(ENTRY, functions={"release_req": ENTRY["functions"]["g"],
                                "Req.other": ENTRY["functions"]["A.f"]})
    data = {"files": {str(base / "session/streaming_session.py"): ENTRY,
                      str(base / "managers/schedule_batch.py"): sb,
                      str(base / "managers/scheduler.py"): ENTRY}}
    files = {f.path: f for f in sglang_report(data)}
    assert set(files) == {"srt/session/streaming_session.py", "srt/managers/schedule_batch.py"}
    assert files["srt/managers/schedule_batch.py"].branches == 2       # release_req alone


@pytest.mark.parametrize("args, needle", [
    (["--backend", "spec"], "--backend spec"),
    (["--backend", "sglang:9.9.9"], "sglang-9.9.9"),
    (["--rounds", "-1"], "--rounds"),
    (["--examples", "0"], "--examples"),
])
def test_usage_errors_are_one_line_and_exit_2(args, needle):
    r = kvcheck("coverage", *args, timeout=60)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvcheck coverage: error:"), r.stderr
    assert needle in lines[0] and "Traceback" not in r.stderr


SGLANG = ROOT / ".venv-sglang-0.5.23" / "bin" / "python"


@pytest.mark.skipif(not SGLANG.exists(), reason="needs make sglang-env (.venv-sglang-0.5.23)")
def test_sglang_coverage_is_measured_in_the_release_process(tmp_path):
    out = tmp_path / "cov.json"
    r = kvcheck("coverage", "--backend", "sglang:0.5.23", "--examples", "3", "--rounds", "0",
                "--no-corpus", "--no-exhaustive", "--brief", "--json", str(out))
    assert r.returncode == 0, r.stderr[-2000:]
    files = json.loads(out.read_text())["files"]
    ss = files["srt/session/streaming_session.py"]
    assert ss["branches"] > len(ss["missing_branches"]), "no branch of the session reached"
    assert "srt/managers/schedule_batch.py" in files


def test_a_lazy_track_buffer_is_drawn_with_the_overlap_scheduler():
    """Without overlap a lazy buffer is an eager one (one slot, no -1 entry), so the
    -1 entry `lazy_track_frees_sentinel` frees would be drawn half as often."""
    import random
    from kvcheck.engines.configs import draw_config
    from kvcheck.engines.draw import RandomDrawer
    d = RandomDrawer(random.Random(0))
    cfgs = [draw_config(d, hybrid=True, hybrid_kinds=("mamba",), spec_enabled=False)
            for _ in range(200)]
    lazy = [c for c in cfgs if c.mamba_extra_buffer == "lazy"]
    assert lazy and all(c.overlap for c in lazy)
    assert any(not c.overlap for c in cfgs), "overlap is still drawn for the others"


def test_the_mamba_tree_gets_a_fair_share_of_drawn_configs():
    """`draw_mamba_tree_in` takes Mamba-only configs of either drawn era (one in
    MAMBA_TREE_ONE_IN): about one config in 18, not the one in 72 of the borrow era
    alone, each keeping its era (0.5.15's MambaRadixCache on the wrapper era);
    wrapper-era Mamba-only configs keep a share, and an era asked for stays."""
    import random
    from kvcheck.engines.configs import draw_config
    from kvcheck.engines.draw import RandomDrawer
    d = RandomDrawer(random.Random(0))
    cfgs = [draw_config(d) for _ in range(900)]
    tree = [c for c in cfgs if c.mamba_tree]
    assert 25 <= len(tree) <= 80 and {c.era for c in tree} == {"borrow", "wrapper"}
    assert sum(1 for c in cfgs if c.mamba_slots and not c.swa_window and not c.mamba_tree
               and c.era == "wrapper") >= 20
    asked = [draw_config(d, era="wrapper") for _ in range(300)]
    assert not any(c.mamba_tree for c in asked) and all(c.era == "wrapper" for c in asked)


@pytest.mark.parametrize("era, call", [("borrow", "free_segment"), ("wrapper", "free")])
def test_tree_kv_goes_back_as_upstream_frees_it_in_each_era(era, call):
    """0.5.23 frees an evicted leaf and an insert's duplicates with `free_segment`
    (`FreeDeviceKV`); 0.5.15 with `free`."""
    import torch
    from kvcheck.impl.scheduler import Scheduler
    s = Scheduler(page_size=2, num_pages=8, num_rows=2, era=era, device="cpu")
    alloc, calls = s.token_to_kv_pool_allocator, []
    for name in ("free", "free_segment"):
        real = getattr(alloc, name)
        setattr(alloc, name, lambda x, *a, _n=name, _r=real, **k: (calls.append(_n), _r(x, *a, **k)))
    tree = s.tree_cache.inner
    kv = alloc.alloc_extend(torch.tensor([0]), torch.tensor([4]), torch.tensor([-1]), 4)
    tree.insert((1, 2, 3, 4), kv)
    tree.evict(4)
    assert calls == [call]
