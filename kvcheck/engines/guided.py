"""The guided engine (`--engine guided`): coverage-guided generation on top of the walk
engine, as AFL and HypoFuzz do.

A corpus keeps every sequence that reached a branch no earlier sequence reached
(coverage.py's branch arcs of impl/ when the system under test is impl, of spec/
otherwise: a release runs in another process, and the spec's paths follow its own).
Fresh walks (kvcheck.engines.walk, the same sequences the walk engine runs) come first,
the first WARMUP of them untraced;
once FRESH_DRY of them in a row reached nothing new, three sequences in four are
derived from the corpus (half the time from one of its latest entries), until fresh
walks pay again; a derived one is one of:

  extend   the first half or more of a corpus sequence, then more random steps;
  splice   the head of one corpus sequence, then the tail of another;
  argument a corpus sequence with one operation's argument changed (and a few of the
           operations after it);
  swap     a corpus sequence with two neighbouring operations swapped (same);
  config   a corpus sequence under its configuration with one field drawn afresh;

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

from kvcheck.engines.gen import RandomDrawer, Stats, draw_config
from kvcheck.engines.walk import Sequence, walk
from spec import ops as O

ROOT = Path(__file__).resolve().parents[2]
MUTATE_SHARE = 0.75
MUTATIONS = ("extend", "splice", "argument", "swap", "config")
RECENT = 16
WARMUP = 8
DRY_AFTER = 20
SAMPLE_EVERY = 4
EXTRA_STEPS = (4, 8, 16)
TAIL = 12
"""After a changed or swapped operation, at most this many of the parent's next ones."""
FRESH_DRY = 2
"""Derive only once this many fresh walks in a row reached nothing new (while random
walks still pay, they are the cheaper way to new branches)."""
MAX_CORPUS = 512


_COLLECTORS: dict = {}
"""coverage.py collectors this module started, by source folder (created once: a
collector costs a few tenths of a second to set up)."""


class Feedback:
    """New branch arcs since the last call, from the coverage.py collector running in
    this process (`kvcheck coverage`'s, or one started here over `source`)."""

    def __init__(self, source: Path) -> None:
        import coverage
        self.cov = coverage.Coverage.current()
        self.own = self.cov is None
        if self.own:                    # one collector per source for the process
            if source not in _COLLECTORS:
                cov = coverage.Coverage(branch=True, data_file=None, source=[str(source)])
                cov.set_option("run:disable_warnings", ["no-data-collected"])
                _COLLECTORS[source] = cov
            self.cov = _COLLECTORS[source]
            self.cov.erase()            # a campaign's feedback starts from nothing;
        self.tracing = not self.own     # before() starts an own collector after the warm-up
        self.dry = 0                    # traced sequences in a row that reached nothing new
        self.seen: set = set()
        if not self.own:
            self.new_arcs()             # what the running collector has: not new

    def before(self, index: int) -> None:
        """Tracing costs about 1.6x. The first WARMUP sequences are plain walks, not
        traced (most planted faults fall in them, found at the walk engine's speed);
        once DRY_AFTER traced sequences in a row reached nothing new, only every
        SAMPLE_EVERY-th sequence is traced (until one reaches something new again). A
        collector this class did not start (kvcheck coverage's) always runs."""
        want = not self.own or (index >= WARMUP and (self.dry < DRY_AFTER
                                                     or index % SAMPLE_EVERY == 0))
        if want and not self.tracing:
            self.cov.start()
        elif not want and self.tracing:
            self.cov.stop()
        self.tracing = want

    def pause(self) -> None:
        """Between chunks: nothing outside the sequences is traced."""
        if self.own and self.tracing:
            self.cov.stop()
            self.tracing = False

    def after(self) -> int:
        """New arcs of the sequence just run (0 when it was not traced)."""
        if not self.tracing:
            return 0
        n = self.new_arcs()
        self.dry = 0 if n else self.dry + 1
        return n

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
    elif f == "logprob_start_len":
        new = rng.choice((None, -1, rng.randint(0, len(op.tokens))))
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
    if f == "tokens" and (getattr(op, "logprob_start_len", None) or 0) > len(new):
        return dataclasses.replace(op, tokens=new, logprob_start_len=len(new))
    return dataclasses.replace(op, **{f: new})


CONFIG_FIELDS = ("page_size", "num_pages", "num_rows", "chunk_size", "spec_enabled",
                 "overlap", "era")


