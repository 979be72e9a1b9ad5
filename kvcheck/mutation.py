"""Mutation testing of impl/ with mutmut (`python -m kvcheck.mutation`, `make mutation`,
`make mutation-sample`): every mutant mutmut makes of impl/ is run against the fast parts
of `kvcheck check` (mutation/test_fast_check.py: the regression corpus, the planted-fault
corpus, a fixed-count differential run); a mutant is killed when one of them fails.

mutmut's configuration is `[tool.mutmut]` in pyproject.toml; it works in `mutants/` (a
copy of the project, git-ignored). `--sample N` runs a fixed-seed sample of N mutants
(what CI runs); without it every mutant runs (nightly). A mutant mutmut has already
judged (in mutants/, for the same function source, --examples and ORACLE) is not run
again, so an interrupted run resumes and a sample can grow in chunks (`--sample 100`,
then `--sample 250` with the same seed: the first 100 are reused); `--fresh` runs
them again. The score leaves out the mutants
docs/coverage.md lists as equivalent (section "Equivalent mutants", one backticked
mutmut name per line with the reason), which are not run at all (each would survive the
whole test command, the slowest verdict there is), and prints every survivor.

Exit codes: 0 the score reaches --min-score, 1 it does not, 2 usage error.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from kvcheck.errors import ROOT

DOC = ROOT / "docs" / "coverage.md"
MUTANTS = ROOT / "mutants"
GENERATE = """
from mutmut.__main__ import (CatchOutput, copy_also_copy_files, copy_src_dir, create_mutants,
                             set_mutant_under_test, setup_source_paths)
import os
set_mutant_under_test("mutant_generation")
os.makedirs("mutants", exist_ok=True)
with CatchOutput(spinner_title="Generating mutants"):
    copy_src_dir(); copy_also_copy_files(); setup_source_paths()
    create_mutants(os.cpu_count() or 1)
"""
"""The mutants generated, nothing run: the first steps of `mutmut run` (mutmut 3.8's
`_run`), so that the sample is drawn from what it made before `mutmut run NAMES` collects
its per-test stats and runs the clean tests once (`mutmut run` with a name that matches
no mutant generates them too, but runs every test twice on the way, once for the stats
and once clean, and the run of the sample then runs the clean tests again)."""
RUN_RECORD = MUTANTS / "kvcheck-run.json"
"""The --examples and the oracle the results in mutants/ were judged with (a result under
another count or another oracle is run again)."""
ORACLE = ("spec", "kvcheck", "adapters/impl.py", "stateful_tests", "mutation")
"""What the test command judges impl/'s mutants with, besides impl/ itself (mutmut runs a
mutant again when its own function changes, not when these do): the model, the checker,
the impl adapter, the regression and planted-fault corpora, the test command."""
PENDING = ("not checked", "check was interrupted by user")
"""A mutant without a verdict yet: run it (again)."""
KILLED = ("killed", "timeout", "segfault", "caught by type check")
"""A mutant the test command stopped: a failure, a hang past mutmut's timeout, a crash."""


@dataclass
class Score:
    results: dict               # mutant name -> mutmut status
    equivalent: set

    @property
    def judged(self) -> dict:
        return {k: v for k, v in self.results.items()
                if v not in ("not checked", "skipped") and k not in self.equivalent}

    @property
    def killed(self) -> int:
        return sum(v in KILLED for v in self.judged.values())

    @property
    def survivors(self) -> list:
        return sorted(k for k, v in self.judged.items() if v not in KILLED)

    @property
    def score(self) -> float:
        n = len(self.judged)
        return 100.0 * self.killed / n if n else 100.0

    def render(self) -> str:
        eq = sorted(k for k in self.results if k in self.equivalent)
        lo, hi = wilson_interval(self.killed, len(self.judged))
        lines = [f"mutation score: {self.killed}/{len(self.judged)} non-equivalent mutants "
                 f"killed ({self.score:.1f}%, 95% CI {100 * lo:.1f}-{100 * hi:.1f}% Wilson); "
                 f"{len(eq)} equivalent (docs/coverage.md) left out"]
        for k in self.survivors:
            lines.append(f"  SURVIVED ({self.judged[k]}) {k}   (mutmut show {k})")
        for k in eq:
            verdict = self.results[k]
            lines.append(f"  equivalent {k} "
                         f"({'not run' if verdict in PENDING else verdict})")
        return "\n".join(lines)


def wilson_interval(k: int, n: int, z: float = 1.96) -> tuple:
    """Wilson score interval of a proportion k/n (95% for z=1.96); (0, 1) when n is 0."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def equivalent_mutants(doc: Path = DOC) -> set:
    """Mutant names listed under docs/coverage.md's "Equivalent mutants" heading."""
    if not doc.exists():
        return set()
    text = doc.read_text()
    m = re.search(r"^## Equivalent mutants\s*$(.*?)(?=^## |\Z)", text, re.M | re.S)
    return set(re.findall(r"`(kvcheck\.impl\.[\w.ǁ]+__mutmut_\d+)`", m.group(1))) if m else set()


def mutant_results(mutants: Path = MUTANTS) -> dict:
    """mutant name -> mutmut's status, from mutmut's per-file records."""
    from mutmut.stats import status_by_exit_code
    out = {}
    for meta in sorted(mutants.glob("kvcheck/impl/**/*.py.meta")):
        for k, code in json.loads(meta.read_text())["exit_code_by_key"].items():
            out[k] = status_by_exit_code[code]
    return out


