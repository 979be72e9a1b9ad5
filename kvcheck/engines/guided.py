"""The guided engine (`--engine guided`): coverage-guided generation on top of the walk
engine, as AFL and HypoFuzz do.

The novelty signal is the spec's own record of each step, not a tracer: the operation
and its outcome, under the configuration's shape, after the previous step's outcome,
with its arguments' classes, and each named PATH (retract-retry, `_free_tail` frees,
...) it took (`step_features`); and the step's effects on the spec's state, read through
the walk's `observe` hook (`effect_features`: pages taken or freed, a pool left full,
lengths against the page boundary, the request's phase change). It costs little
(coverage.py's branch tracing cost about 1.6x per sequence) and is the same for every
backend, a release included. A corpus keeps every sequence that showed a feature no
earlier one showed.

Fresh walks are spread (`Guided.preview`): PREVIEW plans are drawn for the index (the
walk engine's own first; a plan is the configuration, the length and the swarm,
`walk.draw_plan`), and the one whose traits (`plan_traits`) earlier fresh walks ran least
often is run. Measured (docs/coverage.md), this is where guided's lead in branches comes
from: a fresh walk in an untried configuration reaches more new code than a variation of
a known sequence.

The first WARMUP sequences are never derived. After them, MUTATE_SHARE of the sequences
are derived from the corpus (an entry picked by rarity, AFL's energy: 1 / the fewest
sequences that showed one of the features it found first; or one of the latest), the
rest are fresh walks. A derived sequence keeps its parent's configuration and is one of
DERIVE_MUTATIONS:

  extend   the first half or more of a corpus sequence, then more random steps;
  splice   the head of one corpus sequence, then the tail of another;
  argument a corpus sequence with one operation's argument changed (and a few of the
           operations after it);
  swap     a corpus sequence with two neighbouring operations swapped (same);

("config", a corpus sequence under its configuration with one field drawn afresh, is
in MUTATIONS but not drawn: see DERIVE_MUTATIONS) each replayed through the walk (an
operation the spec does not enable at its point is left out) and continued by it.
Sequence `index` of campaign `seed` is a pure function of (seed, index, the sequences
before it in this process): one worker replays a campaign exactly; N workers each keep
their own corpus.
"""
from __future__ import annotations

import dataclasses
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Optional

from kvcheck.engines.configs import draw_config
from kvcheck.engines.draw import RandomDrawer
from kvcheck.engines.gen import ARGS
from kvcheck.engines.stats import Stats
from kvcheck.engines.walk import BASE_WEIGHTS, Plan, Sequence, draw_plan, plan_rng, walk
from kvcheck.spec import ops as O

MUTATE_SHARE = 0.15
MUTATIONS = ("extend", "splice", "argument", "swap", "config")
DERIVE_MUTATIONS = ("extend", "splice", "argument", "swap")
"""The mutations a derived sequence is drawn with: "config" is left out (a derived
sequence keeps its parent's configuration; fresh walks spread the configurations)."""
PREVIEW = 4
"""Fresh walks: plans previewed per sequence (the walk's own first), the rarest run."""
EFFECTS = True
"""Novelty from the steps' effects (`effect_features`) besides their names and paths."""
RECENT = 16
WARMUP = 8
EXTRA_STEPS = (4, 8, 16)
TAIL = 12
"""After a changed or swapped operation, at most this many of the parent's next ones."""
MAX_CORPUS = 512


def shape(cfg) -> str:
    """The configuration's shape, the part that selects code paths: page size 1 or more,
    speculative decoding, overlap, chunking, the era, SWA and Mamba pools."""
    return "".join((
        f"P{cfg.page_size}", "s" if cfg.spec_enabled else "-",
        "o" if cfg.overlap else "-", "c" if cfg.chunk_size else "-", cfg.era[:3],
        "w" if cfg.swa_window else "-", "m" if cfg.mamba_slots else "-"))


def _bucket(v) -> str:
    """A coarse class of an operation's argument: None, a flag, 0/1/2-3/4-7/... by size."""
    if v is None or isinstance(v, bool):
        return str(v)
    n = len(v) if isinstance(v, tuple) else v
    return str(n.bit_length()) if isinstance(n, int) and n >= 0 else "-"


def step_features(sh: str, op: O.Op, outcome: str, paths, prev: str) -> list:
    """The abstract features of one step, the novelty signal (as HypoFuzz uses
    Hypothesis's own events): the operation and its outcome, alone, under the
    configuration's shape, after the previous step's, and with its arguments' classes
    (not the ids); each named PATH (retract-retry, _free_tail frees, ...) it took."""
    here = f"{op.name}:{outcome}"
    args = ",".join(_bucket(v) for f, v in op.args() if f not in ("rid", "sid", "token"))
    return [here, f"{sh}|{here}", f"{prev}>{here}", f"{sh}|{here}({args})",
            *(f"path:{p}" for p in paths), *(f"{sh}|path:{p}" for p in paths)]


