"""What a fixed-count differential walk reaches in the sglang release installed in THIS
interpreter (in-process, no proxy): the walk engine's sequences (the same ones `kvcheck
fuzz --backend sglang:V --rounds N --seed S` draws), the spec against the release, and
the `kvcheck/engines/stats.py` PATHS they took. Run it under coverage.py inside a release
venv to see which upstream lines those sequences execute:

  .venv-sglang-0.5.23/bin/python -m coverage run --branch \\
      --include='*/sglang/srt/session/*,*/sglang/srt/mem_cache/*' \\
      -m kvcheck.engines.reach --accept U1,U2,U6 --sequences 200 --seed 1
  .venv-sglang-0.5.23/bin/python -m coverage report --show-missing

Prints one line per PATHS entry, then each failure (the first failure ends a sequence).
Exit 0; 2 on a usage error.
"""
from __future__ import annotations

import argparse
import sys

from kvcheck.adapters.sglang.backend import SglangBackend, installed_version


def reach(sequences: int, seed: int, accept: tuple) -> tuple:
    """(Stats, failures) of `sequences` walks of campaign `seed` against the release."""
    from kvcheck.backends import config_kw, known_findings
    from kvcheck.engines.stats import Stats
    from kvcheck.engines.walk import walk
    name = f"sglang:{installed_version()}"
    kw = config_kw(name, accept)
    skip = known_findings(name, accept)
    stats, failures = Stats(), []
    for i in range(sequences):
        seq = walk(seed, i, SglangBackend, f"sglang-{installed_version()}", stats,
                   config_kw=kw, skip=skip)
        if seq.failure is not None:
            failures.append((i, seq.failure))
    return stats, failures


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m kvcheck.engines.reach", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sequences", type=int, default=100)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--accept", default="", help="recorded findings the spec takes (U1,U2,...)")
    a = p.parse_args(argv)
    if a.sequences < 1:
        p.error("--sequences must be >= 1")
    from kvcheck.engines.stats import PATHS, beyond_line
    accept = tuple(x for x in a.accept.split(",") if x)
    stats, failures = reach(a.sequences, a.seed, accept)
    print(f"sglang {installed_version()}: {stats.sequences} sequences, {stats.steps} steps, "
          f"seed {a.seed}, accept {','.join(accept) or '-'}")
    for path in PATHS:
        print(f"  {path}: {stats.paths.get(path, 0)}")
    if stats.beyond:
        print(beyond_line(stats.beyond, stats.not_compared))
    for i, f in failures:
        print(f"  sequence {i}: {f.render().splitlines()[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
