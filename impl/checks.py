"""Checks on the concrete state, callable at any time; they RETURN findings.

- Leak checks as upstream has them (DOMAIN.md 2.14): the pool accounting identity
  (idle and busy form) and the request-pool check.
- Concrete checks C1..C5 that only tensors can show: a page both free and owned, a
  duplicate in the free lists, row/page congruence, page 0 handed out, a row both free
  and held.
Findings are `Finding` records (the adapter turns them into spec Violations).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


from kvcheck.impl.radix_cache import TreeNode


@dataclass(frozen=True)
class Finding:
    id: str
    name: str
    message: str
    owner: Optional[str] = None
    page: Optional[int] = None


def ceil_align(x: int, p: int) -> int:
    return -(-x // p) * p


# ---------------------------------------------------------------------------
# leak checks (scheduler_runtime_checker_mixin)
# ---------------------------------------------------------------------------

def check_pool_invariant(sched) -> list[Finding]:
    """available + evictable + protected + session_held + uncached == total.
    Idle (no running request): uncached == 0. Busy: uncached sums
    ceil_align(allocated) - protected over running requests that still hold their KV."""
    P = sched.page_size
    alloc = sched.token_to_kv_pool_allocator
    tc = sched.tree_cache
    running = sched.running_reqs()
    active = sched.active_pool_idxs()
    uncached = 0
    out: list[Finding] = []
    for r in running:
        if r.req_pool_idx is None or r.kv_committed_freed:
            continue
        if r.kv_committed_freed != r.kv_overallocated_freed:
            out.append(Finding("L1", "busy freed flags", f"kv_committed_freed={r.kv_committed_freed} "
                               f"kv_overallocated_freed={r.kv_overallocated_freed}", f"req {r.rid}"))
        if r.cache_protected_len % P:
            out.append(Finding("L1", "busy protected alignment",
                               f"cache_protected_len={r.cache_protected_len} not a multiple of {P}", f"req {r.rid}"))
        uncached += ceil_align(r.kv_allocated_len, P) - r.cache_protected_len
    available = getattr(alloc, "full_available_size", alloc.available_size)()   # SWA: full side
    evictable = tc.evictable_size()
    protected = tc.protected_size()
    held = tc.session_held_tokens(active)
    total = sched.max_total_num_tokens
    s = available + evictable + protected + held + uncached
    if s != total:
        kind = "busy" if running else "idle"
        out.append(Finding("L1", f"{kind} pool accounting (_check_pool_invariant)",
                           f"available {available} + evictable {evictable} + protected {protected} + "
                           f"session_held {held} + uncached {uncached} = {s} != total {total}",
                           "allocator"))
    return out


def check_req_pool(sched) -> list[Finding]:
    """len(free_slots) + session_held_req_count + running requests holding a row == size."""
    pool = sched.req_to_token_pool
    active = sched.active_pool_idxs()
    held = sched.tree_cache.session_held_req_count(active)
    n_free = len(pool.free_slots)
    s = n_free + held + len(active)
    if s != pool.size:
        return [Finding("L2", "request pool accounting (_check_req_pool)",
                        f"free_slots {n_free} + session_held_req_count {held} + running rows {len(active)} "
                        f"= {s} != size {pool.size}", "req_to_token_pool")]
    return []


def leak_check(sched) -> list[Finding]:
    return check_pool_invariant(sched) + check_req_pool(sched)


# ---------------------------------------------------------------------------
# concrete checks C1..C5
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Snapshot:
    """The tensors a check or a view reads, copied out once (one `.tolist()` each) so that
    the concrete checks and the adapter's abstract view share them within a step."""
    free: list          # page ids in the free lists (free_pages, then release_pages)
    r2t: list           # req_to_token, one list of KV indices per row
    nodes: list         # (node, path, KV indices of its key) for every node but the root
    token_of: list      # the token id whose KV each KV index holds (-1: unwritten)
    swa_map: Optional[list] = None  # SWA: full_to_swa_index_mapping, one entry per KV index


