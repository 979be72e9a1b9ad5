"""What both fuzz engines draw, defined once: configurations, lengths biased to page
boundaries and full pools, prompts built from shared prefixes, and each operation's
arguments (one entry per operation name in `ARGS`).

Every draw goes through a `Drawer`: `RandomDrawer` (a seeded `random.Random`, used by
the walk engine) or `HypothesisDrawer` (Hypothesis's `draw`, used by the state machine,
so Hypothesis still sees and can shrink each choice). The tables and the bias logic
live only here.
"""
from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Optional, Protocol, Sequence

from kvcheck.checker import RELEASE_SAME, differ_kind
from kvcheck.spec import ops as O
from kvcheck.spec.actions import ACTIONS
from kvcheck.spec.config import Config
from kvcheck.spec.pages import ceil_align, free_kv_aligned_pages, restore_prefix_len

PREFIXES = ((1, 2, 3, 4, 5, 6, 7, 8), (1, 2, 3, 4, 9, 9, 9, 9), (5, 6, 7, 8, 1, 2, 3, 4))
"""Prompts start with a cut of one of these, so radix matches and splits happen."""
TOKEN_RANGE = (1, 4)
MAX_LIVE_REQS = 6
MAX_SESSIONS = 2
ERA_WEIGHTS = ("wrapper", "wrapper", "wrapper", "borrow")


class Drawer(Protocol):
    def integer(self, lo: int, hi: int, label: str = "") -> int: ...
    def choice(self, seq: Sequence, label: str = ""): ...


