"""What the scheduler asks of the tree cache: room for an allocation (`evict_from_tree_cache`,
`alloc_for_extend`, `alloc_for_decode`) and a request's KV moved into the tree
(`cache_unfinished_req`, `cache_finished_req`).
"""
from __future__ import annotations

from kvcheck.spec import mamba_pool, mamba_tree, swa_pool, swa_tree
from kvcheck.spec.allocator import _alloc_pages, _free_row_range, available_size
from kvcheck.spec.pages import ceil_div, floor_align, pages_needed_extend
from kvcheck.spec.radix_cache import (_evict_full, _evict_swa, _path_pages, alloc_mamba_slot,
                                      dec_lock_ref, evict, evict_for_alloc_swa, evict_mamba,
                                      inc_lock_ref, insert, insert_mamba, match_prefix)
from kvcheck.spec.state import Req, State
from kvcheck.spec.token_arrays import fill_key
from kvcheck.spec.violations import ModelError


def _alloc_extend(s: State, row: int, prefix: int, end: int, mamba_evict: bool = False,
                  evict: bool = True) -> bool:
    """`alloc_for_extend` for one request: evict first, then P=1 `alloc(n)` or P>1
    `alloc_extend` (continue the partial last page, then new pages); fill the row.
    `mamba_evict` (a 0.5.15 Mamba tree's next chunk): once the KV fits, `alloc_req_slots`
    evicts Mamba states before the allocation (`mamba_tree.alloc_req_slots_evict`)."""
    P = s.cfg.page_size
    n = end - prefix
    if P == 1:
        if evict:
            evict_from_tree_cache(s, n)
        if mamba_evict and len(s.free_pages) >= n:
            evict_mamba(s, mamba_tree.alloc_req_slots_evict(s))
        pages = _alloc_pages(s, n)
        if pages is None:
            return False
        s.rows[row][prefix:end] = pages
        return True
    if evict:
        evict_from_tree_cache(s, n + P)
    pages = _alloc_pages(s, pages_needed_extend(prefix, end, P))
    if pages is None:
        return False
    first_new = ceil_div(prefix, P)
    s.rows[row][first_new:first_new + len(pages)] = pages
    return True


