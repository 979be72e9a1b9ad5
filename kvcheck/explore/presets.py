"""The named scopes (`kvcheck explore --preset NAME`, `--list-presets`): tables of
scopes, each a Config and its argument domains; the check-impl and check-sglang-VERSION
presets are smaller copies of the check preset's scopes, listed as rows."""
from __future__ import annotations

from dataclasses import replace
from typing import Optional

from kvcheck.explore.scope import Scope, _scope

HYBRID_SCOPE = _scope(
    "check-hybrid", dict(page_size=1, num_pages=9, num_rows=2, max_context_len=16, overlap=True,
                         swa_window=1, swa_num_pages=7, mamba_slots=3, mamba_extra_buffer="lazy"),
    sessions=1, plain=1, max_live=2, prompts=((2, 2, 3),), turns=((2, 2, 2),), max_new=(4,),
    evict=(1,), max_depth=9, out_of_reach=("shared_lock",))
"""Hybrid models (spec/hybrid.py): a window of one token, smaller than a turn, freeing the
SWA KV of decoded tokens; SWA and Mamba pools small enough to run out (each request takes
its state and a lazy track entry, so the 3-slot Mamba pool never admits two requests at
once: no node is locked twice). ~8 s on one loaded core."""


HYBRID_BORROW_SCOPE = _scope(
    "hybrid-borrow", dict(page_size=2, num_pages=8, num_rows=2, max_context_len=32, era="borrow",
                          swa_window=3, swa_num_pages=7, mamba_slots=3, mamba_extra_buffer="eager"),
    sessions=1, plain=1, max_live=2, prompts=((2, 2, 3),), turns=((2, 2, 2),), max_new=(6,),
    evict=(2,), max_depth=10, out_of_reach=("shared_lock",))
"""Borrow-era (0.5.23) hybrid rules: a 3-token window on 2-token pages, so 0.5.23's
`ceil_align(max(window, P), P)` keep and the distance trigger differ from 0.5.15's; a turn
on its slot's record; Mamba state and one eager track entry per request."""


MAMBA_TREE_SCOPE = _scope(
    "mamba-tree", dict(page_size=1, num_pages=8, num_rows=2, max_context_len=16, era="borrow",
                       mamba_slots=4, mamba_tree=True),
    sessions=1, plain=1, max_live=2, prompts=((2, 2, 3),), turns=((2,), (2, 3)), max_new=(2,),
    evict=(1,), max_depth=9)
"""0.5.23's Mamba tree component (spec/mamba_tree.py): per-node states with their own lock
and LRU, the copy-on-write at a match, the checkpoint copy, the donation at finish, and a
4-slot pool small enough that a checkpoint copy or an admission evicts states."""


P1_SCOPE = _scope("p1", dict(page_size=1, num_pages=4, num_rows=2, max_context_len=16),
                  sessions=1, plain=1, max_live=2, prompts=((2, 3),), turns=((2,), (2, 2)),
                  max_new=(1, 2), evict=(1,), max_depth=12)
"""Page size 1 (every token its own page: no partial page, no alignment), no overlap."""


TWO_SESSIONS_SCOPE = _scope(
    "two-sessions", dict(page_size=2, num_pages=5, num_rows=3, max_context_len=16, overlap=True),
    sessions=2, plain=1, max_live=3, prompts=((2, 2, 3),), turns=((2,), (2, 2, 2)),
    max_new=(1, 2), evict=(2,), max_depth=12)
"""Two sessions sharing the tree with a plain request."""


