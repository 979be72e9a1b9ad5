"""CrossHair over the PEP 316 contracts (`pre:` / `post:` docstring lines) of
spec/pages.py, plus a negative control: a copy of one function whose body breaks its
own contract, which CrossHair must report. With a proofs/cache.py cache only the
contracts whose function (or a callee) changed since they last passed are re-checked."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kvcheck.proofs.core import Result

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


def _start(targets: str, cwd: Path, env_path: str) -> subprocess.Popen:
    cmd = _crosshair() + ["check", "--analysis_kind=PEP316",
                          f"--per_condition_timeout={PER_CONDITION_TIMEOUT}",
                          "--per_path_timeout=1", *targets.split()]
    env = dict(os.environ, PYTHONPATH=env_path + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


REAL_NAME = "crosshair PEP316: kvcheck.spec.pages contracts"
MUTANT_NAME = "crosshair PEP316 / control: ceil_align mutant (floor)"


def contract_keys(root: Path = ROOT) -> dict[str, str]:
    """One cache key per function of spec/pages.py: its source, its callees' sources,
    this module (the options) and the tool versions. Only changed ones are re-checked."""
    from kvcheck.proofs.cache import digest, function_sources, source_key
    base = source_key("proofs/crosshair_check.py", root=root)
    return {f"crosshair: kvcheck.spec.pages.{name}": digest(base, name, text)
            for name, text in function_sources((root / "spec/pages.py").read_text()).items()}


def _outcome(proc, name, expected, t0, timeout_s) -> Result:
    kind = "crosshair" if expected == "proved" else "control"
    try:
        text, _ = proc.communicate(timeout=max(1.0, timeout_s - (time.perf_counter() - t0)))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return Result(name, kind, "unknown", time.perf_counter() - t0, expected, detail="time limit")
    text = text.strip()
    if proc.returncode == 0 and not text:
        status, detail = "proved", f"no counterexample within {PER_CONDITION_TIMEOUT:g} s per condition"
    elif proc.returncode in (0, 1) and text:
        status, detail = "refuted", text.splitlines()[0][:300]
    else:
        status, detail = "error", f"exit {proc.returncode}: {text[:300]}"
    return Result(name, kind, status, time.perf_counter() - t0, expected, detail=detail)


def run_crosshair(timeout_s: float = 60.0, cache=None, only: str | None = None) -> list[Result]:
    """The contracts whose key is not in `cache` (all without one) and the mutant control,
    concurrently (one process each). Contracts that passed under the same key are reused."""
    from kvcheck.proofs.cache import cached_unit, digest, source_key
    t0 = time.perf_counter()
    keys = contract_keys()
    if only is not None:
        keys = {u: k for u, k in keys.items() if only in u or only in REAL_NAME}
    stale = [u for u, k in keys.items() if cache is None or cache.get(u, k) is None]
    mutant_key = digest(source_key("proofs/crosshair_check.py"), MUTANT_NAME)
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "kvcheck_crosshair_mutant.py").write_text(_BROKEN)
        real = (_start(" ".join(u.split(": ", 1)[1] for u in stale), ROOT, str(ROOT))
                if stale else None)

        def mutant():
            proc = _start("kvcheck_crosshair_mutant", Path(tmp), tmp)
            return [_outcome(proc, MUTANT_NAME, "refuted", t0, timeout_s)]

        if only is None or only in MUTANT_NAME:
            out += cached_unit(cache, MUTANT_NAME, mutant_key, mutant)
        if keys:
            res = (_outcome(real, REAL_NAME, "proved", t0, timeout_s) if real is not None else
                   Result(REAL_NAME, "crosshair", "proved", 0.0, cached=True))
            if res.ok and cache is not None:
                for u in stale:
                    cache.put(u, keys[u], [Result(u, "crosshair", "proved", res.seconds)])
            res.detail = (f"{len(stale)} of {len(keys)} contracts checked "
                          f"({len(keys) - len(stale)} unchanged since they last passed)"
                          + (f"; {res.detail}" if res.detail else ""))
            out.insert(0, res)
    return out
