"""Every transition of an explored scope, the spec against a backend
(`kvcheck explore --backend impl`).

The explorer (kvcheck/explore/) visits each distinct spec state of a scope once and
keeps the state's parent and the operation that first reached it: a spanning tree of the
scope, each state at the end of a shortest path. This engine walks that tree depth-first
with a `kvcheck.checker.Lockstep` (the spec and the backend side by side), so that every
distinct state is reached on the backend too, and at every state it applies every
operation the explorer tried there, including those into states already visited (a
transition the backend gets wrong may well lead the spec somewhere known), each checked
as every run checks a step: the spec's invariants, the backend's concrete checks, the
abstract states compared. A state's operations run on copies of the pair
(`Lockstep.fork`: impl/ deep-copied; a real sglang release, served in its own venv,
copies its bookkeeping there under a new handle: adapters/sglang/run_trace.py "fork"),
the last tree edge on the pair itself.

So within a scope the backend is checked exhaustively, where fuzzing samples: every
operation of the scope's domains at every reachable state up to the depth bound, on
impl/ (`make check`, preset check-impl) and on each real release (`make check-sglang`,
presets check-sglang-0.5.15 and check-sglang-0.5.23).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Optional

@dataclass
class TransitionReport:
    backend: str
    states: int = 0                    # distinct states reached on the backend
    transitions: int = 0               # operations applied and compared
    seconds: float = 0.0
    failure: Optional[object] = None   # kvcheck.checker.Failure of the first failing step
    ops: list = field(default_factory=list)   # the operations up to and with that step
    skipped: dict = field(default_factory=dict)   # finding id -> its triggers not applied
    unreached: int = 0                 # states only such a trigger leads to (not visited)
    beyond: int = 0                    # under accept: transitions past the model (not gone on)
    beyond_states: int = 0             # states only they lead to (not visited)
    beyond_checked: int = 0            # of those, stops where the backend ran alone on the step
    beyond_same: int = 0               # ... and showed what the spec stopped at
    beyond_past: int = 0               # ... did not, past what the spec follows of it (R1)
    differs: dict = field(default_factory=dict)
    """Kind (`checker.Beyond.kind`: the reason, "-raised" where the backend raised) ->
    (operations, `checker.Beyond`) of the first stop of that kind where the backend alone
    did not show what the spec stopped at: where to look next."""

    @property
    def rate(self) -> float:
        return self.transitions / self.seconds if self.seconds else 0.0

    def verdict(self, timing: bool = False) -> str:
        head = (f"spec vs {self.backend} on every transition: {self.transitions:,} transitions "
                f"from {self.states:,} states")
        if timing:
            head += f", {self.seconds:.1f} s ({self.rate:,.0f}/s)"
        if self.skipped:
            head += (f" (not applied: the triggers of recorded findings "
                     f"{', '.join(f'{k} x{v:,}' for k, v in sorted(self.skipped.items()))}, "
                     f"and the {self.unreached:,} states only they lead to)")
        if self.beyond:
            head += (f" ({self.beyond:,} went past the accepted findings' model and stopped "
                     f"there, with the {self.beyond_states:,} states only they lead to"
                     + (f"; the system under test alone at those steps showed the same in "
                        f"{self.beyond_same:,} of {self.beyond_checked:,}"
                        + (f", and was past what the spec follows of it in "
                           f"{self.beyond_past:,}" if self.beyond_past else "")
                        if self.beyond_checked else "") + ")")
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


def subtree_size(children, i: int) -> int:
    """States in the spanning tree under state i, i included."""
    n, todo = 0, [i]
    while todo:
        n += 1
        todo.extend(children[todo.pop()])
    return n


def check_transitions(res, backend: str = "impl", progress: Optional[Callable] = None,
                      every: float = 2.0, visit: Optional[Callable] = None,
                      differ: Optional[Callable] = None) -> TransitionReport:
    """Every transition of an explored scope (`explore(...)`'s Result, its visited set
    kept) on the spec and `backend`, until the first failing step. On a release with
    recorded upstream findings (adapters/sglang/findings.py) their triggers are not
    applied, as in a differential run without `--accept`: each finding stays checked by
    its trace, and would otherwise be found again at once. Under the scope's
    `Config.accept` they are applied, the spec taking upstream's behaviour, and a
    transition the lockstep finds past the accepted findings' model (`Lockstep.beyond`)
    is not gone on from. `visit(path, lockstep)` is called at every state the walk
    reaches (tests); `differ(kind, ops, beyond)` at the first stop of each kind
    (`checker.Beyond.kind`) where the backend alone differed (`rep.differs`), as it is
    found, so that what it writes outlasts an interrupted walk."""
    from kvcheck.backends import known_findings, release_refusal, resolve
    from kvcheck.checker import RELEASE_SAME, Lockstep
    from kvcheck.explore import candidate_ops
    from kvcheck.spec.config import ConfigError
    factory, bname = resolve(backend)
    if factory is None:
        raise ValueError("a transition check needs a system under test (impl, sglang:VERSION), "
                         "not the spec alone")
    sc = res.scope
    why = release_refusal(sc.cfg, backend)      # before a release is started for nothing
    if why:
        raise ConfigError(why)
    skip = known_findings(backend, sc.cfg.accept)
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
            finding = skip(lock.state, op) if skip is not None else None
            if finding is not None:
                rep.skipped[finding] = rep.skipped.get(finding, 0) + 1
                if op in tree:
                    rep.unreached += subtree_size(children, tree[op])
                continue
            nxt = lock if k == last and op in tree else lock.fork()
            rep.transitions += 1
            _, fail = nxt.apply(op)
            if fail is not None:
                rep.ops = path + [op]
                rep.failure = confirmed(sc.cfg, rep.ops, fail, factory, bname)
                rep.seconds = time.perf_counter() - t0
                return rep
            if nxt.beyond is not None:
                rep.beyond += 1
                rep.beyond_checked += nxt.beyond.release is not None
                rep.beyond_same += nxt.beyond.release == RELEASE_SAME
                rep.beyond_past += nxt.beyond.release_past is not None
                kind = nxt.beyond.kind
                if nxt.beyond.release_differs and kind not in rep.differs:
                    rep.differs[kind] = (path + [op], nxt.beyond)
                    if differ is not None:
                        differ(kind, path + [op], nxt.beyond)
                if op in tree:
                    rep.beyond_states += subtree_size(children, tree[op])
            elif op in tree:
                stack.append((tree[op], nxt, path + [op]))
        if progress is not None and time.perf_counter() >= next_progress:
            next_progress = time.perf_counter() + every
            progress(rep, time.perf_counter() - t0)
    rep.seconds = time.perf_counter() - t0
    return rep
