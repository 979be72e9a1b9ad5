"""`kvcheck coverage`: how much of the system under test the checker's runs reach.

Runs what `make check` runs against a system (the regression corpus, the planted-fault
corpus on impl, the fixed-seed differential run, the exhaustive differential of the
check-impl preset on impl or of check-sglang-VERSION on a release) and a fixed-count fuzz
run under
coverage.py with branch coverage, then prints per-file line and branch coverage and
every branch no run took, with its source line.

* `--backend impl`: coverage.py measures impl/ in this process (started before impl/
  is imported, so module-level lines count too).
* `--backend sglang:V`: the release runs in its own venv's server process
  (adapters/sglang/proxy.py); the server is started under `python -m coverage run`
  (KVCHECK_SGLANG_COVERAGE names the rc file), its data is combined here, and the report
  covers the modules the adapter drives (`SGLANG_TARGETS`).

`reached(data)` is the set of branches a run took, named by source text; the test
tests/test_coverage.py keeps a recorded baseline of it (`BASELINE`) so that a change
that stops the check from reaching a branch fails.
"""
from __future__ import annotations

import importlib.util
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from fnmatch import fnmatch
from pathlib import Path
from typing import Optional

from kvcheck.errors import REGRESSIONS, ROOT, UPSTREAM

IMPL = Path(importlib.util.find_spec("kvcheck.impl").origin).resolve().parent
"""impl/'s folder (found without importing it: measure_impl must start first)."""
NAMES = IMPL.parent
"""What a file's name in a report is relative to ("impl/x.py", in the checkout and installed)."""
BASELINE = ROOT / "tests" / "coverage_baseline.json"
FUZZ_SEED = 1
"""The fixed-count fuzz run's seed (the differential part uses kvcheck.check.CHECK_SEED)."""
SGLANG_ENV = "KVCHECK_SGLANG_COVERAGE"
"""Set to a coverage rc file: adapters/sglang/proxy.py starts its server under coverage."""

SGLANG_TARGETS: tuple = (
    # (path under the sglang package, functions reported (None: the whole file))
    ("srt/session/*.py", None),
    ("srt/mem_cache/allocator.py", None),
    ("srt/mem_cache/allocator/*.py", None),
    ("srt/mem_cache/radix_cache.py", None),
    ("srt/mem_cache/unified_radix_cache.py", None),
    # 0.5.23's tree components: FULL always, MAMBA with `mamba_tree`, SWA with swa_window
    # (prefill-aware SWA stays refused)
    ("srt/mem_cache/unified_cache/components/*.py", None),
    ("srt/mem_cache/common.py", ("release_kv_cache", "maybe_cache_unfinished_req",
                                 "checkpoint_kv_cache", "evict_from_tree_cache",
                                 "alloc_*", "free_*", "write_cache_indices",
                                 "_free_*", "*session_held*", "coalesce_ranges")),
    ("srt/mem_cache/allocation.py", ("alloc_*", "free_*", "evict_from_tree_cache",
                                     "write_cache_indices", "coalesce_ranges")),
    ("srt/mem_cache/memory_pool.py", ("ReqToTokenPool.*",)),
    ("srt/managers/schedule_batch.py", ("release_req", "Req.reset_for_retract",
                                        "ScheduleBatch.prepare_for_extend",
                                        "ScheduleBatch.prepare_for_decode",
                                        "ScheduleBatch.init_new", "Req.init_next_round_input",
                                        "Req.set_extend_range", "Req.pop_*",
                                        "ScheduleBatch.check_decode_mem",
                                        "ScheduleBatch.new_tokens_required_next_decode",
                                        "ScheduleBatch.retract_decode",
                                        "ScheduleBatch._get_decode_retraction_order",
                                        "ScheduleBatch.filter_batch")),
    # the prefill round's admission: the PrefillAdder and its budgets, the queue's policy
    ("srt/managers/schedule_policy.py", ("PrefillAdder.*", "SchedulePolicy.*")),
    ("srt/mem_cache/prefill_budget.py", None),
    # the request entry (adapters/sglang/entry.py: 0.5.15, 0.5.22, 0.5.23)
    ("srt/managers/scheduler.py", ("Scheduler.handle_generate_request",
                                   "Scheduler._handle_generate_request",
                                   "Scheduler.init_req_max_new_tokens",
                                   "Scheduler._add_request_to_queue",
                                   "Scheduler._set_or_validate_priority",
                                   "Scheduler._release_aborted_request",
                                   "Scheduler.abort_request", "Scheduler.open_session",
                                   "Scheduler.close_session")),
)
"""What the sglang adapter drives (adapters/sglang/backend.py): the session wrapper,
the allocator, the radix cache and 0.5.23's tree components whole; of the large modules, the functions it calls
(release, cache-unfinished, eviction, allocation, retract, the request entry) and what they
call."""
SGLANG_INCLUDE = ("*/sglang/srt/session/*", "*/sglang/srt/mem_cache/*",
                  "*/sglang/srt/managers/schedule_batch.py",
                  "*/sglang/srt/managers/schedule_policy.py",
                  "*/sglang/srt/managers/scheduler.py")


