"""Distinct states per second of `kvcheck explore` on a fixed preset, one core, invariants on.

    python -m benchmarks.bench_explore [--preset bench] [--max-depth N] [--breakdown]
    python -m benchmarks.bench_explore --against main [--rounds 3] [--compiled] [--all-scopes]
    python -m benchmarks.bench_explore --preset nightly --memory [--compiled] --max-states N

Prints the search figures (distinct states, transitions, states/s) and, with
--breakdown, the cost of each part of one BFS transition measured in isolation on a
sample of the visited states: candidate ops (spec guards), kvcheck.spec.model.step (of which
State.clone), state_key, the fast invariant verdict, kvcheck.spec.view.abstract, check_state (the
reference, which the search runs only on a state the fast verdict does not call clean)
and check_step.

`--against REV` explores the preset's first scope (`--all-scopes`: all of them) with git revision REV's explorer
(exported with `git archive` into build/against/REV-SHA, kept so that its Cython build is
made once) and with this tree's, in alternating subprocesses, `--rounds` times each, and
prints states per CPU-second with the medians and the load average: the before/after
figure of one run. `--compiled`: both on their Cython builds (REV's is built on first use;
this tree's must be current, `make cython`).
"""
from __future__ import annotations

import argparse
import gc
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Optional

from kvcheck import explore as E
from kvcheck.fast_invariants import state_clean
from kvcheck.spec import model as M
from kvcheck.spec.invariants import check_state, check_step
from kvcheck.spec.view import abstract


