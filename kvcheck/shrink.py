"""Shrink a failing operation list to a small one that fails the same way.

Hypothesis's own shrinker works on the draws of a test case and can run for minutes on
a long stateful example; a fuzzer needs a bounded shrinker on the trace itself. Passes,
repeated until none removes anything (or the budget ends):
1. whole objects: every op of one request (rid), then of one session (sid, and the
   requests submitted to it), since a request's ops are interleaved with others';
2. delta debugging (ddmin) over the list, down to single ops (1-minimal).
Each candidate is replayed through the same checker and kept only if it fails with the
same failure id on the same side. A candidate that makes a later op disabled fails with
X1 and is therefore rejected.

The budget is a number of replays, not seconds, so the same failure shrinks to the same
trace on any machine. `on_replay(replays, current_length)` is called after every replay
(a progress line; it may raise KeyboardInterrupt to stop: the caller keeps what it has).
"""
from __future__ import annotations

from typing import Callable, Optional

DEFAULT_REPLAYS = 400


class _Budget:
    def __init__(self, fails_same, max_replays: int, on_replay: Optional[Callable]) -> None:
        self.fails_same, self.left, self.on_replay = fails_same, max_replays, on_replay
        self.used = 0

    def __call__(self, cand: list, cur_len: int) -> bool:
        self.left -= 1
        self.used += 1
        ok = self.fails_same(cand)
        if self.on_replay is not None:
            self.on_replay(self.used, len(cand) if ok else cur_len)
        return ok

    @property
    def spent(self) -> bool:
        return self.left <= 0


def _objects(ops: list) -> list[set]:
    """Groups of op indices that belong to one request or one session."""
    by_rid: dict = {}
    by_sid: dict = {}
    for i, op in enumerate(ops):
        rid, sid = getattr(op, "rid", None), getattr(op, "sid", None)
        if rid is not None:
            by_rid.setdefault(rid, set()).add(i)
        if sid is not None:
            by_sid.setdefault(sid, set()).add(i)
    for sid, idx in by_sid.items():          # a session takes its turns' ops with it
        rids = {getattr(ops[i], "rid", None) for i in idx} - {None}
        for rid in rids:
            idx |= by_rid.get(rid, set())
    return sorted(by_sid.values(), key=len, reverse=True) + sorted(by_rid.values(), key=len, reverse=True)


def shrink(ops: list, fails_same: Callable[[list], bool], *, max_replays: int = DEFAULT_REPLAYS,
           on_replay: Optional[Callable[[int, int], None]] = None) -> list:
    """The smallest list found within `max_replays` replays of `fails_same`."""
    budget = _Budget(fails_same, max_replays, on_replay)
    cur = list(ops)
    changed = True
    while changed and not budget.spent:
        changed = False
        for group in _objects(cur):
            cand = [op for i, op in enumerate(cur) if i not in group]
            if cand and len(cand) < len(cur) and budget(cand, len(cur)):
                cur, changed = cand, True
                break
            if budget.spent:
                return cur
        if changed:
            continue
        before = len(cur)
        cur = _ddmin(cur, budget)
        changed = len(cur) < before
    return cur


def _ddmin(cur: list, budget: _Budget) -> list:
    n = 2
    while len(cur) >= 2 and not budget.spent:
        chunk = max(1, len(cur) // n)
        reduced = False
        for start in range(0, len(cur), chunk):
            cand = cur[:start] + cur[start + chunk:]
            if cand and budget(cand, len(cur)):
                cur, n, reduced = cand, max(n - 1, 2), True
                break
            if budget.spent:
                return cur
        if not reduced:
            if chunk == 1:
                break
            n = min(len(cur), n * 2)
    return cur
