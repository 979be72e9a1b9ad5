"""The guided engine (`--engine guided`): coverage-guided generation on top of the walk
engine, as AFL and HypoFuzz do.

A corpus keeps every sequence that reached a branch no earlier sequence reached
(coverage.py's branch arcs of impl/ when the system under test is impl, of spec/
otherwise: a release runs in another process, and the spec's paths follow its own).
Once the corpus holds anything, three sequences in four are derived from it, the
fourth is a fresh walk (kvcheck.engines.walk); a derived one is one of:

  extend   a corpus sequence, then more random steps;
  splice   the head of one corpus sequence, then the tail of another;
  argument a corpus sequence with one operation's argument changed;
  swap     a corpus sequence with two neighbouring operations swapped;

each replayed through the walk (an operation the spec does not enable at its point is
left out) and continued by it. Sequence `index` of campaign `seed` is a pure function of
(seed, index, the sequences before it in this process): one worker replays a campaign
exactly; N workers each keep their own corpus.
"""
from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from kvcheck.engines.gen import Stats
from kvcheck.engines.walk import Sequence, walk
from spec import ops as O

ROOT = Path(__file__).resolve().parents[2]
MUTATE_SHARE = 0.75
MUTATIONS = ("extend", "splice", "argument", "swap")
EXTRA_STEPS = (0, 8, 16, 32)
MAX_CORPUS = 512


class Feedback:
    """New branch arcs since the last call, from the coverage.py collector running in
    this process (`kvcheck coverage`'s, or one started here over `source`)."""

    def __init__(self, source: Path) -> None:
        import coverage
        self.cov = coverage.Coverage.current()
        if self.cov is None:
            self.cov = coverage.Coverage(branch=True, data_file=None, source=[str(source)])
            self.cov.start()
        self.seen: set = set()
        self.new_arcs()                  # what this process reached before: not new

    def new_arcs(self) -> int:
        data = self.cov.get_data()
        arcs = {(f, a) for f in data.measured_files() for a in (data.arcs(f) or ())}
        new = arcs - self.seen
        self.seen |= new
        return len(new)


@dataclass
class Entry:
    cfg: object
    ops: list


def _bump(v: int, lo: int, hi: int, rng: random.Random) -> int:
    return min(hi, max(lo, v + rng.choice((-2, -1, 1, 2))))


def change_argument(op: O.Op, ids: list, rng: random.Random) -> O.Op:
    """One field of `op` changed: a count nudged, a token or the prompt's length
    changed, a flag flipped, or the request/session id of another operation."""
    f = rng.choice([x.name for x in dataclasses.fields(op)])
    v = getattr(op, f)
    if isinstance(v, bool):
        new = not v
    elif isinstance(v, tuple):
        toks = list(v)
        if len(toks) > 1 and rng.random() < 0.5:
            toks.pop(rng.randrange(len(toks)))
        else:
            toks.insert(rng.randrange(len(toks) + 1), rng.randint(1, 9))
        new = tuple(toks)
    elif f in ("rid", "sid") and ids:
        new = rng.choice(ids)
    elif f in ("drafts", "accepted"):
        new = _bump(v, 0 if f == "accepted" else 1, 3, rng)
    else:
        new = _bump(v, 1, 64, rng)
    if isinstance(op, O.SpecDecode):
        d = new if f == "drafts" else op.drafts
        a = new if f == "accepted" else op.accepted
        return dataclasses.replace(op, drafts=d, accepted=min(a, d))
    return dataclasses.replace(op, **{f: new})


def derive(how: str, corpus: list, rng: random.Random) -> tuple:
    """(cfg, script, length) of a sequence derived from the corpus."""
    a = rng.choice(corpus)
    ops = list(a.ops)
    extra = rng.choice(EXTRA_STEPS)
    if how == "extend":
        extra = max(extra, 8)
    elif how == "splice":
        b = rng.choice(corpus)
        ops = ops[:rng.randint(0, len(ops))] + list(b.ops[rng.randint(0, len(b.ops)):])
    elif how == "argument" and ops:
        i = rng.randrange(len(ops))
        ids = sorted({getattr(o, "rid", None) for o in ops} - {None})
        ops[i] = change_argument(ops[i], ids, rng)
    elif how == "swap" and len(ops) > 1:
        i = rng.randrange(len(ops) - 1)
        ops[i], ops[i + 1] = ops[i + 1], ops[i]
    return a.cfg, ops, len(ops) + extra


class Guided:
    """One campaign's corpus and feedback in this process."""

    def __init__(self, seed: int, backend: str) -> None:
        self.seed = seed
        self.corpus: list = []
        self.feedback = Feedback(ROOT / ("impl" if backend == "impl" else "spec"))
        self.derived = 0

    def run(self, index: int, factory: Optional[Callable], bname: str, stats: Stats,
            config_kw: Optional[dict] = None, skip: Optional[Callable] = None) -> Sequence:
        rng = random.Random(f"kvcheck-guided:{self.seed}:{index}")
        if self.corpus and rng.random() < MUTATE_SHARE:
            how = rng.choice(MUTATIONS)
            cfg, script, length = derive(how, self.corpus, rng)
            self.derived += 1
            seq = walk(self.seed, index, factory, bname, stats, config_kw=config_kw, skip=skip,
                       cfg=cfg, script=script, rng_tag=how, length=length)
        else:
            seq = walk(self.seed, index, factory, bname, stats, config_kw=config_kw, skip=skip)
        if self.feedback.new_arcs() and seq.failure is None and len(self.corpus) < MAX_CORPUS:
            self.corpus.append(Entry(seq.cfg, list(seq.ops)))
        return seq


_CAMPAIGNS: dict = {}


def guided_for(key, seed: int, backend: str, start: int) -> Guided:
    """The campaign's Guided in this process; a campaign that starts again at index 0
    starts with an empty corpus."""
    if start == 0 or key not in _CAMPAIGNS:
        _CAMPAIGNS[key] = Guided(seed, backend)
    return _CAMPAIGNS[key]
