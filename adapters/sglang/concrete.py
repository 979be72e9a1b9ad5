"""SglangBackend's concrete checks: what only upstream's concrete state shows (its own
invariant checkers, busy-pool accounting, leaks, the hybrid trees' checks)."""
from __future__ import annotations

import types

from kvcheck.spec.violations import Violation

from kvcheck.adapters.sglang import swa_tree, swa_unified

class Concrete:
    """The concrete checks of SglangBackend (adapters/sglang/backend.py)."""

    def _invariant_checker(self):
        """Upstream's own `SchedulerPoolStatsObserver` and `SchedulerInvariantChecker`
        (`managers/scheduler_components/`), built as `Scheduler.init_invariant_checker`
        builds them for a plain (no SWA, no SSM, no HiSparse, no disaggregation) server;
        each release takes the fields its dataclasses declare. None where the release
        has no such checker."""
        if getattr(self, "_checker", False) is not False:
            return self._checker
        import dataclasses
        try:
            from sglang.srt.disaggregation.utils import DisaggregationMode
            from sglang.srt.managers.scheduler_components import invariant_checker as ic
            from sglang.srt.managers.scheduler_components import pool_stats_observer as po
            from sglang.srt.server_args import get_global_server_args
        except ImportError:
            self._checker = None
            return None
        values = dict(
            tree_cache=self.cache, token_to_kv_pool_allocator=self.alloc,
            req_to_token_pool=self.pool, session_controller=self.ctrl,
            hisparse_coordinator=None, is_hybrid_swa=bool(self.cfg.swa_window),
            # a hybrid SSM server sets is_hybrid_ssm; set here where 0.5.15's
            # MambaRadixCache (whose evictable_size() raises) needs its split accessors
            is_hybrid_ssm=bool(self.cfg.mamba_tree and self.api == "flat"), enable_hisparse=False,
            full_tokens_per_layer=self.cfg.num_pages * self.P if self.cfg.swa_window else None,
            swa_tokens_per_layer=self.cfg.swa_pages * self.P if self.cfg.swa_window else None,
            max_total_num_tokens=self.cfg.num_pages * self.P, page_size=self.P,
            disaggregation_mode=DisaggregationMode.NULL,
            get_last_batch=self._running_batch, get_running_batch=lambda: None,
            scheduler_stage_metrics=None)

        def build(cls, **extra):
            names = {f.name for f in dataclasses.fields(cls) if f.init}
            if "server_args" in names:      # 0.5.15; retired (raises) in 0.5.23
                extra["server_args"] = get_global_server_args()
            return cls(**{k: v for k, v in {**values, **extra}.items() if k in names})

        observer = build(po.SchedulerPoolStatsObserver)
        self._checker = (observer, build(ic.SchedulerInvariantChecker, pool_stats_observer=observer))
        return self._checker

    def _running_batch(self):
        """The scheduler's last batch as upstream's checks read it: the requests that
        hold a row in a forward (prefilling or decoding); None when there are none."""
        reqs = [L.req for L in self.live.values() if L.phase in ("prefill", "decode")]
        if not reqs:
            return None
        return types.SimpleNamespace(reqs=reqs, is_empty=lambda: False)

    def upstream_busy_violations(self) -> list[Violation]:
        """`self_check_during_busy`'s accounting, upstream's own code: available +
        evictable + protected + session_held + the running requests' uncached tokens
        (`_get_total_uncached_sizes`) == total. L1 (busy)."""
        observer, checker = self._invariant_checker()
        full_uncached, swa_uncached = checker._get_total_uncached_sizes()
        stats = observer.get_pool_stats()
        leak, msg = checker._check_full_pool(stats, uncached=full_uncached)
        if not leak and self.cfg.swa_window:
            leak, msg = checker._check_swa_pool(stats, uncached=swa_uncached)
        return [Violation("L1", "upstream pool accounting (busy)", msg, owner="allocator")] \
            if leak else []

    def upstream_leak_violations(self) -> list[Violation]:
        """`Scheduler.on_idle`'s leak checks, upstream's own code, when the emulated
        scheduler is fully idle (no live request): L1 `_check_all_pools` (available +
        evictable + protected + `session_held_tokens()` == total), L2 `_check_req_pool`
        (free rows + `session_held_req_count()` == rows). Beside kvcheck's own held
        count (the spec's invariants on this side's abstract state)."""
        if self._invariant_checker() is None:
            return []
        if self.live:
            return self.upstream_busy_violations() if self._running_batch() else []
        observer, checker = self._invariant_checker()
        out = []
        leak, messages = checker._check_all_pools(observer.get_pool_stats())
        if leak:
            out.append(Violation("L1", "upstream pool accounting (idle)",
                                 "; ".join(m for m in messages if m), owner="allocator"))
        before = checker.count_req_pool_leak_warnings
        said = ""
        try:
            checker._check_req_pool()
        except ValueError as e:     # SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE (on by
            if "memory leak" not in str(e):     # default): upstream raises its message
                raise
            said = f" (upstream: {str(e).strip()})"
        if said or checker.count_req_pool_leak_warnings != before:
            out.append(Violation("L2", "upstream request-pool accounting (idle)",
                                 f"free rows {len(self.pool.free_slots)} + session_held_req_count "
                                 f"{observer.session_held_req_count()} != {self.pool.size}{said}",
                                 owner="req_to_token_pool"))
        return out

    def concrete_violations(self) -> list[Violation]:
        """What only the concrete tensors show: C1 a free page still referenced by a
        live row range or tree node; C2 a duplicate in the free census; C3 row/page
        congruence (index % P == position % P, one page per row-page); C4 page 0 (the
        reserved dummy) handed out; C5 a row both free and held."""
        P = self.P
        out: list[Violation] = []
        free = self._free_page_census()
        seen, dups = set(), set()
        for p in free:
            (dups if p in seen else seen).add(p)
        for p in sorted(dups):
            out.append(Violation("C2", "duplicate free page", f"page {p} is in the free "
                                 f"census {free.count(p)} times", owner="allocator", page=p))
        owners = []
        for rid, L in self.live.items():
            committed, allocated, _ = self._lens(L.req)
            owners.append((f"req {rid}", self._row(L.req), allocated))
        for sid, slot in self._slots().items():
            row, _, allocated, _, _ = self._slot_kv(slot, sid)
            owners.append((f"slot of session {sid}", row, allocated))
        held_rows = set()
        for who, row, allocated in owners:
            if row is None:
                continue
            held_rows.add((who, row))
            vals = [int(v) for v in self.pool.req_to_token[row, :allocated].tolist()]
            for i, v in enumerate(vals):
                page = v // P
                if page == 0:
                    out.append(Violation("C4", "reserved page handed out",
                                         f"row {row} position {i} holds KV index {v}",
                                         owner=who, page=0))
                    break
                if page in seen:
                    out.append(Violation("C1", "free page still owned",
                                         f"row {row} position {i} -> page {page} is free",
                                         owner=who, page=page))
                    break
                if v % P != i % P or page != vals[i - i % P] // P:
                    out.append(Violation("C3", "row/page congruence",
                                         f"row {row} position {i} -> KV index {v}",
                                         owner=who, page=page))
                    break
        stack = [self._root()]
        while stack:
            n = stack.pop()
            for c in n.children.values():
                stack.append(c)
                value = self._node_value(c)
                for v in (value.tolist() if value is not None else []):
                    if int(v) // P in seen:
                        out.append(Violation("C1", "free page still owned",
                                             f"tree node holds KV index {int(v)}",
                                             owner="tree node", page=int(v) // P))
                        break
        free_rows = set(int(r) for r in self.pool.free_slots)
        for who, row in sorted(held_rows, key=repr):
            if row in free_rows:
                out.append(Violation("C5", "row both free and held",
                                     f"row {row} is in free_slots", owner=who))
        if self.cfg.swa_window and self.api == "flat":
            out += swa_tree.tree_violations(self.cfg, self.tree, self.alloc)
        elif self.cfg.swa_window:
            out += swa_unified.tree_violations(self.cfg, self.cache, self.alloc)
        return out + self.upstream_leak_violations()
