"""Every transition of an explored scope, the spec against a backend
(`kvcheck explore --backend impl`).

The explorer (kvcheck/explore.py) visits each distinct spec state of a scope once and
keeps the state's parent and the operation that first reached it: a spanning tree of the
scope, each state at the end of a shortest path. This engine walks that tree depth-first
with a `kvcheck.checker.Lockstep` (the spec and the backend side by side), so that every
distinct state is reached on the backend too, and at every state it applies every
operation the explorer tried there, including those into states already visited (a
transition the backend gets wrong may well lead the spec somewhere known), each checked
as every run checks a step: the spec's invariants, the backend's concrete checks, the
abstract states compared. A state's operations run on copies of the pair
(`Lockstep.fork`: the backend deep-copied), the last tree edge on the pair itself.

So within a scope the backend is checked exhaustively, where fuzzing samples: every
operation of the scope's domains at every reachable state up to the depth bound. A real
release behind a server (adapters/sglang) cannot be copied, so this runs on impl/ only.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Optional

COPYABLE = ("impl",)
"""The backends a transition check can drive (their state copies in process)."""


@dataclass
class TransitionReport:
    backend: str
    states: int = 0                    # distinct states reached on the backend
    transitions: int = 0               # operations applied and compared
    seconds: float = 0.0
    failure: Optional[object] = None   # kvcheck.checker.Failure of the first failing step
    ops: list = field(default_factory=list)   # the operations up to and with that step

    @property
    def rate(self) -> float:
        return self.transitions / self.seconds if self.seconds else 0.0

    def verdict(self, timing: bool = False) -> str:
        head = (f"spec vs {self.backend} on every transition: {self.transitions:,} transitions "
                f"from {self.states:,} states")
        if timing:
            head += f", {self.seconds:.1f} s ({self.rate:,.0f}/s)"
        if self.failure is None:
            return head + ", every step agreed"
        return head + "; FAILED:\n" + self.failure.render()

    def line(self) -> str:
        return self.verdict(timing=True)


class ForkError(RuntimeError):
    """A failure found on a copied backend that a fresh replay of its operations does not
    show: the backend keeps state a deep copy does not carry (a closure over the
    original object, a module-level counter). A defect of the copy, never reported as a
    finding."""


def confirmed(cfg, ops, fail, factory, bname):
    """The failure as a fresh replay of `ops` (new spec and backend, no copy) gives it; a
    ForkError when the replay does not fail the same way at the same step."""
    from kvcheck.checker import run_ops
    again = run_ops(cfg, ops, factory(cfg), backend_name=bname).failure
    if again is None or (again.id, again.step, again.side) != (fail.id, fail.step, fail.side):
        raise ForkError(f"{fail.id} at step {fail.step} on a copied {bname} is "
                        f"{'not reproduced' if again is None else again.id} by a fresh replay of "
                        f"its {len(ops)} operations: the backend keeps state that "
                        f"copy.deepcopy does not carry")
    return again


def tree_children(parents) -> list:
    """children[i]: the states first reached from state i, in the order they were found."""
    children: list = [[] for _ in range(len(parents))]
    for i in range(1, len(parents)):
        children[parents[i]].append(i)
    return children


def check_transitions(res, backend: str = "impl", progress: Optional[Callable] = None,
                      every: float = 2.0, visit: Optional[Callable] = None) -> TransitionReport:
    """Every transition of an explored scope (`explore(...)`'s Result, its visited set
    kept) on the spec and `backend`, until the first failing step. `visit(path, lockstep)`
    is called at every state the walk reaches (tests)."""
    from kvcheck.backends import resolve
    from kvcheck.checker import Lockstep
    from kvcheck.explore import candidate_ops
    if backend not in COPYABLE:
        raise ValueError(f"a transition check needs a backend whose state copies in process "
                         f"({', '.join(COPYABLE)}), not {backend!r}")
    factory, bname = resolve(backend)
    sc = res.scope
    _, parents, via = res.visited
    children = tree_children(parents)
    rep = TransitionReport(bname)
    t0 = time.perf_counter()
    next_progress = t0 + every
    stack = [(0, Lockstep(sc.cfg, factory(sc.cfg), bname), [])]
    while stack:
        i, lock, path = stack.pop()
        rep.states += 1
        if visit is not None:
            visit(path, lock)
        if len(path) >= res.max_depth:      # the explorer's last level: visited, not expanded
            continue
        tree = {res.op_table[via[c]]: c for c in children[i]}
        ops = candidate_ops(lock.state, sc, res.symmetric)
        ops = [op for op in ops if op not in tree] + [op for op in ops if op in tree]
        last = len(ops) - 1
        for k, op in enumerate(ops):
            nxt = lock if k == last and op in tree else lock.fork()
            rep.transitions += 1
            _, fail = nxt.apply(op)
            if fail is not None:
                rep.ops = path + [op]
                rep.failure = confirmed(sc.cfg, rep.ops, fail, factory, bname)
                rep.seconds = time.perf_counter() - t0
                return rep
            if op in tree:
                stack.append((tree[op], nxt, path + [op]))
        if progress is not None and time.perf_counter() >= next_progress:
            next_progress = time.perf_counter() + every
            progress(rep, time.perf_counter() - t0)
    rep.seconds = time.perf_counter() - t0
    return rep
