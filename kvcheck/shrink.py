"""Shrink a failing operation list to a 1-minimal one that fails the same way.

Hypothesis's own shrinker works on the draws of a test case and can run for minutes on
a long stateful example; a fuzzer with a time budget needs a bounded shrinker on the
trace itself. Delta debugging (ddmin) over the operation list, then single-op removal
until nothing can go: each candidate is replayed through the same checker, and it is
kept only if it fails with the same failure id on the same side. A candidate that
makes a later op disabled fails with X1 and is therefore rejected.
"""
from __future__ import annotations

import time
from typing import Callable


def shrink(ops: list, fails_same: Callable[[list], bool], *, budget_s: float = 60.0) -> list:
    deadline = time.monotonic() + budget_s
    cur = list(ops)
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