class RandomDrawer:
    """Draws from a seeded `random.Random` (the walk engine)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def integer(self, lo: int, hi: int, label: str = "") -> int:
        return self.rng.randint(lo, hi)

    def choice(self, seq: Sequence, label: str = ""):
        return seq[self.rng.randrange(len(seq))]


class HypothesisDrawer:
    """Draws through Hypothesis: `st.data()`'s draw (labelled) or a composite's draw."""

    def __init__(self, draw: Callable, labelled: bool = True) -> None:
        self.draw, self.labelled = draw, labelled

    def integer(self, lo: int, hi: int, label: str = "") -> int:
        from hypothesis import strategies as st
        return self._draw(st.integers(lo, hi), label)

    def choice(self, seq: Sequence, label: str = ""):
        from hypothesis import strategies as st
        return self._draw(st.sampled_from(tuple(seq)), label)

    def _draw(self, strategy, label):
        return self.draw(strategy, label=label) if self.labelled and label else self.draw(strategy)


def boolean(d: Drawer, label: str = "") -> bool:
    return d.integer(0, 1, label) == 1


def one_in(d: Drawer, n: int, label: str = "go") -> bool:
    return d.integer(0, n - 1, label) == 0


# -- configurations --------------------------------------------------------------------

def draw_config(d: Drawer, page_sizes=(1, 2, 4), spec_enabled: Optional[bool] = None,
                era: Optional[str] = None, accept: tuple = (), hybrid: Optional[bool] = None,
                hybrid_kinds: tuple = (), tree_off: bool = True,
                evict_shortfall: Optional[bool] = None,
                priority: Optional[bool] = None,
                filter_before_prefill: Optional[bool] = None) -> Config:
    """Small pools (so they fill up), page sizes 1/2/4, chunking, flags and era;
    `accept`: the recorded findings whose upstream behaviour the spec takes; `hybrid`:
    SWA / Mamba pools always (True), never (False), or one config in three (either era),
    of `hybrid_kinds` (default HYBRID_KINDS); `tree_off`: draw the disabled tree in one
    borrow-era config in six (`draw_tree_off`; False: never, as for a real release,
    `backends.config_kw`, whose hybrid kinds say where it runs one); `evict_shortfall`:
    the wrapper era's eviction rule, drawn when None (`draw_evict_shortfall`);
    `priority`: priority scheduling always (True), never (False) or drawn
    (`draw_priority_scheduling`), with `filter_before_prefill` given (a release's rule) or
    drawn."""
    P = d.choice(page_sizes, "page_size")
    if spec_enabled is None:
        spec_enabled = boolean(d, "spec_enabled")
    cfg = _draw_plain_config(d, P, spec_enabled, era, accept)
    if not (hybrid is False or (hybrid is None and not one_in(d, 3, "hybrid"))):
        cfg = draw_hybrid(d, cfg, hybrid_kinds or HYBRID_KINDS)
        if not hybrid_kinds:
            cfg = draw_mamba_tree_in(d, cfg, era_drawn=era is None)
    cfg = draw_tree_off(d, cfg) if tree_off else cfg
    cfg = draw_evict_shortfall(d, cfg, evict_shortfall)
    if priority is False:
        return cfg
    return draw_priority_scheduling(d, cfg, priority, filter_before_prefill)


PRIORITY_ONE_IN = 3


def draw_priority_scheduling(d: Drawer, cfg: Config, always: Optional[bool] = None,
                             filter_before_prefill: Optional[bool] = None) -> Config:
    """`--enable-priority-scheduling` (preemption) on a non-hybrid cfg, one time in
    PRIORITY_ONE_IN, with or without 0.5.23's filter of the running batch before each
    prefill round, and with 1 to 3 rows (a round preempts only when the rows are spent);
    drawn last, so the rest of the config draws as before."""
    from dataclasses import replace
    if cfg.hybrid or not (always or one_in(d, PRIORITY_ONE_IN, "enable_priority_scheduling")):
        return cfg
    if filter_before_prefill is None:
        filter_before_prefill = boolean(d, "filter_before_prefill")
    rows = min(cfg.num_rows, d.integer(1, 3, "priority_rows"))  # rounds short of rows preempt
    return replace(cfg, enable_priority_scheduling=True, filter_before_prefill=filter_before_prefill,
                   num_rows=rows)


def draw_evict_shortfall(d: Drawer, cfg: Config, given: Optional[bool] = None) -> Config:
    """The wrapper era's eviction rule (`Config.evict_shortfall`: 0.5.17+ evicts only the
    shortfall): `given` (a release's rule, no draw) or drawn; drawn last, so the rest of
    the config draws as before. The borrow era draws nothing (it always does)."""
    from dataclasses import replace
    if cfg.era != "wrapper":
        return cfg
    value = boolean(d, "evict_shortfall") if given is None else given
    return replace(cfg, evict_shortfall=value) if value else cfg


TREE_OFF_ONE_IN = 6


def draw_tree_off(d: Drawer, cfg: Config) -> Config:
    """`--disable-radix-cache` (0.5.23's disabled `UnifiedRadixCache`) on a borrow-era cfg,
    plain or hybrid, one time in TREE_OFF_ONE_IN; drawn last, so the rest of the config
    draws as before. Other eras and an already disabled tree draw nothing."""
    from dataclasses import replace
    if cfg.era != "borrow" or cfg.disable_radix_cache or cfg.mamba_tree:
        return cfg
    if not one_in(d, TREE_OFF_ONE_IN, "disable_radix_cache"):
        return cfg
    return replace(cfg, disable_radix_cache=True)


HYBRID_KINDS = ("swa", "mamba", "swa+mamba")
"""The kinds drawn by default; "mamba-tree" (and the sglang backends' kinds, e.g. 0.5.23's
"swa-no-prefill-aware"; "swa-full-pool" also keeps the SWA pool as large as the full one)
only when named, and by default one Mamba-only config in MAMBA_TREE_ONE_IN, of either drawn era
(`draw_mamba_tree_in`)."""
MAMBA_TREE_ONE_IN = 2


SWA_NO_FLOOR = ("swa-no-prefill-aware", "swa-full-pool", "swa-window-pages")
"""SWA kinds drawn without 0.5.23's prefill-aware SWA (which the release pairs only with an
all-SWA model: the sglang adapter refuses it, docs/semantics.md W1). "swa-window-pages" also
rounds a window wider than a page up to whole pages, where 0.5.22's SWA keep
(`max(window, P)`) is 0.5.23's (`ceil_align(max(window, P), P)`, kvcheck.spec.swa_pool.swa_keep)."""

EXTRA_BUFFERS = ("off", "off", "eager", "lazy")
NO_LAZY = ("off", "off", "eager")
"""Track-buffer modes drawn: lazy is never drawn with speculative decoding (upstream
refuses it), nor where `hybrid_kinds` names "mamba-no-lazy"."""


def draw_hybrid(d: Drawer, cfg: Config, kinds: tuple = HYBRID_KINDS) -> Config:
    """SWA and/or Mamba pools on cfg: a window smaller than a turn and around page
    boundaries, an SWA pool up to half the full one, a maintenance interval; a Mamba pool
    small enough to run out (a few slots, with or without track buffers)."""
    from dataclasses import replace
    P, kind = cfg.page_size, d.choice(kinds, "hybrid_kind")
    if kind == "mamba-tree":
        return draw_mamba_tree(d, cfg)
    kw: dict = {}
    if "swa" in kind:
        kw["swa_window"] = draw_length(d, P, 1, 3 * P + 1, "swa_window")
        if kind == "swa-window-pages" and kw["swa_window"] > P:
            kw["swa_window"] = ceil_align(kw["swa_window"], P)
        if kind != "swa-full-pool":
            kw["swa_num_pages"] = d.choice([None, max(2, cfg.num_pages // 2),
                                            max(2, cfg.num_pages - 2)], "swa_num_pages")
        kw["swa_eviction_interval"] = d.choice([1, 1, 2, 3], "swa_eviction_interval")
        if cfg.era == "borrow" and kind not in SWA_NO_FLOOR:    # 0.5.23's prefill-aware SWA
            kw["prefill_aware_swa"] = boolean(d, "prefill_aware_swa")
    if "mamba" in kind:
        kw["mamba_slots"] = d.integer(1, 2 * cfg.num_rows + 2, "mamba_slots")
        lazy_ok = not cfg.spec_enabled and kind != "mamba-no-lazy"
        kw["mamba_extra_buffer"] = d.choice(EXTRA_BUFFERS if lazy_ok else NO_LAZY,
                                            "mamba_extra_buffer")
        if kw["mamba_extra_buffer"] == "lazy":
            # A lazy track buffer differs from an eager one only under the overlap
            # scheduler (two entries, one left -1); without it both hold one slot. So
            # lazy takes overlap on, with no extra draw (other configurations keep
            # theirs): the -1 entry that 0.5.15's `_free_slot_mamba` frees
            # (`lazy_track_frees_sentinel`) was drawn in one sequence in 72 before.
            kw["overlap"] = True
    if kind == "mamba-no-radix":        # 0.5.23's hybrid SSM tree keeping no Mamba state
        kw["disable_radix_cache"] = True
    return replace(cfg, **kw)


def draw_mamba_tree_in(d: Drawer, cfg: Config, era_drawn: bool = False) -> Config:
    """The Mamba tree on a Mamba-only cfg, one time in MAMBA_TREE_ONE_IN, of the drawn era:
    0.5.23's component (borrow era) or 0.5.15's `MambaRadixCache` (wrapper era). Drawn
    after the rest of the config (as `draw_tree_off`), so every config that is not
    Mamba-only draws as before. A wrapper-era cfg takes part only where its era was drawn
    (not asked for: a caller that asks for an era names the kinds it drives, as the
    sglang:0.5.15 backend names "mamba-tree"), so spec-vs-impl runs draw 0.5.15's tree too
    (300 sequences of it, `walk` seed 1, agree step for step)."""
    from dataclasses import replace
    if not cfg.mamba_slots or cfg.swa_window or cfg.disable_radix_cache:
        return cfg
    if cfg.era != "borrow" and not era_drawn:
        return cfg
    if not one_in(d, MAMBA_TREE_ONE_IN, "mamba_tree"):
        return cfg
    return draw_mamba_tree(d, cfg)


def draw_mamba_tree(d: Drawer, cfg: Config) -> Config:
    """The Mamba tree (config.mamba_tree: 0.5.23's component, 0.5.15's MambaRadixCache
    on a wrapper-era cfg): page_size 1,
    no chunking, no extra buffer (what the component is modelled with); a pool of 2 to
    2 * rows + 2 slots, so states are evicted and admissions refused."""
    from dataclasses import replace
    chunk = cfg.chunk_size if cfg.era == "wrapper" else None   # 0.5.15: chunked checkpoints
    return replace(cfg, page_size=1, chunk_size=chunk, mamba_tree=True, mamba_extra_buffer="off",
                   mamba_slots=d.integer(2, 2 * cfg.num_rows + 2, "mamba_slots"))


def _draw_plain_config(d: Drawer, P: int, spec_enabled: bool, era, accept) -> Config:
    return Config(
        page_size=P,
        num_pages=d.integer(4, 40 // P + 4, "num_pages"),
        num_rows=d.integer(2, 4, "num_rows"),
        max_context_len=64,
        chunk_size=d.choice([None, None, P, 2 * P, 3 * P], "chunk_size"),
        spec_enabled=spec_enabled,
        max_drafts=3,
        overlap=boolean(d, "overlap"),
        era=era or d.choice(ERA_WEIGHTS, "era"),
        accept=tuple(accept),
        need_sort=boolean(d, "need_sort"),
        debug_mode=one_in(d, 4, "debug_mode"),
    )


# -- lengths and prompts -----------------------------------------------------------------

def boundary_lengths(P: int, lo: int, hi: int) -> list:
    """k*P - 1, k*P, k*P + 1 within [lo, hi]."""
    return sorted({x for k in range(1, hi // P + 2) for x in (k * P - 1, k * P, k * P + 1)
                   if lo <= x <= hi})


def draw_length(d: Drawer, P: int, lo: int, hi: int, label: str = "length") -> int:
    """A length in [lo, hi], half the time on either side of a page boundary."""
    near = boundary_lengths(P, lo, hi)
    if near and boolean(d, label + "_near_page"):
        return d.choice(near, label)
    return d.integer(lo, hi, label)


def draw_prompt(d: Drawer, P: int, lo: int = 1, hi: int = 14, label: str = "tokens") -> tuple:
    """A cut of a shared prefix, then random tokens, of a page-biased length."""
    n = draw_length(d, P, lo, hi, label + "_len")
    base = d.choice(PREFIXES + ((),), label + "_prefix")
    cut = d.integer(0, min(n, len(base)), label + "_cut")
    rest = tuple(d.integer(*TOKEN_RANGE, label + "_tok") for _ in range(n - cut))
    return tuple(base[:cut]) + rest


def draw_evict(d: Drawer, P: int, evictable: int) -> int:
    """Evict a page-biased amount, or exactly everything evictable (a full sweep)."""
    if evictable > 0 and one_in(d, 4, "evict_all"):
        return evictable
    return draw_length(d, P, 1, 16, "num_tokens")


# -- each operation's arguments ----------------------------------------------------------

@dataclass
class Ctx:
    """What an argument draw may read: the spec state (live objects) and a fresh-id source."""
    state: object
    fresh: Callable[[], int]

    @property
    def cfg(self) -> Config:
        return self.state.cfg

    def rids(self, *phases) -> list:
        return sorted(r.rid for r in self.state.reqs.values() if r.phase in phases)

    def room(self) -> bool:
        return len(self.state.reqs) < MAX_LIVE_REQS


def _pick(name: str):
    """A live request for operation `name`: one in the phases its action acts on."""
    phases = ACTIONS[name].acts_on

    def pick(c: Ctx, d: Drawer):
        rids = c.rids(*phases)
        return d.choice(rids, "rid") if rids else None
    return pick


REFUSED_ONE_IN = 10
"""A client request upstream turns down (`kvcheck.spec.model.refused`) or answers with a stub
(a turn for a session that is not open) is drawn once in this many draws of its op."""


def _refused(d: Drawer, label: str) -> bool:
    return one_in(d, REFUSED_ONE_IN, label)


def _open_session(c: Ctx, d: Drawer):
    sids = sorted(c.state.sessions)
    if sids and _refused(d, "open_in_use"):     # success=False: the id is already open
        return O.OpenSession(d.choice(sids, "sid"))
    return O.OpenSession(c.fresh()) if len(sids) < MAX_SESSIONS else None


def _submit_turn(c: Ctx, d: Drawer):
    s = c.state
    if not c.room():
        return None
    P = c.cfg.page_size
    if _refused(d, "no_session"):       # an aborted stub: the session id is not open
        return O.SubmitTurn(c.fresh(), c.fresh(), draw_prompt(d, P, 1, 10, "new_tokens"),
                            draw_length(d, P, 1, 10, "max_new_tokens"), draw_priority(c, d))
    if not s.sessions:
        return None
    idle = sorted(x for x, v in s.sessions.items() if v.inflight_rid is None)
    # mostly a session that can take a turn; sometimes one in flight (create_req rejects it)
    pool = idle if idle and d.integer(0, 3, "idle") else sorted(s.sessions)
    sid = d.choice(pool, "sid")
    new = draw_prompt(d, P, 1, 10, "new_tokens")
    return O.SubmitTurn(sid, c.fresh(), new, draw_length(d, P, 1, 10, "max_new_tokens"),
                        draw_priority(c, d))


def _submit_request(c: Ctx, d: Drawer):
    if not c.room():
        return None
    P = c.cfg.page_size
    tokens = draw_prompt(d, P, 1, 16, "tokens")
    return O.SubmitRequest(c.fresh(), tokens, draw_length(d, P, 1, 10, "max_new_tokens"),
                           draw_logprob_start(d, P, len(tokens)), draw_priority(c, d))


PRIORITIES = (0, 0, 5, 15, 30, 30)
"""Priority scheduling's priorities, against the default preemption threshold (10):
equal ones (the queue entry breaks ties), differences of 5 and exactly 10 (no
preemption) and of 15, 25 and 30 (preemption)."""


def draw_priority(c: Ctx, d: Drawer) -> int:
    """A request's priority under `config.enable_priority_scheduling`; 0 (nothing drawn)
    without it."""
    if not c.cfg.enable_priority_scheduling:
        return 0
    return d.choice(PRIORITIES, "priority")


def draw_logprob_start(d: Drawer, P: int, prompt_len: int):
    """`logprob_start_len` of a plain request: mostly none, else upstream's default (-1:
    caps a retried request's match at its prompt) or a page-biased start in the prompt."""
    kind = d.choice((None, None, None, -1, "start"), "logprob_start_len")
    return draw_length(d, P, 0, prompt_len, "logprob_start_len") if kind == "start" else kind


def _rid_op(name: str):
    """Operation `name` on a live request its action acts on (no other argument)."""
    cls, pick = ACTIONS[name].op, _pick(name)

    def make(c: Ctx, d: Drawer):
        rid = pick(c, d)
        return None if rid is None else cls(rid)
    return make


def _abort_op(name: str):
    """A client abort: of a live request its action acts on, or sometimes of a rid that is
    not live (`abort_request` finds nothing: refused)."""
    cls, live = ACTIONS[name].op, _rid_op(name)

    def make(c: Ctx, d: Drawer):
        return cls(c.fresh()) if _refused(d, "abort_gone") else live(c, d)
    return make


def _schedule(c: Ctx, d: Drawer):
    rid = _pick("schedule")(c, d)
    return None if rid is None else O.Schedule(rid, d.choice((True, True, True, False), "admit"))


def draw_order(d: Drawer, items: list, k: int, label: str) -> list:
    """k of items in a drawn order (a round's policy order, a batch's order)."""
    pool, out = list(items), []
    for _ in range(k):
        out.append(pool.pop(d.integer(0, len(pool) - 1, label)))
    return out


def _schedule_round(c: Ctx, d: Drawer):
    """A prefill round: the chunked request first when one is in flight (the round
    continues it), then waiting requests in a drawn policy order (a turn beside its
    session's rejected stub, plain requests on shared prefixes), sometimes cut by the
    round's other budgets. One request a round with SWA or Mamba pools."""
    queued, chunked = c.rids("queued"), c.rids("prefill")
    if c.cfg.hybrid and chunked:
        return None
    head = [d.choice(chunked, "chunked")] if chunked else []
    most = 1 if c.cfg.hybrid else len(queued)
    if not head and not queued:
        return None
    rids = head + draw_order(d, queued, d.integer(0 if head else 1, most), "round_order")
    if not rids:
        return None
    limit = d.integer(0, len(rids), "limit") if one_in(d, 4, "round_limited") else None
    return O.ScheduleRound(tuple(rids), limit)


def _decode_round(c: Ctx, d: Drawer):
    """A decode round over the running batch in a drawn batch order (`retract_decode`
    picks its victims from it when memory is short)."""
    rids = c.rids("decode")
    if not rids or c.cfg.spec_enabled or c.cfg.hybrid:
        return None
    return O.DecodeRound(tuple(draw_order(d, rids, len(rids), "batch_order")))


def _decode(c: Ctx, d: Drawer):
    rid = _pick("decode")(c, d)
    if rid is None or c.cfg.spec_enabled:
        return None
    return O.Decode(rid, d.integer(*TOKEN_RANGE, "token"))


def _spec_decode(c: Ctx, d: Drawer):
    rid = _pick("spec_decode")(c, d)
    if rid is None or not c.cfg.spec_enabled:
        return None
    drafts = d.integer(1, c.cfg.max_drafts, "drafts")
    return O.SpecDecode(rid, drafts, d.integer(0, drafts, "accepted"),
                        d.integer(*TOKEN_RANGE, "token"))


def _close_session(c: Ctx, d: Drawer):
    sids = sorted(c.state.sessions)
    if sids and _refused(d, "close_unknown"):   # "does not exist, cannot delete"
        return O.CloseSession(c.fresh())
    return O.CloseSession(d.choice(sids, "sid")) if sids else None


def _evict(c: Ctx, d: Drawer):
    ev = c.state.evictable_size
    return O.Evict(draw_evict(d, c.cfg.page_size, ev)) if ev > 0 else None


ARGS: dict[str, Callable[[Ctx, Drawer], Optional[O.Op]]] = {
    "open_session": _open_session,
    "submit_turn": _submit_turn,
    "submit_request": _submit_request,
    "schedule": _schedule,
    "prefill_chunk": _rid_op("prefill_chunk"),
    "decode": _decode,
    "spec_decode": _spec_decode,
    "finish": _rid_op("finish"),
    "abort_queued": _abort_op("abort_queued"),
    "queue_reject": _rid_op("queue_reject"),
    "pre_abort": _abort_op("pre_abort"),
    "abort_running": _abort_op("abort_running"),
    "retract": _rid_op("retract"),
    "close_session": _close_session,
    "evict": _evict,
    "schedule_round": _schedule_round,
    "decode_round": _decode_round,
}
"""op name -> draw(ctx, drawer) -> an op with its arguments, or None when the state has
no object to act on: one entry per action of kvcheck.spec.actions.ACTIONS (a request is
picked among its `acts_on` phases). The walk draws its swarm in this order: a new entry
goes last, so the other draws stay as they were."""
assert set(ARGS) == set(ACTIONS), (
    f"gen.ARGS needs one drawer per action: missing {sorted(set(ACTIONS) - set(ARGS))}, "
    f"unknown {sorted(set(ARGS) - set(ACTIONS))}")


# -- what a run counts -------------------------------------------------------------------

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