def _alloc_decode(s: State, row: int, pos: int, evict: bool = True) -> bool:
    """`alloc_for_decode` for row position pos: a new page iff pos % P == 0."""
    P = s.cfg.page_size
    if evict:
        evict_from_tree_cache(s, P)
    if pos % P:
        return True                     # last_loc + 1, in the page already held
    pages = _alloc_pages(s, 1)
    if pages is None:
        return False
    s.rows[row][pos // P] = pages[0]
    return True


def evict_from_tree_cache(s: State, n: int) -> None:
    """V1 `evict_from_tree_cache`: if available < n, evict(n) (0.5.14-0.5.16), or only the
    shortfall n - available (`config.evict_shortfall`: 0.5.17+; the borrow era)."""
    if s.cfg.era == "borrow":
        if swa_pool.swa_on(s):
            evict_for_alloc_swa(s, n)
            return
        # 0.5.22+ `allocator.evict_to_free_tokens`: evict only the shortfall
        if available_size(s) < n:
            evict(s, n - available_size(s))
        return
    if swa_tree.swa_tree_on(s):
        # 0.5.15 `common.py` l.297-316 with an SWATokenToKVPoolAllocator: each pool's
        # shortfall, `EvictParams(num_tokens=n - full_available, swa_num_tokens=n -
        # swa_available)`; the leaves the full loop evicts count on the SWA side too
        full_short = max(0, n - len(s.free_pages) * s.cfg.page_size)
        swa_short = max(0, n - swa_pool.swa_available_size(s))
        if full_short or swa_short:
            _, swa = _evict_full(s, full_short)
            _evict_swa(s, swa_short - swa)
        return
    available = available_size(s)
    if available < n:
        evict(s, n - available if s.cfg.evict_shortfall else n)


def cache_unfinished_req_inner(s: State, req: Req) -> None:
    """Inner `RadixCache.cache_unfinished_req` (DOMAIN.md 2.4): the page-aligned
    committed prefix moves into the tree and the lock moves with it. A disabled tree
    (`checkpoint_into_tree`: `if self.disable`) keeps nothing and moves no lock. In the
    wrapper era a request anchored on its session slot's virtual node reaches it only once
    detached from its session (after an accepted U2's second `finish_req`): 0.5.15's inner
    tree then unlocks the virtual node and raises."""
    if s.cfg.era == "wrapper" and req.last_node is not None and req.last_node[0] == "virtual":
        raise ModelError(f"RadixCache.dec_lock_ref: req {req.rid}, detached from its session, "
                         f"still anchored on session {req.last_node[1]}'s virtual node",
                         upstream=("'_VirtualNode' object has no attribute 'lock_ref'",))
    if s.cfg.disable_radix_cache:
        return
    if mamba_tree.on(s):
        _checkpoint_mamba_tree(s, req, finished=False)
        return
    P = s.cfg.page_size
    row = s.rows[req.row]
    branch = swa_tree.swa_branch_cache_len(req, req.committed)
    cache_len = req.committed if branch is None else branch
    # the key is `get_fill_ids()` (0.5.15 radix_cache.py l.493-500; 0.5.23 `checkpoint`,
    # fill[:extend_end]) page-aligned: shorter than committed only when a later turn
    # rewrote the shared array in place (U1); cache_protected_len then becomes that
    # shorter length, as upstream's `len(new_indices)` does
    keys_len = floor_align(min(cache_len, len(req.fill)), P)
    key = req.fill[:keys_len]
    swa_pool.free_out_of_window_slots(s, req, cache_len)
    new_prefix_len = insert(s, key, row[:keys_len // P], swa_tree.insert_cursor(s, req),
                            prev_prefix_len=req.protected)
    if new_prefix_len > req.protected:
        _free_row_range(s, req.row, req.protected, new_prefix_len)
    if swa_tree.prompt_split_on(s):
        _split_at_prompt(s, req, key)
    nid, pages = match_prefix(s, key)
    if len(pages) * P != keys_len:
        raise ModelError(f"cache_unfinished_req: re-match {len(pages) * P} != {keys_len}")
    row[req.protected // P:keys_len // P] = pages[req.protected // P:]
    req.protected = keys_len
    dec_lock_ref(s, req.last_node)
    req.last_node = ("node", nid)
    inc_lock_ref(s, req.last_node)
    req.locked = True
    swa_tree.note_swa_lock(s, req)
    swa_tree.cleanup_swa_branch(s, req, branch, finished=False)


def _checkpoint_mamba_tree(s: State, req: Req, finished: bool) -> None:
    """0.5.23 `checkpoint_into_tree` with a Mamba component (P = 1, no extra buffer): the
    state offered to the tree is a copy in a fresh slot (unfinished) or the request's own
    (finished: donated); the insert keys [0, committed), the duplicates of
    [protected, existing) are freed, the lock moves to the node the key ends on, and
    `cleanup_after_caching_req` frees what the node did not take."""
    if finished:
        value = req.mamba_pool_idx
        if value is None:
            raise ModelError(f"prepare_for_caching_req: finished req {req.rid} holds no "
                             "Mamba state to donate")
    else:
        value = alloc_mamba_slot(s, "prepare_for_caching_req")   # copy_from(req's state)
    # `full_untruncated_fill_ids[:up_to]`: shorter than committed only where a later turn
    # rewrote the shared array (U1); a finished request's row past it is then freed by
    # `release_kv_cache` ([cache_protected_len, owned_kv_len)), an unfinished one keeps it
    key = fill_key(s, req, finished)[:req.committed]
    keys_len = len(key)
    row = s.rows[req.row]
    nid, new_prefix_len, exist = insert_mamba(s, key, row[:keys_len], value)
    if new_prefix_len > req.protected:
        _free_row_range(s, req.row, req.protected, new_prefix_len)
    row[req.protected:keys_len] = _path_pages(s, nid)[req.protected:]
    if finished and keys_len < req.committed and s.cfg.era == "borrow":
        _free_row_range(s, req.row, keys_len, req.committed)
    dec_lock_ref(s, req.last_node)
    req.last_node = ("node", nid)
    inc_lock_ref(s, req.last_node)
    req.locked = True
    req.protected = keys_len
    if not finished:
        if exist:
            mamba_tree.free_slot(s, value)
    elif exist:
        mamba_pool.free_mamba(s, req)       # `free_mamba_cache`: the node kept its own
    else:
        req.mamba_pool_idx = None       # the node owns it now (upstream leaves the ref)


def _split_at_prompt(s: State, req: Req, key: tuple) -> None:
    """Borrow era (`checkpoint_into_tree`), a FULL-only tree (`swa_tree.prompt_split_on`): a
    second insert of the page-aligned prompt, cut from the inserted `key`, splits the
    inserted path at the prompt boundary (so eviction can drop the output KV without the
    prompt); it adds and frees nothing."""
    P = s.cfg.page_size
    prompt_len = floor_align(len(req.origin), P)
    if 0 < prompt_len < len(key):
        insert(s, key[:prompt_len], s.rows[req.row][:prompt_len // P])


def cache_finished_req_inner(s: State, req: Req, is_insert: bool) -> None:
    """Inner `RadixCache.cache_finished_req` (DOMAIN.md 2.6, non-streaming)."""
    P = s.cfg.page_size
    committed = req.committed
    req.committed_freed = True                      # pop_committed_kv_cache
    if is_insert and mamba_tree.on(s):
        _checkpoint_mamba_tree(s, req, finished=True)
        if req.locked:
            dec_lock_ref(s, req.last_node)
            req.locked = False
        return
    branch = swa_tree.swa_branch_cache_len(req, committed) if is_insert else None
    n, key_len = committed, branch
    if branch is None:
        # the key is the token array `fill_key` names cut at kv_committed_len: shorter than
        # committed only when a later turn rewrote the arrays in place (U1,
        # `aliases_token_arrays`). 0.5.22+ (`checkpoint_into_tree`, then `release_kv_cache`'s
        # free of [cache_protected_len, owned_kv_len)) frees the row past the page-aligned
        # key; 0.5.15 (radix_cache.py l.451-454) frees the row slice of its key only, and
        # row positions [key, committed) by nothing
        key_len = min(committed, len(fill_key(s, req, finished=True)))
        if s.cfg.era == "wrapper":
            n = key_len
    keys_len = floor_align(key_len, P)
    if is_insert and not s.cfg.disable_radix_cache:     # disabled: the row is freed
        key = fill_key(s, req, finished=True)[:keys_len]
        new_prefix_len = insert(s, key, s.rows[req.row][:keys_len // P],
                                req.swa_evicted_seqlen, req.protected)
        if new_prefix_len > req.protected:
            _free_row_range(s, req.row, req.protected, new_prefix_len)
        if swa_tree.prompt_split_on(s):
            _split_at_prompt(s, req, key)
    elif keys_len > req.protected:
        _free_row_range(s, req.row, req.protected, keys_len)
    if n > keys_len:
        _free_row_range(s, req.row, keys_len, n)    # the unaligned tail page
    if req.locked:
        dec_lock_ref(s, req.last_node)
        req.locked = False
    swa_tree.cleanup_swa_branch(s, req, branch, finished=True)
