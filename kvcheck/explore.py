"""Exhaustive bounded exploration of the spec (`kvcheck explore`): an explicit-state model
checker in the style of TLC / Stateright that runs on the Python spec itself.

    kvcheck explore [--preset NAME] [--page-size P --pages N --rows R --sessions S ...]

- Breadth-first from `spec.model.initial_state`, so the first counterexample found is a
  shortest one. It is written as a trace file (kvcheck/trace.py format, expect = the
  violation id and step, backend "spec") that `kvcheck replay` runs on the spec and impl.
- The operations tried in a state are drawn from bounded argument domains (the scope:
  which sids and rids, prompt shapes, tokens, evict sizes) and filtered by the spec's own
  guard `spec.model.enabled`; their effect is `spec.model.step`. Nothing here re-states
  the model.
- Every state passes `check_state` (evaluated once per equivalence class: the invariants
  do not depend on ids) and every transition `check_step`, exactly as `run_ops` does, so
  a counterexample replays to the same invariant at the same step.
- Symmetry reduction: page ids, row ids, session ids and request ids are interchangeable;
  `state_key` renames them canonically before hashing. The key is complete for the
  spec's future (see `state_key` for what it omits and why that is dead data).
- Reachability ("sometimes") goals: every operation and outcome, and the situations in
  `SITUATIONS`, detected from (before, op, outcome, after) states; the report says at
  which depth each was first reached, or that the scope missed it.
"""
from __future__ import annotations

import argparse
import gc
import itertools
import sys
import time
from array import array
from bisect import bisect_left, bisect_right
from collections import Counter, deque
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Optional

from kvcheck import argtypes as T
from kvcheck.errors import ROOT as PROJECT
from spec import hybrid as H
from spec import model as M
from spec import ops as O
from spec.config import ERAS, Config, ConfigError
from kvcheck.fast_invariants import applies as applies_fast
from kvcheck.fast_invariants import state_clean
from spec.invariants import STATE_INVARIANTS, STEP_INVARIANTS, check_state, check_step
from spec.state import ROOT, State
from spec.view import abstract

SPEC_ASSERTION = "M1"      # an upstream assertion the spec reached (kvcheck.checker's id)
SPEC_EXCEPTION = "E1"      # the spec itself raised something else (a defect in spec/)


# ---------------------------------------------------------------------------
# the scope
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Scope:
    """What one exploration covers: a Config and the bounded argument domains."""
    cfg: Config
    sessions: int = 1                 # session ids 1..sessions
    plain: int = 1                    # plain requests live at once (0: none)
    max_live: int = 2                 # requests (turns, stubs, plain) live at once
    prompts: tuple = ((2, 3),)        # plain request prompts
    turns: tuple = ((2,),)            # new_tokens of a session turn
    max_new: tuple = (1, 2)           # max_new_tokens choices
    decode_tokens: tuple = (1,)       # Decode / SpecDecode token choices
    evict: tuple = ()                 # Evict(num_tokens) choices (() = no evict op)
    reject: bool = True               # also try Schedule(admit=False)
    max_depth: int = 12
    name: str = "custom"
    out_of_reach: tuple = ()          # situation ids the scope cannot reach, by design

    def describe(self) -> str:
        c = self.cfg
        flags = [f"P={c.page_size}", f"pages={c.num_pages}", f"rows={c.num_rows}",
                 f"ctx={c.max_context_len}", f"era={c.era}"]
        if c.chunk_size is not None:
            flags.append(f"chunk={c.chunk_size}")
        if c.spec_enabled:
            flags.append(f"spec(max_drafts={c.max_drafts})")
        if c.overlap:
            flags.append("overlap")
        return (f"{self.name}: {' '.join(flags)}; sessions={self.sessions} plain={self.plain} "
                f"max_live={self.max_live} prompts={_fmt_words(self.prompts)} "
                f"turns={_fmt_words(self.turns)} max_new={list(self.max_new)} "
                f"decode_tokens={list(self.decode_tokens)} evict={list(self.evict)} "
                f"reject={self.reject} depth<={self.max_depth}")


def _fmt_words(ws) -> str:
    return "[" + " ".join("".join(map(str, w)) if all(t < 10 for t in w) else
                          ",".join(map(str, w)) for w in ws) + "]"


def words(alphabet, lengths) -> tuple:
    """Every token sequence over `alphabet` with a length in `lengths`."""
    return tuple(w for n in lengths for w in itertools.product(alphabet, repeat=n))


def _scope(name, cfg_kw, **kw) -> Scope:
    return Scope(cfg=Config(**cfg_kw), name=name, **kw)


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


# ---------------------------------------------------------------------------
# canonical state key (symmetry reduction)
# ---------------------------------------------------------------------------

def _b(x) -> int:
    return 1 if x else 0


SIGNATURE_ORDER = hash
"""How state_key orders sessions and requests by their id-free signatures. hash() is
fast but, on Python 3.11, hashes None by address, so the representative a key names can
differ between processes (never the reduction's soundness); repr is the same in every
process (tests comparing state sets across processes set it)."""


def req_sig(r) -> tuple:
    """A request's id-free signature in `state_key`: every field the spec reads, its ids,
    row and anchor node left to the caller (which labels them)."""
    ln = r.last_node
    if ln is None:
        anc = 0
    elif ln[0] == "virtual":
        anc = 1
    elif r.locked:
        anc = 2
    else:
        anc = 3
    return (r.streaming, r.rejected, r.origin, tuple(r.output), r.max_new_tokens, r.phase,
            r.row is None, r.committed, r.allocated, r.protected, anc, r.locked, r.to_finish,
            r.finished_reason, r.finished_len, r.committed_freed, r.overallocated_freed,
            r.is_retracted, r.extend_end, r.logprob_start)


