"""The breadth-first search on several workers (`kvcheck explore --workers N`, `--ray
[ADDRESS]`), with the Result one process gives, state for state.

Each level is cut into contiguous ranges of state indices, one per worker. A worker
expands its range with the search's own `Expander` (steps, fingerprints, invariants) and
sends back, per state, its notes: the transitions' (op, outcome) pairs, and only for the
successors it did not know, the fingerprint, the op and any violation. The coordinator
(`Merge`, the same code as one process runs) merges the ranges in index order, so the
visited set, the parent links, the first trace of each violation and every count are the
ones a single process writes; then it sends every worker the level's new fingerprints,
parent links and operations (`LevelWorker.commit`).

States never travel. A worker keeps the successors it found that became new states (the
children of its range, a contiguous range of the next level) and rebuilds the others of
its next range by re-executing their parent links from the initial state
(`frontier._level_states`), as a level too large to keep is rebuilt in one process. Each
worker holds a copy of the visited fingerprints of the levels before (so that it checks
only the successors that may be new): about 70 bytes a state per worker beside the
coordinator's set.

Workers are forked (`ForkPool`: they inherit the scope and the spec as the parent has
them, compiled or interpreted) or Ray actors (`RayPool`). Worker processes ignore SIGINT:
on Ctrl-C the coordinator stops them and the KeyboardInterrupt goes on up.
"""
from __future__ import annotations

import hashlib
import signal
import time
import traceback
from array import array
from typing import Optional

from kvcheck.spec import model as M
from kvcheck.explore import symmetry
from kvcheck.explore.goals import SITUATIONS, situation_applies
from kvcheck.explore.scope import Scope
from kvcheck.explore.expand import Expander
from kvcheck.explore.frontier import _level_states
from kvcheck.explore.merge import Merge
from kvcheck.explore.search import _whole_key
from kvcheck.explore.symmetry import state_key