def _cls(n: int, P: int) -> str:
    """A length's place against the page boundary: 0, aligned, one past, one short, inside."""
    if n == 0:
        return "0"
    r = n % P
    return "a" if r == 0 else "+1" if r == 1 else "-1" if r == P - 1 else "m"


def effect_features(sh: str, before, op: O.Op, outcome: str, after) -> list:
    """The features of one step's effects on the spec's state: pages taken or given back
    (and how many), a pool left full (KV pages, rows, SWA, Mamba), the radix tree grown
    or shrunk, the request's phase change and where its committed and allocated lengths
    end against a page boundary, and evictable KV left or not."""
    cfg, here = after.cfg, f"{op.name}:{outcome}"
    dp = len(after.free_pages) - len(before.free_pages)
    out = [f"{here}:pages{(dp > 0) - (dp < 0)}:{_bucket(abs(dp))}",
           f"{here}:nodes{(len(after.nodes) > len(before.nodes)) - (len(after.nodes) < len(before.nodes))}",
           f"{here}:evictable{bool(after.evictable_size)}"]
    if not after.free_pages:
        out.append(f"{sh}|{here}:kv-full")
    if not after.free_rows:
        out.append(f"{here}:rows-full")
    if cfg.swa_window and not after.swa_free_pages:
        out.append(f"{sh}|{here}:swa-full")
    if cfg.mamba_slots and not after.mamba_free_slots:
        out.append(f"{sh}|{here}:mamba-full")
    rid = getattr(op, "rid", None)
    if rid is not None:
        rb, ra = before.reqs.get(rid), after.reqs.get(rid)
        out.append(f"{here}:{rb.phase if rb else '-'}>{ra.phase if ra else '-'}")
        if ra is not None:
            P = cfg.page_size
            out.append(f"P{P}|{here}:c{_cls(ra.committed, P)}:a{_cls(ra.allocated, P)}"
                       f":over{_bucket(ra.allocated - ra.committed)}")
    return out


@dataclass
class StepStats(Stats):
    """The walk's Stats, which also keeps each step it records (operation, outcome, paths)."""
    steps_taken: list = field(default_factory=list)

    def record(self, op: O.Op, outcome: str, paths=()) -> None:
        super().record(op, outcome, paths)
        self.steps_taken.append((op, outcome, tuple(paths)))

    def features(self, cfg) -> set:
        """The features of every step recorded, under `cfg`'s shape."""
        sh, prev, out = shape(cfg), "start", set()
        for op, outcome, paths in self.steps_taken:
            out.update(step_features(sh, op, outcome, paths, prev))
            prev = f"{op.name}:{outcome}"
        return out


@dataclass
class Entry:
    cfg: object
    ops: list
    rarity: float = 1.0
    """How rare the features it found first still are (1 / the fewest sequences that
    have shown one of them): rare finds are where the frontier is (AFL's energy)."""


def _bump(v: int, lo: int, hi: int, rng: random.Random) -> int:
    return min(hi, max(lo, v + rng.choice((-2, -1, 1, 2))))


def change_argument(op: O.Op, ids: list, rng: random.Random) -> O.Op:
    """One field of `op` changed: a count nudged, a token or the prompt's length
    changed, a flag flipped, or the request/session id of another operation."""
    f = rng.choice([name for name, _ in op.args()])
    v = getattr(op, f)
    if isinstance(v, bool):
        new = not v
    elif f == "rids":
        new = _change_round(list(v), ids, rng)
    elif f == "limit":
        new = rng.choice((None, rng.randint(0, len(op.rids))))
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
    elif f == "priority":
        new = v + rng.choice((-1, 1))
    elif f in ("drafts", "accepted"):
        new = _bump(v, 0 if f == "accepted" else 1, 3, rng)
    else:
        new = _bump(v, 1, 64, rng)
    if isinstance(op, O.SpecDecode):
        d = new if f == "drafts" else op.drafts
        a = new if f == "accepted" else op.accepted
        return dataclasses.replace(op, drafts=d, accepted=min(a, d))
    if f == "rids" and (getattr(op, "limit", None) or 0) > len(new):
        return dataclasses.replace(op, rids=new, limit=len(new))
    if f == "tokens" and (getattr(op, "logprob_start_len", None) or 0) > len(new):
        return dataclasses.replace(op, tokens=new, logprob_start_len=len(new))
    return dataclasses.replace(op, **{f: new})


def _change_round(rids: list, ids: list, rng: random.Random) -> tuple:
    """A round's requests changed: two swapped (another policy or batch order), one
    left out, or another request added; each still named once."""
    others = [i for i in ids if i not in rids]
    kind = rng.choice(("swap", "drop", "add"))
    if kind == "swap" and len(rids) > 1:
        i, j = rng.sample(range(len(rids)), 2)
        rids[i], rids[j] = rids[j], rids[i]
    elif kind == "drop" and len(rids) > 1:
        rids.pop(rng.randrange(len(rids)))
    elif others:
        rids.insert(rng.randrange(len(rids) + 1), rng.choice(others))
    return tuple(rids)


