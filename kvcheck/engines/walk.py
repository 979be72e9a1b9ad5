"""The walk engine: a seeded random walk over the operations the spec enables, driving
`kvcheck.checker.Lockstep` directly (no framework between the draw and the step).

Swarm testing: each sequence draws its own configuration (`configs.draw_config`), its own
length, and its own subset and weighting of the operations (`draw_swarm`), so a
sequence that never aborts, or one that mostly retracts, is as likely as an average one.
Arguments come from the shared per-operation table `gen.ARGS` (page-boundary lengths,
shared-prefix prompts, full sweeps), the same one the Hypothesis machine draws from.
Sequence `index` of campaign `seed` is a pure function of (seed, index): any worker on
any machine replays it exactly.
"""
from __future__ import annotations

import random
from bisect import bisect
from dataclasses import dataclass, field, replace
from itertools import accumulate
from typing import Callable, Optional

from kvcheck.checker import Failure, Lockstep
from kvcheck.engines.configs import draw_config
from kvcheck.engines.draw import Drawer, RandomDrawer, one_in
from kvcheck.engines.gen import ARGS, Ctx
from kvcheck.engines.stats import Stats, paths_of
from kvcheck.spec.config import Config
from kvcheck.spec.model import enabled

BASE_WEIGHTS: dict[str, float] = {
    "open_session": 1.0, "submit_turn": 4.0, "submit_request": 1.5, "schedule": 4.0,
    "prefill_chunk": 4.0, "decode": 6.0, "spec_decode": 6.0, "finish": 2.0,
    "abort_queued": 0.7, "queue_reject": 0.5, "pre_abort": 0.7, "abort_running": 1.0, "retract": 1.5,
    "close_session": 0.7, "evict": 1.0, "schedule_round": 3.0, "decode_round": 4.0,
}
"""How often each operation is tried before swarm scaling; an operation missing here
(a new one in kvcheck.spec.ops) gets DEFAULT_WEIGHT."""
DEFAULT_WEIGHT = 1.0
CORE = frozenset({"open_session", "submit_turn", "schedule", "prefill_chunk", "decode",
                  "spec_decode", "finish"})
"""Never left out by the swarm: without them a sequence cannot get anywhere."""
SWARM_FACTORS = (0.25, 0.5, 1.0, 1.0, 2.0, 4.0)
LENGTHS = (32, 48, 64, 96, 128, 192)
"""Drawn operations per sequence (the enabled ones are applied): `check`'s 100 sequences
average ~65 applied steps, long enough for retract -> re-schedule -> finish paths."""
TRIES_PER_STEP = 8


@dataclass
class Sequence:
    """One walk: its configuration, the operations applied, and the failure if any."""
    index: int
    cfg: Config
    ops: list = field(default_factory=list)
    failure: Optional[Failure] = None
    beyond: Optional[object] = None     # kvcheck.checker.Beyond where it stopped comparing


def sequence_rng(seed: int, index: int) -> random.Random:
    """The random source of one sequence: a pure function of (campaign seed, index)."""
    return random.Random(f"kvcheck-walk:{seed}:{index}")


def plan_rng(seed: int, index: int, tag: str = "") -> random.Random:
    """The random source of sequence `index`, or of its variant `tag` (the guided engine's
    derived sequences and previewed fresh walks): the plan is drawn from it first, then
    the operations."""
    return sequence_rng(seed, index) if not tag else random.Random(
        f"kvcheck-walk:{seed}:{index}:{tag}")


@dataclass
class Plan:
    """What a sequence draws before its first operation: its configuration, its length,
    its swarm (op name -> weight), and the drawer its operations come from next. The
    guided engine previews several before it runs one."""
    d: RandomDrawer
    cfg: Config
    length: int
    weights: dict
    findings: tuple = ()
    """Under `--accept`, the accepted findings whose triggers this sequence may draw
    (`draw_findings`); the others' are left out."""


def draw_plan(d: RandomDrawer, config_kw: Optional[dict] = None) -> Plan:
    """A sequence's plan, drawn from `d` (the same draws, in the same order, as ever; a
    run with `--accept` then draws which accepted findings the sequence may trigger)."""
    cfg = draw_config(d, **(config_kw or {}))
    length = d.choice(LENGTHS, "length")
    weights = draw_swarm(d, ARGS)
    return Plan(d, cfg, length, weights, draw_findings(d, cfg.accept))


def draw_findings(d: Drawer, accept: tuple) -> tuple:
    """Swarm testing over the accepted findings: each one's trigger left out of a sequence
    one time in two. Once a sequence takes an accepted finding's branch, the spec follows
    upstream there and the lockstep stops comparing at the first invariant outside that
    finding's model (`checker.Beyond`); U1's trigger (a turn submitted while another runs)
    is drawn in most sequences, so with every trigger in, 448 of 1,000 sequences against
    0.5.23 (seed 31) stopped early. A sequence that leaves them all out is compared to its
    end; the others still drive the findings' paths."""
    return accept if not accept or not one_in(d, 2, "one_turn_per_session") else ()