def snapshot(sched) -> Snapshot:
    nodes = [(n, n.path(), [] if n.value is None else n.value.tolist())
             for n in sched.radix_cache.all_nodes()]
    nodes.sort(key=lambda x: x[1])
    alloc = sched.token_to_kv_pool_allocator
    swa = getattr(alloc, "full_to_swa_index_mapping", None)
    return Snapshot(free=alloc.get_all_free_pages().tolist(),
                    r2t=sched.req_to_token_pool.req_to_token.tolist(), nodes=nodes,
                    token_of=sched.kv_buffer.token_of.tolist(),
                    swa_map=None if swa is None else swa.tolist())


def holders(sched) -> list:
    """(owner label, row, allocated) for every request and slot naming a row."""
    out = []
    for r in sorted(sched.reqs.values(), key=lambda r: r.rid):
        if r.req_pool_idx is not None:
            out.append((f"req {r.rid}", r.req_pool_idx, r.kv_allocated_len))
    for sid, s in sorted(sched.tree_cache.slots.items()):
        if s.req_pool_idx is not None:
            out.append((f"slot of session {sid}", s.req_pool_idx, s.kv_allocated_len))
    return out


def node_label(n: TreeNode) -> str:
    return f"node {list(n.path())}"


def _first(flags) -> Optional[int]:
    return next((i for i, bad in enumerate(flags) if bad), None)


def concrete_findings(sched, snap: Optional[Snapshot] = None) -> list[Finding]:
    P = sched.page_size
    snap = snapshot(sched) if snap is None else snap
    out: list[Finding] = []
    free = snap.free
    free_set = set(free)

    # C2: duplicates in the free lists (free_pages + release_pages)
    counts: dict = {}
    for p in free:
        counts[p] = counts.get(p, 0) + 1
    for p in sorted(counts):
        if counts[p] > 1:
            out.append(Finding("C2", "double free", f"page {p} appears {counts[p]} times in the free lists",
                               "allocator", p))
    # C4: page 0 in the free lists
    if 0 in free_set:
        out.append(Finding("C4", "page 0 handed out", "reserved page 0 is in the free lists", "allocator", 0))

    # owners: tree nodes and live row positions
    owned: list = []       # (label, page)
    for n, path, vals in snap.nodes:
        if not vals:
            continue
        for p in sorted({v // P for v in vals}):
            owned.append((f"node {list(path)}", p))
    for label, row, allocated in holders(sched):
        if allocated <= 0:
            continue
        idx = snap.r2t[row][:allocated]
        pages = [v // P for v in idx]
        for p in sorted(set(pages)):
            owned.append((label, p))
        # C3: congruence and one physical page per row-page
        i = _first(v % P != k % P for k, v in enumerate(idx))
        if i is not None:
            out.append(Finding("C3", "row/page congruence",
                               f"row {row} position {i} holds KV index {idx[i]}: "
                               f"{idx[i] % P} != {i % P} (mod {P})", label, pages[i]))
        i = _first(pages[k] != pages[k // P * P] for k in range(allocated))
        if i is not None:
            first_of_page = pages[i // P * P]
            out.append(Finding("C3", "row/page congruence",
                               f"row {row} row-page {i // P} maps to pages {first_of_page} and {pages[i]}",
                               label, pages[i]))
    for label, p in owned:
        if p in free_set:
            out.append(Finding("C1", "free and owned", f"page {p} is in the free lists and owned by {label}",
                               label, p))
        if p == 0:
            out.append(Finding("C4", "page 0 handed out", f"reserved page 0 is owned by {label}", label, 0))

    # C5: a row both free and held
    free_rows = sched.req_to_token_pool.free_slots
    seen: dict = {}
    for r in free_rows:
        seen[r] = seen.get(r, 0) + 1
    for r in sorted(seen):
        if seen[r] > 1:
            out.append(Finding("C5", "row free and held", f"row {r} appears {seen[r]} times in free_slots",
                               "req_to_token_pool"))
    for label, row, _ in holders(sched):
        if row in seen:
            out.append(Finding("C5", "row free and held", f"row {row} is in free_slots and held by {label}", label))
    return out