def sample(names, n: int, seed: int) -> list:
    """A fixed-seed sample: the same names for the same mutants, seed and count. A larger
    count with the same seed holds the smaller one's while both stay under a ninth of the
    mutants (random.sample draws one by one there; 341 of 3,062)."""
    names = sorted(names)
    return sorted(random.Random(f"kvcheck-mutation:{seed}").sample(names, min(n, len(names))))


def _mutmut(*names, env=None) -> int:
    exe = Path(sys.executable).with_name("mutmut")
    cmd = [str(exe) if exe.exists() else "mutmut", "run", *names]
    print(f"$ mutmut run {' '.join(names[:3])}{' ...' if len(names) > 3 else ''} "
          f"({len(names)} name(s))", flush=True)
    return subprocess.run(cmd, cwd=ROOT, env=env).returncode


def _generate(env=None) -> int:
    print("$ mutmut: generate the mutants (nothing run)", flush=True)
    return subprocess.run([sys.executable, "-c", GENERATE], cwd=ROOT, env=env).returncode


def to_run(names, results: dict, reuse: bool) -> list:
    """The names still to run: those without a verdict, or all of them without reuse."""
    return [k for k in names if not reuse or results.get(k, "not checked") in PENDING]


def oracle_fingerprint() -> str:
    """A hash of the ORACLE's .py and .json files (paths and contents): a new corpus trace
    or a changed invariant re-judges every mutant, so an old survivor is not reused."""
    import hashlib
    h = hashlib.sha256()
    for top in ORACLE:
        root = ROOT / top
        files = [root] if root.is_file() else sorted(
            f for f in root.rglob("*") if f.suffix in (".py", ".json") and f.is_file()
            and "__pycache__" not in f.parts and f.resolve() == f)   # not kvcheck/spec -> ../spec
        for f in files:
            h.update(str(f.relative_to(ROOT)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def _record(examples: int) -> dict:
    return {"examples": examples, "oracle": oracle_fingerprint()}


def _reusable(examples: int) -> bool:
    """The verdicts in mutants/ were reached with this --examples and this oracle (a record
    says so)."""
    try:
        return json.loads(RUN_RECORD.read_text()) == _record(examples)
    except (OSError, ValueError):
        return False


def report(n_sample=None, seed: int = 0) -> Score:
    """The score from the verdicts mutmut recorded in mutants/, running nothing."""
    res = mutant_results()
    names = sorted(res) if n_sample is None else sample(res, n_sample, seed)
    return Score({k: res[k] for k in names}, equivalent_mutants())


def run(n_sample=None, seed: int = 0, examples: int = 60, fresh: bool = False) -> Score:
    env = dict(os.environ, KVCHECK_MUTATION_EXAMPLES=str(examples))
    env.pop("PYTHONPATH", None)     # mutmut puts mutants/ first; the project must not shadow it
    reuse = not fresh and _reusable(examples)
    if _generate(env=env):          # (re)generate the mutants; judges none
        raise SystemExit("python -m kvcheck.mutation: error: mutmut could not generate "
                         "the mutants (its output is above)")
    RUN_RECORD.write_text(json.dumps(_record(examples)))
    results = mutant_results()
    names = sorted(results) if n_sample is None else sample(results, n_sample, seed)
    eq = equivalent_mutants()
    todo = [k for k in to_run(names, results, reuse) if k not in eq]
    n_eq = sum(k in eq for k in names)
    print(f"{len(names)} mutant(s): {n_eq} judged equivalent (docs/coverage.md, not run), "
          f"{len(names) - n_eq - len(todo)} judged before (reused), {len(todo)} to run",
          flush=True)
    if todo:        # mutmut records each verdict as it comes: an interrupted run resumes
        _mutmut(*todo, env=env)
    res = mutant_results()
    return Score({k: res[k] for k in names}, eq)


def main(argv=None) -> int:
    from kvcheck import argtypes as T
    p = argparse.ArgumentParser(prog="python -m kvcheck.mutation",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--sample", type=T.positive_int, default=None,
                   help="run a fixed-seed sample of N mutants (None: every mutant)")
    p.add_argument("--seed", type=T.seed, default=0, help="the sample's seed")
    p.add_argument("--examples", type=T.positive_int, default=60,
                   help="sequences of the differential run in the test command")
    p.add_argument("--fresh", action="store_true",
                   help="run every mutant again (default: reuse the verdicts in mutants/)")
    p.add_argument("--report", action="store_true",
                   help="print the score from the verdicts in mutants/ and run nothing "
                        "(after judging a survivor: the same sample, the list updated)")
    p.add_argument("--min-score", type=float, default=90.0,
                   help="exit 1 below this percentage of non-equivalent mutants killed")
    args = p.parse_args(argv)
    try:
        import mutmut  # noqa: F401
    except ImportError:
        print("python -m kvcheck.mutation: error: mutmut is not installed "
              "(pip install 'kvcheck[mutation]')", file=sys.stderr)
        return 2
    if args.report and not MUTANTS.is_dir():
        print("python -m kvcheck.mutation: error: --report: no mutants/ folder yet "
              "(run without --report first)", file=sys.stderr)
        return 2
    score = (report(args.sample, args.seed) if args.report
             else run(args.sample, args.seed, args.examples, fresh=args.fresh))
    print(score.render(), flush=True)
    return 0 if score.score >= args.min_score else 1


if __name__ == "__main__":
    sys.exit(main())
