"""kvcheck: the command line. `kvcheck --help` lists the subcommands; each command's
body lives in its own module (replay, check, selftest, explore, proofs)."""
from __future__ import annotations

import argparse
import sys

from kvcheck.check import cmd_check
from kvcheck.errors import UsageError
from kvcheck.replay import cmd_replay
from kvcheck.selftest import cmd_fuzz, cmd_selftest


def cmd_explore(args) -> int:
    from kvcheck import explore as X
    return X.main(args)


def cmd_prove(args) -> int:
    import proofs
    res = proofs.run_all(verbose=args.verbose, crosshair=not args.no_crosshair)
    print(proofs.report(res))
    return 0 if proofs.ok(res) else 1


# ---------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kvcheck",
        description="Model checker for the KV-cache bookkeeping of SGLang streaming sessions.")
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND")

    c = sub.add_parser("check", help="invariant verification within a fixed budget (what `make check` runs)")
    c.add_argument("--backend", default="impl", help="system under test: impl (default), spec, sglang[:VERSION]")
    c.add_argument("--examples", type=int, default=100, help="differential sequences (default 100)")
    c.add_argument("--out", default="failures", help="where failure traces go (default failures/)")
    c.add_argument("--accept", help="recorded upstream findings whose behaviour the spec takes, "
                   "e.g. U1,U2 (spec or sglang backends; default: the fixed behaviour)")
    c.add_argument("--skip-explore", action="store_true")
    c.add_argument("--skip-proofs", action="store_true")
    c.set_defaults(fn=cmd_check)

    f = sub.add_parser("fuzz", help="randomised differential runs for a time budget")
    f.add_argument("--seconds", type=float, default=60)
    f.add_argument("--seed", type=int, default=None, help="recorded and printed; rerun with it")
    f.add_argument("--backend", default="impl")
    f.add_argument("--out", default="failures", help="where shrunk failure traces go (default failures/)")
    f.add_argument("--accept", help="recorded upstream findings whose behaviour the spec takes, "
                   "e.g. U1,U2 (spec or sglang backends)")
    f.set_defaults(fn=cmd_fuzz)

    r = sub.add_parser("replay", help="run one trace on the spec and a backend, step by step")
    r.add_argument("trace")
    r.add_argument("--backend", default="impl", help="spec, impl (default), sglang[:VERSION]")
    r.add_argument("-q", "--quiet", action="store_true", help="only the verdict")
    r.set_defaults(fn=cmd_replay)

    s = sub.add_parser("selftest", help="fuzz against each planted fault in impl/; all must be caught")
    s.add_argument("--seconds", type=float, default=60, help="budget per fault (default 60)")
    s.add_argument("--seed", type=int, default=1)
    s.add_argument("--shrink-seconds", type=float, default=30)
    s.add_argument("--out", default="failures/selftest")
    s.add_argument("faults", nargs="*", help="fault names (default: all)")
    s.set_defaults(fn=cmd_selftest)

    e = sub.add_parser("explore", help="exhaustive bounded exploration of the spec (BFS)")
    try:
        from kvcheck import explore as X
        X.add_arguments(e)
    except ImportError:
        pass
    e.set_defaults(fn=cmd_explore)

    pr = sub.add_parser("prove", help="z3 lemmas, inductive accounting, CrossHair contracts")
    pr.add_argument("-v", "--verbose", action="store_true", help="print each result as it finishes")
    pr.add_argument("--no-crosshair", action="store_true", help="z3 only, skip the CrossHair run")
    pr.set_defaults(fn=cmd_prove)
    return p


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "fn", None):
        parser.print_help()
        return 2
    from kvcheck.backends import BackendError
    try:
        return args.fn(args)
    except (UsageError, BackendError) as e:
        print(f"kvcheck {args.cmd}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"kvcheck {args.cmd}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