def stable_fingerprint(key: tuple) -> int:
    """A 64-bit fingerprint that every process computes alike (`hash` is salted per
    process for strings, and hashes None by address on Python 3.11): for workers that
    are not forks of the coordinator (Ray). Used with `symmetry.SIGNATURE_ORDER = repr`
    so that the canonical key itself is the same in every process."""
    digest = hashlib.blake2b(repr(key).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


class LevelWorker:
    """One worker of the parallel search: a copy of the parent links and of the visited
    fingerprints of the levels merged so far, the states it keeps of the next level, and
    its `Expander`."""

    def __init__(self, sc: Scope, symmetric: bool, check: bool, all_violations: bool,
                 fingerprints: bool, frontier_states: Optional[int], stable: bool) -> None:
        if stable:
            symmetry.SIGNATURE_ORDER = repr
        fingerprint = (stable_fingerprint if stable else hash) if fingerprints else _whole_key
        self.s0 = M.initial_state(sc.cfg)
        self.known = {fingerprint(state_key(self.s0, symmetric))}
        self.exp = Expander(sc, symmetric, check, self.known, not all_violations, fingerprint)
        self.parents = array("i", [-1])
        self.via = array("i", [-1])
        self.op_table: list = []
        self.starts = [0, 1]
        self.limit = frontier_states
        self.held: tuple = (0, [self.s0])   # (index of the first, the states kept)
        self.succ: Optional[list] = []

    def expand(self, depth: int, lo: int, hi: int, pending: list,
               deadline: Optional[float]) -> tuple:
        """The states [lo, hi) of level `depth` expanded: ([(index, ocs, notes, hits)],
        why it stopped early: "violation" (the Expander halted), "time" (past
        `deadline`, a time.time()), or None; the CPU seconds it took)."""
        c0 = time.process_time()
        records, halted = self._expand(depth, lo, hi, pending, deadline)
        return records, halted, time.process_time() - c0

    def _expand(self, depth: int, lo: int, hi: int, pending: list,
                deadline: Optional[float]) -> tuple:
        exp = self.exp
        exp.new_chunk()
        exp.pending = [x for x in SITUATIONS if x.id in pending]
        records: list = []
        self.succ = succ = []
        for idx, s, a in self._states(depth, lo, hi):
            ocs, notes, hits, found, halted = exp.expand(s, a)
            records.append((idx, ocs, notes, hits))
            if succ is not None:
                succ.extend(found)
                if self.limit is not None and len(succ) > self.limit:
                    self.succ = succ = None     # too many to keep: rebuilt when needed
            if halted:
                return records, "violation"
            if deadline is not None and time.time() > deadline:
                return records, "time"
        return records, None

    def _states(self, depth: int, lo: int, hi: int):
        """Level `depth`'s states [lo, hi): the ones kept, the others rebuilt."""
        base, held = self.held
        top = base + len(held)
        rebuild = lambda a, b: _level_states(self.s0, depth, self.starts, self.parents,
                                             self.via, self.op_table, a, b)
        if not held or top <= lo or base >= hi:
            yield from rebuild(lo, hi)
            return
        if lo < base:
            yield from rebuild(lo, base)
        for j in range(max(lo, base), min(hi, top)):
            yield j, held[j - base], None
        if top < hi:
            yield from rebuild(top, hi)

    def commit(self, level_end: int, parents: array, via: array, ops: list, fingerprints,
               base: int, keep: Optional[list]) -> None:
        """The merged level: its parent links and operations, the fingerprints it added to
        the visited set, and which of this worker's successors became its states (their
        indices from `base` on; None: none kept)."""
        self.known.update(fingerprints)
        self.parents.extend(parents)
        self.via.extend(via)
        self.op_table.extend(ops)
        self.starts.append(level_end)
        succ, self.succ = self.succ, []
        self.held = (base, [succ[k] for k in keep]) if keep is not None and succ is not None \
            else (0, [])


def _ranges(lo: int, hi: int, parts: int) -> list:
    """[lo, hi) cut into `parts` contiguous ranges of sizes that differ by one at most."""
    n = hi - lo
    return [(lo + n * i // parts, lo + n * (i + 1) // parts) for i in range(parts)]


class ParallelLevels:
    """The levels of one search expanded by a pool's workers (the `_search` loop's
    `expand` and `next`) and merged here in index order."""

    def __init__(self, pool, sc: Scope, fingerprints: bool) -> None:
        self.pool = pool
        self.sc = sc
        self.fingerprints = fingerprints
        self.sent_ops = 0
        self.made: dict = {}            # worker -> (first new index, its candidates kept)

    def expand(self, m: Merge, depth: int, starts: list, clock) -> None:
        pool, res = self.pool, m.res
        parts = _ranges(starts[depth], starts[depth + 1], pool.workers)
        pending = [x.id for x in SITUATIONS if situation_applies(x, self.sc) is None
                   and x.id not in res.reached]
        deadline = None if clock.deadline is None else \
            time.time() + clock.deadline - time.perf_counter()
        jobs = [w for w, (lo, hi) in enumerate(parts) if lo < hi]
        for w in jobs:
            pool.call(w, "expand", depth, *parts[w], pending, deadline)
        done: dict = {}
        self.made = {}
        m.res.workers.level()
        for w in jobs:                  # merged in index order, as they come in
            while w not in done:
                done.update(pool.results(clock.every))
                clock.tick(m, depth)
            self._merge(m, w, *done.pop(w), clock)
            if m.stop:                  # the search ends: the pool is closed
                return
        clock.out_of_time(m)

    def _merge(self, m: Merge, w: int, records: list, halted: Optional[str], cpu: float,
               clock) -> None:
        m.res.workers.note(w, cpu)
        base, kept, offset = len(m.parents), [], 0
        for idx, ocs, notes, hits in records:
            kept.extend(offset + k for k, _ in m.parent(idx, ocs, notes, hits))
            if m.stop:
                break
            offset += sum(1 for note in notes if note[3])
        self.made[w] = (base, kept)
        if halted == "time" and not m.stop:
            clock.time_up(m)
        elif halted == "violation" and not m.stop:
            raise RuntimeError(f"worker {w} stopped at a violation that the merge does not "
                               "see: the workers disagree with the coordinator")

    def next(self, m: Merge, depth: int, starts: list, kept: bool) -> None:
        lo, hi = starts[depth], starts[depth + 1]
        ops = m.op_table[self.sent_ops:]
        self.sent_ops = len(m.op_table)
        parents, via = m.parents[lo:hi], m.via[lo:hi]
        fps = array("q", m.level_new) if self.fingerprints else list(m.level_new)
        for w in range(self.pool.workers):
            base, keep = self.made.get(w, (0, None))
            self.pool.tell(w, "commit", hi, parents, via, ops, fps, base,
                           keep if kept else None)


def _die_with_parent() -> None:
    """On Linux, SIGTERM when the coordinator's process dies (a `kvcheck check` worker
    stopped by its driver cannot close its pool), so that no worker outlives the search;
    elsewhere a worker ends when its pipe closes, at the end of the range it expands."""
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)           # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _serve(conn, make_worker) -> None:
    """A forked worker's loop: calls from the coordinator, each answered in order (commit
    is not answered); any exception goes back as ("error", traceback)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent()
    worker = make_worker()
    while True:
        try:
            method, args = conn.recv()
        except EOFError:
            return
        if method == "stop":
            return
        try:
            out = getattr(worker, method)(*args)
        except Exception:
            conn.send(("error", traceback.format_exc()))
            continue
        if method != "commit":
            conn.send(("ok", out))


class ForkPool:
    """N forked worker processes, one `LevelWorker` each, for one search."""
    fingerprint = staticmethod(hash)

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self.conns: list = []
        self.procs: list = []

    def levels(self, sc, symmetric, check, all_violations, fingerprints, frontier_states):
        import multiprocessing as mp
        ctx = mp.get_context("fork")
        make = lambda: LevelWorker(sc, symmetric, check, all_violations, fingerprints,
                                   frontier_states, False)
        for _ in range(self.workers):
            mine, theirs = ctx.Pipe()
            p = ctx.Process(target=_serve, args=(theirs, make), daemon=True)
            p.start()
            theirs.close()
            self.conns.append(mine)
            self.procs.append(p)
        return ParallelLevels(self, sc, fingerprints)

    def call(self, w: int, method: str, *args) -> None:
        self.conns[w].send((method, args))

    tell = call

    def results(self, timeout: float) -> dict:
        from multiprocessing.connection import wait
        out = {}
        for conn in wait(self.conns, timeout):
            w = self.conns.index(conn)
            try:
                status, value = conn.recv()
            except EOFError:
                raise RuntimeError(f"explore worker {w} (pid {self.procs[w].pid}) died") from None
            if status == "error":
                raise RuntimeError(f"explore worker {w} failed:\n{value}")
            out[w] = value
        return out

    def close(self) -> None:
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            p.join(5)
        for c in self.conns:
            c.close()
        self.procs, self.conns = [], []

