"""Configuration of one checked system: pool sizes, page size, scheduler flags, era.

Every driver (the spec, impl/, upstream adapters, the explorer) is built from one
`Config`; an invalid one is refused with a message that says which field and why.
"""
from __future__ import annotations

import typing
from dataclasses import asdict, dataclass, fields
from typing import Annotated, Literal, Optional

from kvcheck.spec.fields import (MAX_CONTEXT, MAX_DRAFTS, MAX_PAGE_SIZE, MAX_PAGES, MAX_PRIORITY, MAX_ROWS,
                                 Range, field_error)

Era = Literal["wrapper", "borrow"]
ERAS = typing.get_args(Era)
"""`wrapper`: sglang 0.5.11-0.5.21 (`StreamingSession(RadixCache)`, the seed):
a mid-abort releases all session KV through `release_session`, no tree insert.
`borrow`: sglang 0.5.22+ (session inside `UnifiedRadixCache`): a mid-abort drops the
slot's lock and releases the aborted turn like any request, checkpointing its
committed prefix into the radix tree."""


ACCEPTABLE = {
    "U1": "H3: the rejected stub's detach (find_active_slot) clears another turn's _inflight",
    "U2": "H4: retract runs finish_req (checkpoint advances, _inflight cleared)",
    "U3": "H5 (0.5.15): a queued abort of a streaming turn makes no session call",
    "U6": "0.5.23: a queue drop (_release_aborted_request) of a rejected stub clears _inflight",
    "U7": "0.5.22+: a rejected stub admitted in the round of its session's first turn meets "
          "the slot that turn took (StreamingSession.take asserts 'already has a slot')",
    "U8": "0.5.14-0.5.18 (wrapper era): a rejected stub admitted in the round where its session's "
          "first turn finishes releases that turn's new slot in its place and leaks its own "
          "row and KV",
    "U9": "priority scheduling: a preempted streaming turn keeps its row in its session's slot, "
          "yet the request it was preempted for is admitted without one and alloc_req_slots "
          "raises (the scheduler dies)",
    "M2": "0.5.23 (hybrid SSM): a queued turn on its slot's record, aborted, is finished "
          "(release_kv_cache -> try_cache_finished_req -> finish_req): its tokens become the "
          "checkpoint",
}
"""Recorded upstream findings (docs/upstream-findings.md) whose known behaviour the spec
takes instead of the fix when `Config.accept` names them (`--accept U1,U2`)."""
Accepted = Literal["U1", "U2", "U3", "U6", "U7", "U8", "U9", "M2"]
assert set(typing.get_args(Accepted)) == set(ACCEPTABLE)


MambaExtraBuffer = Literal["off", "eager", "lazy"]
Admission = Literal["pages", "reserve", "reserve-held-rows"]
HYBRID_DEFAULTS = {"swa_window": 0, "swa_num_pages": None, "swa_eviction_interval": 1,
                   "mamba_slots": 0, "mamba_extra_buffer": "off", "prefill_aware_swa": False}
"""The hybrid fields and their off values: a trace of a non-hybrid run omits them."""
TREE_DEFAULTS = {"disable_radix_cache": False, "mamba_tree": False}
"""The tree's settings at their default: a trace omits them at these values."""
ALLOCATOR_DEFAULTS = {"need_sort": True, "debug_mode": False}
"""The KV allocator's settings and the values traces written before them ran with: a
trace omits them at these values."""
SCHEDULE_DEFAULTS = {"admission": "pages", "enable_priority_scheduling": False,
                     "priority_scheduling_preemption_threshold": 10,
                     "filter_before_prefill": False}
"""The scheduler's policy switches at their default: a trace omits them at these values."""
RUN_DEFAULTS = {"drain": False}
"""How a run ends: a trace omits it at this value."""


class ConfigError(ValueError):
    """A configuration that no driver can run."""


