"""Shrink a failing operation list to a small one that fails the same way.

Hypothesis's own shrinker works on the draws of a test case and can run for minutes on
a long stateful example; a fuzzer with a time budget needs a bounded shrinker on the
trace itself. Passes, repeated until none removes anything (or the budget ends):
1. whole objects: every op of one request (rid), then of one session (sid, and the
   requests submitted to it), since a request's ops are interleaved with others';
2. delta debugging (ddmin) over the list, down to single ops (1-minimal).
Each candidate is replayed through the same checker and kept only if it fails with the
same failure id on the same side. A candidate that makes a later op disabled fails with
X1 and is therefore rejected.
"""
from __future__ import annotations

import time
from typing import Callable


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


def shrink(ops: list, fails_same: Callable[[list], bool], *, budget_s: float = 60.0) -> list:
    deadline = time.monotonic() + budget_s
    cur = list(ops)
    changed = True
    while changed and time.monotonic() < deadline:
        changed = False
        for group in _objects(cur):
            cand = [op for i, op in enumerate(cur) if i not in group]
            if cand and len(cand) < len(cur) and fails_same(cand):
                cur, changed = cand, True
                break
            if time.monotonic() >= deadline:
                return cur
        if changed:
            continue
        before = len(cur)
        cur = _ddmin(cur, fails_same, deadline)
        changed = len(cur) < before
    return cur


def _ddmin(cur: list, fails_same, deadline: float) -> list:
    n = 2
    while len(cur) >= 2 and time.monotonic() < deadline:
        chunk = max(1, len(cur) // n)
        reduced = False
        for start in range(0, len(cur), chunk):
            cand = cur[:start] + cur[start + chunk:]
            if cand and fails_same(cand):
                cur, n, reduced = cand, max(n - 1, 2), True
                break
            if time.monotonic() >= deadline:
                return cur
        if not reduced:
            if chunk == 1:
                break
            n = min(len(cur), n * 2)
    return cur