CONFIG_FIELDS = ("page_size", "num_pages", "num_rows", "chunk_size", "spec_enabled",
                 "overlap", "era")


def change_config(cfg, fresh, f: str):
    """`cfg` with field `f` taken from the freshly drawn `fresh` (with the page size, the
    pool size and chunk size drawn for it too); `fresh` itself if that is not valid."""
    from kvcheck.spec.config import ConfigError
    kw = {f: getattr(fresh, f)}
    if f == "page_size":
        kw.update(num_pages=fresh.num_pages, chunk_size=fresh.chunk_size)
    try:
        return dataclasses.replace(cfg, **kw)
    except ConfigError:
        return fresh


def pick(corpus: list, rng: random.Random) -> Entry:
    """A corpus entry, by its rarity half the time, else one of the latest."""
    if rng.random() < 0.5:
        return rng.choices(corpus, weights=[e.rarity for e in corpus])[0]
    return rng.choice(corpus[-RECENT:])


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


def plan_traits(plan) -> list:
    """What a fresh walk's plan sets apart (its configuration's fields, its length, the
    operations its swarm leaves out or leans on): a previewed plan whose traits were
    run least often is the one run (fresh walks spread over the configurations)."""
    cfg = plan.cfg
    out = [f"{f}={getattr(cfg, f)}" for f in TRAIT_FIELDS]
    out += [shape(cfg), f"length={plan.length}"]
    for n in ARGS:
        w = plan.weights.get(n)
        out.append(f"{n}:off" if w is None else
                   f"{n}:{'low' if w < BASE_WEIGHTS.get(n, 1.0) else 'high'}")
    return out


TRAIT_FIELDS = ("page_size", "num_rows", "chunk_size", "spec_enabled", "overlap", "era",
                "need_sort", "debug_mode", "mamba_extra_buffer", "prefill_aware_swa",
                "disable_radix_cache", "swa_eviction_interval", "evict_shortfall",
                "enable_priority_scheduling", "filter_before_prefill")


class Guided:
    """One campaign's corpus and feedback (the features seen) in this process."""

    def __init__(self, seed: int, backend: str) -> None:
        self.seed = seed
        self.corpus: list = []
        self.hits: Counter = Counter()      # feature -> sequences that showed it
        self.found: list = []               # per corpus entry, the features it found first
        self.traits: Counter = Counter()    # plan trait -> fresh walks run with it
        self.derived = 0

    def run(self, index: int, factory: Optional[Callable], bname: str, stats: Stats,
            config_kw: Optional[dict] = None, skip: Optional[Callable] = None) -> Sequence:
        rng = random.Random(f"kvcheck-guided:{self.seed}:{index}")
        local = StepStats()
        effects: set = set()
        observe = None
        if EFFECTS:
            sh_of = {}

            def observe(before, op, outcome, after, paths):
                sh = sh_of.get(after.cfg) or sh_of.setdefault(after.cfg, shape(after.cfg))
                effects.update(effect_features(sh, before, op, outcome, after))
        kw = dict(config_kw=config_kw, skip=skip, observe=observe)
        if self.corpus and index >= WARMUP and rng.random() < MUTATE_SHARE:
            how = rng.choice(DERIVE_MUTATIONS)
            fresh = draw_config(RandomDrawer(rng), **(config_kw or {}))
            cfg, script, length = derive(how, self.corpus, rng, fresh)
            self.derived += 1
            seq = walk(self.seed, index, factory, bname, local, cfg=cfg, script=script,
                       rng_tag=how, length=length, **kw)
        else:
            seq = walk(self.seed, index, factory, bname, local,
                       plan=self.preview(index, config_kw), **kw)
        stats.merge(local)
        feats = local.features(seq.cfg) | effects
        new = feats - self.hits.keys()
        self.hits.update(feats)
        if new and seq.failure is None and len(self.corpus) < MAX_CORPUS:
            self.corpus.append(Entry(seq.cfg, list(seq.ops)))
            self.found.append(new)
        self._rescore()
        return seq

    def preview(self, index: int, config_kw: Optional[dict]) -> Plan:
        """The plan of a fresh walk: of PREVIEW plans drawn for this index (the walk
        engine's own first), the one whose traits fresh walks ran least often (the sum of
        1 / (1 + runs) over its traits; a tie keeps the earlier, so sequence 0 is the
        walk's own)."""
        best, best_score, best_traits = None, -1.0, ()
        for k in range(PREVIEW):
            plan = draw_plan(RandomDrawer(plan_rng(self.seed, index, f"plan{k}" if k else "")),
                             config_kw)
            traits = plan_traits(plan)
            score = sum(1.0 / (1 + self.traits[t]) for t in traits)
            if score > best_score:
                best, best_score, best_traits = plan, score, traits
        self.traits.update(best_traits)
        return best

    def _rescore(self) -> None:
        for e, new in zip(self.corpus, self.found):
            e.rarity = 1.0 / min(self.hits[f] for f in new)

    def pause(self) -> None:
        """Between chunks (nothing to stop: the feedback is the walk's own record)."""


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
