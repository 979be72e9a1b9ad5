"""`kvcheck explore`: its flags, the scopes they select, one run per scope with its report,
counterexample traces and HTML reports, and the transition check against a backend."""
from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from kvcheck import argtypes as T
from kvcheck.spec.config import ERAS, ConfigError
from kvcheck.explore.presets import PRESETS
from kvcheck.explore.scope import Scope, words
from kvcheck.explore.pools import explore_on
from kvcheck.explore.frontier import FRONTIER_STATES
from kvcheck.explore.result import Result, missed, to_trace
from kvcheck.explore_report import report

# ---------------------------------------------------------------------------
# command line
# ---------------------------------------------------------------------------

def _ints(text: str) -> tuple:
    try:
        vals = tuple(int(x) for x in text.replace(" ", "").split(",") if x != "")
    except ValueError:
        vals = (-1,)
    if any(v < 0 for v in vals):
        raise argparse.ArgumentTypeError(f"expected comma-separated integers >= 0, got {text!r}")
    return vals


def _word_list(text: str) -> tuple:
    """'2,2,3;2,2' -> ((2, 2, 3), (2, 2))."""
    try:
        ws = tuple(tuple(int(t) for t in w.split(",") if t.strip() != "")
                   for w in text.split(";") if w.strip() != "")
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected words like '2,2,3;2,2', got {text!r}") from None
    return ws


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default="check", help=f"named scope(s): {', '.join(PRESETS)} "
                   "(default: check); the flags below override its fields")
    p.add_argument("--list-presets", action="store_true", help="print the presets and exit")
    p.add_argument("--scope", action="append", metavar="NAME",
                   help="only this scope of the preset (repeatable; `--list-presets` names them)")
    g = p.add_argument_group("scope", "each flag defaults to the --preset scope's value")
    g.add_argument("--page-size", type=T.positive_int, help="page_size")
    g.add_argument("--pages", type=T.positive_int, help="num_pages")
    g.add_argument("--rows", type=T.positive_int, help="num_rows")
    g.add_argument("--context", type=T.positive_int, help="max_context_len")
    g.add_argument("--chunk-size", type=T.nonnegative_int, help="chunked prefill budget (0: off)")
    g.add_argument("--spec", dest="spec_enabled", action=argparse.BooleanOptionalAction,
                   help="speculative decoding (spec_enabled)")
    g.add_argument("--max-drafts", type=T.positive_int, help="max_drafts")
    g.add_argument("--overlap", action=argparse.BooleanOptionalAction, help="overlap scheduler")
    g.add_argument("--era", choices=ERAS, help="upstream era")
    g.add_argument("--sessions", type=T.nonnegative_int, help="session ids 1..N")
    g.add_argument("--plain", type=T.nonnegative_int, help="plain requests live at once")
    g.add_argument("--max-live", type=T.positive_int, help="requests live at once")
    g.add_argument("--prompts", type=_word_list, help="plain prompts, e.g. '2,2,3;2,3'")
    g.add_argument("--turns", type=_word_list, help="turn new_tokens, e.g. '2;2,2,2'")
    g.add_argument("--alphabet", type=_ints, help="with --lengths: every prompt and turn over it")
    g.add_argument("--lengths", type=_ints, help="prompt lengths for --alphabet")
    g.add_argument("--max-new", type=_ints, help="max_new_tokens choices, e.g. 1,2")
    g.add_argument("--decode-tokens", type=_ints, help="token choices of decode steps")
    g.add_argument("--evict", type=_ints, help="Evict(num_tokens) choices ('' for none)")
    g.add_argument("--reject", action=argparse.BooleanOptionalAction,
                   help="also try schedule(admit=false)")
    g.add_argument("--max-depth", type=T.positive_int, help="operations per path")
    b = p.add_argument_group("search")
    b.add_argument("--backend", type=T.backend, default="spec",
                   help="spec: the spec's invariants on every state and transition; impl or "
                        "sglang:VERSION: then also every transition of the explored scope on the "
                        "spec and that system side by side, compared step by step "
                        "(kvcheck/engines/exhaustive.py)")
    T.accept_flag(b)
    b.add_argument("--no-symmetry", action="store_true", help="no symmetry reduction")
    b.add_argument("--compare", action="store_true",
                   help="run with and without symmetry reduction and compare")
    b.add_argument("--all", dest="all_violations", action="store_true",
                   help="keep going after a violation: the shortest trace per invariant")
    b.add_argument("--max-states", type=T.positive_int, help="stop cleanly after this many states")
    b.add_argument("--max-seconds", type=T.positive_float, help="stop cleanly after this many seconds")
    b.add_argument("--frontier-states", type=T.nonnegative_int, default=FRONTIER_STATES,
                   metavar="N", help="a BFS level of more than N states is not kept in memory "
                   "but rebuilt by re-executing the parent links when it is expanded (about "
                   "10%% more CPU on such a level; 0: never kept, then the whole search holds "
                   "about 100 bytes a state); default: %(default)s (about 1.5 GB a level)")
    b.add_argument("--workers", type=T.positive_int, default=None, metavar="N",
                   help="expand each level in N forked worker processes, merged in the order one "
                        "process expands them: the same states, counts, goals and shortest "
                        "traces (kvcheck/explore/parallel.py); default 1, with --ray the local "
                        "Ray's cores or the cluster's CPUs")
    b.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                   help="the workers as Ray actors: a local Ray without ADDRESS, else the cluster "
                        "at ADDRESS (needs pip install 'kvcheck[ray]')")
    b.add_argument("--no-check", action="store_true", help="skip invariants (raw state count)")
    b.add_argument("--out", type=T.writable_dir, default=Path("failures") / "explore",
                   help="directory for counterexample traces")
    b.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    b.add_argument("--strict-coverage", action="store_true",
                   help="exit 1 when an applicable reachability goal is not reached")