def state_key(s: State, symmetric: bool = True) -> tuple:
    """A hashable key such that two states with the same key have the same future up to
    renaming of page, row, session and request ids.

    Included: every field the spec reads, with ids renamed: tree nodes by key path (node
    ids are not observable), their pages, lock_ref and the *rank* of their access tick
    (eviction order is (tick, path); new ticks always exceed old ones, so only the order
    matters); the allocator's free pages as a multiset (the allocator takes the lowest
    free page, but free pages nothing else names are interchangeable); free rows as a
    multiset (same argument); each held row's page ids on row-pages [0, ceil(allocated/P))
    of its holders; the KV content of every page that is not unreferenced-and-free; every
    request, slot and session field.

    Left out, as dead data no step reads before writing it: row entries at or past a
    holder's allocated length and the entries of free rows (a row is rewritten when it is
    handed out); `req.prefix_pages` and `req.prefix_len` (written by the match of the
    same `schedule` that reads them); a request's radix `last_node` when it holds no lock
    through it (a rejected admission: the next schedule matches again; only "is it None"
    is read, by the pre_abort guard); `next_node_id` and the global tick.

    Requests and sessions are ordered by an id-free signature (sessions first, with the
    signatures of their requests), pages and rows by first appearance in a fixed walk
    (nodes by path, then rows of requests, then of slots). Ties between entities with
    equal signatures may leave two isomorphic states with different keys (less reduction,
    never a wrong merge). symmetric=False keeps every id as it is (no reduction)."""
    P = s.cfg.page_size
    reqs = dict(s.reqs)             # plain snapshots: reading copies nothing (spec.state.CowMap)
    sessions = dict(s.sessions)
    slots = dict(s.slots)

    # ---- sessions and requests
    sid_set = set(sessions)
    sid_set.update(slots)
    for r in reqs.values():
        if r.session is not None:
            sid_set.add(r.session)
        ln = r.last_node
        if ln is not None and ln[0] == "virtual":
            sid_set.add(ln[1])

    rsig = {}
    for rid, r in reqs.items():
        rsig[rid] = req_sig(r)
    if symmetric and len(sid_set) <= 1 and len(reqs) <= 1:
        sid_l = dict.fromkeys(sid_set, 1)
        rid_order = list(reqs)
        rid_l = dict.fromkeys(rid_order, 1)
    elif symmetric:
        def sess_sig(sid):
            x = sessions.get(sid)
            t = slots.get(sid)
            order = SIGNATURE_ORDER
            att = sorted(order(rsig[r.rid]) for r in reqs.values() if r.session == sid)
            return order((None if x is None else (x.inflight_rid is not None, x.checkpoint,
                                                 x.close_pending),
                         None if t is None else (t.row is None, t.committed, t.allocated,
                                                 t.protected, t.last_node is None),
                         tuple(att)))
        sid_order = sorted(sid_set, key=sess_sig) if len(sid_set) > 1 else list(sid_set)
        sid_l = {sid: i + 1 for i, sid in enumerate(sid_order)}
        rid_order = sorted(reqs, key=lambda rid: SIGNATURE_ORDER((rsig[rid],
                                                                  sid_l.get(reqs[rid].session))))
        rid_l = {rid: i + 1 for i, rid in enumerate(rid_order)}
    else:
        sid_l = {sid: sid for sid in sorted(sid_set)}
        rid_order = sorted(reqs)
        rid_l = {rid: rid for rid in rid_order}

    # ---- nodes (path, pages, lock_ref, tick rank), then rows of requests and slots
    nodes = s.nodes
    node_key, pages = _tree_key(nodes, symmetric)
    row_alloc: dict = {}
    for r in reqs.values():
        if r.row is not None:
            row_alloc[r.row] = max(row_alloc.get(r.row, 0), r.allocated)
    for t in slots.values():
        if t.row is not None:
            row_alloc[t.row] = max(row_alloc.get(t.row, 0), t.allocated)
    rows: dict = {}
    row_keys = []
    srows = s.rows

    def rl(row):
        if row is None:
            return None
        v = rows.get(row)
        if v is None:
            v = rows[row] = (len(rows) if symmetric else row)
            held = dict.__getitem__(srows, row)[:-(-row_alloc[row] // P)]
            if symmetric:
                lab = []
                for p in held:
                    if p is not None:
                        q = pages.get(p)
                        if q is None:
                            q = pages[p] = len(pages) + 1
                        p = q
                    lab.append(p)
                row_keys.append((v, tuple(lab)))
            else:
                for p in held:
                    if p is not None:
                        pages[p] = p
                row_keys.append((v, tuple(held)))
        return v

    def anchor(ln, locked):
        if ln is None:
            return None
        if ln[0] == "virtual":
            return ("v", sid_l.get(ln[1]))
        if not locked:
            return ("stale",)
        n = dict.get(nodes, ln[1])
        return ("gone", ln[1]) if n is None else ("n", n.path)

    req_key = []
    for rid in rid_order:
        r = reqs[rid]
        req_key.append((rid_l[rid], sid_l.get(r.session), rsig[rid], rl(r.row),
                        anchor(r.last_node, r.locked)))
    # loops, not generator expressions, where rl and anchor are called: a closure that a
    # generator captures is held by the scope it closes over in the Cython build (one
    # scope object per function), a reference cycle per call that the paused collector
    # never frees (tests/test_compiled.py counts them)
    slot_key = []
    for sid, t in (sorted(slots.items(), key=lambda x: sid_l[x[0]]) if len(slots) > 1
                   else slots.items()):
        slot_key.append((sid_l[sid], rl(t.row), t.committed, t.allocated, t.protected,
                         anchor(t.last_node, True)))
    sess_key = tuple(
        (sid_l[sid], None if x.inflight_rid is None else rid_l.get(x.inflight_rid, ("dead",)),
         x.checkpoint, x.close_pending)
        for sid, x in (sorted(sessions.items(), key=lambda x: sid_l[x[0]]) if len(sessions) > 1
                       else sessions.items()))

    content = s.content
    if symmetric:               # map and zip: no per-call comprehension frames
        free_key = tuple(sorted(map(pages.get, s.free_pages, itertools.repeat(0))))
        content_key = tuple(zip(pages.values(), map(content.get, pages)))
        free_rows = tuple(sorted(map(rows.get, s.free_rows, itertools.repeat(-9))))
    else:
        free_key = tuple(s.free_pages)
        content_key = tuple(sorted(content.items()))
        free_rows = tuple(s.free_rows)
    key = (node_key, tuple(req_key), tuple(slot_key), sess_key, tuple(row_keys), content_key,
           free_key, free_rows, s.evictable_size, s.protected_size)
    return key + (_hybrid_key(s, pages, rid_l, sid_l),) if s.cfg.hybrid else key


def _tree_key(tree, symmetric: bool) -> tuple:
    """The tree's part of `state_key`: (node key, the page labels it gave, as a fresh dict
    the caller extends). Nodes by path with their pages, lock_ref and tick rank; pages
    labelled by first appearance. Kept on the node map (`CowMap._memo`): a successor
    whose step touched no node shares its parent's map and reuses it, so the key of such
    a successor costs nothing for the tree."""
    memo = tree._memo
    if memo is not None and memo[0] is symmetric:
        return memo[1], dict(memo[2])
    node_list = sorted(((n.path, n) for nid, n in dict.items(tree) if nid != ROOT),
                       key=_first)
    trank = {t: i for i, t in enumerate(sorted({n.tick for _, n in node_list}))}
    pages: dict = {}
    if symmetric:
        for _, n in node_list:
            for p in n.pages:
                if p is not None and p not in pages:
                    pages[p] = len(pages) + 1
        get = pages.get
        node_key = tuple((pth, tuple(get(p) for p in n.pages), n.lock_ref, trank[n.tick])
                         for pth, n in node_list)
    else:
        for _, n in node_list:
            for p in n.pages:
                if p is not None:
                    pages[p] = p
        node_key = tuple((pth, tuple(n.pages), n.lock_ref, trank[n.tick])
                         for pth, n in node_list)
    tree._memo = (symmetric, node_key, pages)
    return node_key, dict(pages)


def _first(x):
    return x[0]


def _hybrid_key(s: State, pages: dict, rid_l: dict, sid_l: dict) -> tuple:
    """The hybrid fields (spec/hybrid.py) under the same renaming: SWA pages by the full
    page that maps to them, Mamba slots by first appearance; a page nothing else labels
    keeps its id (less reduction, never a wrong merge)."""
    swa = {}
    smap = tuple(sorted((pages.get(f, ("id", f)), swa.setdefault(w, len(swa) + 1))
                        for f, w in sorted(s.full_to_swa_index_mapping.items(),
                                           key=lambda x: repr(pages.get(x[0], ("id", x[0]))))))
    mamba = {-1: -1}
    tree = ()
    if s.cfg.mamba_tree:                # per node: its state (labelled first), Mamba lock, LRU rank
        held = sorted((n.path, n) for n in dict.values(s.nodes) if n.mamba_value is not None
                      or n.mamba_lock_ref)
        mrank = {t: i for i, t in enumerate(sorted({n.mamba_tick for _, n in held}))}
        tree = tuple((pth, None if n.mamba_value is None else mamba.setdefault(n.mamba_value, len(mamba)),
                      n.mamba_lock_ref, mrank[n.mamba_tick]) for pth, n in held)
    if H.swa_lru_on(s):         # 0.5.23's SWA LRU: each SWA holder's rank
        live = sorted((n.path, n.swa_tick) for n in dict.values(s.nodes)
                      if n.id and H.swa_tokens(s, n))
        srank = {t: i for i, t in enumerate(sorted({t for _, t in live}))}
        tree += tuple((pth, srank[t]) for pth, t in live)
    reqs = tuple((rid_l[rid], r.swa_evicted_seqlen, r.decode_batch_idx,
                  _uuid_path(s, r.swa_uuid_for_lock), _mamba_labels(r, mamba), r.swa_evict_floor,
                  r.swa_branching_seqlen)
                 for rid, r in sorted(dict.items(s.reqs), key=lambda x: rid_l[x[0]]))
    slots = tuple((sid_l[sid], t.swa_evicted_seqlen, _uuid_path(s, t.swa_uuid_for_lock),
                   _mamba_labels(t, mamba), t.swa_evict_floor)
                  for sid, t in sorted(dict.items(s.slots), key=lambda x: sid_l[x[0]]))
    return (smap, len(s.swa_free_pages), reqs, slots, len(s.mamba_free_slots),
            s.forward_iter % s.cfg.swa_eviction_interval) + ((tree,) if tree else ())


def _mamba_labels(holder, mamba: dict) -> tuple:
    """A request's or slot's Mamba slots (pool index, then track buffer), labelled by first
    appearance in `mamba` (module level, not a closure: see state_key's loops)."""
    return tuple(mamba.setdefault(m, len(mamba)) for m in
                 (() if holder.mamba_pool_idx is None else (holder.mamba_pool_idx,))
                 + tuple(holder.mamba_ping_pong_track_buffer or ()))


def _uuid_path(s: State, a) -> Optional[tuple]:
    return None if a is None else _path_of(s, a[1])


def _path_of(s: State, nid: int) -> tuple:
    from spec.model import node_path
    return node_path(s, nid) if nid in s.nodes else ("gone", nid)


# ---------------------------------------------------------------------------
# enabled operations over the scope's domains
# ---------------------------------------------------------------------------

def _fresh_rid(s: State, taken: set) -> int:
    rid = 1
    while rid in taken:
        rid += 1
    return rid


_OP_TABLES: dict = {}


def _ops_of(sc: Scope, key: tuple) -> tuple:
    """The scope's candidate operations for `key` (("open", sid), ("close", sid),
    ("turn", sid, rid), ("plain", rid), ("req", rid), ("evict",)), built once per scope:
    operations are immutable values, and building them was a tenth of the guards' cost."""
    got = _OP_TABLES.get(id(sc))
    if got is None or got[0] is not sc:
        got = _OP_TABLES[id(sc)] = (sc, {})
    table = got[1]
    ops = table.get(key)
    if ops is None:
        ops = table[key] = _build_ops(sc, key)
    return ops


def _build_ops(sc: Scope, key: tuple) -> tuple:
    kind = key[0]
    if kind == "open":
        return (O.OpenSession(key[1]),)
    if kind == "close":
        return (O.CloseSession(key[1]),)
    if kind == "turn":
        return tuple(O.SubmitTurn(key[1], key[2], tuple(toks), mn)
                     for toks in sc.turns for mn in sc.max_new)
    if kind == "plain":
        return tuple(O.SubmitRequest(key[1], tuple(toks), mn)
                     for toks in sc.prompts for mn in sc.max_new)
    if kind == "evict":
        return tuple(O.Evict(n) for n in sc.evict)
    rid, cfg = key[1], sc.cfg
    cands = [O.Schedule(rid, True)]
    if sc.reject:
        cands.append(O.Schedule(rid, False))
    cands += [O.PrefillChunk(rid), O.Finish(rid), O.AbortQueued(rid), O.PreAbort(rid),
              O.AbortRunning(rid), O.Retract(rid), O.QueueReject(rid)]
    if cfg.spec_enabled:
        cands += [O.SpecDecode(rid, d, a, t) for d in range(1, cfg.max_drafts + 1)
                  for a in range(d + 1) for t in sc.decode_tokens]
    else:
        cands += [O.Decode(rid, t) for t in sc.decode_tokens]
    return tuple(cands)


def candidate_ops(s: State, sc: Scope, symmetric: bool = True) -> list:
    """Every operation of the scope's domains that `spec.model.enabled` allows here.
    With symmetry, a new request takes the lowest free rid and a new session the lowest
    unused sid (any other choice gives an isomorphic state); without, every one."""
    enabled, refused = M.enabled, M.refused
    ops: list = []
    live = len(s.reqs)
    s_reqs, s_sessions = dict(s.reqs), dict(s.sessions)     # reads: no copy-on-write
    sids = range(1, sc.sessions + 1)
    for sid in sids:        # a refused request (M.refused) changes nothing: not explored
        op, = _ops_of(sc, ("open", sid))
        if enabled(s, op) and not refused(s, op):
            ops.append(op)
            if symmetric:
                break
    for sid in sids:
        op, = _ops_of(sc, ("close", sid))
        if enabled(s, op) and not refused(s, op):
            ops.append(op)
    if live < sc.max_live:
        taken = set(s_reqs) | {x.inflight_rid for x in s_sessions.values()}
        if symmetric:
            new_rids = [_fresh_rid(s, taken)]
        else:
            new_rids = [r for r in range(1, sc.max_live + 1) if r not in taken]
        for rid in new_rids:
            for sid in sids:
                if sid in s_sessions:
                    ops.extend(op for op in _ops_of(sc, ("turn", sid, rid)) if enabled(s, op))
            nplain = sum(1 for r in s_reqs.values() if not r.streaming)
            if nplain < sc.plain:
                ops.extend(op for op in _ops_of(sc, ("plain", rid)) if enabled(s, op))
    for rid in sorted(s_reqs):
        ops.extend(op for op in _ops_of(sc, ("req", rid)) if enabled(s, op))
    ops.extend(op for op in _ops_of(sc, ("evict",)) if enabled(s, op))
    return ops


# ---------------------------------------------------------------------------
# reachability goals: situations worth reaching, seen in (before, op, outcome, after)
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Situation:
    id: str
    text: str
    detect: Callable          # (cfg, before, op, outcome, after) -> bool
    applies: Callable = lambda cfg: True
    why_not: str = ""


def _restoring(b: State, op):
    """(req, sid, slot) when op is a schedule that restores from a slot holding KV."""
    if not isinstance(op, O.Schedule):
        return None
    r = b.reqs.get(op.rid)
    if r is None or r.session is None or r.to_finish:
        return None
    t = b.slots.get(r.session)
    if t is None or t.row is None:
        return None
    return r, r.session, t


def _restore_tail(cfg, b, op, a):
    """(prefix_len, slot allocated before) of a restore that cut the slot's tail."""
    x = _restoring(b, op)
    if x is None:
        return None
    r, sid, t0 = x
    t1 = a.slots.get(sid)
    if t1 is None or t1.allocated >= t0.allocated:
        return None
    return t1.allocated, t0.allocated         # _free_tail sets slot.allocated = prefix_len


def _tail_free_at_page_boundary(cfg, b, op, out, a):
    x = _restore_tail(cfg, b, op, a)
    return x is not None and x[0] % cfg.page_size == 0


def _tail_kept_mid_page(cfg, b, op, out, a):
    x = _restore_tail(cfg, b, op, a)
    return x is not None and x[0] % cfg.page_size != 0


def _split_under_lock(cfg, b, op, out, a):
    bn = dict(b.nodes)              # reads through plain snapshots: no copy-on-write
    for nid, n in dict.items(a.nodes):
        if nid in bn:
            continue
        for cid in n.children.values():
            c = bn.get(cid)
            if c is not None and c.lock_ref > 0 and c.parent != nid:
                return True
    return False


def _deferred_close_done(cfg, b, op, out, a):
    return any(x.close_pending and sid not in a.sessions for sid, x in dict.items(b.sessions))


def _retract_retry_off_by_one(cfg, b, op, out, a):
    x = _restoring(b, op)
    if x is None:
        return False
    r, sid, t0 = x
    return r.is_retracted and t0.committed >= r.seqlen


def _ephemeral_abort_slot(cfg, b, op, out, a):
    if not isinstance(op, O.AbortRunning):
        return False
    r = b.reqs[op.rid]
    return r.session is not None and r.session not in b.slots


def _eviction_under_pressure(cfg, b, op, out, a):
    return not isinstance(op, O.Evict) and any(nid not in a.nodes for nid in b.nodes)


def _admission_rejected_for_budget(cfg, b, op, out, a):
    return isinstance(op, O.Schedule) and op.admit and out == "rejected"


def _idempotent_restore_retry(cfg, b, op, out, a):
    x = _restoring(b, op)
    if x is None:
        return False
    r = x[0]
    return r.row is not None            # restored once already (a rejected admission)


def _pre_abort_detach(cfg, b, op, out, a):
    if not isinstance(op, O.Schedule):
        return False
    r = b.reqs.get(op.rid)
    return (r is not None and r.session is not None and r.to_finish
            and r.session in b.slots and b.slots[r.session].row is not None)


def _parked_turn_dropped(cfg, b, op, out, a):
    if not isinstance(op, (O.AbortQueued, O.Schedule)):
        return False
    r = b.reqs.get(op.rid)
    return (r is not None and r.is_retracted and r.session is not None
            and r.session in b.slots and r.session not in a.slots)


def _spec_overshoot(cfg, b, op, out, a):
    if not isinstance(op, O.SpecDecode) or out != "ok":
        return False
    r = b.reqs[op.rid]                  # the step's result may finish (and remove) it
    return len(r.output) + op.accepted + 1 > r.max_new_tokens


def _shared_lock(cfg, b, op, out, a):
    return any(n.lock_ref >= 2 for nid, n in dict.items(a.nodes) if nid != ROOT)


def _slot_lends_row(cfg, b, op, out, a):
    return isinstance(op, O.Schedule) and out == "ok" and _restoring(b, op) is not None


def _swa_window_freed(cfg, b, op, out, a):
    """A decode step moved a request's SWA window cursor (spec/hybrid.py)."""
    r, q = b.reqs.get(getattr(op, "rid", None)), a.reqs.get(getattr(op, "rid", None))
    return r is not None and q is not None and q.swa_evicted_seqlen > max(r.swa_evicted_seqlen,
                                                                            r.protected)


def _swa_cursor_restored(cfg, b, op, out, a):
    x = _restoring(b, op)
    return x is not None and x[2].swa_evicted_seqlen > 0


def _mamba_pool_short(cfg, b, op, out, a):
    from spec.hybrid import mamba_short
    r = b.reqs.get(getattr(op, "rid", None))
    return isinstance(op, O.Schedule) and op.admit and out == "rejected" and r is not None \
        and mamba_short(b, r)


def _mamba_back_from_slot(cfg, b, op, out, a):
    return any(t.mamba_pool_idx is not None and sid not in a.slots
               for sid, t in dict.items(b.slots))


HYBRID_SITUATIONS: tuple = (
    Situation("swa_window_freed", "an out-of-window SWA free (a decode moves swa_evicted_seqlen)",
              _swa_window_freed, lambda c: c.swa_window > 0, "no SWA"),
    Situation("swa_cursor_restored", "a restore hands the slot's SWA window cursor to the next turn",
              _swa_cursor_restored, lambda c: c.swa_window > 0, "no SWA"),
    Situation("mamba_pool_short", "an admission refused because the Mamba pool is short",
              _mamba_pool_short, lambda c: c.mamba_slots > 0, "no Mamba"),
    Situation("mamba_back_from_slot", "a slot's Mamba state returned (close or abort)",
              _mamba_back_from_slot, lambda c: c.mamba_slots > 0, "no Mamba"),
)


SITUATIONS: tuple = (
    Situation("tail_free_at_page_boundary", "a page-boundary tail free (a restore cuts the "
              "slot's tail at a page boundary: the page past it is freed)",
              _tail_free_at_page_boundary),
    Situation("tail_kept_mid_page", "a mid-page tail cut (a restore cuts the slot's tail inside "
              "a page: the partial page stays attached)", _tail_kept_mid_page,
              lambda c: c.page_size > 1, "page_size 1"),
    Situation("split_under_lock", "a node split under a lock (the locked node gets a new parent)",
              _split_under_lock),
    Situation("deferred_close_done", "a deferred close carried out when the turn ended",
              _deferred_close_done),
    Situation("retract_retry_off_by_one", "a retract retry with the overlap off-by-one "
              "(slot committed == seqlen, restore prefix = seqlen - 1)", _retract_retry_off_by_one,
              lambda c: c.overlap or c.spec_enabled, "neither overlap nor spec"),
    Situation("ephemeral_abort_slot", "an ephemeral abort slot (first-turn mid-abort, wrapper era)",
              _ephemeral_abort_slot, lambda c: c.era == "wrapper", "era borrow"),
    Situation("eviction_under_pressure", "eviction under pressure (an allocation evicts a node)",
              _eviction_under_pressure),
    Situation("admission_rejected_for_budget", "an admission rejected for rows/KV budget",
              _admission_rejected_for_budget),
    Situation("idempotent_restore_retry", "a second restore after a rejected admission",
              _idempotent_restore_retry),
    Situation("pre_abort_detach", "a pre-aborted turn detached from its slot at schedule",
              _pre_abort_detach),
    Situation("parked_turn_dropped", "a retracted turn's parked KV released when it ends unsuccessfully",
              _parked_turn_dropped),
    Situation("spec_overshoot", "a speculative step accepts past max_new_tokens (trimmed at "
              "finish)", _spec_overshoot, lambda c: c.spec_enabled, "spec off"),
    Situation("shared_lock", "a tree node locked by two holders", _shared_lock),
    Situation("slot_lends_row", "a later turn admitted on its slot's row", _slot_lends_row),
) + HYBRID_SITUATIONS


def _op_applies(name: str, cfg: Config) -> Optional[str]:
    if name == "decode" and cfg.spec_enabled:
        return "spec on"
    if name == "spec_decode" and not cfg.spec_enabled:
        return "spec off"
    if name == "prefill_chunk" and cfg.chunk_size is None:
        return "no chunk size"
    return None


# ---------------------------------------------------------------------------
# the search
# ---------------------------------------------------------------------------

PREFILTERED_STEP_INVARIANTS = frozenset({"I10", "I16", "I25", "I28"})


def step_check_needed(b: State, op, out: str, a: State) -> bool:
    """A sound over-approximation of "some step invariant can fire on this transition",
    on the concrete states, so that the abstract view of a transition into an already
    visited state is built only when it matters. It covers the step invariants of
    spec/invariants.py as they are: I25 (rejected restore idempotent) a rejected schedule
    of a request that holds a row through its slot's virtual anchor; I16 (locked node
    evicted) a step that removes a node locked before it; I10 (slot fixed) a step that
    changes a slot's protected length or anchor (a node keeps its path for life, so an
    unchanged anchor names the same path); I28 (checkpoint advance) a step that changes a
    checkpoint. When spec/ gains another step invariant the explorer stops using it (see
    `explore`); tests check it against the full check_step."""
    if out == "rejected":
        r = dict.get(b.reqs, getattr(op, "rid", None))
        if r is not None and r.row is not None and r.last_node is not None \
                and r.last_node[0] == "virtual":
            return True
    bn = b.nodes                    # key views and plain reads: nothing is copied
    for nid in dict.keys(bn) - dict.keys(a.nodes):
        if dict.__getitem__(bn, nid).lock_ref > 0:
            return True
    get = dict.get                  # reads; an entity the step did not touch is shared
    aslots = a.slots
    for sid, t in dict.items(b.slots):
        u = get(aslots, sid)
        if u is not None and u is not t and (u.protected != t.protected
                                             or u.last_node != t.last_node):
            return True
    asess = a.sessions
    for sid, x in dict.items(b.sessions):
        y = get(asess, sid)
        if y is not None and y is not x and y.checkpoint != x.checkpoint:
            return True
    return False

@dataclass
class Found:
    id: str
    name: str
    message: str
    depth: int                # number of ops in the trace
    ops: list


@dataclass
class Result:
    scope: Scope
    symmetric: bool
    states: int = 0
    transitions: int = 0
    max_depth: int = 0
    complete_depth: int = -1          # every state at depth <= this was expanded
    exhausted: bool = False           # no new states below the depth bound
    stopped: Optional[str] = None     # why the search stopped early
    seconds: float = 0.0
    op_counts: Counter = field(default_factory=Counter)
    outcome_counts: Counter = field(default_factory=Counter)
    op_first: dict = field(default_factory=dict)          # op name -> depth first taken
    outcome_first: dict = field(default_factory=dict)     # (op, outcome) -> depth
    reached: dict = field(default_factory=dict)           # situation id -> depth
    violations: list = field(default_factory=list)        # Found, first per id
    level_sizes: list = field(default_factory=list)
    rebuilt_levels: list = field(default_factory=list)    # depths not kept (frontier_states)
    frontier_states: Optional[int] = None
    visited: tuple = field(default=(), repr=False)      # (seen set, parents, via)
    op_table: list = field(default_factory=list, repr=False)   # via's operations
    backend_check: str = ""           # `--backend impl`: the transition check's verdict line
    beyond_traces: dict = field(default_factory=dict)   # kind -> trace of the first stop
                                      # where the backend alone differed (TransitionReport.differs)

    def bytes_per_state(self, sample: int = 2000) -> float:
        """Memory of the visited set and the parent links per distinct state (a sample of
        the keys sized deeply, so that whole keys are counted with their contents)."""
        if not self.visited:
            return 0.0
        seen, parents, via = self.visited
        keys = list(itertools.islice(seen, sample))
        per_key = sum(_deep_size(k) for k in keys) / max(len(keys), 1)
        total = (sys.getsizeof(seen) + per_key * len(seen) + parents.itemsize * len(parents)
                 + via.itemsize * len(via))
        return total / max(self.states, 1)

    @property
    def states_per_s(self) -> float:
        return self.states / self.seconds if self.seconds > 0 else 0.0


OLD_STYLE = dict(fingerprints=False, fast_invariants=False)
"""explore()'s options that reproduce the explorer before the speed work (benchmarks):
whole keys in the visited set, every new state's invariants through its AbstractState."""


def _whole_key(key: tuple) -> tuple:
    return key


def _deep_size(x, _seen=None) -> int:
    """Bytes of x and of everything it holds that no other sized object shares."""
    _seen = set() if _seen is None else _seen
    if id(x) in _seen:
        return 0
    _seen.add(id(x))
    if isinstance(x, int) and -5 <= x <= 256:
        return 0                    # CPython's shared small ints
    n = sys.getsizeof(x)
    if isinstance(x, (tuple, list, frozenset, set)):
        n += sum(_deep_size(y, _seen) for y in x)
    return n


FRONTIER_STATES = 250_000
"""`_search`'s default: a level of more states is rebuilt by re-execution, not kept
(about 1.5 GB a level kept; the nightly's levels pass it from depth 16)."""


def _level_states(s0: State, d: int, starts: list, parents: array, via: array,
                  op_table: list):
    """The states of BFS level d, in index order, as (index, state, None): rebuilt by
    re-executing the parent links from the initial state s0, depth first (only the path
    and its siblings are held). Breadth-first search gives every state a higher index
    than its parent and the children of one parent consecutive indices, in the parents'
    order, so a level's parent links are sorted and a node's children are found by
    bisection; `starts[k]` is the first index of level k. A child with no children of
    its own above level d is not rebuilt. Re-execution is exact: a step is a function of
    its state and op, and the op is the one that first reached the state."""
    if d == 0:
        yield 0, s0, None
        return
    step = M.step
    stack = [(0, s0, 0)]
    while stack:
        i, s, k = stack.pop()
        lo = bisect_left(parents, i, starts[k + 1], starts[k + 2])
        hi = bisect_right(parents, i, lo, starts[k + 2])
        if k + 1 == d:
            for j in range(lo, hi):
                yield j, step(s, op_table[via[j]], True)[0], None
            continue
        below, end = starts[k + 2], starts[k + 3]
        for j in range(hi - 1, lo - 1, -1):     # popped in index order
            c = bisect_left(parents, j, below, end)
            if c < end and parents[c] == j:
                stack.append((j, step(s, op_table[via[j]], True)[0], k + 1))


def reachable_states(sc: Scope, symmetric: bool = True) -> list:
    """Every distinct state of the scope within its depth bound, level by level, the
    initial state first: a plain breadth-first walk (no invariants, no bookkeeping) for
    tests and benchmarks that look at each state."""
    frontier = [M.initial_state(sc.cfg)]
    seen, out = {state_key(frontier[0], symmetric)}, list(frontier)
    for _ in range(sc.max_depth):
        nxt = []
        for s in frontier:
            for op in candidate_ops(s, sc, symmetric):
                s2, _ = M.step(s, op, checked=True)
                k = state_key(s2, symmetric)
                if k not in seen:
                    seen.add(k)
                    nxt.append(s2)
        out += nxt
        frontier = nxt
    return out


def explore(sc: Scope, **kw) -> Result:
    """The breadth-first search (`_search`, which documents the options) with Python's
    cyclic garbage collector paused: the frontier holds tens of thousands of states,
    each a few dozen containers, and every collection of the oldest generation walks
    them all (x1.16 interpreted, x1.4 compiled on `bench`, depth 9). A state holds no
    reference cycle (entities name each other by id), so nothing is left for the
    collector; it runs again, as it was, when the search returns."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        return _search(sc, **kw)
    finally:
        if was_on:
            gc.enable()


def _search(sc: Scope, *, symmetric: bool = True, all_violations: bool = False,
            max_states: Optional[int] = None, max_seconds: Optional[float] = None,
            check: bool = True, progress: Optional[Callable] = None,
            progress_every: float = 2.0, prefilter: bool = True,
            fingerprints: bool = True, fast_invariants: bool = True,
            frontier_states: Optional[int] = FRONTIER_STATES) -> Result:
    """Breadth-first search over the scope. Stops at the first violation unless
    all_violations (then it records the first, shortest, trace per violation id and does
    not expand violating states).

    The visited set holds a 64-bit fingerprint of each state's canonical key (TLC and
    Stateright style; fingerprints=False: the whole key, the old way), each state's parent
    index and the index of the operation that reached it (two flat arrays); a
    counterexample trace is the chain of operations, re-executed from the initial state
    by whoever replays it. Two distinct keys share a fingerprint with probability about
    n^2 / 2^65 (1e-7 at a million states): one state would be wrongly merged.

    The invariants: a new state's state invariants are first asked of
    `kvcheck.fast_invariants.state_clean` (on the State itself; fast_invariants=False:
    never), and only a state it does not call clean gets an AbstractState and
    spec/invariants.py's `check_state`, which writes the report. A transition's step
    invariants run (on the two abstract views) where `step_check_needed` says they can
    fire. So most states never get an abstract view; a frontier state gets one only when
    one of its transitions needs it.

    Under `Config.accept` the search judges nothing (check is off, and a step that raises
    is a leaf): the spec follows upstream's recorded behaviour there, and the transition
    check's lockstep (kvcheck/engines/exhaustive.py) judges every step, telling a path
    past the accepted findings' model (it stops comparing there) from a defect of the
    spec (reported, as always).

    The frontier: a level of up to `frontier_states` states is kept as State objects
    (about 6 KB each, shared entities divided); a larger one is not kept at all, and its
    states are rebuilt when the level is expanded by re-executing the parent links from
    the initial state (`_level_states`), so that memory stays at the visited set's bytes
    per state (None: always kept; 0: never). Both give the same search, state for state."""
    cfg = sc.cfg
    check = check and not cfg.accept
    res = Result(sc, symmetric, frontier_states=frontier_states)
    prefilter = prefilter and {i.id for i in STEP_INVARIANTS} == PREFILTERED_STEP_INVARIANTS
    fast = fast_invariants and applies_fast(cfg, [i.id for i in STATE_INVARIANTS])
    t0 = time.perf_counter()
    s0 = M.initial_state(cfg)
    a0 = abstract(s0)
    parents = array("i", [-1])          # parent index of each state
    via = array("i", [-1])              # index into op_table of the op that reached it
    op_table: list = res.op_table
    op_index: dict = {}
    fp = hash if fingerprints else _whole_key
    seen = {fp(state_key(s0, symmetric))}
    res.visited = (seen, parents, via)
    res.states = 1
    res.level_sizes.append(1)
    if check:
        vs = check_state(a0, cfg)
        if vs:
            res.violations.append(Found(vs[0].id, vs[0].name, str(vs[0]), 0, []))
            res.seconds = time.perf_counter() - t0
            return res
    pending_sits = [x for x in SITUATIONS if x.applies(cfg)]
    frontier = [(0, s0, a0)]
    level_n = 1                         # states in the level being expanded
    starts = [0, 1]                     # index of each level's first state, and the end
    depth = 0
    next_progress = t0 + progress_every
    found_ids = set()
    stop = False

    def trace_of(idx, op=None):
        out = [] if op is None else [op]
        while idx > 0:
            out.append(op_table[via[idx]])
            idx = parents[idx]
        out.reverse()
        return out

    stop_at_level_end = False
    op_counts, outcome_counts = res.op_counts, res.outcome_counts
    op_first, outcome_first = res.op_first, res.outcome_first
    step, enabled_ops = M.step, candidate_ops
    while level_n and not stop:
        if depth >= sc.max_depth or stop_at_level_end:
            break
        nxt = []                        # None once the level outgrows frontier_states
        nxt_n = 0
        d1 = depth + 1
        for idx, s, a in frontier:
            for op in enabled_ops(s, sc, symmetric):
                res.transitions += 1
                name = op.name
                op_counts[name] += 1
                try:
                    s2, out = step(s, op, True)
                except Exception as e:
                    if cfg.accept:      # a leaf: the lockstep judges it (docstring)
                        continue
                    if isinstance(e, M.ModelError):
                        found = Found(SPEC_ASSERTION, "upstream assertion reached by the spec",
                                      str(e), d1, trace_of(idx, op))
                    else:                   # a defect in spec/ itself
                        found = Found(SPEC_EXCEPTION, "the spec raised",
                                      f"{type(e).__name__}: {e}", d1, trace_of(idx, op))
                    s2 = None
                if s2 is None:
                    # an exception inside the step: keep going to the end of this level,
                    # so that an invariant violation at the same depth (which replays
                    # cleanly through run_ops) is preferred
                    if found.id not in found_ids:
                        found_ids.add(found.id)
                        res.violations.append(found)
                        if not all_violations:
                            stop_at_level_end = True
                    continue
                oc = (name, out)
                outcome_counts[oc] += 1
                if name not in op_first:
                    op_first[name] = d1
                if oc not in outcome_first:
                    outcome_first[oc] = d1
                if pending_sits:
                    hit = [x for x in pending_sits if x.detect(cfg, s, op, out, s2)]
                    for x in hit:
                        res.reached[x.id] = d1
                        pending_sits.remove(x)
                key = fp(state_key(s2, symmetric))
                known = key in seen
                if not check:
                    if known:
                        continue
                    vs = ()
                else:
                    # the abstract views only where a reference evaluation needs them
                    a2 = None
                    vs = []
                    if not prefilter or step_check_needed(s, op, out, s2):
                        if a is None:
                            a = abstract(s)
                        a2 = abstract(s2)
                        vs = check_step(a, op, out, a2, cfg)
                    elif known:
                        continue
                    if not known and not (fast and state_clean(s2)):
                        vs = check_state(a2 or abstract(s2), cfg) + vs
                if vs:
                    v = vs[0]
                    if v.id not in found_ids:
                        found_ids.add(v.id)
                        res.violations.insert(0, Found(v.id, v.name, str(v), d1, trace_of(idx, op)))
                        if not all_violations:
                            del res.violations[1:]
                            res.stopped = "first violation found"
                            stop = True
                            break
                    if not known:
                        seen.add(key)           # violating: recorded, never expanded
                    continue
                if known:
                    continue
                n = len(parents)
                seen.add(key)
                parents.append(idx)
                k = op_index.get(op)
                if k is None:
                    k = op_index[op] = len(op_table)
                    op_table.append(op)
                via.append(k)
                nxt_n += 1
                if nxt is not None:
                    if frontier_states is None or nxt_n <= frontier_states:
                        nxt.append((n, s2, None))     # its abstract view: built when needed
                    else:
                        nxt = None      # rebuilt from the parent links when expanded
                res.states += 1
                if max_states is not None and res.states >= max_states:
                    res.stopped = f"state budget {max_states} reached"
                    stop = True
                    break
            if progress is not None:
                now = time.perf_counter()
                if now >= next_progress:
                    next_progress = now + progress_every
                    progress(res, depth, nxt_n, now - t0)
            if stop:
                break
            if max_seconds is not None and time.perf_counter() - t0 > max_seconds:
                res.stopped = f"time budget {max_seconds:g} s reached"
                stop = True
                break
        if not stop:
            res.complete_depth = depth
        depth = d1
        starts.append(len(parents))
        if nxt_n:
            res.max_depth = depth
            res.level_sizes.append(nxt_n)
        level_n = nxt_n
        if nxt is None:
            res.rebuilt_levels.append(depth)
            frontier = _level_states(s0, depth, starts, parents, via, op_table)
        else:
            frontier = nxt
    if not level_n and not stop:
        res.exhausted = True
    if stop_at_level_end and not res.stopped:
        res.stopped = "first violation found (an exception in the step; level finished)"
    # invariant violations first (they replay through run_ops), then M1, then E1
    res.violations.sort(key=lambda v: (v.depth, v.id == SPEC_EXCEPTION, v.id == SPEC_ASSERTION))
    res.seconds = time.perf_counter() - t0
    return res


# ---------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------

def report(res: Result, out=None) -> None:
    out = sys.stdout if out is None else out
    sc, cfg = res.scope, res.scope.cfg
    w = lambda line="": print(line, file=out)
    w(f"scope {sc.describe()}")
    w(f"  symmetry reduction: {'on' if res.symmetric else 'off'}")
    if res.exhausted:
        cover = "exhausted: every reachable state of the scope was visited"
    elif not res.stopped:
        cover = (f"every state within {res.max_depth} steps visited (depth bound "
                 f"{sc.max_depth}; the last level is not expanded)")
    else:
        cover = (f"every state within {res.complete_depth + 1} steps visited, depth "
                 f"{res.complete_depth + 2} partly")
    if res.stopped:
        cover += f"; stopped early: {res.stopped}"
    w(f"  {res.states} distinct states, {res.transitions} transitions, max depth {res.max_depth}, "
      f"{res.seconds:.1f} s, {res.states_per_s:,.0f} states/s")
    if res.visited:
        w(f"  visited set: {res.bytes_per_state():,.0f} bytes per state (fingerprints and "
          "parent links)")
    w(f"  coverage: {cover}")
    w(f"  states per depth: {res.level_sizes}")
    if res.rebuilt_levels:
        w(f"  depths not kept in memory (over {res.frontier_states:,} states; rebuilt by "
          f"re-execution where expanded): {res.rebuilt_levels}")
    w("  operations (transitions taken; first depth; outcomes):")
    for name in O.OP_NAMES:
        na = _op_applies(name, cfg)
        if name in res.op_first:
            outs = ", ".join(f"{o} {res.outcome_counts[(name, o)]}@{res.outcome_first[(name, o)]}"
                             for o in O.OUTCOMES if (name, o) in res.outcome_first)
            w(f"    {name:15s} {res.op_counts[name]:9d}  depth {res.op_first[name]:2d}  {outs}")
        elif na:
            w(f"    {name:15s}         -  n/a ({na})")
        else:
            w(f"    {name:15s}         0  NOT REACHED in this scope")
    w("  situations (sometimes):")
    for x in SITUATIONS:
        if x.id in res.reached:
            w(f"    reached at depth {res.reached[x.id]:2d}  {x.id}: {x.text}")
        elif not x.applies(cfg):
            w(f"    n/a ({x.why_not})   {x.id}: {x.text}")
        elif x.id in res.scope.out_of_reach:
            w(f"    out of reach         {x.id}: {x.text}")
        else:
            w(f"    NOT REACHED          {x.id}: {x.text}")
    if res.violations:
        for v in res.violations:
            w(f"  VIOLATION {v.id} {v.name} at step {v.depth - 1} (trace of {v.depth} ops): {v.message}")
    else:
        w("  no violation")


def missed(res: Result) -> list:
    """Reachability goals that apply to the scope's config but were not reached."""
    cfg = res.scope.cfg
    out = [n for n in O.OP_NAMES if n not in res.op_first and not _op_applies(n, cfg)]
    out += [x.id for x in SITUATIONS if x.applies(cfg) and x.id not in res.reached
            and x.id not in res.scope.out_of_reach]
    return out


def to_trace(res: Result, v: Found):
    from kvcheck.trace import Expect, Trace
    return Trace(res.scope.cfg, list(v.ops),
                 Expect("violation", v.id, v.depth - 1, "spec"),
                 {"source": "explore", "scope": res.scope.name,
                  "symmetry": res.symmetric, "message": v.message,
                  "states": res.states, "shortest": True})


# ---------------------------------------------------------------------------
# command line
# ---------------------------------------------------------------------------

def _ints(text: str) -> tuple:
    try:
        vals = tuple(int(x) for x in text.replace(" ", "").split(",") if x != "")
    except ValueError:
        vals = (-1,)
    if any(v < 0 for v in vals):
        raise argparse.ArgumentTypeError(f"expected comma-separated integers >= 0, got {text!r}")
    return vals


def _word_list(text: str) -> tuple:
    """'2,2,3;2,2' -> ((2, 2, 3), (2, 2))."""
    try:
        ws = tuple(tuple(int(t) for t in w.split(",") if t.strip() != "")
                   for w in text.split(";") if w.strip() != "")
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected words like '2,2,3;2,2', got {text!r}") from None
    return ws


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default="check", help=f"named scope(s): {', '.join(PRESETS)} "
                   "(default: check); the flags below override its fields")
    p.add_argument("--list-presets", action="store_true", help="print the presets and exit")
    p.add_argument("--scope", action="append", metavar="NAME",
                   help="only this scope of the preset (repeatable; `--list-presets` names them)")
    g = p.add_argument_group("scope", "each flag defaults to the --preset scope's value")
    g.add_argument("--page-size", type=T.positive_int, help="page_size")
    g.add_argument("--pages", type=T.positive_int, help="num_pages")
    g.add_argument("--rows", type=T.positive_int, help="num_rows")
    g.add_argument("--context", type=T.positive_int, help="max_context_len")
    g.add_argument("--chunk-size", type=T.nonnegative_int, help="chunked prefill budget (0: off)")
    g.add_argument("--spec", dest="spec_enabled", action=argparse.BooleanOptionalAction,
                   help="speculative decoding (spec_enabled)")
    g.add_argument("--max-drafts", type=T.positive_int, help="max_drafts")
    g.add_argument("--overlap", action=argparse.BooleanOptionalAction, help="overlap scheduler")
    g.add_argument("--era", choices=ERAS, help="upstream era")
    g.add_argument("--sessions", type=T.nonnegative_int, help="session ids 1..N")
    g.add_argument("--plain", type=T.nonnegative_int, help="plain requests live at once")
    g.add_argument("--max-live", type=T.positive_int, help="requests live at once")
    g.add_argument("--prompts", type=_word_list, help="plain prompts, e.g. '2,2,3;2,3'")
    g.add_argument("--turns", type=_word_list, help="turn new_tokens, e.g. '2;2,2,2'")
    g.add_argument("--alphabet", type=_ints, help="with --lengths: every prompt and turn over it")
    g.add_argument("--lengths", type=_ints, help="prompt lengths for --alphabet")
    g.add_argument("--max-new", type=_ints, help="max_new_tokens choices, e.g. 1,2")
    g.add_argument("--decode-tokens", type=_ints, help="token choices of decode steps")
    g.add_argument("--evict", type=_ints, help="Evict(num_tokens) choices ('' for none)")
    g.add_argument("--reject", action=argparse.BooleanOptionalAction,
                   help="also try schedule(admit=false)")
    g.add_argument("--max-depth", type=T.positive_int, help="operations per path")
    b = p.add_argument_group("search")
    b.add_argument("--backend", type=T.backend, default="spec",
                   help="spec: the spec's invariants on every state and transition; impl or "
                        "sglang:VERSION: then also every transition of the explored scope on the "
                        "spec and that system side by side, compared step by step "
                        "(kvcheck/engines/exhaustive.py)")
    T.accept_flag(b)
    b.add_argument("--no-symmetry", action="store_true", help="no symmetry reduction")
    b.add_argument("--compare", action="store_true",
                   help="run with and without symmetry reduction and compare")
    b.add_argument("--all", dest="all_violations", action="store_true",
                   help="keep going after a violation: the shortest trace per invariant")
    b.add_argument("--max-states", type=T.positive_int, help="stop cleanly after this many states")
    b.add_argument("--max-seconds", type=T.positive_float, help="stop cleanly after this many seconds")
    b.add_argument("--frontier-states", type=T.nonnegative_int, default=FRONTIER_STATES,
                   metavar="N", help="a BFS level of more than N states is not kept in memory "
                   "but rebuilt by re-executing the parent links when it is expanded (about "
                   "10%% more CPU on such a level; 0: never kept, then the whole search holds "
                   "about 100 bytes a state); default: %(default)s (about 1.5 GB a level)")
    b.add_argument("--no-check", action="store_true", help="skip invariants (raw state count)")
    b.add_argument("--out", type=T.writable_dir, default=PROJECT / "failures" / "explore",
                   help="directory for counterexample traces")
    b.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    b.add_argument("--strict-coverage", action="store_true",
                   help="exit 1 when an applicable reachability goal is not reached")


