"""The configurations both fuzz engines draw: small pools, page sizes 1/2/4, chunking,
flags and era, then hybrid (SWA / Mamba) pools, the disabled tree and priority scheduling."""
from __future__ import annotations

from typing import Optional

from kvcheck.engines.draw import Drawer, boolean, draw_length, one_in
from kvcheck.spec.config import Config
from kvcheck.spec.pages import ceil_align

ERA_WEIGHTS = ("wrapper", "wrapper", "wrapper", "borrow")


def draw_config(d: Drawer, page_sizes=(1, 2, 4), spec_enabled: Optional[bool] = None,
                era: Optional[str] = None, accept: tuple = (), hybrid: Optional[bool] = None,
                hybrid_kinds: tuple = (), tree_off: bool = True,
                evict_shortfall: Optional[bool] = None,
                priority: Optional[bool] = None,
                filter_before_prefill: Optional[bool] = None,
                admission: Optional[str] = None) -> Config:
    """Small pools (so they fill up), page sizes 1/2/4, chunking, flags and era;
    `accept`: the recorded findings whose upstream behaviour the spec takes; `hybrid`:
    SWA / Mamba pools always (True), never (False), or one config in three (either era),
    of `hybrid_kinds` (default HYBRID_KINDS); `tree_off`: draw the disabled tree in one
    borrow-era config in six (`draw_tree_off`; False: never, as for a real release,
    `backends.config_kw`, whose hybrid kinds say where it runs one); `evict_shortfall`:
    the wrapper era's eviction rule, drawn when None (`draw_evict_shortfall`);
    `priority`: priority scheduling always (True), never (False) or drawn
    (`draw_priority_scheduling`), with `filter_before_prefill` given (a release's rule) or
    drawn; `admission`: the upstream admission rule drawn (`draw_admission`; None: either)."""
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
    if priority is not False:
        cfg = draw_priority_scheduling(d, cfg, priority, filter_before_prefill)
    return draw_admission(d, cfg, admission, filter_before_prefill)


ADMISSION_ONE_IN = 3


def draw_admission(d: Drawer, cfg: Config, rule: Optional[str] = None,
                   filter_before_prefill: Optional[bool] = None) -> Config:
    """Upstream's own PrefillAdder admission (`Config.admission`: 'reserve', or 0.5.23's
    'reserve-held-rows'; `rule` a release's, else drawn) on a non-hybrid cfg with the tree
    on, one time in ADMISSION_ONE_IN, with a chunk budget that is sometimes not a page
    multiple (what a cut chunk leaves of it then lets the round go on), and 0.5.23's filter
    of the running batch before each round (`filter_before_prefill` given, a release's rule,
    or drawn, as under priority scheduling); drawn last, so the rest of the config draws as
    before."""
    from dataclasses import replace
    if cfg.hybrid or cfg.disable_radix_cache or not one_in(d, ADMISSION_ONE_IN, "admission"):
        return cfg
    rule = rule or d.choice(("reserve", "reserve-held-rows"), "admission_rule")
    chunk = cfg.chunk_size
    if chunk is not None and cfg.page_size > 1:
        chunk += d.integer(0, cfg.page_size - 1, "chunk_slack")
    if not cfg.enable_priority_scheduling:
        filter_before_prefill = boolean(d, "filter_before_prefill") \
            if filter_before_prefill is None else filter_before_prefill
        cfg = replace(cfg, filter_before_prefill=filter_before_prefill)
    return replace(cfg, admission=rule, chunk_size=chunk)


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