def accepted_findings(args) -> tuple:
    """`--accept` (a ValueError for a usage error): only with a release to compare with,
    since under it the spec follows upstream's recorded behaviour and the invariants are
    judged on every transition by the lockstep (kvcheck.checker: a step past the accepted
    findings' model stops the comparison there), not by the search."""
    from kvcheck.backends import parse_accept
    backend = getattr(args, "backend", "spec")
    accept = parse_accept(getattr(args, "accept", None), backend)
    if accept and not backend.startswith("sglang"):
        raise ValueError("--accept needs --backend sglang:VERSION: the transition check judges "
                         "the accepted findings' paths step by step")
    return accept


def scopes_from_args(args) -> list:
    if args.preset not in PRESETS:
        raise ValueError(f"unknown preset {args.preset!r}; known: {', '.join(PRESETS)}")
    chosen = PRESETS[args.preset]
    only = getattr(args, "scope", None)
    if only:
        names = [sc.name for sc in chosen]
        unknown = [n for n in only if n not in names]
        if unknown:
            raise ValueError(f"preset {args.preset!r} has no scope {', '.join(map(repr, unknown))}; "
                             f"its scopes: {', '.join(names)}")
        chosen = [sc for sc in chosen if sc.name in only]
    accept = accepted_findings(args)
    out = []
    for sc in chosen:
        ckw = {}
        for flag, f in (("page_size", "page_size"), ("pages", "num_pages"), ("rows", "num_rows"),
                        ("context", "max_context_len"), ("spec_enabled", "spec_enabled"),
                        ("max_drafts", "max_drafts"), ("overlap", "overlap"), ("era", "era")):
            v = getattr(args, flag, None)
            if v is not None:
                ckw[f] = v
        if getattr(args, "chunk_size", None) is not None:
            ckw["chunk_size"] = args.chunk_size or None
        if accept:
            ckw["accept"] = accept
        cfg = replace(sc.cfg, **ckw) if ckw else sc.cfg     # replace re-validates
        skw = {}
        for f in ("sessions", "plain", "max_live", "prompts", "turns", "max_new",
                  "decode_tokens", "evict", "reject", "max_depth"):
            v = getattr(args, f, None)
            if v is not None:
                skw[f] = v
        if getattr(args, "alphabet", None) is not None or getattr(args, "lengths", None) is not None:
            ws = words(args.alphabet or (2, 3), args.lengths or (1, 2))
            skw.setdefault("prompts", ws)
            skw.setdefault("turns", ws)
        sc2 = replace(sc, cfg=cfg, **skw)
        for f in ("sessions", "plain", "max_live", "max_depth"):
            if getattr(sc2, f) < 0:
                raise ValueError(f"--{f.replace('_', '-')} must be >= 0")
        if any(len(w) == 0 for w in sc2.prompts + sc2.turns):
            raise ValueError("prompts and turns must be non-empty words")
        out.append(sc2)
    return out


