"""Invariants of the hybrid pools, I40-I46: the SWA pool (spec/swa_pool.py) and the Mamba pool
(spec/mamba_pool.py). Each returns [] when its pool is off (swa_num_pages / mamba_slots 0),
so non-hybrid runs are unchanged."""
from __future__ import annotations

from collections import Counter

from kvcheck.spec.abstract import AbstractState
from kvcheck.spec.config import Config
from kvcheck.spec.invariants_base import _holders, _req, _slot, _v, invariant, row_owners
from kvcheck.spec.pages import ceil_div
from kvcheck.spec.swa_pool import cursor_at_dead_lo, row_swa_held


def _window_start(h, P: int) -> int:
    """The first row-page whose SWA KV the holder still needs: from its cursor, never
    the tree-owned prefix."""
    return max(h.protected, h.swa_evicted_seqlen) // P


@invariant("I40", "SWA pages exclusive and conserved")
def swa_pages_conserved(s: AbstractState, cfg: Config):
    if not s.swa_num_pages:
        return []
    out, places = [], {}
    for w in s.swa_free_pages:
        places.setdefault(w, []).append("SWA free list")
    for full, w in s.swa_map:
        places.setdefault(w, []).append(f"full page {full}")
    for w, where in sorted(places.items(), key=lambda x: repr(x[0])):
        if not (isinstance(w, int) and 1 <= w <= s.swa_num_pages):
            out.append(_v(swa_pages_conserved, f"SWA page id out of range 1..{s.swa_num_pages}: "
                          f"{', '.join(where)}", where[0], w))
        elif len(where) > 1:
            out.append(_v(swa_pages_conserved, f"SWA page held {len(where)} times: "
                          f"{', '.join(where)}", where[0], w))
    for w in range(1, s.swa_num_pages + 1):
        if w not in places:
            out.append(_v(swa_pages_conserved, "SWA page is neither free nor mapped from a full "
                          "page (leaked)", "SWA allocator", w))
    return out


@invariant("I41", "no full-to-SWA mapping entry of a free page or pointing at a free SWA page")
def swa_mapping_live(s: AbstractState, cfg: Config):
    if not s.swa_num_pages:
        return []
    free, swa_free, out = set(s.free_pages), set(s.swa_free_pages), []
    for full, w in s.swa_map:
        if w in swa_free:
            out.append(_v(swa_mapping_live, f"full_to_swa_index_mapping[{full}] = {w}, a free SWA "
                          "page", "full_to_swa_index_mapping", full))
        if full in free:
            out.append(_v(swa_mapping_live, f"free full page {full} still maps to SWA page {w}",
                          "full_to_swa_index_mapping", full))
    return out


