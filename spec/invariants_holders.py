"""Invariants of one row holder (a request or a session slot) on its own: its lengths agree,
its protected prefix is aligned, its flags match the row it holds (I6-I9, I12, I29)."""
from __future__ import annotations

from kvcheck.spec.abstract import AbstractState
from kvcheck.spec.config import Config
from kvcheck.spec.invariants_base import _holders, _req, _slot, _v, invariant


@invariant("I6", "kv_committed_len <= kv_allocated_len")
def committed_le_allocated(s: AbstractState, cfg: Config):
    return [_v(committed_le_allocated, f"kv_committed_len {h.committed} > kv_allocated_len {h.allocated}", n)
            for n, h in _holders(s) if h.committed > h.allocated]


@invariant("I7", "without speculative decoding, committed == allocated")
def committed_eq_allocated(s: AbstractState, cfg: Config):
    if cfg.spec_enabled:
        return []
    return [_v(committed_eq_allocated, f"kv_committed_len {h.committed} != kv_allocated_len {h.allocated}", n)
            for n, h in _holders(s) if h.committed != h.allocated]


@invariant("I8", "cache_protected_len is page-aligned")
def protected_aligned(s: AbstractState, cfg: Config):
    out = [_v(protected_aligned, f"cache_protected_len {r.protected} % page_size {s.page_size} != 0", _req(r))
           for r in s.reqs if r.protected % s.page_size]
    out += [_v(protected_aligned, f"cache_protected_len {t.protected} % page_size {s.page_size} != 0", _slot(t))
            for t in s.slots if t.protected % s.page_size]
    return out


@invariant("I9", "cache_protected_len <= kv_committed_len for every row holder")
def protected_le_committed(s: AbstractState, cfg: Config):
    return [_v(protected_le_committed, f"cache_protected_len {h.protected} > kv_committed_len {h.committed}", n)
            for n, h in _holders(s) if h.protected > h.committed]


@invariant("I12", "released flags agree for running requests")
def freed_flags(s: AbstractState, cfg: Config):
    out = []
    for r in s.reqs:
        if r.phase in ("prefill", "decode") and r.committed_freed != r.overallocated_freed:
            out.append(_v(freed_flags, f"kv_committed_freed={r.committed_freed} "
                          f"kv_overallocated_freed={r.overallocated_freed}", _req(r)))
        if r.row is not None and (r.committed_freed or r.overallocated_freed):
            out.append(_v(freed_flags, f"holds row {r.row} after its KV was released", _req(r)))
    return out


@invariant("I29", "a running request holds its row until its KV is released")
def running_holds_row(s: AbstractState, cfg: Config):
    """The converse of I23: a request in a running batch (phase prefill or decode) whose KV
    `release_kv_cache` has not released reads and writes `req_to_token[req_pool_idx]` on its
    next step, so it must hold a row (its own, or its session slot's)."""
    return [_v(running_holds_row, f"{r.phase} request with req_pool_idx None while its KV is "
               "not released (kv_committed_freed False)", _req(r))
            for r in s.reqs if r.phase != "queued" and r.row is None and not r.committed_freed]