@dataclass(frozen=True)
class Config:
    page_size: Annotated[int, Range(1, MAX_PAGE_SIZE)] = 1
    num_pages: Annotated[int, Range(1, MAX_PAGES)] = 16
    """KV pages 1..num_pages are allocatable; page 0 is reserved (dummy writes)."""
    num_rows: Annotated[int, Range(1, MAX_ROWS)] = 4
    """Rows of `req_to_token` (request-pool size)."""
    max_context_len: Annotated[int, Range(2, MAX_CONTEXT)] = 64
    chunk_size: Optional[Annotated[int, Range(1, MAX_CONTEXT)]] = None
    """Chunked-prefill budget in tokens (`chunked_prefill_size`); None disables it."""
    spec_enabled: bool = False
    """Speculative decoding: `SpecDecode` over-allocates and accepts drafts."""
    max_drafts: Annotated[int, Range(1, MAX_DRAFTS)] = 3
    overlap: bool = False
    """Overlap scheduler: the step after the last one is already prepared at
    finish/retract, so committed == seqlen there (DOMAIN.md section 2.5)."""
    era: Era = "wrapper"
    accept: tuple[Accepted, ...] = ()
    """Recorded findings (ids of ACCEPTABLE) whose upstream behaviour the spec takes, so a
    differential run drives their paths; () is the fixed behaviour everywhere."""
    swa_window: Annotated[int, Range(0, MAX_CONTEXT)] = 0
    """Hybrid SWA model: `sliding_window_size` in tokens; 0 = no SWA layers (spec/swa_pool.py)."""
    swa_num_pages: Optional[Annotated[int, Range(1, MAX_PAGES)]] = None
    """Pages of the SWA KV pool (`size_swa // page_size`); None = num_pages."""
    swa_eviction_interval: Annotated[int, Range(1, 1024)] = 1
    """`SGLANG_SWA_EVICTION_INTERVAL`: out-of-window SWA KV is freed in decode batches whose
    forward_iter is a multiple of it (upstream default 128)."""
    prefill_aware_swa: bool = False
    """0.5.23's `model_runner.prefill_aware_swa` (borrow era, SWA only): every prefill batch
    sets `req.kv.swa_evict_floor = req.extend_end` (`Scheduler.get_new_batch_prefill`), and
    window eviction never frees SWA KV below it (`ReqKvInfo.swa_dead_lo`)."""
    mamba_slots: Annotated[int, Range(0, MAX_ROWS * 4)] = 0
    """Hybrid SSM model: Mamba state slots (`MambaSlotAllocator` size; slot 0 is the
    reserved dummy); 0 = no Mamba layers."""
    mamba_extra_buffer: MambaExtraBuffer = "off"
    """The ping-pong track buffers: `eager` allocates 2 slots under overlap (else 1) with
    the request's state, `lazy` allocates 1 and leaves the second -1 (the sentinel)."""
    disable_radix_cache: bool = False
    """`--disable-radix-cache`, borrow era only: 0.5.22+ keeps `UnifiedRadixCache` with
    `disable` set, whose match finds nothing, whose checkpoints insert nothing and whose
    release frees the whole row; the streaming slots work as with the tree on (0.5.15
    builds a `ChunkCache` instead: not modelled). A hybrid SSM model's tree then keeps
    no Mamba state (adapters/sglang/hybrid.py)."""
    mamba_tree: bool = False
    """The Mamba tree (with `mamba_slots`): tree nodes keep Mamba states
    (spec/mamba_tree.py): 0.5.23's `UnifiedRadixCache` MAMBA component (borrow era),
    0.5.15's `MambaRadixCache` under the `StreamingSession` wrapper (wrapper era). Off:
    the tree keeps none and a plain release frees the request's state (the pairing
    kvcheck drove before; not a production one with the radix cache on,
    adapters/sglang/hybrid.py). Needs page_size 1, no extra buffer (upstream asserts page
    1 without it; the extra buffer's checkpoints are placed by the forward's tracking),
    no SWA (not modelled together), and in the borrow era no chunked prefill (0.5.23's
    chunked checkpoints are not modelled; 0.5.15's are)."""
    evict_shortfall: bool = False
    """Wrapper era: `evict_from_tree_cache` asks the tree for the allocation's shortfall
    only, `n - available_size()` (sglang 0.5.17+, `mem_cache/common.py`: "evict only the
    shortfall"), where 0.5.14-0.5.16 ask for the whole `n` (False). The borrow era always
    evicts the shortfall (0.5.22+ `evict_to_free_tokens`), and so does the wrapper era's SWA
    allocator (each pool's shortfall): the field changes neither."""
    need_sort: bool = True
    """The KV allocator's `need_sort`: freed pages wait in `release_pages` and are merged
    and sorted into `free_pages` when an allocation runs short (upstream sets it under
    PD disaggregation); False: freed pages go straight to the front of `free_pages` (the
    default server). Page ids differ, ownership does not: the spec ignores it."""
    debug_mode: bool = False
    """`SGLANG_DEBUG_MEMORY_POOL`: the allocator asserts on every free (no duplicate page
    in the free lists) and on each alloc's congruence; a violation is an exception (E1)
    instead of the concrete check C2/C3 one step later. The spec ignores it."""
    admission: Admission = "pages"
    """The prefill round's admission rule (spec/admission.py). `pages`: a request is
    admitted when the round's new pages fit available + evictable, and the chunked request
    continues when its chunk does. `reserve`: upstream's own `PrefillAdder` budget
    (0.5.14-0.5.22): each admitted request reserves its page-ceiled extend, a page and
    (unless chunked) `min(max_new_tokens, CLIP)` of decode headroom, and the running batch
    its remaining output; a request is admitted when its whole remaining input,
    remaining output and a page are strictly below available + evictable less those
    reservations (NO_TOKEN ends the round); a new chunk ends at a page boundary of the
    sequence; the chunked request always continues, cut to what the budget has left; the
    rows are counted before each match, every admitted request against the free rows.
    `reserve-held-rows`: the same as 0.5.23 runs it: rows a request of the round already
    holds are added back to the free rows, and a spent chunk budget ends the round before
    the next match. Not with the hybrid pools or a disabled tree (upstream's
    `add_one_req_ignore_eos` path)."""
    enable_priority_scheduling: bool = False
    """`--enable-priority-scheduling` (preemption on, `schedule_low_priority_values_first`
    off): requests carry a `priority`, and a prefill round whose rows are spent preempts
    running requests of lower priority (`PrefillAdder.preempt_to_schedule`). Not with the
    hybrid pools."""
    priority_scheduling_preemption_threshold: Annotated[int, Range(0, MAX_PRIORITY)] = 10
    """`--priority-scheduling-preemption-threshold`: a running request is preempted only
    by one whose priority exceeds its own by more than this."""
    filter_before_prefill: bool = False
    """0.5.23's scheduler filters the finished requests out of the running batch before
    every prefill round (scheduler.py l.3963-3968); before it (False) a request that
    finished in the last decode step is still in the batch when the next round admits
    (the two-phase finish), counted by the PrefillAdder's budget and skipped by
    preemption. Read under priority scheduling and `admission` 'reserve' only."""
    drain: bool = False
    """The run ends with a drain (spec/progress.py): after the trace's operations the
    scheduler runs alone, with no new request, until every request is finished or released
    and every session closed; not idle within the bound is P1. Each drain operation is
    applied and compared like any other step. The systems under test ignore the field."""

    def __post_init__(self) -> None:
        if isinstance(self.accept, list):       # from JSON
            object.__setattr__(self, "accept", tuple(self.accept))
        err = field_error(self, "config")      # each field's declared type and range
        if err:
            raise ConfigError(err)
        if self.max_context_len % self.page_size:
            raise ConfigError(
                f"config.max_context_len ({self.max_context_len}) must be a multiple of "
                f"page_size ({self.page_size})")
        if self.chunk_size is not None and self.chunk_size < self.page_size:
            raise ConfigError(
                f"config.chunk_size ({self.chunk_size}) must be >= page_size ({self.page_size}): "
                "a chunk is truncated to whole pages and would make no progress")

        hybrid_error = _hybrid_error(self)
        if hybrid_error:
            raise ConfigError(hybrid_error)

    @property
    def swa_pages(self) -> int:
        """SWA pool pages (1..swa_pages are allocatable)."""
        return self.num_pages if self.swa_num_pages is None else self.swa_num_pages

    @property
    def hybrid(self) -> bool:
        return bool(self.swa_window or self.mamba_slots)

    @property
    def aliases_token_arrays(self) -> bool:
        """Upstream's in-place token arrays (`Session._share_token_arrays`) matter only
        once a live turn shares the arrays a new turn is built on, which U1 and U2 allow;
        accepting either takes that consequence too (the fixed spec gives each request
        its own)."""
        return "U1" in self.accept or "U2" in self.accept

    @property
    def total_tokens(self) -> int:
        """`max_total_num_tokens`: every allocatable KV slot, in tokens."""
        return self.num_pages * self.page_size

    def to_json(self) -> dict:
        d = asdict(self)
        for k, off in {**HYBRID_DEFAULTS, **TREE_DEFAULTS, **ALLOCATOR_DEFAULTS,
                       **SCHEDULE_DEFAULTS, **RUN_DEFAULTS}.items():  # older traces stay as they were
            if d[k] == off:
                del d[k]
        return d

    @classmethod
    def from_json(cls, data: dict) -> "Config":
        if not isinstance(data, dict):
            raise ConfigError(f"config must be a JSON object, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown config field(s) {unknown}; known: {sorted(known)}")
        return cls(**data)


