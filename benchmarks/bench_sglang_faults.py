"""Does the exhaustive check against a real sglang release catch real upstream defects?

`python -m benchmarks.bench_sglang_faults [--versions 0.5.15,0.5.23] [--faults a,b]`

For each release with a venv (.venv-sglang-VERSION) and each planted fault of
adapters/sglang/faults.py that applies to it: KVCHECK_SGLANG_PLANT=fault, then the
release's preset check-sglang-VERSION scope by scope (kvcheck.explore.explore, then
kvcheck.engines.exhaustive.check_transitions against sglang:VERSION) until a step fails,
with the release's recorded findings accepted as `make check-sglang` runs it
(`--no-accept`: their triggers skipped instead).
One row per fault: caught or NOT, the scope, the invariant id, the step, the transitions
applied and the seconds (all scopes walked up to and with the catching one; the served
process's start, ~6 s of imports, is counted in the first scope). The clean release (no
fault) runs first and must pass every scope. A fault no scope catches is a finding about
the checker: the row says so; the reason is for the reader (adapters/sglang/README.md).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import replace

from kvcheck.adapters.sglang.faults import ENV, code_of
from kvcheck.adapters.sglang.proxy import available_versions
from kvcheck.engines.exhaustive import ForkError, check_transitions
from kvcheck.explore import PRESETS, explore

def fault_table() -> dict:
    """name -> (releases, description), read without importing sglang: faults.py and its
    installers' modules (faults_*.py) import upstream modules only inside the installers."""
    from kvcheck.adapters.sglang.faults import FAULTS
    return {n: (f.releases, f.description) for n, f in FAULTS.items()}


_EXPLORED: dict = {}


def scopes(version: str, accept: bool = True) -> list:
    """The preset's scopes as `make check-sglang` runs them: with the release's recorded
    findings accepted (`--accept`, adapters/sglang/findings.py RELEASES), so the spec takes
    upstream's behaviour there and the walk drives those paths; accept=False: their
    triggers are skipped instead (the walk without --accept)."""
    from kvcheck.adapters.sglang.findings import RELEASES
    acc = RELEASES.get(version, ()) if accept else ()
    return [replace(sc, cfg=replace(sc.cfg, accept=acc))
            for sc in PRESETS[f"check-sglang-{version}"]]


def explored(version: str, accept: bool = True) -> list:
    """The scopes explored on the spec (once per release; the spec side does not depend on
    the planted fault). Under --accept the search judges nothing itself, as `kvcheck
    explore --accept` runs it: the lockstep judges every transition."""
    if (version, accept) not in _EXPLORED:
        _EXPLORED[version, accept] = [explore(sc) for sc in scopes(version, accept)]
    return _EXPLORED[version, accept]


def run_one(version: str, fault: str | None, accept: bool = True) -> dict:
    """The preset scope by scope with `fault` planted (None: clean), until caught."""
    old = os.environ.get(ENV)
    if fault:
        os.environ[ENV] = fault
    else:
        os.environ.pop(ENV, None)
    row = {"version": version, "fault": fault or "(clean)", "caught": False, "scope": None,
           "invariant": None, "step": None, "transitions": 0, "seconds": 0.0, "scopes": 0}
    try:
        t0 = time.perf_counter()
        for res in explored(version, accept):
            row["scopes"] += 1
            try:
                rep = check_transitions(res, f"sglang:{version}")
            except ForkError as e:
                row.update(scope=res.scope.name, invariant="ForkError", note=str(e))
                break
            row["transitions"] += rep.transitions
            if rep.failure is not None:
                f = rep.failure
                row.update(caught=True, scope=res.scope.name, invariant=f.id, step=f.step,
                           side=f.side, ops=[op.to_json() for op in rep.ops],
                           failure=f.render())
                break
        row["seconds"] = round(time.perf_counter() - t0, 1)
    finally:
        if old is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = old
    return row


def fmt(row: dict) -> str:
    if row["fault"] == "(clean)":
        verdict = "FAILS" if row["invariant"] else "passes"
    else:
        verdict = "caught" if row["caught"] else "NOT caught"
    if row["scope"]:
        step = "-" if row["step"] is None else row["step"]
        where = f"{row['scope']:<20} {row['invariant']:<9} {step:>4}"
    else:
        where = f"{'(all ' + str(row['scopes']) + ' scopes)':<20} {'-':<9} {'-':>4}"
    return (f"{row['version']:<7} {row['fault']:<30} {verdict:<10} {where} "
            f"{row['transitions']:>7,} {row['seconds']:>7.1f}")


HEAD = (f"{'release':<7} {'fault':<30} {'verdict':<10} {'scope':<20} {'invariant':<9} "
        f"{'step':>4} {'transit.':>7} {'seconds':>7}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_sglang_faults")
    ap.add_argument("--versions", help="releases (default: every .venv-sglang-* present "
                                       "with a check-sglang preset)")
    ap.add_argument("--faults", help="faults (default: every one that applies)")
    ap.add_argument("--no-clean", action="store_true", help="skip the clean run")
    ap.add_argument("--no-accept", action="store_true",
                    help="skip the recorded findings' triggers instead of accepting them "
                         "(the walk without --accept)")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args(argv)
    table = fault_table()
    versions = (args.versions.split(",") if args.versions else
                [v for v in available_versions() if f"check-sglang-{v}" in PRESETS])
    wanted = args.faults.split(",") if args.faults else list(table)
    unknown = [n for n in wanted if n not in table]
    if unknown:
        ap.error(f"unknown fault(s) {unknown}; known: {', '.join(table)}")
    rows = []
    print(HEAD, flush=True)
    for v in versions:
        todo = ([] if args.no_clean else [None]) + [n for n in wanted
                                                     if code_of(v) in table[n][0]]
        for fault in todo:
            row = run_one(v, fault, accept=not args.no_accept)
            rows.append(row)
            print(fmt(row), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    clean_bad = [r for r in rows if r["fault"] == "(clean)" and r["invariant"]]
    missed = [r for r in rows if r["fault"] != "(clean)" and not r["caught"]]
    print(f"\n{sum(r['caught'] for r in rows if r['fault'] != '(clean)')} of "
          f"{sum(r['fault'] != '(clean)' for r in rows)} planted faults caught; "
          f"clean: {'FAILED' if clean_bad else 'not run' if args.no_clean else 'every scope passes'}"
          + (f"; missed: {', '.join(r['version'] + ':' + r['fault'] for r in missed)}" if missed else ""))
    return 1 if clean_bad else 0


if __name__ == "__main__":
    sys.exit(main())