def change_config(cfg, fresh, f: str):
    """`cfg` with field `f` taken from the freshly drawn `fresh` (with the page size, the
    pool size and chunk size drawn for it too); `fresh` itself if that is not valid."""
    from spec.config import ConfigError
    kw = {f: getattr(fresh, f)}
    if f == "page_size":
        kw.update(num_pages=fresh.num_pages, chunk_size=fresh.chunk_size)
    try:
        return dataclasses.replace(cfg, **kw)
    except ConfigError:
        return fresh


def pick(corpus: list, rng: random.Random) -> Entry:
    """A corpus entry, half the time one of the latest (where the frontier is)."""
    return rng.choice(corpus[-RECENT:] if rng.random() < 0.5 else corpus)


def derive(how: str, corpus: list, rng: random.Random, fresh_cfg=None) -> tuple:
    """(cfg, script, length) of a sequence derived from the corpus; `fresh_cfg`: a newly
    drawn configuration the "config" mutation takes one field from."""
    a = pick(corpus, rng)
    ops = list(a.ops)
    cfg = a.cfg
    extra = rng.choice(EXTRA_STEPS)
    if how == "extend":
        ops = ops[:rng.randint(len(ops) // 2, len(ops))]
        extra = max(extra, 8)
    elif how == "config" and fresh_cfg is not None:
        cfg = change_config(cfg, fresh_cfg, rng.choice(CONFIG_FIELDS))
    elif how == "splice":
        b = rng.choice(corpus)
        ops = ops[:rng.randint(0, len(ops))] + list(b.ops[rng.randint(0, len(b.ops)):])
    elif how == "argument" and ops:
        i = rng.randrange(len(ops))
        ids = sorted({getattr(o, "rid", None) for o in ops} - {None})
        ops[i] = change_argument(ops[i], ids, rng)
        ops = ops[:i + 1 + rng.randint(0, TAIL)]        # what follows the change matters
    elif how == "swap" and len(ops) > 1:
        i = rng.randrange(len(ops) - 1)
        ops[i], ops[i + 1] = ops[i + 1], ops[i]
        ops = ops[:i + 2 + rng.randint(0, TAIL)]
    return cfg, ops, len(ops) + extra


class Guided:
    """One campaign's corpus and feedback in this process."""

    def __init__(self, seed: int, backend: str) -> None:
        self.seed = seed
        self.corpus: list = []
        self.feedback = Feedback(ROOT / ("impl" if backend == "impl" else "spec"))
        self.derived = 0
        self.fresh_dry = 0

    def run(self, index: int, factory: Optional[Callable], bname: str, stats: Stats,
            config_kw: Optional[dict] = None, skip: Optional[Callable] = None) -> Sequence:
        rng = random.Random(f"kvcheck-guided:{self.seed}:{index}")
        self.feedback.before(index)
        derived = (self.corpus and self.fresh_dry >= FRESH_DRY and rng.random() < MUTATE_SHARE)
        if derived:
            how = rng.choice(MUTATIONS)
            fresh = draw_config(RandomDrawer(rng), **(config_kw or {}))
            cfg, script, length = derive(how, self.corpus, rng, fresh)
            self.derived += 1
            seq = walk(self.seed, index, factory, bname, stats, config_kw=config_kw, skip=skip,
                       cfg=cfg, script=script, rng_tag=how, length=length)
        else:
            seq = walk(self.seed, index, factory, bname, stats, config_kw=config_kw, skip=skip)
        new = self.feedback.after()
        if not derived and self.feedback.tracing:
            self.fresh_dry = 0 if new else self.fresh_dry + 1
        if new and seq.failure is None and len(self.corpus) < MAX_CORPUS:
            self.corpus.append(Entry(seq.cfg, list(seq.ops)))
        return seq


    def pause(self) -> None:
        self.feedback.pause()


_CAMPAIGNS: dict = {}


def guided_for(key, seed: int, backend: str, start: int) -> Guided:
    """The campaign's Guided in this process; a campaign that starts again at index 0
    starts with an empty corpus."""
    if start == 0 or key not in _CAMPAIGNS:
        old = _CAMPAIGNS.pop(key, None)
        if old is not None:
            old.pause()
        _CAMPAIGNS[key] = Guided(seed, backend)
    return _CAMPAIGNS[key]