def draw_swarm(d: Drawer, names) -> dict:
    """Op name -> weight for one sequence: each non-core op left out one time in four,
    every weight scaled by a random factor."""
    weights = {}
    for n in names:
        if n not in CORE and one_in(d, 4, f"omit_{n}"):
            continue
        weights[n] = BASE_WEIGHTS.get(n, DEFAULT_WEIGHT) * d.choice(SWARM_FACTORS, f"w_{n}")
    return weights


Observer = Callable[[object, object, str, object, tuple], None]
"""observe(state before, op, outcome, state after, paths): called after each step that
both sides ran (the guided engine reads the step's effects from it)."""


def walk(seed: int, index: int, factory: Optional[Callable], backend_name: str,
         stats: Stats, *, config_kw: Optional[dict] = None,
         skip: Optional[Callable] = None, cfg: Optional[Config] = None,
         script: Optional[list] = None, rng_tag: str = "",
         length: Optional[int] = None, plan: Optional[Plan] = None,
         observe: Optional[Observer] = None) -> Sequence:
    """Run sequence `index` of campaign `seed` until its length or its first failure.
    `cfg` and `script` (the guided engine, kvcheck.engines.guided): the configuration to
    use and operations to apply first, each one the spec does not enable left out; the
    walk goes on from there (to `length` steps in all). `rng_tag` names another random
    source for the same index; `plan`: the plan already drawn from it (`draw_plan`).
    `observe`: see Observer (None: nothing is called, nothing is kept)."""
    if plan is None:
        plan = draw_plan(RandomDrawer(plan_rng(seed, index, rng_tag)), config_kw)
    d, weights = plan.d, plan.weights
    cfg = replace(cfg or plan.cfg, drain=True)     # every walk ends with the drain (P1)
    pick = weighted_pick(list(weights), list(weights.values()), d.rng)
    draw_skip = _leaving_out(skip, cfg.accept, plan.findings)
    script = list(script or ())
    length = max(length or plan.length, len(script))
    next_id = [max([1] + [getattr(o, a, 0) for o in script for a in ("rid", "sid")])]

    def fresh() -> int:
        next_id[0] += 1
        return next_id[0]

    backend = factory(cfg) if factory is not None else None
    seq = Sequence(index, cfg)
    stats.sequences += 1
    try:
        lock = Lockstep(cfg, backend, backend_name)
        for n in range(length):
            op = None
            while script and op is None:
                op = _scripted(lock.state, script.pop(0), skip)
            if op is None:
                op = _draw_enabled(lock.state, pick, d, fresh, draw_skip)
            if op is None:
                continue
            seq.ops.append(op)
            paths = paths_of(lock.state, op)
            before = lock.state
            rec, fail = lock.apply(op)
            if fail is not None:
                seq.failure = fail
                return seq
            if lock.beyond is not None:     # nothing more is compared: the walk ends here
                stats.record_beyond(lock.beyond.reason, length - n, lock.beyond.release,
                                    lock.beyond.release_past is not None)
                seq.beyond = lock.beyond
                return seq
            stats.record(op, rec.outcome, paths)
            if observe is not None:
                observe(before, op, rec.outcome, lock.state, paths)
        drained, seq.failure = lock.drain(draw_skip)
        for rec in drained[:-1] if seq.failure is not None else drained:
            stats.record(rec.op, rec.outcome, ())
        if lock.beyond is not None:
            b = lock.beyond
            stats.record_beyond(b.reason, 0, b.release, b.release_past is not None)
            seq.beyond = b
    finally:
        if backend is not None and hasattr(backend, "close"):
            backend.close()
    return seq


def _leaving_out(skip, accept: tuple, taken: tuple):
    """`skip`, and the triggers of the accepted findings a sequence leaves out (for drawn
    operations; a guided engine's scripted ones are applied as recorded)."""
    from kvcheck.adapters.sglang.findings import leaves_one_turn_per_session
    out = leaves_one_turn_per_session if accept and not taken else None
    if out is None or skip is None:
        return out or skip
    return lambda s, op: skip(s, op) or out(s, op)


def _scripted(state, op, skip):
    """A scripted operation if the spec enables it here (and no recorded finding
    triggers it), else None."""
    if not enabled(state, op) or (skip is not None and skip(state, op)):
        return None
    return op


def weighted_pick(names: list, weights: list, rng: random.Random) -> Callable[[], str]:
    """`lambda: rng.choices(names, weights)[0]` with the cumulative weights and their
    total computed once per sequence, not per draw: the same draws from the same random
    stream (choices(cum_weights=...) is one `random()` and one bisect)."""
    cum = list(accumulate(weights))
    total, hi, random_ = cum[-1] + 0.0, len(cum) - 1, rng.random
    return lambda: names[bisect(cum, random_() * total, 0, hi)]


def _draw_enabled(state, pick, d, fresh, skip):
    """An operation the spec enables here (and no recorded finding triggers), or None."""
    ctx = Ctx(state, fresh)
    for _ in range(TRIES_PER_STEP):
        name = pick()
        op = ARGS[name](ctx, d)
        if op is None or not enabled(state, op):
            continue
        if skip is not None and skip(state, op):
            continue
        return op
    return None