def _hybrid_error(cfg: "Config") -> Optional[str]:
    """Why the hybrid fields of cfg cannot run together, or None."""
    if cfg.enable_priority_scheduling and cfg.hybrid:
        return ("config.enable_priority_scheduling is not modelled with the hybrid pools "
                "(swa_window, mamba_slots)")
    if cfg.admission != "pages" and (cfg.hybrid or cfg.disable_radix_cache):
        return (f"config.admission {cfg.admission!r} is modelled without the hybrid pools "
                "(swa_window, mamba_slots) and with the radix tree on (disable_radix_cache)")
    if not cfg.swa_window and cfg.swa_num_pages is not None:
        return "config.swa_num_pages needs config.swa_window >= 1 (0 = no SWA pool)"
    if cfg.prefill_aware_swa and not (cfg.swa_window and cfg.era == "borrow"):
        return ("config.prefill_aware_swa needs config.swa_window >= 1 and era='borrow' "
                "(0.5.15 has no prefill-aware SWA)")
    if not cfg.mamba_slots and cfg.mamba_extra_buffer != "off":
        return "config.mamba_extra_buffer needs config.mamba_slots >= 1 (0 = no Mamba pool)"
    if cfg.disable_radix_cache and cfg.era != "borrow":
        return ("config.disable_radix_cache needs era='borrow' (0.5.15's disabled cache is a "
                "ChunkCache, which kvcheck does not model)")
    if cfg.mamba_tree:
        why = _mamba_tree_error(cfg)
        if why:
            return f"config.mamba_tree needs {why}"
    if cfg.mamba_extra_buffer == "lazy" and cfg.spec_enabled:
        return ("config.mamba_extra_buffer 'lazy' with spec_enabled: upstream refuses it "
                "(server_args: extra_buffer_lazy unsupported with spec); use 'eager' or 'off'")
    return None


def _mamba_tree_error(cfg: "Config") -> Optional[str]:
    """The first setting that config.mamba_tree cannot run with, or None."""
    for bad, why in ((not cfg.mamba_slots, "config.mamba_slots >= 1"),
                     (cfg.disable_radix_cache, "disable_radix_cache=False (a disabled tree keeps no state)"),
                     (cfg.page_size != 1, "page_size 1 (MambaComponent and 0.5.15's MambaRadixCache "
                      "assert it without the extra buffer)"),
                     (cfg.mamba_extra_buffer != "off", "mamba_extra_buffer 'off' (the track buffers' "
                      "checkpoint seqlens are set by the forward, not modelled)"),
                     (cfg.chunk_size is not None and cfg.era == "borrow",
                      "chunk_size None in the borrow era (0.5.23's chunked checkpoints not modelled)"),
                     (cfg.swa_window != 0, "swa_window 0 (SWA and Mamba components together not modelled)")):
        if bad:
            return why
    return None
