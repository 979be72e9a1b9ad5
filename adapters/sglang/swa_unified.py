"""The SWA tree on a real 0.5.23 release (borrow era): `UnifiedRadixCache` with the FULL +
SWA components over the real `SWATokenToKVPoolAllocator` (`hybrid.swa_allocator`).

Built as production builds it for a sliding-window model: `registry.create_unified_radix_cache`
with `is_hybrid_swa` (`kv_cache_builder.py` l.441-461 -> `registry.py` l.147-169: components
FULL, SWA), `CacheInitParams.sliding_window_size` = the window, `swa_gates_prefix_match` on
(a paged SWA pool the tree owns) and no fused draft (`swa_retain_window` = the window). The
tree core is the Python `UnifiedTreeCore` (as for every other 0.5.23 config here; the Rust
core is not built in the venv). The release's environment defaults are kept
(`SGLANG_OPT_UNIFIED_CACHE_FREE_OUT_OF_WINDOW_SLOTS` on, `SGLANG_OPT_RELEASE_PREFILL_SWA`
off) but for `SGLANG_SWA_EVICTION_INTERVAL`, set to `config.swa_eviction_interval`.

Every call into it is upstream's own code: `match_prefix` (the SWA match validator and
`finalize_match_result_in_tree_core`, which sets `swa_branching_seqlen`), `lock` / `unlock`
(the SWA segment lock up to the node stamped with the lock's uuid), `checkpoint_into_tree`
(the SWA component's `prepare_for_caching_req`, `free_out_of_window_slots` and its insert
hooks), `evict`, `release_kv_cache`, `ScheduleBatch.maybe_evict_swa`.

Read back (`swa_fields`, `lock_boundary`, `tree_swa`): a holder's cursor
`kv.component_evicted_seqlens[SWA]` and `kv.swa_evict_floor`, its lock's SWA boundary (the
node whose SWA `metadata["uuid"]` is the receipt's `component_lock_uuids[SWA]`), and per node
its SWA value (None: a tombstone) and SWA `lock_ref`. Checked on the concrete tree
(`tree_violations`): C6 upstream's own `UnifiedTreeCore.sanity_check` (leaf sets, LRUs, the
per-component evictable/protected sizes, aux locks under the full lock), C7 each node's
SWA value against the allocator's `full_to_swa_index_mapping` of its full value (a live node
maps each index to its SWA value, a tombstone to none).
"""
from __future__ import annotations

import os

from kvcheck.spec.violations import Violation


def configure_env(cfg) -> None:
    os.environ["SGLANG_SWA_EVICTION_INTERVAL"] = str(cfg.swa_eviction_interval)
    for name in ("SGLANG_OPT_UNIFIED_CACHE_FREE_OUT_OF_WINDOW_SLOTS",
                 "SGLANG_OPT_RELEASE_PREFILL_SWA", "SGLANG_OPT_SWA_RELEASE_LEAF_LOCK_AFTER_WINDOW"):
        os.environ.pop(name, None)


def build(cfg, pool, alloc):
    """The `UnifiedRadixCache` production builds for a hybrid SWA model (module docstring)."""
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.registry import TreeCacheBuildContext, create_unified_radix_cache
    configure_env(cfg)
    # 0.5.22 has no `swa_gates_prefix_match`: its SWA component gates the match unless the
    # allocator is a per-request ring (`is_swa_req_ring`), which a paged SWA pool is not
    gates = ({"swa_gates_prefix_match": True}
             if "swa_gates_prefix_match" in CacheInitParams.__dataclass_fields__ else {})
    params = CacheInitParams(disable=cfg.disable_radix_cache, req_to_token_pool=pool,
                             token_to_kv_pool_allocator=alloc, page_size=cfg.page_size,
                             sliding_window_size=cfg.swa_window, tree_core_backend="python",
                             **gates)
    # server_args is read only by init_hicache (no HiCache here)
    ctx = TreeCacheBuildContext(
        server_args=None, params=params, is_hybrid_swa=True, is_hybrid_ssm=False,
        enable_hierarchical_cache=False, disable_radix_cache=cfg.disable_radix_cache,
        tp_worker=None, model_config=None, tp_size=1, tp_rank=0, tp_group=None,
        full_tokens_per_layer=cfg.num_pages * cfg.page_size)
    return create_unified_radix_cache(ctx)


def _swa():
    from sglang.srt.mem_cache.unified_cache.components.base import ComponentType
    return ComponentType.SWA


def swa_fields(holder) -> dict:
    """A request's or slot's SWA cursor and floor (their `ReqKvInfo`)."""
    kv = holder.kv
    return dict(swa_evicted_seqlen=int(kv.get_evicted_seqlen(_swa())),
                swa_evict_floor=int(kv.swa_evict_floor))


def branching_seqlen(req):
    """A request's `swa_branching_seqlen` (set by `common.match_kv_cache` from the SWA
    component's `finalize_match_result_in_tree_core`, cleared once a checkpoint inserted
    the branch)."""
    b = getattr(req, "swa_branching_seqlen", None)
    return None if b is None else int(b)


def lock_uuid(lock):
    """The SWA boundary uuid a `TreeLock`'s receipt carries (None: the segment reached the
    root, or no lock)."""
    if lock is None:
        return None
    return lock.receipt.component_lock_uuids.get(_swa())


