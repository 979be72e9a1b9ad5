"""The record of a search (`Result`: its counts, goals reached and violations `Found`),
and what a report reads from it: the goals missed, a violation's trace."""
from __future__ import annotations

import itertools
import sys
from collections import Counter
from dataclasses import dataclass, field
from typing import Optional

from kvcheck.spec import model as M
from kvcheck.spec import ops as O
from kvcheck.spec.progress import P1, drained
from kvcheck.spec.state import initial_state
from kvcheck.explore.goals import SITUATIONS, _op_applies, situation_applies
from kvcheck.explore.scope import Scope


@dataclass
class Found:
    id: str
    name: str
    message: str
    depth: int                # number of ops in the trace
    ops: list


@dataclass
class Result:
    scope: Scope
    symmetric: bool
    states: int = 0
    transitions: int = 0
    max_depth: int = 0
    complete_depth: int = -1          # every state at depth <= this was expanded
    exhausted: bool = False           # no new states below the depth bound
    stopped: Optional[str] = None     # why the search stopped early
    seconds: float = 0.0
    op_counts: Counter = field(default_factory=Counter)
    outcome_counts: Counter = field(default_factory=Counter)
    op_first: dict = field(default_factory=dict)          # op name -> depth first taken
    outcome_first: dict = field(default_factory=dict)     # (op, outcome) -> depth
    reached: dict = field(default_factory=dict)           # situation id -> depth
    violations: list = field(default_factory=list)        # Found, first per id
    level_sizes: list = field(default_factory=list)
    rebuilt_levels: list = field(default_factory=list)    # depths not kept (frontier_states)
    frontier_states: Optional[int] = None
    visited: tuple = field(default=(), repr=False)      # (seen set, parents, via)
    op_table: list = field(default_factory=list, repr=False)   # via's operations
    backend_check: str = ""           # `--backend impl`: the transition check's verdict line
    beyond_traces: dict = field(default_factory=dict)   # kind -> trace of the first stop
                                      # where the backend alone differed (TransitionReport.differs)
    workers: "WorkerTimes" = field(default_factory=lambda: WorkerTimes())

    def bytes_per_state(self, sample: int = 2000) -> float:
        """Memory of the visited set and the parent links per distinct state (a sample of
        the keys sized deeply, so that whole keys are counted with their contents)."""
        if not self.visited:
            return 0.0
        seen, parents, via = self.visited
        keys = list(itertools.islice(seen, sample))
        per_key = sum(_deep_size(k) for k in keys) / max(len(keys), 1)
        total = (sys.getsizeof(seen) + per_key * len(seen) + parents.itemsize * len(parents)
                 + via.itemsize * len(via))
        return total / max(self.states, 1)

    @property
    def states_per_s(self) -> float:
        return self.states / self.seconds if self.seconds > 0 else 0.0


@dataclass
class WorkerTimes:
    """Where a parallel search's CPU went: each worker's CPU seconds, per level and in
    all (empty for a search in one process)."""
    levels: list = field(default_factory=list)      # per level: {worker: CPU seconds}

    def level(self) -> None:
        self.levels.append({})

    def note(self, w: int, cpu: float) -> None:
        self.levels[-1][w] = cpu

    @property
    def count(self) -> int:
        return 1 + max((w for lv in self.levels for w in lv), default=0)

    @property
    def cpu(self) -> float:
        return sum(sum(lv.values()) for lv in self.levels)

    @property
    def critical(self) -> float:
        """CPU seconds of the busiest worker of each level, summed: the wall time the
        levels take on free cores, every worker waiting for the slowest."""
        return sum(max(lv.values(), default=0.0) for lv in self.levels)


def _deep_size(x, _seen=None) -> int:
    """Bytes of x and of everything it holds that no other sized object shares."""
    _seen = set() if _seen is None else _seen
    if id(x) in _seen:
        return 0
    _seen.add(id(x))
    if isinstance(x, int) and -5 <= x <= 256:
        return 0                    # CPython's shared small ints
    n = sys.getsizeof(x)
    if isinstance(x, (tuple, list, frozenset, set)):
        n += sum(_deep_size(y, _seen) for y in x)
    return n


def missed(res: Result) -> list:
    """Reachability goals that apply to the scope's config but were not reached."""
    sc = res.scope
    out = [n for n in O.OP_NAMES if n not in res.op_first and not _op_applies(n, sc)]
    out += [x.id for x in SITUATIONS if situation_applies(x, sc) is None
            and x.id not in res.reached and x.id not in sc.out_of_reach]
    return out


def to_trace(res: Result, v: Found):
    """A violation's trace; P1's runs the drain after its operations and fails once the
    drain has run its course (`Lockstep.drain`)."""
    from dataclasses import replace
    from kvcheck.trace import Expect, Trace
    cfg, step = res.scope.cfg, v.depth - 1
    if v.id == P1[0]:
        s = initial_state(cfg)
        for op in v.ops:
            s, _ = M.step(s, op)
        cfg, step = replace(cfg, drain=True), len(v.ops) + drained(s)[1]
    return Trace(cfg, list(v.ops), Expect("violation", v.id, step, "spec"),
                 {"source": "explore", "scope": res.scope.name,
                  "symmetry": res.symmetric, "message": v.message,
                  "states": res.states, "shortest": True})