def _per_call(fn, xs) -> float:
    """CPU microseconds per call (this process's: a shared machine's other jobs are not
    charged), with the cyclic collector paused as `explore` pauses it (a collection of the
    sample's states inside one row would be charged to that row)."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        t = time.process_time()
        for x in xs:
            fn(x)
        return (time.process_time() - t) / max(len(xs), 1) * 1e6
    finally:
        if was_on:
            gc.enable()


def breakdown(sc, sample: int = 2000) -> None:
    states = E.reachable_states(sc)[1:]     # a spread of states (every level), no checks
    step_ = max(1, len(states) // sample)
    states = states[::step_][:sample]
    trs = [(s, op) for s in states for op in E.candidate_ops(s, sc)]
    outs = [(s, op) + M.step(s, op) for s, op in trs]
    abs_ = [(abstract(s), op, out, abstract(s2)) for s, op, s2, out in outs]
    per_state = len(trs) / len(states)
    rows = [
        ("candidate_ops (guards)", _per_call(lambda s: E.candidate_ops(s, sc), states), 1.0),
        ("spec step", _per_call(lambda x: M.step(*x), trs), per_state),
        ("  of which State.clone", _per_call(lambda x: x[0].clone(), trs), 0.0),
        ("state_key (symmetric)", _per_call(lambda x: E.state_key(x[2]), outs), per_state),
        ("step_check_needed", _per_call(lambda x: E.step_check_needed(x[0], x[1], x[3], x[2]), outs),
         per_state),
        ("fast state_clean", _per_call(lambda x: state_clean(x[2]), outs), 1.0),
        ("abstract", _per_call(lambda x: abstract(x[2]), outs), None),
        ("  check_state (off the fast path)", _per_call(lambda x: check_state(x[3], sc.cfg), abs_),
         0.0),
        ("check_step", _per_call(lambda x: check_step(*x), abs_), None),
    ]
    needed = sum(1 for s, op, s2, out in outs if E.step_check_needed(s, op, out, s2)) / len(outs)
    print(f"breakdown on {len(states)} sampled states, {per_state:.1f} transitions per state, "
          f"step invariants needed on {needed:.0%} of transitions:")
    total = 0.0
    for name, us, mult in rows:
        if mult is None:   # abstract / check_step: on the transitions the prefilter lets through
            mult = needed * per_state
        cost = us * mult
        if not name.startswith("  "):
            total += cost
        print(f"  {name:26s} {us:7.1f} us/call  x{mult:4.1f}  = {cost:7.1f} us per distinct state")
    print(f"  {'estimated total':26s} {total:7.1f} us per distinct state "
          f"(~{1e6 / total:,.0f} states/s)")


def compare(sc) -> dict:
    """The same scope explored with whole canonical keys in the visited set (`fingerprints=
    False`, as before the fingerprints; the explorers before the other speed work are the
    git-archived BEFORE and PREVIOUS rows) and the new way (the explorer's defaults), CPU
    seconds of this process:
    {"old": (Result, cpu s), "new": (Result, cpu s)}."""
    out = {}
    for name, kw in (("old", {"fingerprints": False}), ("new", {})):
        t0 = time.process_time()
        res = E.explore(sc, **kw)
        out[name] = (res, time.process_time() - t0)
    return out


COMPILED_RUN = """
import json, sys, time
from kvcheck.compiled import activate, is_compiled
activate()
from kvcheck import explore as E
sc = [x for scs in E.PRESETS.values() for x in scs if x.name == sys.argv[1]][0]
if len(sys.argv) > 2:
    from dataclasses import replace
    sc = replace(sc, max_depth=int(sys.argv[2]))
t0 = time.process_time()
r = E.explore(sc)
print(json.dumps({"compiled": is_compiled(E.search), "states": r.states, "transitions": r.transitions,
                  "cpu_s": time.process_time() - t0}))
"""


BEFORE = "5caeb04"
"""The last commit before the copy-on-write state and the tighter step prefilter: its
explorer is the "before" row, run from `git archive` of that commit in a subprocess."""

PREVIOUS = "865cc94"
"""The explorer before the fast invariant verdict, the per-scope operation table and the
tree-key memo (main when that work began): the "previous" row, run the same way."""

BEFORE_RUN = COMPILED_RUN.replace("from kvcheck.compiled import activate, is_compiled\nactivate()\n",
                                  "is_compiled = lambda m: False\n")


def before_run(sc, commit: str = BEFORE):
    """The explorer of `commit` (interpreted) on the same scope, in a subprocess:
    (states, transitions, cpu s), or the reason it could not run."""
    import subprocess
    import tempfile

    from kvcheck import compiled
    with tempfile.TemporaryDirectory() as tmp:
        arch = subprocess.run(["git", "archive", commit, "spec", "kvcheck"], cwd=compiled.ROOT,
                              capture_output=True)
        if arch.returncode != 0:
            return f"git archive {commit} failed: {arch.stderr.decode().strip()[-200:]}"
        subprocess.run(["tar", "-x", "-C", tmp], input=arch.stdout, check=True)
        try:
            return _rate_in(Path(tmp), sc, compiled=False)
        except RuntimeError as e:
            return f"{commit}: {e}"


def compiled_run(sc):
    """The new explorer on the Cython build (kvcheck/compiled.py) in a subprocess:
    (states, transitions, cpu s), or the reason there is no usable build."""
    from kvcheck import compiled
    try:
        compiled.check_build()
        return _rate_in(compiled.ROOT, sc, compiled=True)
    except (compiled.NotBuilt, RuntimeError) as e:
        return str(e)


def _rate_in(tree, sc, compiled: bool) -> tuple:
    """(states, transitions, cpu s) of one exploration of `sc` (a preset's scope, by name)
    by a fresh interpreter importing `tree`'s sources."""
    import json
    import os
    import subprocess
    import sys
    run = COMPILED_RUN if compiled else BEFORE_RUN
    p = subprocess.run([sys.executable, "-c", run, sc.name, str(sc.max_depth)], cwd=tree,
                       env=dict(os.environ, PYTHONPATH=str(tree)), capture_output=True,
                       text=True)
    if p.returncode != 0:
        raise RuntimeError(f"the run in {tree} failed: {p.stderr.strip()[-400:]}")
    d = json.loads(p.stdout)
    if compiled and not d["compiled"]:
        raise RuntimeError(f"{tree}: the compiled run imported the sources")
    return d["states"], d["transitions"], d["cpu_s"]


def against(rev: str, scopes, rounds: int, compiled: bool, out=print) -> dict:
    """{rev: [states/cpu-s], "this tree": [...]}, the two trees alternating round by round
    (a shared machine's load hits both alike); a round explores every scope in `scopes`
    (each in its own subprocess) and counts their states and CPU seconds together. Both
    trees must explore the same state counts."""
    import statistics
    import subprocess
    import sys

    from benchmarks.bench_diff import export_rev
    from kvcheck import compiled as C
    sha = subprocess.run(["git", "rev-parse", "--short", rev], cwd=C.ROOT, capture_output=True,
                         text=True, check=True).stdout.strip()
    tree = C.ROOT / "build" / "against" / sha
    env = dict(os.environ, PYTHONPATH=str(tree))
    if not (tree / "kvcheck").exists():
        tree.mkdir(parents=True, exist_ok=True)
        export_rev(rev, tree)
    if compiled:
        C.check_build()
        if subprocess.run([sys.executable, "-c", "from kvcheck import compiled as C; C.check_build()"],
                          cwd=tree, env=env, capture_output=True).returncode:
            out(f"building {rev} ({sha}) with Cython in {tree.relative_to(C.ROOT)} ...", flush=True)
            subprocess.run([sys.executable, "-m", "kvcheck.compiled", "build"], cwd=tree, env=env,
                           check=True)
    res: dict = {f"{rev} ({sha})": [], "this tree": []}
    counts = set()
    for k in range(rounds):
        for name, t in zip(res, (tree, C.ROOT)):
            runs = [(sc.name,) + _rate_in(t, sc, compiled) for sc in scopes]
            states, trans, cpu = (sum(r[i] for r in runs) for i in (1, 2, 3))
            counts.add(tuple(r[1:3] for r in runs))
            res[name].append(states / cpu)
            parts = ("" if len(runs) == 1 else
                     " (" + ", ".join(f"{n} {c:.2f}" for n, _, _, c in runs) + ")")
            out(f"round {k + 1}: {name:<16} {states} states, {trans} transitions, {cpu:6.2f} "
                f"cpu-s{parts}: {res[name][-1]:7,.0f} states/cpu-s", flush=True)
    (a, ra), (b, rb) = res.items()
    ma, mb = statistics.median(ra), statistics.median(rb)
    out(f"{'+'.join(sc.name for sc in scopes)} ({'compiled' if compiled else 'interpreted'}), "
        f"states per CPU-second, median of {rounds}: {a} {ma:,.0f}, this tree {mb:,.0f} "
        f"(x{mb / ma:.2f}; load average {os.getloadavg()[0]:.1f})")
    if len(counts) != 1:
        out(f"WARNING: the runs explored different state counts: {sorted(counts)}")
    return res


MEMORY_RUN = """
import gc, json, os, sys, time
if sys.argv[1] == "compiled":
    from kvcheck.compiled import activate
    activate()
from kvcheck import explore as E
from kvcheck.compiled import is_compiled
from benchmarks.bench_explore import frontier_bytes
sc = E.PRESETS[sys.argv[2]][0]
max_states, max_seconds = (int(sys.argv[3]) or None), (float(sys.argv[4]) or None)
frontier_states = None if sys.argv[5] == "none" else int(sys.argv[5])
from kvcheck.explore_cmd import peak_rss as rss
rss0, load0, windows = rss(), os.getloadavg()[0], [(time.process_time(), 1)]
def tick(res, depth, nxt, el):
    windows.append((time.process_time(), res.states))
c0, w0 = time.process_time(), time.perf_counter()
r = E.explore(sc, max_states=max_states, max_seconds=max_seconds, progress=tick, progress_every=15,
              frontier_states=frontier_states)
cpu, wall, peak = time.process_time() - c0, time.perf_counter() - w0, rss()
windows.append((time.process_time(), r.states))
t = time.perf_counter()
visited = r.bytes_per_state()
del r.visited
load1 = os.getloadavg()[0]
print(json.dumps({"compiled": is_compiled(E.search), "states": r.states, "transitions": r.transitions,
                  "cpu_s": cpu, "wall_s": wall, "load": [load0, load1], "rss0": rss0,
                  "peak_rss": peak, "visited_bytes": visited, "levels": r.level_sizes,
                  "complete_depth": r.complete_depth, "stopped": r.stopped,
                  "frontier_states": frontier_states,
                  "violations": [v.id for v in r.violations], "windows": windows,
                  "frontier_bytes": (frontier_bytes(sc, min(r.complete_depth, 11))
                                     if sys.argv[6] == "frontier-bytes" else None)}))
"""


def frontier_bytes(sc, depth: int) -> tuple:
    """(states, bytes per state) of level `depth` of the scope, counted as the search's
    frontier holds it: every object those states reach, once, so that the entities they
    share copy-on-write are divided among them (the Config, classes and functions not
    counted)."""
    import sys as _sys
    states = E.reachable_states(replace(sc, max_depth=depth))
    level = states[len(E.reachable_states(replace(sc, max_depth=depth - 1))):]
    seen, total, todo = {id(sc.cfg)}, 0, list(level)
    while todo:
        o = todo.pop()
        if id(o) in seen or callable(o):
            continue
        seen.add(id(o))
        total += _sys.getsizeof(o)
        todo.extend(gc.get_referents(o))
    return len(level), total / max(len(level), 1)


def memory_run(sc, max_states: int, max_seconds: float, compiled: bool, out=print,
               frontier_states: Optional[int] = E.FRONTIER_STATES,
               frontier_size: bool = True) -> dict:
    """One search of `sc` in a fresh process (compiled: on this tree's Cython build;
    frontier_states: as `explore`'s, None every level kept; frontier_size: also
    size a frontier state, a second walk of the scope), with
    its CPU seconds, peak RSS, the visited set's and the frontier's bytes per state, the
    level sizes, and the rate in 15-second windows (does a state cost more deeper?)."""
    import json
    import subprocess
    import sys

    from kvcheck import compiled as C
    if compiled:
        C.check_build()
    p = subprocess.run([sys.executable, "-c", MEMORY_RUN, "compiled" if compiled else "interpreted",
                        sc.name, str(max_states or 0), str(max_seconds or 0),
                        "none" if frontier_states is None else str(frontier_states),
                        "frontier-bytes" if frontier_size else "-"], cwd=C.ROOT,
                       env=dict(os.environ, PYTHONPATH=str(C.ROOT)), capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"the run failed: {p.stderr.strip()[-600:]}")
    d = json.loads(p.stdout)
    mb = 1 << 20
    out(f"{sc.name} ({'compiled' if d['compiled'] else 'interpreted'}): {d['states']:,} states, "
        f"{d['transitions']:,} transitions, {d['cpu_s']:.1f} CPU-s ({d['states'] / d['cpu_s']:,.0f} "
        f"states/CPU-s), wall {d['wall_s']:.1f} s, load average {d['load'][0]:.1f} -> "
        f"{d['load'][1]:.1f}; stopped: {d['stopped']}; violations: {d['violations'] or 'none'}; "
        + ("every level kept" if d["frontier_states"] is None
           else f"levels over {d['frontier_states']:,} states rebuilt, not kept"))
    out(f"  levels {d['levels']} (complete to depth {d['complete_depth']})")
    w = d["windows"]
    out("  states/CPU-s by 15 s window (the last one: to the search's return, the frontier "
        "freed): " + ", ".join(
        f"{(b[1] - a[1]) / max(b[0] - a[0], 1e-9):,.0f}@{b[1] // 1000}k" for a, b in zip(w, w[1:])
        if b[0] - a[0] > 1))
    fb = ("" if d["frontier_bytes"] is None else
          "; a frontier state {1:,.0f} bytes (the {0:,} states of one level, shared entities "
          "counted once)".format(*d["frontier_bytes"]))
    out(f"  peak RSS {d['peak_rss'] / mb:,.0f} MiB (at start {d['rss0'] / mb:,.0f} MiB): "
        f"{(d['peak_rss'] - d['rss0']) / d['states']:,.0f} bytes per distinct state; visited set "
        f"{d['visited_bytes']:,.0f} bytes per state{fb}")
    out(f"  a million states at this rate: {1e6 * d['cpu_s'] / d['states']:,.0f} CPU-s")
    return d


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_explore")
    ap.add_argument("--preset", default="bench")
    ap.add_argument("--max-depth", type=int)
    ap.add_argument("--breakdown", action="store_true")
    ap.add_argument("--against", metavar="REV", help="side by side with git revision REV")
    ap.add_argument("--rounds", type=int, default=3, help="with --against: runs of each tree")
    ap.add_argument("--compiled", action="store_true", help="with --against: Cython builds")
    ap.add_argument("--all-scopes", action="store_true",
                    help="with --against: every scope of the preset (e.g. check: make check's)")
    ap.add_argument("--memory", action="store_true",
                    help="one search in a fresh process: CPU seconds, peak RSS, bytes per state "
                         "(with --compiled: the Cython build; bounded by the two flags below)")
    ap.add_argument("--max-states", type=int)
    ap.add_argument("--max-seconds", type=float)
    ap.add_argument("--frontier-states", type=int, default=E.FRONTIER_STATES,
                    help="with --memory: levels of more states are rebuilt by re-execution, not "
                         "kept (default: the explorer's, %(default)s)")
    args = ap.parse_args(argv)
    sc = E.PRESETS[args.preset][0]
    if args.max_depth is not None:
        sc = replace(sc, max_depth=args.max_depth)
    if args.memory:
        memory_run(sc, args.max_states, args.max_seconds, args.compiled,
                   frontier_states=args.frontier_states)
        return 0
    if args.against:
        scopes = [sc] if not args.all_scopes else [
            replace(x, max_depth=args.max_depth) if args.max_depth is not None else x
            for x in E.PRESETS[args.preset]]
        against(args.against, scopes, args.rounds, args.compiled)
        return 0
    print(sc.describe())
    res = E.explore(sc)
    print(f"explore: {res.states} distinct states, {res.transitions} transitions, "
          f"{res.seconds:.2f} s -> {res.states_per_s:,.0f} distinct states/s "
          f"({res.transitions / res.seconds:,.0f} transitions/s), invariants checked, "
          f"{'no violation' if not res.violations else res.violations[0].id}")
    raw = E.explore(sc, check=False)
    print(f"without invariants: {raw.states_per_s:,.0f} distinct states/s")
    if args.breakdown:
        breakdown(sc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
