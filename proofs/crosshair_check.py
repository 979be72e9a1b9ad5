"""CrossHair over the PEP 316 contracts (`pre:` / `post:` docstring lines) of
spec/pages.py, plus a negative control: a copy of one function whose body breaks its
own contract, which CrossHair must report. With a proofs/cache.py cache only the
contracts whose function (or a callee) changed since they last passed are re-checked.

Every verdict is bounded by counts, never by the clock (proofs/crosshair_run.py):
ITERATIONS paths per condition, each solver query SMT_RLIMIT z3 steps. A wall-clock
limit (`kvcheck prove --crosshair-time-limit`) stays as a safety net only: a run it
stops is "interrupted" (no verdict, the flag named), never a refuted or unknown proof."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kvcheck.proofs.core import Result

ROOT = Path(__file__).resolve().parent.parent
ITERATIONS = 100
"""Paths explored per condition (CrossHair's max_iterations). Most conditions of
spec/pages.py exhaust their paths in under 20; the four over `%` go on to the bound."""
SMT_RLIMIT = 2_000_000
"""Each of CrossHair's z3 queries stops after this many solver steps (CROSSHAIR_SMT_RLIMIT;
about 1.4 s where proofs/core.py was calibrated): an exhausted query leaves its path
unexplored, the same path on every machine."""
TIME_LIMIT = 300.0
"""The default wall-clock safety net for the CrossHair processes (about 10 CPU-s of work
each; a machine loaded 10x still finishes well within it)."""
TIME_LIMIT_FLAG = "--crosshair-time-limit"

_BROKEN = '''
def ceil_align(x: int, p: int) -> int:
    """A mutant: floor where ceil is promised.
    pre: p >= 1
    post: __return__ >= x
    post: __return__ % p == 0
    """
    return (x // p) * p
'''


def _start(targets: str, cwd: Path, env_path: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "kvcheck.proofs.crosshair_run", str(ITERATIONS), *targets.split()]
    paths = [env_path, str(ROOT)] + [x for x in [os.environ.get("PYTHONPATH")] if x]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths), PYTHONHASHSEED="0",
               CROSSHAIR_SMT_RLIMIT=str(SMT_RLIMIT))
    return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


SOURCES = ("proofs/crosshair_check.py", "proofs/crosshair_run.py")
"""The options a contract's verdict depends on (its cache key covers them)."""
REAL_NAME = "crosshair PEP316: kvcheck.spec.pages contracts"
MUTANT_NAME = "crosshair PEP316 / control: ceil_align mutant (floor)"


def contract_keys(root: Path = ROOT) -> dict[str, str]:
    """One cache key per function of spec/pages.py: its source, its callees' sources,
    this module (the options) and the tool versions. Only changed ones are re-checked."""
    from kvcheck.proofs.cache import digest, function_sources, source_key
    base = source_key(*SOURCES, root=root)
    return {f"crosshair: kvcheck.spec.pages.{name}": digest(base, name, text)
            for name, text in function_sources((root / "spec/pages.py").read_text()).items()}


def _outcome(proc, name, expected, t0, timeout_s) -> Result:
    kind = "crosshair" if expected == "proved" else "control"
    try:
        text, _ = proc.communicate(timeout=max(1.0, timeout_s - (time.perf_counter() - t0)))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return Result(name, kind, "interrupted", time.perf_counter() - t0, expected,
                      detail=f"interrupted by the time limit ({timeout_s:g} s; raise it with "
                             f"{TIME_LIMIT_FLAG}): no verdict, not a failed proof")
    text = text.strip()
    if proc.returncode == 0 and not text:
        status, detail = "proved", (f"no counterexample in {ITERATIONS} paths per condition "
                                    f"({SMT_RLIMIT:,} z3 steps per query)")
    elif proc.returncode in (0, 1) and text:
        status, detail = "refuted", text.splitlines()[0][:300]
    else:
        status, detail = "error", f"exit {proc.returncode}: {text[:300]}"
    return Result(name, kind, status, time.perf_counter() - t0, expected, detail=detail)


def run_crosshair(timeout_s: float = TIME_LIMIT, cache=None, only: str | None = None) -> list[Result]:
    """The contracts whose key is not in `cache` (all without one) and the mutant control,
    concurrently (one process each). Contracts that passed under the same key are reused."""
    from kvcheck.proofs.cache import cached_unit, digest, source_key
    t0 = time.perf_counter()
    keys = contract_keys()
    if only is not None:
        keys = {u: k for u, k in keys.items() if only in u or only in REAL_NAME}
    stale = [u for u, k in keys.items() if cache is None or cache.get(u, k) is None]
    mutant_key = digest(source_key(*SOURCES), MUTANT_NAME)
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