def paths(cache) -> list:
    """(key path length, node) of every node below the root."""
    out, stack = [], [(cache.tree_core.root_node, 0)]
    while stack:
        node, depth = stack.pop()
        kids = [(depth + len(c.key), c) for c in node.children.values()]
        out += kids
        stack += [(c, d) for d, c in kids]
    return out


def nodes(cache) -> list:
    return [n for _, n in paths(cache)]


def uuid_node(cache, uuid):
    """The node whose SWA `metadata["uuid"]` is uuid, or None."""
    if uuid is None:
        return None
    ct = _swa()
    for n in nodes(cache):
        if n.component_data[ct].metadata.get("uuid") == uuid:
            return n
    return None


def tree_swa(cache) -> list:
    """(key path length, node length, SWA value or None, SWA lock_ref, FULL lock_ref) of
    every node, by path length: what a probe or test reads of the SWA component."""
    from sglang.srt.mem_cache.unified_cache.components.base import ComponentType
    out = []
    for d, n in paths(cache):
        cd = n.component_data[ComponentType.SWA]
        out.append((d, len(n.key), None if cd.value is None else [int(v) for v in cd.value.tolist()],
                    int(cd.lock_ref), int(n.component_data[ComponentType.FULL].lock_ref)))
    return sorted(out, key=lambda x: (x[0], x[1], repr(x)))


def tree_violations(cfg, cache, alloc) -> list:
    """C6: upstream's `UnifiedTreeCore.sanity_check` (without the facade's skip while a
    session holds KV: the tree core's checks do not assume an unlocked tree). C7: per node,
    its SWA value against `full_to_swa_index_mapping` of its full value."""
    from sglang.srt.mem_cache.unified_cache.components.base import ComponentType
    out = []
    try:
        cache.tree_core.sanity_check([], [])
    except AssertionError as e:
        out.append(Violation("C6", "UnifiedTreeCore.sanity_check", str(e)[:400],
                             owner="UnifiedRadixCache"))
    m = alloc.full_to_swa_index_mapping
    for n in nodes(cache):
        full = n.component_data[ComponentType.FULL].value
        swa = n.component_data[ComponentType.SWA].value
        if full is None:
            continue
        mapped = [int(m[int(v)]) for v in full.tolist()]
        who = f"unified tree node {n.id} (key {len(n.key)} tokens)"
        if swa is None and any(mapped):
            out.append(Violation("C7", "SWA tombstone holds SWA KV", f"{sum(map(bool, mapped))}"
                                 f" of its {len(mapped)} full indices still map to SWA",
                                 owner=who))
        elif swa is not None and [int(v) for v in swa.tolist()] != mapped:
            out.append(Violation("C7", "node SWA value off the mapping", f"SWA value "
                                 f"{swa.tolist()[:8]}, mapping of its full value {mapped[:8]}",
                                 owner=who))
    return out


def probe_ops() -> dict:
    """Named operation sequences for `swa_unified_probe`, each reaching one SWA path of
    the 0.5.23 tree (window 4 at P = 2 unless the probe's cfg says otherwise)."""
    from kvcheck.spec import ops as O
    long_prompt = tuple(range(1, 13))           # 12 tokens: 3 windows
    return {
        # the first prefill's checkpoint, decode past the window, finish, a shared match
        "plain": [O.SubmitRequest(1, long_prompt, 8), O.Schedule(1)]
                 + [O.Decode(1, 50 + k) for k in range(6)]
                 + [O.Finish(1), O.SubmitRequest(2, long_prompt + (70, 71), 2), O.Schedule(2),
                    O.Finish(2)],
        # a session: the first turn's lock boundary, a second turn on the record, close
        "session": [O.OpenSession(1), O.SubmitTurn(1, 1, long_prompt, 8), O.Schedule(1)]
                   + [O.Decode(1, 50 + k) for k in range(5)]
                   + [O.Finish(1), O.SubmitTurn(1, 2, (80, 81, 82), 4), O.Schedule(2),
                      O.Decode(2, 90), O.Finish(2), O.CloseSession(1)],
        # eviction of a finished prompt whose leaf is partly a tombstone
        "evict": [O.SubmitRequest(1, long_prompt, 8), O.Schedule(1)]
                 + [O.Decode(1, 50 + k) for k in range(5)]
                 + [O.Finish(1), O.Evict(64)],
        # a retracted decode and its re-admission
        "retract": [O.SubmitRequest(1, long_prompt, 8), O.Schedule(1)]
                   + [O.Decode(1, 50 + k) for k in range(4)]
                   + [O.Retract(1), O.Schedule(1), O.Decode(1, 60), O.Finish(1)],
        # the retried request's prompt is no node boundary once the tree is evicted: its
        # finish does not split there (`checkpoint_into_tree` splits a FULL-only tree only)
        "retract_evict": [O.SubmitRequest(1, long_prompt, 8), O.Schedule(1)]
                         + [O.Decode(1, 50 + k) for k in range(4)]
                         + [O.Retract(1), O.Evict(64), O.Schedule(1), O.Decode(1, 60),
                            O.Finish(1)],
    }


