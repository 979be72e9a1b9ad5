"""`kvcheck replay --emit-pytest`: by default the emitted test asserts the correct
behaviour (fails while the defect is there, passes once it is fixed) and is named after
the invariant and the operation; `--emit-style recorded` asserts the trace's expectation
(passes with the planted fault on, fails, saying why, with it off)."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvcheck.impl import faults
from kvcheck import cli

ROOT = Path(__file__).resolve().parents[1]
REG = ROOT / "stateful_tests" / "regressions"
PLANTED = REG / "planted" / "free_tail_unaligned.json"


def _emit(tmp_path, trace, *extra, backend=None, style="recorded") -> Path:
    out = tmp_path / f"test_{trace.stem}_{style}.py"
    with faults.planted(*[x for x in extra if x]):
        cli.main(["replay", str(trace), "--emit-pytest", str(out), "-q",
                  *(["--backend", backend] if backend else []),
                  *(["--emit-style", style] if style != "fixed" else [])])
    return out


def _load(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_by_default_the_test_fails_while_the_defect_is_there_and_passes_once_fixed(tmp_path):
    path = _emit(tmp_path, PLANTED, style="fixed")
    mod = _load(path)
    assert "Expects every step to pass on impl (recorded: C1 at step 4 on impl)" in path.read_text()
    with faults.planted("free_tail_unaligned"):            # the defect is there: red
        with pytest.raises(AssertionError, match=r"the defect is still there:\nFAIL at step 4"):
            mod.test_C1_holds_at_schedule()
    mod.test_C1_holds_at_schedule()                          # fixed (fault off): green


def test_a_passing_trace_is_named_after_its_file(tmp_path):
    mod = _load(_emit(tmp_path, REG / "worked_example_5_4.json", style="fixed"))
    mod.test_worked_example_5_4()


def test_emitted_test_passes_with_the_fault_and_fails_without(tmp_path):
    mod = _load(_emit(tmp_path, PLANTED, "free_tail_unaligned"))
    assert [str(op) for op in mod.OPS][-1] == "schedule(rid=4, admit=False)"
    assert mod.CONFIG.page_size == 4 and mod.BACKEND == "impl"
    with faults.planted("free_tail_unaligned"):
        mod.test_free_tail_unaligned()                  # C1 at step 4 on impl: as recorded
    with pytest.raises(AssertionError, match=r"expected C1 at step 4 on impl; got:\nall 5 steps passed"):
        mod.test_free_tail_unaligned()


def _pytest(path: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(path)],
                          cwd=path.parent, env=env, capture_output=True, text=True, timeout=300)


def test_emitted_tests_run_standalone_under_pytest(tmp_path):
    ok = _pytest(_emit(tmp_path, REG / "worked_example_5_4.json"))
    assert ok.returncode == 0 and "1 passed" in ok.stdout, ok.stdout + ok.stderr
    bad = _pytest(_emit(tmp_path, PLANTED))            # the fault is not on in that process
    assert bad.returncode == 1 and "1 failed" in bad.stdout, bad.stdout + bad.stderr
    assert "expected C1 at step 4 on impl" in bad.stdout
    fixed = _pytest(_emit(tmp_path, PLANTED, style="fixed"))    # no fault there: fixed
    assert fixed.returncode == 0 and "1 passed" in fixed.stdout, fixed.stdout + fixed.stderr


def test_emitted_test_for_another_backend_expects_what_replay_expects(tmp_path):
    """A recorded upstream finding (sglang-0.5.15) emitted for impl expects a pass there,
    as `kvcheck replay` judges it."""
    h3 = ROOT / "stateful_tests" / "upstream" / "h3-sglang-0.5.15.json"
    path = _emit(tmp_path, h3, backend="impl")
    text = path.read_text()
    assert "Expects every step passes on impl" in text
    assert "O.SubmitTurn(sid=1, rid=1, new_tokens=(11, 12, 13, 14, 15), max_new_tokens=3)," in text
    _load(path).test_h3_sglang_0_5_15()
