"""The search's own records (the Result, the visited set of fingerprints, each state's
parent link and operation) and the merge of each expanded state's notes into them (`Merge`)."""
from __future__ import annotations

from array import array
from collections import Counter
from typing import Optional

from kvcheck.explore.result import Found, Result


class Merge:
    """The search's own records (the Result, the visited set, the parent links) and the
    merge of each expanded state's notes into them, in the order one process expands
    them (the order of the parents' indices): the same records whoever expanded what."""

    def __init__(self, res: Result, all_violations: bool, max_states: Optional[int],
                 root_fingerprint) -> None:
        self.res = res
        self.all_violations, self.max_states = all_violations, max_states
        self.parents = array("i", [-1])         # parent index of each state
        self.via = array("i", [-1])             # index into op_table of the op that reached it
        self.op_table: list = res.op_table
        self.op_index: dict = {}
        self.seen = {root_fingerprint}
        res.visited = (self.seen, self.parents, self.via)
        self.found_ids: set = set()
        self.stop = False                   # a violation or a budget: no more merging
        self.stop_at_level_end = False      # an exception in a step: finish the level
        self.level_ocs: Counter = Counter()
        self.level_new: list = []           # fingerprints this level added to the visited set
        self.nxt_n = 0
        self.d1 = 1

    def trace_of(self, idx: int, op=None) -> list:
        out = [] if op is None else [op]
        while idx > 0:
            out.append(self.op_table[self.via[idx]])
            idx = self.parents[idx]
        out.reverse()
        return out

    def begin_level(self, d1: int) -> None:
        self.d1, self.nxt_n = d1, 0
        self.level_ocs = Counter()
        self.level_new = []

    def parent(self, idx: int, ocs: list, notes: list, hits: list) -> list:
        """Merge the expansion of state idx: [(candidate number, new state index)] of the
        candidates that became new states, in order; sets `stop` where the search ends."""
        res, seen, d1 = self.res, self.seen, self.d1
        made: list = []
        k = -1
        end = len(ocs)
        for pos, op, key, cand, vs_state, vs_step, exc in notes:
            if exc is not None:
                # an exception inside the step: keep going to the end of this level, so
                # that an invariant violation at the same depth (which replays cleanly
                # through run_ops) is preferred
                if exc[0] not in self.found_ids:
                    self.found_ids.add(exc[0])
                    res.violations.append(Found(*exc, d1, self.trace_of(idx, op)))
                    if not self.all_violations:
                        self.stop_at_level_end = True
                continue
            if cand:
                k += 1
            known = not cand or key in seen
            vs = vs_step if known else vs_state + vs_step
            if vs:
                v = vs[0]
                if v[0] not in self.found_ids:
                    self.found_ids.add(v[0])
                    res.violations.insert(0, Found(*v, d1, self.trace_of(idx, op)))
                    if not self.all_violations:
                        del res.violations[1:]
                        res.stopped = "first violation found"
                        self.stop, end = True, pos + 1
                        break
                if not known:
                    seen.add(key)           # violating: recorded, never expanded
                    self.level_new.append(key)
                continue
            if known:
                continue
            n = len(self.parents)
            seen.add(key)
            self.level_new.append(key)
            self.parents.append(idx)
            j = self.op_index.get(op)
            if j is None:
                j = self.op_index[op] = len(self.op_table)
                self.op_table.append(op)
            self.via.append(j)
            made.append((k, n))
            self.nxt_n += 1
            res.states += 1
            if self.max_states is not None and res.states >= self.max_states:
                res.stopped = f"state budget {self.max_states} reached"
                self.stop, end = True, pos + 1
                break
        res.transitions += end
        self.level_ocs.update(ocs if end == len(ocs) else ocs[:end])
        for pos, ids in hits:
            if pos < end:
                for x in ids:
                    res.reached.setdefault(x, d1)
        return made

    def end_level(self) -> None:
        """The level's operation and outcome counts into the Result, with the depth each
        was first taken at."""
        res, d1 = self.res, self.d1
        for (name, out), n in self.level_ocs.items():
            res.op_counts[name] += n
            if out is not None:
                res.op_first.setdefault(name, d1)
                res.outcome_counts[(name, out)] += n
                res.outcome_first.setdefault((name, out), d1)
        self.level_ocs = Counter()
