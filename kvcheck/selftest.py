"""`kvcheck fuzz` and `kvcheck selftest` as commands (the engine is kvcheck.fuzz)."""
from __future__ import annotations

import statistics
from pathlib import Path

from kvcheck.errors import UsageError


def cmd_fuzz(args) -> int:
    from kvcheck.fuzz import fuzz
    if args.seconds <= 0:
        raise UsageError("--seconds must be positive")
    from kvcheck.backends import parse_accept
    accept = parse_accept(getattr(args, "accept", None), args.backend)
    rep = fuzz(args.seconds, args.seed, args.backend, args.out, accept=accept)
    print(rep.render())
    return 1 if rep.found else 0


def cmd_selftest(args) -> int:
    from impl import faults
    from kvcheck.fuzz import fuzz
    names = args.faults or sorted(faults.FAULTS)
    unknown = [n for n in names if n not in faults.FAULTS]
    if unknown:
        raise UsageError(f"unknown fault(s) {unknown}; known: {', '.join(sorted(faults.FAULTS))}")
    rows = []
    for name in names:
        with faults.planted(name):
            rep = fuzz(args.seconds, args.seed, "impl", Path(args.out) / name, stop_on_first=True,
                       quiet=True, shrink_budget_s=args.shrink_seconds, label=name)
        f = rep.found[0] if rep.found else None
        rows.append((name, f, rep))
        status = (f"caught  {f.seconds_to_find:6.1f} s  {f.id:<3} on {f.side:<5} shrunk "
                  f"{f.original_length:>3} -> {f.length:>3} ops" if f else
                  f"MISSED  after {rep.seconds:.0f} s, {rep.steps} steps")
        print(f"{name:<32} {status}", flush=True)
    caught = [f for _, f, _ in rows if f]
    print(f"\ncaught {len(caught)}/{len(rows)} planted faults (seed {args.seed})")
    if caught:
        t = [f.seconds_to_find for f in caught]
        n = [f.length for f in caught]
        print(f"seconds to detection: median {statistics.median(t):.1f}, worst {max(t):.1f}; "
              f"shrunk trace length: median {statistics.median(n):g}, worst {max(n)}")
    return 0 if len(caught) == len(rows) else 1