def accepted_findings(args) -> tuple:
    """`--accept` (a ValueError for a usage error): only with a release to compare with,
    since under it the spec follows upstream's recorded behaviour and the invariants are
    judged on every transition by the lockstep (kvcheck.checker: a step past the accepted
    findings' model stops the comparison there), not by the search."""
    from kvcheck.backends import parse_accept
    backend = getattr(args, "backend", "spec")
    accept = parse_accept(getattr(args, "accept", None), backend)
    if accept and not backend.startswith("sglang"):
        raise ValueError("--accept needs --backend sglang:VERSION: the transition check judges "
                         "the accepted findings' paths step by step")
    return accept


def scopes_from_args(args) -> list:
    if args.preset not in PRESETS:
        raise ValueError(f"unknown preset {args.preset!r}; known: {', '.join(PRESETS)}")
    chosen = PRESETS[args.preset]
    only = getattr(args, "scope", None)
    if only:
        names = [sc.name for sc in chosen]
        unknown = [n for n in only if n not in names]
        if unknown:
            raise ValueError(f"preset {args.preset!r} has no scope {', '.join(map(repr, unknown))}; "
                             f"its scopes: {', '.join(names)}")
        chosen = [sc for sc in chosen if sc.name in only]
    accept = accepted_findings(args)
    out = []
    for sc in chosen:
        ckw = {}
        for flag, f in (("page_size", "page_size"), ("pages", "num_pages"), ("rows", "num_rows"),
                        ("context", "max_context_len"), ("spec_enabled", "spec_enabled"),
                        ("max_drafts", "max_drafts"), ("overlap", "overlap"), ("era", "era")):
            v = getattr(args, flag, None)
            if v is not None:
                ckw[f] = v
        if getattr(args, "chunk_size", None) is not None:
            ckw["chunk_size"] = args.chunk_size or None
        if accept:
            ckw["accept"] = accept
        cfg = replace(sc.cfg, **ckw) if ckw else sc.cfg     # replace re-validates
        skw = {}
        for f in ("sessions", "plain", "max_live", "prompts", "turns", "max_new",
                  "decode_tokens", "evict", "reject", "max_depth"):
            v = getattr(args, f, None)
            if v is not None:
                skw[f] = v
        if getattr(args, "alphabet", None) is not None or getattr(args, "lengths", None) is not None:
            ws = words(args.alphabet or (2, 3), args.lengths or (1, 2))
            skw.setdefault("prompts", ws)
            skw.setdefault("turns", ws)
        sc2 = replace(sc, cfg=cfg, **skw)
        for f in ("sessions", "plain", "max_live", "max_depth"):
            if getattr(sc2, f) < 0:
                raise ValueError(f"--{f.replace('_', '-')} must be >= 0")
        if any(len(w) == 0 for w in sc2.prompts + sc2.turns):
            raise ValueError("prompts and turns must be non-empty words")
        out.append(sc2)
    return out