def _check_transitions(res: Result, args, traces: list) -> int:
    """The scope's every transition on the spec and args.backend (exit code 1 on a failing
    step, whose trace and HTML report are written as a violation's are)."""
    from kvcheck.backends import BackendError, planted_upstream, resolve
    from kvcheck.engines.exhaustive import ForkError, check_transitions
    from kvcheck.engines.stats import differed_lines
    from kvcheck.trace import beyond_trace, failure_trace

    def prog(rep, el):
        print(f"[explore {res.scope.name} vs {rep.backend}] {rep.transitions:,} transitions, "
              f"{rep.states:,} of {res.states:,} states ({rep.transitions / el:,.0f}/s), "
              f"{el:.0f} s", file=sys.stderr, flush=True)
    meta = {"source": "explore", "scope": res.scope.name}

    def differ(kind, ops, b):       # written as found: an interrupted walk keeps them
        res.beyond_traces[kind] = str(beyond_trace(res.scope.cfg, ops, b, meta).save(
            Path(args.out) / "beyond" / f"{kind}-{res.scope.name}.json"))
    try:
        bname = resolve(args.backend)[1]
        meta.update(backend=bname, **planted_upstream(bname))
        rep = check_transitions(res, args.backend, None if getattr(args, "quiet", False) else prog,
                                differ=differ)
    except KeyboardInterrupt:
        for line in differed_lines(res.beyond_traces):
            print(line)
        raise
    except (ConfigError, BackendError, ForkError) as e:
        res.backend_check = f"spec vs {args.backend} on every transition: NOT CHECKED: {e}"
        print(f"  {res.backend_check}")
        if isinstance(e, ForkError):
            return 1
        print(f"kvcheck explore: error: {args.backend} cannot run scope {res.scope.name}: {e}",
              file=sys.stderr)          # the release refuses this configuration
        return 2
    res.backend_check = rep.verdict()
    print(f"  {rep.line()}")
    for line in differed_lines(res.beyond_traces):
        print(line)
    if rep.failure is None:
        return 0
    f = rep.failure
    traces.append(_write_trace(failure_trace(res.scope.cfg, rep.ops, f, meta),
                               Path(args.out) / f"{res.scope.name}-{f.id}-{f.side}.json",
                               rep.backend))
    return 1


def _write_trace(trace, path: Path, backend: str) -> Path:
    """A counterexample's trace file and its HTML report, each named on stdout."""
    from kvcheck.html_report import write_html_report
    trace.save(path)
    print(f"  trace: {path}  (replay: kvcheck replay {path})")
    print(f"  report: {write_html_report(path, backend=backend)}")
    return path


def _progress(res: Result, depth: int, nxt: int, el: float) -> None:
    print(f"[explore {res.scope.name}] depth {depth + 1}: {res.states} states "
          f"({res.states / el:,.0f}/s), {res.transitions} transitions, next level {nxt}, "
          f"{el:.0f} s, peak RSS {peak_rss() / (1 << 20):,.0f} MiB", file=sys.stderr, flush=True)


