"""`kvcheck fuzz` and `kvcheck selftest` as commands (the campaign is kvcheck.fuzz)."""
from __future__ import annotations

import statistics
import sys
from pathlib import Path

from kvcheck.errors import UsageError

INTERRUPTED = 130


def _budget(args, default_seconds: float) -> tuple:
    """(rounds, seconds) from --rounds / --seconds; the seconds default applies only
    when no count is given. Every range was checked while parsing (kvcheck.argtypes)."""
    rounds, seconds = getattr(args, "rounds", None), args.seconds
    if seconds is None and rounds is None:
        seconds = default_seconds
    return rounds, seconds


def cmd_fuzz(args) -> int:
    from kvcheck.fuzz import fuzz
    from kvcheck.backends import parse_accept
    rounds, seconds = _budget(args, 60.0)
    accept = parse_accept(args.accept, args.backend)      # a usage error before any work
    rep = fuzz(seconds, args.seed, args.backend, args.out, rounds=rounds, engine=args.engine,
               workers=args.workers, use_ray=args.ray is not None, ray_address=args.ray or None,
               shrink_replays=args.shrink_replays, accept=accept)
    print(rep.render(), flush=True)
    if rep.interrupted:
        print("kvcheck fuzz: interrupted", file=sys.stderr)
        return INTERRUPTED
    return 1 if rep.found else 0


def cmd_selftest(args) -> int:
    from kvcheck.impl import faults
    from kvcheck.fuzz import Console, fuzz
    rounds, seconds = _budget(args, 60.0)
    names = args.faults or sorted(faults.FAULTS)
    unknown = [n for n in names if n not in faults.FAULTS]
    if unknown:
        raise UsageError(f"unknown fault(s) {unknown}; known: {', '.join(sorted(faults.FAULTS))}")
    rows = []
    for name in names:
        rep = fuzz(seconds, args.seed, "impl", Path(args.out) / name, rounds=rounds,
                   engine=args.engine, stop_on_first=True, shrink_replays=args.shrink_replays,
                   planted=(name,), workers=args.workers, console=Console(True, f"{name}: "))
        f = rep.found[0] if rep.found else None
        rows.append((name, f, rep))
        if f is None:
            status = f"MISSED  after {rep.seconds:.0f} s, {rep.sequences} sequences, {rep.steps} steps"
        else:
            status = (f"caught  {f.seconds_to_find:6.2f} s  {f.id:<3} on {f.side:<5} "
                      + (f"shrunk {f.original_length:>3} -> {f.length:>3} ops" if f.shrunk
                         else f"UNSHRUNK {f.original_length} ops"))
        print(f"{name:<32} {status}" + (" (INTERRUPTED)" if rep.interrupted else ""), flush=True)
        if rep.interrupted:
            break
    caught = [f for _, f, _ in rows if f]
    interrupted = any(r.interrupted for _, _, r in rows)
    print(f"\ncaught {len(caught)}/{len(rows)} planted faults (seed {args.seed}, engine "
          f"{args.engine})" + (f"; INTERRUPTED after {len(rows)} of {len(names)}" if interrupted else ""))
    if caught:
        t = [f.seconds_to_find for f in caught]
        n = [f.length for f in caught]
        print(f"seconds to first report: median {statistics.median(t):.2f}, worst {max(t):.2f}; "
              f"trace length: median {statistics.median(n):g}, worst {max(n)}")
        print("traces written: " + ", ".join(f"{f.path}{'' if f.shrunk else ' (unshrunk)'}"
                                             for f in caught))
    sys.stdout.flush()
    if interrupted:
        print("kvcheck selftest: interrupted", file=sys.stderr)
        return INTERRUPTED
    return 0 if len(caught) == len(rows) else 1