def _check_transitions(res: Result, args, traces: list) -> int:
    """The scope's every transition on the spec and args.backend (exit code 1 on a failing
    step, whose trace and HTML report are written as a violation's are)."""
    from kvcheck.backends import BackendError, planted_upstream, resolve
    from kvcheck.engines.exhaustive import ForkError, check_transitions
    from kvcheck.engines.gen import differed_lines
    from kvcheck.trace import beyond_trace, failure_trace

    def prog(rep, el):
        print(f"[explore {res.scope.name} vs {rep.backend}] {rep.transitions:,} transitions, "
              f"{rep.states:,} of {res.states:,} states ({rep.transitions / el:,.0f}/s), "
              f"{el:.0f} s", file=sys.stderr, flush=True)
    meta = {"source": "explore", "scope": res.scope.name}

    def differ(kind, ops, b):       # written as found: an interrupted walk keeps them
        res.beyond_traces[kind] = str(beyond_trace(res.scope.cfg, ops, b, meta).save(
            Path(args.out) / "beyond" / f"{kind}-{res.scope.name}.json"))
    try:
        bname = resolve(args.backend)[1]
        meta.update(backend=bname, **planted_upstream(bname))
        rep = check_transitions(res, args.backend, None if getattr(args, "quiet", False) else prog,
                                differ=differ)
    except KeyboardInterrupt:
        for line in differed_lines(res.beyond_traces):
            print(line)
        raise
    except (ConfigError, BackendError, ForkError) as e:
        res.backend_check = f"spec vs {args.backend} on every transition: NOT CHECKED: {e}"
        print(f"  {res.backend_check}")
        if isinstance(e, ForkError):
            return 1
        print(f"kvcheck explore: error: {args.backend} cannot run scope {res.scope.name}: {e}",
              file=sys.stderr)          # the release refuses this configuration
        return 2
    res.backend_check = rep.verdict()
    print(f"  {rep.line()}")
    for line in differed_lines(res.beyond_traces):
        print(line)
    if rep.failure is None:
        return 0
    f = rep.failure
    traces.append(_write_trace(failure_trace(res.scope.cfg, rep.ops, f, meta),
                               Path(args.out) / f"{res.scope.name}-{f.id}-{f.side}.json",
                               rep.backend))
    return 1


