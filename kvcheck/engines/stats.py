"""What a run counts: per-operation `Stats`, the model `PATHS` a step takes, and the
report lines on the sequences that stopped comparing."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

from kvcheck.checker import RELEASE_SAME, differ_kind
from kvcheck.spec import ops as O
from kvcheck.spec.pages import free_kv_aligned_pages, restore_prefix_len


@dataclass
class Stats:
    """Per-operation counts of applied steps (enabled and run on both sides), and of the
    PATHS they took."""
    coverage: Counter = field(default_factory=Counter)
    outcomes: Counter = field(default_factory=Counter)
    paths: Counter = field(default_factory=Counter)
    steps: int = 0
    sequences: int = 0
    beyond: Counter = field(default_factory=Counter)
    """Sequences that went beyond the accepted findings' model (`checker.Beyond`), by
    reason; `not_compared`: their steps from there on."""
    not_compared: int = 0
    beyond_checked: int = 0
    """Of those, the stops where a system under test ran beside the spec (run alone on the
    stop's step, `checker.Beyond.release`); `beyond_differs`: by kind (`checker.Beyond.kind`),
    the stops where it did not show what the spec stopped at; `beyond_past`: the stops
    where it did not, but was past what the spec follows of it there
    (`checker.Beyond.release_past`)."""
    beyond_differs: Counter = field(default_factory=Counter)
    beyond_past: int = 0

    def record(self, op: O.Op, outcome: str, paths: Sequence[str] = ()) -> None:
        self.coverage[op.name] += 1
        self.outcomes[f"{op.name}:{outcome}"] += 1
        self.paths.update(paths)
        self.steps += 1

    def record_beyond(self, reason: str, not_compared: int, release: Optional[str] = None,
                      past: bool = False) -> None:
        self.beyond[reason] += 1
        self.not_compared += not_compared
        if release is not None:
            self.beyond_checked += 1
            if past:
                self.beyond_past += 1
            elif release != RELEASE_SAME:
                self.beyond_differs[differ_kind(reason, release)] += 1

    def merge(self, other: "Stats") -> None:
        self.coverage.update(other.coverage)
        self.outcomes.update(other.outcomes)
        self.paths.update(other.paths)
        self.steps += other.steps
        self.sequences += other.sequences
        self.beyond.update(other.beyond)
        self.not_compared += other.not_compared
        self.beyond_checked += other.beyond_checked
        self.beyond_differs.update(other.beyond_differs)
        self.beyond_past += other.beyond_past

    def clear(self) -> None:
        self.coverage.clear(), self.outcomes.clear(), self.paths.clear(), self.beyond.clear()
        self.beyond_differs.clear()
        self.steps = self.sequences = self.not_compared = self.beyond_checked = 0
        self.beyond_past = 0


def _tally(counts: dict) -> str:
    return ", ".join(f"{r} x{k}" for r, k in sorted(counts.items(), key=lambda x: (-x[1], x[0])))


def beyond_line(beyond: dict, not_compared: int, checked: int = 0,
                differs: Optional[dict] = None, past: int = 0) -> str:
    """`check` and `fuzz`'s line on the sequences that stopped comparing ("" if none); with
    a system under test, how many of its stops it showed as the spec did (and at how many
    it was past what the spec follows of it, `Stats.beyond_past`)."""
    n = sum(beyond.values())
    if not n:
        return ""
    line = (f"beyond the accepted findings' model: {n} sequences ({_tally(beyond)}), "
            f"{not_compared} steps not compared")
    if checked:
        d = sum((differs or {}).values())
        line += (f"; the system under test, alone at the stop, showed the same in "
                 f"{checked - d - past}"
                 + (f", was past what the spec follows of it in {past}" if past else "")
                 + (f", not in {d} ({_tally(differs)})" if d else ""))
    return line


def differed_lines(traces: dict, indent: str = "    ") -> list:
    """One line per kind (`checker.Beyond.kind`) naming the trace of the first stop where
    the system under test, alone at the stop, did not show what the spec stopped at
    (kind -> path)."""
    return [f"{indent}where it differed ({reason}), the first: kvcheck replay {path}"
            for reason, path in sorted(traces.items())]


def _matched(state, op):
    """The queued request an operation surely matches: a `schedule`'s, or the first named by
    a prefill round when it is waiting (a round matches its first waiting request before
    any budget can stop it); None otherwise."""
    if isinstance(op, O.Schedule):
        return state.reqs.get(op.rid)
    if isinstance(op, O.ScheduleRound):
        r = state.reqs.get(op.rids[0])
        return r if r is not None and r.phase == "queued" else None
    return None


def _retry(state, op) -> bool:
    """The retry of a retracted request: its next match."""
    r = _matched(state, op)
    return r is not None and r.is_retracted


def _retry_from_slot(state, op) -> bool:
    return _retry(state, op) and _matched(state, op).session in state.slots


def _restored_slot(state, op):
    """The session slot a match restores its turn from (`find_active_slot`), or None."""
    r = _matched(state, op)
    if r is None or r.session is None or r.to_finish:
        return None
    slot = state.slots.get(r.session)
    return slot if slot is not None and slot.row is not None else None


def _restore_clamps(state, op) -> bool:
    """`try_match_prefix`'s `min(kv_committed_len, len(key))` takes the key's length."""
    slot = _restored_slot(state, op)
    return slot is not None and \
        restore_prefix_len(slot.committed, _matched(state, op).seqlen) < slot.committed


def _free_tail_frees(state, op) -> bool:
    """`_free_tail` frees pages past the restored prefix."""
    slot = _restored_slot(state, op)
    if slot is None:
        return False
    prefix = restore_prefix_len(slot.committed, _matched(state, op).seqlen)
    return len(free_kv_aligned_pages(prefix, slot.allocated, state.cfg.page_size)) > 0


PATHS: dict[str, Callable] = {
    "retract-retry": _retry,
    "retract-retry from the session slot": _retry_from_slot,
    "slot restore clamped to the key": _restore_clamps,
    "_free_tail frees": _free_tail_frees,
}
"""Paths through the model that one operation name does not show, each a predicate on
(spec state before, operation); `check` fails when its differential run misses one."""


def paths_of(state, op) -> list:
    """The PATHS that applying `op` in `state` takes."""
    return [name for name, took in PATHS.items() if took(state, op)]