# -- the report -------------------------------------------------------------------------

@dataclass
class FileCoverage:
    path: str                       # as printed (relative to the project or to sglang/)
    statements: int
    missing_lines: int
    branches: int
    missing: list = field(default_factory=list)   # [(from, to, source line)]

    @property
    def line_pct(self) -> float:
        return 100.0 * (self.statements - self.missing_lines) / self.statements \
            if self.statements else 100.0

    @property
    def branch_pct(self) -> float:
        return 100.0 * (self.branches - len(self.missing)) / self.branches \
            if self.branches else 100.0


@dataclass
class CoverageReport:
    backend: str
    files: list
    seconds: float = 0.0
    parts: list = field(default_factory=list)     # [(name, seconds, detail)]

    @property
    def branches(self) -> int:
        return sum(f.branches for f in self.files)

    @property
    def missing_branches(self) -> int:
        return sum(len(f.missing) for f in self.files)

    @property
    def branch_pct(self) -> float:
        b = self.branches
        return 100.0 * (b - self.missing_branches) / b if b else 100.0

    @property
    def line_pct(self) -> float:
        s = sum(f.statements for f in self.files)
        m = sum(f.missing_lines for f in self.files)
        return 100.0 * (s - m) / s if s else 100.0

    def render(self, uncovered: bool = True) -> str:
        width = max([len(f.path) for f in self.files] + [5])
        lines = [f"coverage of {self.backend} ({self.seconds:.1f} s):",
                 f"  {'file':<{width}} {'lines':>6} {'miss':>5} {'line%':>6} "
                 f"{'branches':>8} {'miss':>5} {'branch%':>7}"]
        for f in self.files:
            lines.append(f"  {f.path:<{width}} {f.statements:>6} {f.missing_lines:>5} "
                         f"{f.line_pct:>5.1f}% {f.branches:>8} {len(f.missing):>5} "
                         f"{f.branch_pct:>6.1f}%")
        s = sum(f.statements for f in self.files)
        m = sum(f.missing_lines for f in self.files)
        lines.append(f"  {'TOTAL':<{width}} {s:>6} {m:>5} {self.line_pct:>5.1f}% "
                     f"{self.branches:>8} {self.missing_branches:>5} {self.branch_pct:>6.1f}%")
        if uncovered:
            lines.append(f"uncovered branches ({self.missing_branches}):")
            for f in self.files:
                for a, b, text in f.missing:
                    to = "exit" if b < 0 else str(b)
                    lines.append(f"  {f.path}:{a}->{to}  {text}")
        return "\n".join(lines)

    def to_json(self) -> dict:
        return {"backend": self.backend, "seconds": round(self.seconds, 1),
                "line_pct": round(self.line_pct, 2), "branch_pct": round(self.branch_pct, 2),
                "parts": [{"name": n, "seconds": round(t, 1), "detail": d}
                          for n, t, d in self.parts],
                "files": {f.path: {"statements": f.statements, "missing_lines": f.missing_lines,
                                   "branches": f.branches,
                                   "missing_branches": [[a, b] for a, b, _ in f.missing]}
                          for f in self.files}}


def _source_line(path: Path, cache: dict, n: int) -> str:
    if path not in cache:
        cache[path] = path.read_text().splitlines()
    lines = cache[path]
    return lines[n - 1].strip() if 0 < n <= len(lines) else ""