PRESETS: dict[str, tuple] = {
    # `make check` (`kvcheck check`: one part per scope, the parts spread over the cores, the
    # largest first): 357,263 distinct states in all, every state within the depth bound;
    # about 100 CPU-s interpreted. Ten times the three scopes it had until December 2026
    # (check-overlap to depth 11, check-spec-borrow to 10, check-hybrid to 9: 35,480).
    "check": (
        replace(TWO_SESSIONS_SCOPE, name="check-two-sessions", max_depth=9),
        _scope("check-overlap", dict(page_size=2, num_pages=4, num_rows=2, max_context_len=16,
                                     overlap=True),
               sessions=1, plain=1, max_live=2, prompts=((2, 2, 3),), turns=((2,), (2, 2, 2)),
               max_new=(1, 2), evict=(2,), max_depth=13),
        replace(P1_SCOPE, name="check-p1", max_depth=10),
        _scope("check-spec-borrow", dict(page_size=2, num_pages=5, num_rows=2, max_context_len=16,
                                         spec_enabled=True, max_drafts=1, chunk_size=2,
                                         era="borrow"),
               sessions=1, plain=1, max_live=2, prompts=((2, 2, 3),), turns=((2,), (2, 2, 2)),
               max_new=(2,), evict=(2,), max_depth=14),
        replace(HYBRID_SCOPE, max_depth=12),
        replace(MAMBA_TREE_SCOPE, name="check-mamba-tree", max_depth=11),
        replace(HYBRID_BORROW_SCOPE, name="check-hybrid-borrow", max_depth=13),
        # P = 4 with two drafts of overshoot and 4-token chunks: a 5-token prompt is one
        # whole page (and chunk) and one token; turns of 3 and 1 tokens cross or fill a page
        _scope("check-p4-spec-chunk", dict(page_size=4, num_pages=4, num_rows=2,
                                           max_context_len=16, overlap=True, spec_enabled=True,
                                           max_drafts=2, chunk_size=4),
               sessions=1, plain=1, max_live=2, prompts=((2, 2, 3, 1, 2),),
               turns=((2, 2, 2), (2,)), max_new=(3,), evict=(4,), max_depth=13),
        # 0.5.15's MambaRadixCache (wrapper era, its era rules) with 2-token chunks
        replace(MAMBA_TREE_SCOPE, name="check-mamba-tree-0515", max_depth=11,
                cfg=replace(MAMBA_TREE_SCOPE.cfg, era="wrapper", chunk_size=2)),
    ),
    # hybrid models (spec/hybrid.py) alone
    "hybrid": (HYBRID_SCOPE, HYBRID_BORROW_SCOPE),
    # 0.5.23's Mamba tree component alone
    "mamba-tree": (MAMBA_TREE_SCOPE,),
    # the tests' scope: small enough that the unreduced run finishes too
    "tiny": (
        _scope("tiny", dict(page_size=2, num_pages=3, num_rows=2, max_context_len=16, overlap=True),
               sessions=1, plain=1, max_live=2, prompts=((2, 2, 3),), turns=((2,), (2, 2, 2)),
               max_new=(2,), evict=(), max_depth=8),
    ),
    # two sessions sharing the tree with a plain request
    "two-sessions": (TWO_SESSIONS_SCOPE,),
    # nightly (make explore-nightly): 2 sessions that can each run 3 turns, plus a plain
    # request sharing the prompt prefix; BFS as deep as a time budget allows. max_new 2:
    # the prefill samples the first token, so a request reaches decode, and with it
    # finish, abort_running and retract (max_new 1 finishes every request at its prefill)
    "nightly": (
        _scope("nightly", dict(page_size=2, num_pages=6, num_rows=3, max_context_len=16,
                               overlap=True),
               sessions=2, plain=1, max_live=3, prompts=((2, 2, 3),), turns=((2,), (2, 2, 2)),
               max_new=(2,), evict=(2,), max_depth=26),
    ),
    # the benchmark's fixed scope
    "bench": (
        _scope("bench", dict(page_size=2, num_pages=4, num_rows=2, max_context_len=16, overlap=True),
               sessions=1, plain=1, max_live=2, prompts=((2, 2, 3),), turns=((2,), (2, 2, 2)),
               max_new=(1, 2), evict=(2,), max_depth=11),
    ),
    "p1": (P1_SCOPE,),
}


def preset_scope(preset: str, name: str) -> Scope:
    """The scope of that name in a preset."""
    return next(sc for sc in PRESETS[preset] if sc.name == name)


CHECK_IMPL = (("impl-tiny", "tiny", "tiny", 8, {}),
              ("impl-hybrid", "check", "check-hybrid", 7, {}),
              ("impl-p4-spec-chunk", "check", "check-p4-spec-chunk", 7, {}),
              ("impl-spec-borrow", "check", "check-spec-borrow", 7, {}),
              ("impl-hybrid-borrow", "check", "check-hybrid-borrow", 7,
               {"swa_eviction_interval": 2}),
              ("impl-hybrid-borrow-pa", "check", "check-hybrid-borrow", 7,
               {"prefill_aware_swa": True}),
              ("impl-mamba-tree", "check", "check-mamba-tree", 6, {}),
              ("impl-mamba-tree-0515", "check", "check-mamba-tree-0515", 6, {}))
"""`make check`'s exhaustive differential (`kvcheck explore --preset check-impl --backend
impl`, kvcheck/engines/exhaustive.py): (name, preset, scope, depth, config changes) of the
smaller scopes whose every transition runs on the spec and impl side by side: the check
preset's kinds of configuration, fewer steps; the borrow-era hybrid one twice, with an
eviction interval of 2 (0.5.23's distance rule and 0.5.15's step count then differ) and
with 0.5.23's prefill-aware SWA (the floor under the window eviction)."""


def _smaller(name: str, preset: str, scope: str, depth: int, cfg_kw: dict,
             scope_kw: Optional[dict] = None) -> Scope:
    sc = preset_scope(preset, scope)
    return replace(sc, max_depth=depth, name=name, cfg=replace(sc.cfg, **cfg_kw),
                   **(scope_kw or {}))


PRESETS["check-impl"] = tuple(_smaller(*x) for x in CHECK_IMPL)

