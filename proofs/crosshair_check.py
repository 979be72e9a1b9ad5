"""CrossHair over the PEP 316 contracts (`pre:` / `post:` docstring lines) of
spec/pages.py, plus a negative control: a copy of one function whose body breaks its
own contract, which CrossHair must report."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from proofs.core import Result

ROOT = Path(__file__).resolve().parent.parent
PER_CONDITION_TIMEOUT = 2.0

_BROKEN = '''
def ceil_align(x: int, p: int) -> int:
    """A mutant: floor where ceil is promised.
    pre: p >= 1
    post: __return__ >= x
    post: __return__ % p == 0
    """
    return (x // p) * p
'''


def _crosshair() -> list[str]:
    exe = Path(sys.executable).with_name("crosshair")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "crosshair"]


def _start(target: str, cwd: Path, env_path: str) -> subprocess.Popen:
    cmd = _crosshair() + ["check", "--analysis_kind=PEP316",
                          f"--per_condition_timeout={PER_CONDITION_TIMEOUT}",
                          "--per_path_timeout=1", target]
    env = dict(os.environ, PYTHONPATH=env_path + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def run_crosshair(timeout_s: float = 60.0) -> list[Result]:
    """Both checks run concurrently (one per core)."""
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "kvcheck_crosshair_mutant.py").write_text(_BROKEN)
        real = _start("spec.pages", ROOT, str(ROOT))
        mut = _start("kvcheck_crosshair_mutant", Path(tmp), tmp)
        out = []
        for proc, name, expected in ((real, "crosshair PEP316: spec.pages contracts", "proved"),
                                     (mut, "crosshair PEP316 / control: ceil_align mutant (floor)", "refuted")):
            try:
                text, _ = proc.communicate(timeout=max(1.0, timeout_s - (time.perf_counter() - t0)))
            except subprocess.TimeoutExpired:
                proc.kill()
                text, _ = proc.communicate()
                out.append(Result(name, "crosshair" if expected == "proved" else "control", "unknown",
                                  time.perf_counter() - t0, expected, detail="time limit"))
                continue
            text = text.strip()
            if proc.returncode == 0 and not text:
                status, detail = "proved", (f"no counterexample within {PER_CONDITION_TIMEOUT:g} s "
                                            "per condition")
            elif proc.returncode in (0, 1) and text:
                status, detail = "refuted", text.splitlines()[0][:300]
            else:
                status, detail = "error", f"exit {proc.returncode}: {text[:300]}"
            out.append(Result(name, "crosshair" if expected == "proved" else "control", status,
                              time.perf_counter() - t0, expected, detail=detail))
    return out