@invariant("I42", "the SWA window cursor stays within the committed KV, which keeps its SWA KV from there")
def swa_window_cursor(s: AbstractState, cfg: Config):
    if not s.swa_num_pages:
        return []
    P, mapped, out = s.page_size, {f for f, _ in s.swa_map}, []
    for name, h in _holders(s):
        if h.swa_evicted_seqlen > h.committed and not cursor_at_dead_lo(h, P):
            out.append(_v(swa_window_cursor, f"swa_evicted_seqlen {h.swa_evicted_seqlen} > "
                          f"kv_committed_len {h.committed}", name))
    for row, (names, prot, cursor, committed, pages, _) in sorted(_swa_rows(s).items(),
                                                                key=lambda x: repr(x[0])):
        for k in range(max(prot, cursor) // P, min(ceil_div(committed, P), len(pages))):
            if pages[k] is not None and pages[k] not in mapped:
                out.append(_v(swa_window_cursor, f"row-page {k} (page {pages[k]}) lies at or after "
                              f"swa_evicted_seqlen {cursor} below kv_committed_len {committed}, "
                              "but has no SWA page", " / ".join(names), pages[k]))
                break
    return out


def _swa_rows(s: AbstractState) -> dict:
    """row -> (owner names, protected, cursor, committed, row pages, swa_evict_floor): a
    slot and the request borrowing its row are one owner, the one further on (its cursor
    and committed length, the longer row) speaks for both (the slot is stale while it is
    lent)."""
    out = {}
    for row, (names, prot, alloc, pages) in row_owners(s).items():
        hs = [h for _, h in _holders(s) if h.row == row]
        out[row] = (names, prot, max(h.swa_evicted_seqlen for h in hs),
                    max(h.committed for h in hs), pages, max(h.swa_evict_floor for h in hs))
    return out


@invariant("I43", "SWA accounting identity swa_available + tree + session_held_swa + uncached_swa == swa total")
def swa_accounting(s: AbstractState, cfg: Config):
    """A holder's SWA is `ceil_align(allocated) - max(protected, cursor)`; under
    prefill-aware SWA (a floor above the protected prefix) the row-pages still mapped,
    since a later turn's floor can rise above a range an earlier floor let the window
    free, which 0.5.23's `kv_private_swa_tokens` then counts as held (docs/coverage.md)."""
    if not s.swa_num_pages:
        return []
    P, mapped = s.page_size, {f for f, _ in s.swa_map}
    tree = sum(P for n in s.nodes for p in n.pages if p in mapped)
    allocs = {row: alloc for row, (_, _, alloc, _) in row_owners(s).items()}
    held = sum(row_swa_held(allocs[row], prot, cursor, floor, P, pages, mapped)
               for row, (_, prot, cursor, _, pages, floor) in _swa_rows(s).items())
    available = len(s.swa_free_pages) * P
    total = s.swa_num_pages * P
    if available + tree + held != total:
        return [_v(swa_accounting, f"swa_available {available} + tree SWA {tree} + held SWA {held} "
                   f"= {available + tree + held} != swa total {total}", "SWA allocator")]
    return []


def _mamba_owners(s: AbstractState) -> dict:
    """Owner name -> Mamba entries, a slot and the request borrowing its row counted as one
    owner (they share one set of references, as they share the row)."""
    owners: dict = {}
    for row, (names, *_rest) in row_owners(s).items():
        hs = [h for n, h in _holders(s) if h.row == row]
        refs = max((h.mamba for h in hs), key=len)
        owners[" / ".join(names)] = (refs, hs)
    return owners


@invariant("I44", "each Mamba slot is free or held by exactly one owner, never freed twice, never the sentinel")
def mamba_slots_conserved(s: AbstractState, cfg: Config):
    if not s.mamba_slots:
        return []
    out, places = [], {}
    for m, n in sorted(Counter(s.mamba_free).items()):
        if n > 1:
            out.append(_v(mamba_slots_conserved, f"Mamba slot {m} is in the free list {n} times "
                          "(freed twice)", "MambaSlotAllocator"))
        places.setdefault(m, []).append("free list")
    for owner, m in _mamba_off_row(s):
        places.setdefault(m, []).append(owner)
    for owner, (refs, hs) in _mamba_owners(s).items():
        if any(h.mamba and h.mamba != refs for h in hs):
            out.append(_v(mamba_slots_conserved, "a slot and the request borrowing its row hold "
                          f"different Mamba states {[h.mamba for h in hs]}", owner))
        if not refs:
            out.append(_v(mamba_slots_conserved, "holds a row but no Mamba state", owner))
        for k, m in enumerate(refs):
            if m == -1 and k == 0:
                out.append(_v(mamba_slots_conserved, "mamba_pool_idx is the sentinel -1", owner))
            if m != -1:
                places.setdefault(m, []).append(owner)
    for m, where in sorted(places.items(), key=lambda x: repr(x[0])):
        if not (isinstance(m, int) and 1 <= m <= s.mamba_slots):
            what = "the reserved dummy slot 0" if m == 0 else ("the sentinel -1" if m == -1 else
                                                                f"out of range 1..{s.mamba_slots}")
            out.append(_v(mamba_slots_conserved, f"Mamba slot {m} is {what}: {', '.join(where)}",
                          where[0]))
        elif len(set(where)) > 1 or (len(where) > 1 and where[0] != "free list"):
            out.append(_v(mamba_slots_conserved, f"Mamba slot {m} held {len(where)} times: "
                          f"{', '.join(where)}", where[0]))
    for m in range(1, s.mamba_slots + 1):
        if m not in places:
            out.append(_v(mamba_slots_conserved, f"Mamba slot {m} is neither free nor held (leaked)",
                          "MambaSlotAllocator"))
    return out


def _mamba_off_row(s: AbstractState) -> list:
    """(owner, slot) of every Mamba state held outside a row: a tree node's
    (config.mamba_tree), and a queued request's copy-on-write slot, taken at its match
    before it has a row (kept across a rejected admission by a streaming turn)."""
    out = [(f"node {list(n.path)}", m) for n in s.nodes for m in n.mamba]
    out += [(_req(r), m) for r in s.reqs if r.row is None for m in r.mamba if m != -1]
    return out


@invariant("I45", "Mamba accounting identity available + evictable + protected + held by requests + session_held_mamba_slots == size")
def mamba_accounting(s: AbstractState, cfg: Config):
    if not s.mamba_slots:
        return []
    active_rows = {r.row for r in s.reqs if r.row is not None}
    in_reqs = sum(1 for r in s.reqs for m in r.mamba if m != -1)   # a queued one's copy too
    held = sum(1 for t in s.slots if t.row not in active_rows for m in t.mamba if m != -1)
    evictable = sum(1 for n in s.nodes if n.mamba and not n.mamba_lock_ref)
    protected = sum(1 for n in s.nodes if n.mamba and n.mamba_lock_ref)
    got = len(s.mamba_free) + evictable + protected + in_reqs + held
    if got != s.mamba_slots:
        return [_v(mamba_accounting, f"available {len(s.mamba_free)} + evictable {evictable} + "
                   f"protected {protected} + held by requests {in_reqs} + "
                   f"session_held_mamba_slots {held} = {got} != size {s.mamba_slots}",
                   "MambaSlotAllocator")]
    return []


@invariant("I46", "a node's Mamba lock_ref equals the holders anchored on it, never above its full lock_ref")
def mamba_tree_locks(s: AbstractState, cfg: Config):
    """0.5.23 with a Mamba tree component: `inc_lock_ref` locks the anchor node's own state
    (tombstone or not) beside the full KV up the path; `UnifiedTreeCore.sanity_check`
    asserts `lock_ref >= 0` and `full_lock >= mamba_lock` per node."""
    if cfg is None or not cfg.mamba_tree:
        return []
    anchors = [(_req(r), r.anchor[1]) for r in s.reqs
               if r.locked and r.anchor and r.anchor[0] == "node"]
    anchors += [(_slot(t), t.last_node[1]) for t in s.slots if t.last_node and t.last_node[0] == "node"]
    out = []
    for n in s.nodes:
        holders = [name for name, path in anchors if path == n.path]
        if n.mamba_lock_ref != len(holders):
            out.append(_v(mamba_tree_locks, f"Mamba lock_ref {n.mamba_lock_ref} but {len(holders)} "
                          f"holder(s) anchored on it{': ' + ', '.join(holders) if holders else ''}",
                          f"node {list(n.path)}"))
        if n.mamba_lock_ref > n.lock_ref:
            out.append(_v(mamba_tree_locks, f"Mamba lock_ref {n.mamba_lock_ref} > full lock_ref "
                          f"{n.lock_ref}", f"node {list(n.path)}"))
    return out