def file_coverage(name: str, path: Path, entry: dict, functions=None) -> Optional[FileCoverage]:
    """One file of coverage.py's JSON report, or only the named functions of it
    (fnmatch patterns on coverage.py's "Class.method" names); None when nothing matches."""
    regions = [entry] if functions is None else [
        r for fname, r in entry.get("functions", {}).items()
        if fname and any(fnmatch(fname, p) for p in functions)]
    if not regions:
        return None
    cache: dict = {}
    missing = sorted({(a, b) for r in regions for a, b in r["missing_branches"]})
    return FileCoverage(
        name,
        statements=sum(r["summary"]["num_statements"] for r in regions),
        missing_lines=sum(r["summary"]["missing_lines"] for r in regions),
        branches=sum(r["summary"]["num_branches"] for r in regions),
        missing=[(a, b, _source_line(path, cache, a)) for a, b in missing])


def reached(data: dict, root: Path = NAMES) -> set:
    """The branches a run took, each named by its file, its function and the source text
    of its two ends ("impl/x.py:f: if x: -> return 1"; "exit" for a jump out of the
    function; "#k" numbers repeats of the same pair in one function), so that a baseline
    survives edits that only move lines."""
    out = set()
    for fname, entry in data["files"].items():
        path = Path(fname) if Path(fname).is_absolute() else NAMES / fname
        rel = _relative(path, root)
        cache: dict = {}
        regions = entry.get("functions") or {"": entry}
        for func, region in regions.items():
            seen: dict = {}
            for a, b in sorted(map(tuple, region.get("executed_branches", ()))):
                key = (f"{rel}:{func or '<module>'}: {_source_line(path, cache, a)} -> "
                       f"{_source_line(path, cache, b) if b > 0 else 'exit'}")
                seen[key] = seen.get(key, 0) + 1
                out.add(key if seen[key] == 1 else f"{key} #{seen[key]}")
    return out


def _relative(path: Path, root: Path) -> str:
    path = path if path.is_absolute() else NAMES / path
    try:
        return str(path.resolve().relative_to(root.resolve()))
    except ValueError:
        return str(path)


def impl_report(data: dict) -> list:
    files = []
    for fname, entry in sorted(data["files"].items()):
        path = Path(fname) if Path(fname).is_absolute() else NAMES / fname
        fc = file_coverage(_relative(path, NAMES), path, entry)
        if fc is not None:
            files.append(fc)
    return files


def sglang_report(data: dict) -> list:
    files = []
    for fname, entry in sorted(data["files"].items()):
        path = Path(fname)
        rel = fname.split("/sglang/", 1)[-1]
        for pattern, functions in SGLANG_TARGETS:
            if fnmatch(rel, pattern):
                fc = file_coverage(rel, path, entry, functions)
                if fc is not None:
                    files.append(fc)
                break
    return files


# -- the runs ------------------------------------------------------------------------------

@dataclass
class Plan:
    backend: str = "impl"
    examples: int = 100             # the differential part (as `kvcheck check --examples`)
    rounds: int = 200               # the fixed-count fuzz run (0: none)
    seed: int = FUZZ_SEED
    engine: Optional[str] = None
    accept: tuple = ()
    corpus: bool = True
    exhaustive: bool = True         # check's exhaustive differential (impl, a release with a preset)