def _write_trace(trace, path: Path, backend: str) -> Path:
    """A counterexample's trace file and its HTML report, each named on stdout."""
    from kvcheck.html_report import write_html_report
    trace.save(path)
    print(f"  trace: {path}  (replay: kvcheck replay {path})")
    print(f"  report: {write_html_report(path, backend=backend)}")
    return path


def _progress(res: Result, depth: int, nxt: int, el: float) -> None:
    print(f"[explore {res.scope.name}] depth {depth + 1}: {res.states} states "
          f"({res.states / el:,.0f}/s), {res.transitions} transitions, next level {nxt}, "
          f"{el:.0f} s, peak RSS {peak_rss() / (1 << 20):,.0f} MiB", file=sys.stderr, flush=True)


def peak_rss() -> int:
    """This process's peak resident memory in bytes: Linux's VmHWM, the high-water mark of
    this program's own memory (getrusage's ru_maxrss also keeps the peak of the process
    before an exec: a run started from a large parent, e.g. pytest, reports the parent's
    size); elsewhere ru_maxrss (KiB on Linux, bytes on macOS)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def main(args) -> int:
    if getattr(args, "list_presets", False):
        for name, scs in PRESETS.items():
            print(name)
            for sc in scs:
                print("   ", sc.describe())
        return 0
    try:
        scopes = scopes_from_args(args)
    except (ValueError, ConfigError) as e:
        print(f"kvcheck explore: error: {e}", file=sys.stderr)
        return 2
    rc = 0
    try:
        for sc in scopes:
            rc = max(rc, run_scope(sc, args)[0])
    except KeyboardInterrupt:
        from kvcheck.errors import files_written
        written = files_written(Path(args.out), "*.json")
        print("kvcheck explore: interrupted; " + (
            f"traces written: {', '.join(map(str, written))}" if written else "no trace written"))
        raise
    return rc


def run_scope(sc: Scope, args) -> tuple:
    """Explore one scope as `kvcheck explore` does (report on stdout, a trace and an HTML
    report per violation under args.out): (exit code, results, trace paths)."""
    rc, traces = 0, []
    prog = None if getattr(args, "quiet", False) else _progress
    kw = dict(all_violations=args.all_violations, max_states=args.max_states,
              max_seconds=args.max_seconds, check=not args.no_check, progress=prog,
              frontier_states=getattr(args, "frontier_states", FRONTIER_STATES))
    if sc.cfg.accept:
        print(f"[{sc.name}] --accept {','.join(sc.cfg.accept)}: the spec takes upstream's "
              f"behaviour there; the invariants are judged on every transition against "
              f"{args.backend}")
    runs = [True, False] if args.compare else [not args.no_symmetry]
    results = []
    for sym in runs:
        res = explore(sc, symmetric=sym, **kw)
        results.append(res)
        report(res)
        sys.stdout.flush()
        for v in res.violations:
            path = Path(args.out) / f"{sc.name}-{v.id}{'' if res.symmetric else '-nosym'}.json"
            traces.append(_write_trace(to_trace(res, v), path, "spec"))
        if res.violations:
            rc = 1
        elif getattr(args, "backend", "spec") != "spec":
            if res.stopped:
                print(f"  spec vs {args.backend} on every transition: not run (the exploration "
                      f"stopped early: {res.stopped})")
            else:
                rc = max(rc, _check_transitions(res, args, traces))
        gaps = missed(res)
        if gaps and args.strict_coverage and rc == 0:
            print(f"  coverage goals missed: {', '.join(gaps)}")
            rc = 1
        print()
    if args.compare:
        a, b = results
        ids = lambda r: sorted((v.id, v.depth) for v in r.violations)
        same = ids(a) == ids(b)
        print(f"symmetry comparison ({sc.name}): reduced {a.states} states / {a.transitions} "
              f"transitions in {a.seconds:.1f} s; unreduced {b.states} / {b.transitions} in "
              f"{b.seconds:.1f} s; ratio {b.states / max(a.states, 1):.2f}x; violations "
              f"{ids(a)} vs {ids(b)}: {'same' if same else 'DIFFERENT'}")
        print()
    return rc, results, traces


if __name__ == "__main__":
    ap = argparse.ArgumentParser(prog="python -m kvcheck.explore")
    add_arguments(ap)
    sys.exit(main(ap.parse_args()))
