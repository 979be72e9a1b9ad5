"""The text report of one exploration (`kvcheck explore`): states, coverage, operations
and the reachability goals reached or missed."""
from __future__ import annotations

import sys

from kvcheck.spec import ops as O
from kvcheck.explore.goals import SITUATIONS, _op_applies, situation_applies
from kvcheck.explore.result import Result

# ---------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------

def report(res: Result, out=None) -> None:
    out = sys.stdout if out is None else out
    sc, cfg = res.scope, res.scope.cfg
    w = lambda line="": print(line, file=out)
    w(f"scope {sc.describe()}")
    w(f"  symmetry reduction: {'on' if res.symmetric else 'off'}")
    if res.exhausted:
        cover = "exhausted: every reachable state of the scope was visited"
    elif not res.stopped:
        cover = (f"every state within {res.max_depth} steps visited (depth bound "
                 f"{sc.max_depth}; the last level is not expanded)")
    else:
        cover = (f"every state within {res.complete_depth + 1} steps visited, depth "
                 f"{res.complete_depth + 2} partly")
    if res.stopped:
        cover += f"; stopped early: {res.stopped}"
    w(f"  {res.states} distinct states, {res.transitions} transitions, max depth {res.max_depth}, "
      f"{res.seconds:.1f} s, {res.states_per_s:,.0f} states/s")
    if res.visited:
        w(f"  visited set: {res.bytes_per_state():,.0f} bytes per state (fingerprints and "
          "parent links)")
    w(f"  coverage: {cover}")
    w(f"  states per depth: {res.level_sizes}")
    if res.rebuilt_levels:
        w(f"  depths not kept in memory (over {res.frontier_states:,} states; rebuilt by "
          f"re-execution where expanded): {res.rebuilt_levels}")
    w("  operations (transitions taken; first depth; outcomes):")
    for name in O.OP_NAMES:
        na = _op_applies(name, res.scope)
        if name in res.op_first:
            outs = ", ".join(f"{o} {res.outcome_counts[(name, o)]}@{res.outcome_first[(name, o)]}"
                             for o in O.OUTCOMES if (name, o) in res.outcome_first)
            w(f"    {name:15s} {res.op_counts[name]:9d}  depth {res.op_first[name]:2d}  {outs}")
        elif na:
            w(f"    {name:15s}         -  n/a ({na})")
        else:
            w(f"    {name:15s}         0  NOT REACHED in this scope")
    w("  situations (sometimes):")
    for x in SITUATIONS:
        if x.id in res.reached:
            w(f"    reached at depth {res.reached[x.id]:2d}  {x.id}: {x.text}")
        elif situation_applies(x, res.scope):
            w(f"    n/a ({situation_applies(x, res.scope)})   {x.id}: {x.text}")
        elif x.id in res.scope.out_of_reach:
            w(f"    out of reach         {x.id}: {x.text}")
        else:
            w(f"    NOT REACHED          {x.id}: {x.text}")
    if res.violations:
        for v in res.violations:
            w(f"  VIOLATION {v.id} {v.name} at step {v.depth - 1} (trace of {v.depth} ops): {v.message}")
    else:
        w("  no violation")