def peak_rss() -> int:
    """This process's peak resident memory in bytes: Linux's VmHWM, the high-water mark of
    this program's own memory (getrusage's ru_maxrss also keeps the peak of the process
    before an exec: a run started from a large parent, e.g. pytest, reports the parent's
    size); elsewhere ru_maxrss (KiB on Linux, bytes on macOS)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def main(args) -> int:
    if getattr(args, "list_presets", False):
        for name, scs in PRESETS.items():
            print(name)
            for sc in scs:
                print("   ", sc.describe())
        return 0
    try:
        scopes = scopes_from_args(args)
    except (ValueError, ConfigError) as e:
        print(f"kvcheck explore: error: {e}", file=sys.stderr)
        return 2
    rc = 0
    try:
        for sc in scopes:
            rc = max(rc, run_scope(sc, args)[0])
    except KeyboardInterrupt:
        from kvcheck.errors import files_written
        written = files_written(Path(args.out), "*.json")
        print("kvcheck explore: interrupted; " + (
            f"traces written: {', '.join(map(str, written))}" if written else "no trace written"))
        raise
    return rc


def workers_of(args) -> tuple:
    """(workers, Ray address or None) of `--workers` and `--ray`: one worker unless
    either is given; with --ray and no --workers, this machine's cores for a local Ray
    (0: the cluster's CPUs for an ADDRESS)."""
    from kvcheck.procs import usable_cores
    address = getattr(args, "ray", None)
    workers = getattr(args, "workers", None)
    if workers is None:
        workers = 1 if address is None else 0 if address else usable_cores()
    return workers, address


def run_scope(sc: Scope, args) -> tuple:
    """Explore one scope as `kvcheck explore` does (report on stdout, a trace and an HTML
    report per violation under args.out): (exit code, results, trace paths)."""
    rc, traces = 0, []
    prog = None if getattr(args, "quiet", False) else _progress
    kw = dict(all_violations=args.all_violations, max_states=args.max_states,
              max_seconds=args.max_seconds, check=not args.no_check, progress=prog,
              frontier_states=getattr(args, "frontier_states", FRONTIER_STATES))
    if sc.cfg.accept:
        print(f"[{sc.name}] --accept {','.join(sc.cfg.accept)}: the spec takes upstream's "
              f"behaviour there; the invariants are judged on every transition against "
              f"{args.backend}")
    runs = [True, False] if args.compare else [not args.no_symmetry]
    results = []
    for sym in runs:
        res = explore_on(sc, *workers_of(args), symmetric=sym, **kw)
        results.append(res)
        report(res)
        sys.stdout.flush()
        for v in res.violations:
            path = Path(args.out) / f"{sc.name}-{v.id}{'' if res.symmetric else '-nosym'}.json"
            traces.append(_write_trace(to_trace(res, v), path, "spec"))
        if res.violations:
            rc = 1
        elif getattr(args, "backend", "spec") != "spec":
            if res.stopped:
                print(f"  spec vs {args.backend} on every transition: not run (the exploration "
                      f"stopped early: {res.stopped})")
            else:
                rc = max(rc, _check_transitions(res, args, traces))
        gaps = missed(res)
        if gaps and args.strict_coverage and rc == 0:
            print(f"  coverage goals missed: {', '.join(gaps)}")
            rc = 1
        print()
    if args.compare:
        a, b = results
        ids = lambda r: sorted((v.id, v.depth) for v in r.violations)
        same = ids(a) == ids(b)
        print(f"symmetry comparison ({sc.name}): reduced {a.states} states / {a.transitions} "
              f"transitions in {a.seconds:.1f} s; unreduced {b.states} / {b.transitions} in "
              f"{b.seconds:.1f} s; ratio {b.states / max(a.states, 1):.2f}x; violations "
              f"{ids(a)} vs {ids(b)}: {'same' if same else 'DIFFERENT'}")
        print()
    return rc, results, traces


if __name__ == "__main__":
    ap = argparse.ArgumentParser(prog="python -m kvcheck.explore")
    add_arguments(ap)
    sys.exit(main(ap.parse_args()))
