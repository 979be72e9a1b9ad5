"""A level too large to keep (over `FRONTIER_STATES`): its states rebuilt by re-executing
the parent links from the initial state (`_level_states`)."""
from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from typing import Optional

from kvcheck.spec import model as M
from kvcheck.spec.state import State

FRONTIER_STATES = 250_000
"""`_search`'s default: a level of more states is rebuilt by re-execution, not kept
(about 1.5 GB a level kept; the nightly's levels pass it from depth 16)."""


def _level_states(s0: State, d: int, starts: list, parents: array, via: array,
                  op_table: list, lo: Optional[int] = None, hi: Optional[int] = None):
    """The states of BFS level d, in index order, as (index, state, None): rebuilt by
    re-executing the parent links from the initial state s0, depth first (only the path
    and its siblings are held). Breadth-first search gives every state a higher index
    than its parent and the children of one parent consecutive indices, in the parents'
    order, so a level's parent links are sorted and a node's children are found by
    bisection; `starts[k]` is the first index of level k. A child with no children of
    its own above level d is not rebuilt. Re-execution is exact: a step is a function of
    its state and op, and the op is the one that first reached the state. `lo`, `hi`:
    only the level's states with an index in [lo, hi) (and of the levels above, only
    their ancestors, a contiguous range of each level)."""
    lo = starts[d] if lo is None else lo
    hi = starts[d + 1] if hi is None else hi
    if d == 0:
        if lo <= 0 < hi:
            yield 0, s0, None
        return
    if lo >= hi:
        return
    bounds = [(lo, hi)]                 # the ancestors' index range at levels d, d-1, ..., 1
    for _ in range(d - 1):
        a, b = bounds[-1]
        bounds.append((parents[a], parents[b - 1] + 1))
    bounds.reverse()                    # bounds[k - 1]: level k's
    step = M.step
    stack = [(0, s0, 0)]
    while stack:
        i, s, k = stack.pop()
        a, b = bounds[k]
        lo_c = bisect_left(parents, i, max(starts[k + 1], a), min(starts[k + 2], b))
        hi_c = bisect_right(parents, i, lo_c, min(starts[k + 2], b))
        if k + 1 == d:
            for j in range(lo_c, hi_c):
                yield j, step(s, op_table[via[j]], True)[0], None
            continue
        below, end = starts[k + 2], starts[k + 3]
        for j in range(hi_c - 1, lo_c - 1, -1):     # popped in index order
            c = bisect_left(parents, j, below, end)
            if c < end and parents[c] == j:
                stack.append((j, step(s, op_table[via[j]], True)[0], k + 1))