def _progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run_parts(plan: Plan, out_dir: Path, progress=_progress) -> list:
    """The runs whose coverage is measured: [(name, seconds, detail)]; a finding in a
    run is reported but does not stop the measurement."""
    from kvcheck.check import CHECK_SEED, check_corpus, planted_verdict
    from kvcheck.engines import DEFAULT_ENGINE
    from kvcheck.fuzz import Console, fuzz
    from kvcheck.trace import load
    engine = plan.engine or DEFAULT_ENGINE
    parts = []

    def part(name, fn):
        progress(f"== {name}")
        t0 = time.monotonic()
        detail = fn()
        dt = time.monotonic() - t0
        progress(f"   {detail} ({dt:.1f} s)")
        parts.append((name, dt, detail))

    def corpus():
        paths = [REGRESSIONS]
        if plan.backend.startswith("sglang:"):
            paths += sorted(UPSTREAM.glob(f"*-sglang-{plan.backend.split(':', 1)[1]}.json"))
        bad = check_corpus(paths, plan.backend, out=lambda s: progress("   " + s))
        return f"regression corpus, {len(bad)} unexpected"

    def planted():
        files = sorted((REGRESSIONS / "planted").glob("*.json"))
        verdicts = [planted_verdict(load(f))[0] for f in files]
        return f"{verdicts.count('caught')}/{len(files)} planted-fault traces caught"

    from kvcheck.check import differential_preset
    preset = differential_preset(plan.backend)

    def exhaustive():
        from dataclasses import replace

        from kvcheck import explore as X
        from kvcheck.engines.exhaustive import check_transitions
        n = bad = 0
        for sc in X.PRESETS[preset]:
            if plan.accept:     # as check does: the findings' paths driven, judged by the lockstep
                sc = replace(sc, cfg=replace(sc.cfg, accept=plan.accept))
            rep = check_transitions(X.explore(sc), plan.backend)
            n, bad = n + rep.transitions, bad + (rep.failure is not None)
        return f"{n:,} transitions of {preset}" + (f", {bad} failing" if bad else "")

    def campaign(seed, rounds, label):
        def run():
            rep = fuzz(None, seed, plan.backend, out_dir, rounds=rounds, engine=engine,
                       console=Console(prefix="   "), accept=plan.accept, shrink_replays=0)
            if rep.interrupted:
                raise KeyboardInterrupt
            found = f", {len(rep.found)} finding(s)" if rep.found else ""
            return f"{label}: {rep.sequences} sequences, {rep.steps} steps{found}"
        return run

    if plan.corpus:
        part("regression corpus", corpus)
        if plan.backend == "impl":
            part("planted-fault corpus", planted)
    part(f"differential run ({plan.examples} sequences, seed {CHECK_SEED})",
         campaign(CHECK_SEED, plan.examples, "differential"))
    if plan.exhaustive and preset is not None:
        part(f"exhaustive differential (preset {preset}, every transition)", exhaustive)
    if plan.rounds:
        part(f"fuzz run ({plan.rounds} sequences, seed {plan.seed})",
             campaign(plan.seed, plan.rounds, "fuzz"))
    return parts


def _impl_loaded() -> bool:
    return any(m == "impl" or m.startswith("impl.") for m in sys.modules)


def measure_impl(plan: Plan, work: Path, progress=_progress) -> tuple[dict, list]:
    """coverage.py's JSON report over impl/ for the plan's runs, and the parts run."""
    import coverage
    if _impl_loaded():      # module-level lines would count as missed: measure afresh
        raise RuntimeError("measure_impl must run before impl/ is imported")
    cov = coverage.Coverage(branch=True, data_file=None, source=[str(IMPL)])
    cov.start()
    try:
        parts = run_parts(plan, work / "failures", progress)
    finally:
        cov.stop()
    out = work / "coverage.json"
    cov.json_report(outfile=str(out))
    return json.loads(out.read_text()), parts


def sglang_rcfile(work: Path) -> Path:
    rc = work / "sglang.coveragerc"
    rc.write_text("[run]\nbranch = True\nparallel = True\n"
                  f"data_file = {work / '.coverage'}\n"
                  "include =\n" + "".join(f"    {p}\n" for p in SGLANG_INCLUDE))
    return rc


def measure_sglang(plan: Plan, work: Path, progress=_progress) -> tuple[dict, list]:
    """The release's server runs under coverage (see the module docstring)."""
    import coverage
    from kvcheck.adapters.sglang import proxy
    rc = sglang_rcfile(work)
    os.environ[SGLANG_ENV] = str(rc)
    try:
        parts = run_parts(plan, work / "failures", progress)
    finally:
        proxy._stop_all()           # the server writes its data as it exits
        os.environ.pop(SGLANG_ENV, None)
    cov = coverage.Coverage(config_file=str(rc))
    cov.combine(strict=False)
    out = work / "coverage.json"
    try:
        cov.json_report(outfile=str(out), ignore_errors=True)
    except coverage.exceptions.NoDataError:
        raise RuntimeError("the sglang server wrote no coverage data (is coverage installed "
                           "in its venv? adapters/sglang/make_env.sh installs it)") from None
    return json.loads(out.read_text()), parts


def sglang_branches(rc: Path) -> int:
    """The release's branches reached so far (what `sglang_report` counts), from the data
    files the server processes under `rc` wrote (kept, so a later call counts them again)."""
    import coverage
    cov = coverage.Coverage(config_file=str(rc))
    cov.combine(strict=False, keep=True)
    out = Path(rc).with_suffix(".json")
    cov.json_report(outfile=str(out), ignore_errors=True)
    return sum(f.branches - len(f.missing) for f in sglang_report(json.loads(out.read_text())))


