"""Every failure id a kvcheck report can quote, with its meaning: what `kvcheck explain ID`
prints and what a trace's `expect.invariant` may name.

I* come from spec/invariants.py, P* from spec/progress.py (a drain that does not reach idle) (evaluated on the spec and on every system), D1, D2,
E1, M1, X1 from kvcheck/checker.py. C* and L* are the concrete checks the adapters run
on a system's own state (impl/checks.py, adapters/sglang/backend.py); they are named
here because impl/ may not import spec/ (tests/test_cli_contract.py checks that every
id those files emit is listed).
"""
from __future__ import annotations

CONCRETE_CHECKS = {
    "C1": "a page both in the free lists and owned (by a row, a tree node or a slot)",
    "C2": "a page in the free lists twice (double free)",
    "C3": "row/page congruence: req_to_token of a row disagrees with the pages it owns",
    "C4": "reserved page 0 handed out",
    "C5": "a request-pool row both free and held",
    "L1": "upstream's pool accounting check (_check_pool_invariant) fails",
    "L2": "upstream's request-pool check (_check_req_pool) fails",
}

GROUPS = (("I", "spec invariant, evaluated on the spec and on the system under test"),
          ("P", "progress: the scheduler alone does not drain the system to idle (config.drain)"),
          ("C", "concrete check on the system's own state (adapters)"),
          ("L", "upstream's own leak check, run on the system (adapters)"),
          ("D", "divergence between the spec and the system under test"),
          ("E", "an exception"), ("M", "upstream assertion reached by the spec"),
          ("X", "an operation the spec's guard refuses"))


def failure_ids() -> dict:
    """{id: meaning} for every failure id, I* in numeric order first."""
    from kvcheck.checker import FAILURE_NAMES
    from kvcheck.spec.invariants import INVARIANT_IDS
    from kvcheck.spec.progress import PROGRESS_IDS
    inv = dict(sorted(INVARIANT_IDS.items(), key=lambda kv: int(kv[0][1:])))
    return {**inv, **PROGRESS_IDS, **CONCRETE_CHECKS, **FAILURE_NAMES}


def explain(fid: str) -> str:
    """A few lines on one failure id; KeyError when it is unknown."""
    ids = failure_ids()
    meaning = ids[fid]
    group = next(g for p, g in GROUPS if fid.startswith(p))
    return f"{fid}: {meaning}\n  kind: {group}"


def listing() -> str:
    return "\n".join(f"  {k:<4} {v}" for k, v in failure_ids().items())
