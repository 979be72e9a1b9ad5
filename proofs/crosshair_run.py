"""`crosshair check` with a count budget: python -m kvcheck.proofs.crosshair_run ITERATIONS TARGET...

CrossHair's command line bounds a condition by CPU seconds or by iterations "without
progress", and its solver queries by a wall-clock timeout, so what it finds depends on
the machine's speed and load. Its options also hold `max_iterations` (paths per
condition), which the command line does not expose: this runs `crosshair check
--analysis_kind=PEP316` with it set, no per-condition time limit, a per-path CPU limit
far above what a path takes (a safety net only), and every solver query bounded by
CROSSHAIR_SMT_RLIMIT (a count of z3 steps, set by the caller). CrossHair seeds its own
search, so the same sources give the same paths, and the same verdict, on any machine.
"""
from __future__ import annotations

import sys

PATH_CPU_SECONDS = 60.0
"""A path's CPU limit: a safety net (the slowest path of spec/pages.py takes well under
a second); a path stopped by it is left unexplored, never reported as a counterexample."""


def main(argv: list[str]) -> int:
    from crosshair.auditwall import engage_auditwall
    from crosshair.main import check, command_line_parser
    from crosshair.options import AnalysisOptionSet, option_set_from_dict
    from crosshair.util import add_to_pypath, set_debug
    iterations, targets = int(argv[0]), argv[1:]
    args = command_line_parser().parse_args(
        ["check", "--analysis_kind=PEP316", "--max_uninteresting_iterations=0",
         f"--per_path_timeout={PATH_CPU_SECONDS}", *targets])
    options = option_set_from_dict(args.__dict__).overlay(
        AnalysisOptionSet(max_iterations=iterations))
    set_debug(args.verbose)
    engage_auditwall(())
    with add_to_pypath(""):
        return check(args, options, sys.stdout, sys.stderr)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