def measure(plan: Plan, progress=_progress) -> tuple[CoverageReport, dict]:
    """Run the plan under coverage; (the report, coverage.py's JSON data)."""
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kvcheck-coverage-") as tmp:
        work = Path(tmp)
        if plan.backend.startswith("sglang"):
            data, parts = measure_sglang(plan, work, progress)
            files = sglang_report(data)
        else:
            data, parts = measure_impl(plan, work, progress)
            files = impl_report(data)
    return CoverageReport(plan.backend, files, time.monotonic() - t0, parts), data


# -- the command -------------------------------------------------------------------------

def add_arguments(p) -> None:
    from kvcheck import argtypes as T
    from kvcheck.engines import ENGINES
    p.add_argument("--backend", type=T.backend, default="impl",
                   help="impl (coverage of impl/) or sglang:VERSION (of the release's modules "
                        "the adapter drives, measured in its venv)")
    p.add_argument("--examples", type=T.positive_int, default=100,
                   help="the differential part's sequences (as kvcheck check --examples)")
    p.add_argument("--rounds", type=T.nonnegative_int, default=200,
                   help="the fixed-count fuzz run's sequences (0: none)")
    p.add_argument("--seed", type=T.seed, default=FUZZ_SEED, help="the fuzz run's seed")
    p.add_argument("--engine", choices=ENGINES, default=None,
                   help="the fuzz engine (default: kvcheck fuzz's, walk)")
    p.add_argument("--no-corpus", action="store_true",
                   help="leave out the regression and planted-fault corpora")
    p.add_argument("--no-exhaustive", action="store_true",
                   help="leave out check's exhaustive differential (every transition of the "
                        "check-impl preset on impl/, of check-sglang-VERSION on a release)")
    p.add_argument("--brief", action="store_true", help="the table only, no uncovered branches")
    p.add_argument("--json", type=T.writable_file, metavar="FILE",
                   help="also write the report as JSON (per file, the missing branches)")
    p.add_argument("--reached", type=T.writable_file, metavar="FILE",
                   help="write the sorted list of branches reached (the baseline format "
                        "of tests/coverage_baseline.json)")
    p.add_argument("--accept", metavar="U1,U2,...", default=None,
                   help="sglang only: recorded findings whose behaviour the spec takes "
                        "(default: each release's recorded findings, as make check-sglang)")


def _accept(args) -> tuple:
    from kvcheck.backends import parse_accept
    if args.backend == "impl":
        return ()
    if args.accept is None and ":" in args.backend:
        from kvcheck.adapters.sglang.findings import RELEASES
        return tuple(RELEASES.get(args.backend.split(":", 1)[1], ()))
    return parse_accept(args.accept, args.backend)


def _has_coverage(python: Optional[str]) -> bool:
    import subprocess
    if python is None:
        return True
    return subprocess.run([python, "-c", "import coverage"], capture_output=True).returncode == 0


def cmd_coverage(args) -> int:
    from kvcheck.errors import UsageError
    if args.backend == "spec":
        raise UsageError("--backend spec: coverage is measured on impl or sglang:VERSION")
    if args.backend.startswith("sglang"):
        from kvcheck.backends import resolve
        resolve(args.backend)                       # unknown backend: exit 2, no work
        from kvcheck.adapters.sglang.proxy import SglangUnavailable, resolve_python
        try:
            python = resolve_python(args.backend.split(":", 1)[1] if ":" in args.backend else None)
        except SglangUnavailable as e:
            raise UsageError(f"--backend {args.backend}: {e}") from None
        if not _has_coverage(python):
            raise UsageError(f"--backend {args.backend}: coverage is not installed in {python}'s "
                             "venv; pip install 'coverage==7.17.3' there (make_env.sh does)")
    plan = Plan(args.backend, args.examples, args.rounds, args.seed, args.engine,
                _accept(args), not args.no_corpus, not args.no_exhaustive)
    report, data = measure(plan)
    print(report.render(uncovered=not args.brief))
    if args.json:
        Path(args.json).write_text(json.dumps(report.to_json(), indent=1) + "\n")
    if args.reached:
        Path(args.reached).write_text(json.dumps(sorted(reached(data)), indent=0) + "\n")
    return 0