_NO_MAMBA = {"mamba_slots": 0, "mamba_extra_buffer": "off"}
_TWO_SESSIONS = {"plain": 0, "max_live": 2, "max_new": (2,)}
"""Two sessions sharing their first prompt in the tree (check-two-sessions, smaller)."""
_P1 = {"page_size": 1, "num_pages": 6}
CHECK_SGLANG = {
    "0.5.15": (("sglang-tiny", "tiny", "tiny", 8, {}),
               ("sglang-p1", "tiny", "tiny", 7, _P1),
               ("sglang-p4-spec-chunk", "check", "check-p4-spec-chunk", 7, {}),
               ("sglang-swa", "check", "check-hybrid", 6, _NO_MAMBA),
               ("sglang-mamba-tree", "check", "check-mamba-tree-0515", 6, {}),
               ("sglang-two-sessions", "check", "check-two-sessions", 7, {}, _TWO_SESSIONS)),
    "0.5.23": (("sglang-tiny", "tiny", "tiny", 8, {"era": "borrow"}),
               ("sglang-p1", "tiny", "tiny", 7, {"era": "borrow", **_P1}),
               ("sglang-spec-borrow", "check", "check-spec-borrow", 7, {}),
               ("sglang-swa", "check", "check-hybrid-borrow", 6, _NO_MAMBA),
               ("sglang-mamba-tree", "check", "check-mamba-tree", 6, {}),
               ("sglang-two-sessions", "check", "check-two-sessions", 7, {"era": "borrow"},
                _TWO_SESSIONS)),
}
"""`make check-sglang`'s exhaustive differential against each release (`kvcheck explore
--preset check-sglang-VERSION --backend sglang:VERSION`): check-impl's kinds of
configuration in the release's era and the hybrid models its adapter drives (SWA without
a Mamba pool; 0.5.15's MambaRadixCache, 0.5.23's Mamba tree component), page sizes 1, 2
and 4, speculative overshoot and chunked prefill, and two sessions sharing their first
prompt in the tree. About a minute and a half per release here."""

CHECK_SGLANG["0.5.14"] = tuple(x for x in CHECK_SGLANG["0.5.15"] if x[0] != "sglang-swa")
"""0.5.14, the release before the seed's: 0.5.15's scopes but SWA, whose tree differs there
(the adapter refuses it, adapters/sglang/hybrid.py)."""

CHECK_SGLANG["0.5.16"] = tuple(x for x in CHECK_SGLANG["0.5.15"]
                               if x[0] not in ("sglang-swa", "sglang-mamba-tree"))
"""0.5.16-0.5.18 keep 0.5.15's session design (the request's allocated length and SWA
cursor moved into a `ReqKvInfo` record, `req.kv`, that the slot copies): 0.5.15's scopes but
the hybrid trees, which are unified there (the adapter refuses them,
adapters/sglang/hybrid.py `spec_wrapper_trees`)."""

def _with_cfg(entry: tuple, **cfg_kw) -> tuple:
    """A CHECK_SGLANG entry (name, preset, scope, depth, cfg_kw[, scope_kw]) with more
    configuration fields."""
    return entry[:4] + ({**entry[4], **cfg_kw},) + entry[5:]


CHECK_SGLANG["0.5.17"] = CHECK_SGLANG["0.5.18"] = tuple(
    _with_cfg(x, evict_shortfall=True) for x in CHECK_SGLANG["0.5.16"])
"""0.5.17-0.5.18: 0.5.16's scopes with their eviction rule (`evict_from_tree_cache` asks for
the shortfall only, `Config.evict_shortfall`)."""

CHECK_SGLANG["0.5.19"] = CHECK_SGLANG["0.5.18"]
"""0.5.19: 0.5.18's scopes. Its slot and turn share one `ReqKvInfo` (the slot takes the first
turn's record, `Req.detach_kv`; a later turn runs on the slot's), which the adapter reads
back as 0.5.18's copy (adapters/sglang/backend.py `_note_slot_copies`); with one turn on a
record at a time the bookkeeping is the wrapper era's with the shortfall eviction, and a
state with two (only past accepted U1/U2) is past the model (`past_model`, R1;
docs/upstream-findings.md, "Releases between"). 0.5.20-0.5.21 are refused (their
RadixCache splits a finished request's path at the prompt boundary)."""

CHECK_SGLANG["0.5.22"] = tuple(
    _with_cfg(x, swa_window=4) if x[0] == "sglang-swa" else x for x in CHECK_SGLANG["0.5.23"])
"""0.5.22, the first borrow-era release: 0.5.23's scopes, the SWA one with a window of 4
on 2-token pages, which keeps 4 tokens in both releases (0.5.23's window 3 keeps
`ceil_align(3, 2)` = 4 there and 3 in 0.5.22, which the adapter refuses:
adapters/sglang/hybrid.py `spec_swa_keep`)."""

for _version, _scopes in CHECK_SGLANG.items():
    PRESETS[f"check-sglang-{_version}"] = tuple(_smaller(*x) for x in _scopes)
