"""The real, published sglang KV bookkeeping driven as a kvcheck Backend (set-up and
construction here; the operations in drive.py, the read-back in readback.py, the concrete
checks in concrete.py, the release and its process set-up in release.py).

Runs INSIDE an sglang venv (adapters/sglang/make_env.sh VERSION): every pool, allocator,
radix tree, StreamingSession, SessionSlot, Req, Session, SessionController and the
ScheduleBatch / mem_cache.common helpers are upstream's own objects, and so are a round's
PrefillAdder, check_decode_mem and retract_decode. What this file emulates is the
scheduler glue around them (the spec's admission test inside the PrefillAdder, decode
results, overlap lookahead, speculative over-allocation, deferred-close reaping); each
emulated step is a small method named after the upstream function it stands in for.
README.md in this directory states that fidelity boundary.

Two upstream API shapes are supported:
  * "flat"   (wrapper era; tested on 0.5.14-0.5.19): StreamingSession(RadixCache) (0.5.19:
             the UnifiedRadixCache its registry builds, with its embedded session), KV
             fields directly on Req / SessionSlot (0.5.16-0.5.18: the allocated length and
             SWA cursor in a `kv` ReqKvInfo the slot copies, `_flat_record`; 0.5.19:
             every KV field in `req.kv`, one record per session that the slot and the turn
             running on it share, `shared`: `_note_slot_copies`, `past_model`).
  * "borrow" (0.5.22+; tested on 0.5.22-0.5.23): StreamingSession owned by
             UnifiedRadixCache, ReqKvInfo records, TreeLock, checkpoint_kv_cache /
             release_kv_cache(checkpoint=).
Anything else (e.g. 0.5.11-0.5.13; 0.5.20-0.5.21, whose UnifiedRadixCache splits a
finished request's path at the prompt boundary under wrapper-design sessions) is refused
with the entry point that is missing or unexpected.

KV content: upstream stores no token ids next to its KV indices (the KV tensors are
never computed here). The adapter keeps a shadow record `kv index -> token id` of every
KV write the emulated forward makes (prefill chunk, decode, speculative accept,
overlap lookahead), and clears a page's record whenever upstream's allocator frees it
(observed by wrapping the allocator instance's `free`, and `free_page_ids` where the
release has it: 0.5.23's paged `free_segment` frees through it, not through `free`;
both are otherwise called through). `abstract()` builds the content from that record with kvcheck.spec.abstract.build_content,
so a token/KV mismatch produced by upstream's index bookkeeping is visible.
"""
from __future__ import annotations

import copy
import types
from array import array

from kvcheck.spec import ops as O
from kvcheck.spec.config import Config, ConfigError
from kvcheck.spec.pages import pages_needed_extend

from kvcheck.adapters.sglang import hybrid, shim, swa_tree, swa_unified
from kvcheck.adapters.sglang.concrete import Concrete
from kvcheck.adapters.sglang.drive import Drive
from kvcheck.adapters.sglang.entry import Entry, rid_str
from kvcheck.adapters.sglang.readback import ReadBack
from kvcheck.adapters.sglang.release import (  # noqa: F401  (installed_version etc.: the API)
    TESTED, VOCAB, StubCalled, UnsupportedRelease, _Live, _ShadowClearing,
    _make_forwarders_copyable, component_type, config_refusal, detect_api, installed_version,
    process_setup, unified_plain)


class SglangBackend(Drive, ReadBack, Concrete):
    """kvcheck Backend over the installed sglang release (see module docstring)."""

    def fork(self) -> "SglangBackend":
        """An independent copy of the release's whole bookkeeping (pools, tree, session
        controller, live requests, the shadow KV content), for the exhaustive walk
        (kvcheck/engines/exhaustive.py). Every wrapper the adapter installs on an upstream
        object is an object, never a closure, so that the copy's wrappers act on the copy
        (tests/test_sglang_fork.py compares forks with fresh replays)."""
        _make_forwarders_copyable()
        return copy.deepcopy(self)

    def __init__(self, cfg: Config, expect_version: str | None = None,
                 refuse: bool = True) -> None:
        self.cfg = cfg
        info = process_setup(cfg.page_size, cfg.spec_enabled)
        self.version, self.api, self.record = info["version"], info["api"], info["record"]
        self.shared, self.unified = info["shared"], info["unified"]
        # the tree is a RadixCache (0.5.14-0.5.18; read as TreeNode objects), else the
        # UnifiedRadixCache TreeCore (0.5.19's plain tree, the borrow era: NodeIds)
        self.radix = self.api == "flat" and not self.unified
        # 0.5.19-0.5.21: what each slot's record held when a turn last took it (below)
        self.slot_copy: dict = {}
        self._restored: dict = {}
        self._records: list = []
        self._shared_with = None
        if expect_version and expect_version != self.version:
            raise UnsupportedRelease(f"sglang {self.version} is installed here, "
                                     f"{expect_version} was asked for")
        # refuse=False: a probe (adapters/sglang/hybrid.py) builds a refused config to show
        # what the release does with it
        why = config_refusal(cfg, self.api, self.version) if refuse else None
        if why:
            raise ConfigError(why)
        self.name = f"sglang-{self.version}"
        self.P = cfg.page_size
        self.shadow: dict[int, int] = {}     # kv index -> token id whose KV was written
        self.live: dict[int, _Live] = {}
        self.clock = 0.0
        # priority scheduling and `config.admission` 'reserve': the running batch in merge
        # order (a finished request stays until it is filtered), and the clock of
        # `wait_queue_entry_time`
        self.running: list[_Live] = []
        self.entries = 0
        self._build()
        # borrow era: upstream's own request entry on a shell scheduler (entry.py)
        self.entry = Entry(self, info["scheduler"]) if info["scheduler"] else None
        shim.arm()

    # -- construction ----------------------------------------------------------

    def _build(self) -> None:
        import torch
        from sglang.srt.mem_cache.allocator import (PagedTokenToKVPoolAllocator,
                                                    TokenToKVPoolAllocator)
        from sglang.srt.mem_cache.cache_init_params import CacheInitParams
        from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
        from sglang.srt.session.session_controller import SessionController

        cfg, P = self.cfg, self.P
        if cfg.mamba_slots:     # a real HybridReqToTokenPool over a stand-in MambaPool
            self.pool = hybrid.hybrid_req_to_token_pool(cfg)
        else:
            self.pool = ReqToTokenPool(size=cfg.num_rows, max_context_len=cfg.max_context_len,
                                       device="cpu", enable_memory_saver=False)
        size = cfg.num_pages * P
        # kvcache=None: the allocators only keep the handle; no KV tensor is computed.
        if cfg.swa_window:      # the real SWA allocator and tree (adapters/sglang/swa_tree.py)
            self.alloc = hybrid.swa_allocator(cfg)
        elif P == 1:   # what production uses for page_size 1
            self.alloc = TokenToKVPoolAllocator(size=size, dtype=torch.bfloat16,
                                                device="cpu", kvcache=None, need_sort=False)
        else:
            self.alloc = PagedTokenToKVPoolAllocator(size=size, page_size=P,
                                                     dtype=torch.bfloat16, device="cpu",
                                                     kvcache=None, need_sort=False)
        # upstream keeps row 0 as a padding row: rows 1..N are handed out. The abstract
        # state numbers rows 0..N-1 (row ids are compared up to renaming anyway, but
        # the row-conservation invariant counts 0..num_rows-1).
        self.row_base = min(int(r) for r in self.pool.free_slots)
        self._observe_free()
        if self.api == "flat" and cfg.swa_window:
            self.cache, self.tree = swa_tree.build(cfg, self.pool, self.alloc)
            self.sess_obj = self.cache
        elif self.api == "flat" and cfg.mamba_tree:     # 0.5.15 MambaRadixCache
            self.cache, self.tree = hybrid.mamba_radix_cache(cfg, self.pool, self.alloc)
            self.sess_obj = self.cache
        elif self.api == "flat" and self.unified:
            # 0.5.19: what its registry builds for any model (`default_radix_cache_factory`
            # ends in `_create_unified_radix_cache`, FULL for a plain one), whose own
            # embedded StreamingSession(inner=self) serves the sessions
            # (`supports_streaming_session`: `create_tree_cache` wraps nothing more)
            from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
            params = CacheInitParams(disable=False, req_to_token_pool=self.pool,
                                     token_to_kv_pool_allocator=self.alloc, page_size=P,
                                     tree_components=(component_type().FULL,))
            self.cache = self.tree = UnifiedRadixCache(params)
            self.sess_obj = self.cache.session
        elif self.api == "flat":
            from sglang.srt.mem_cache.radix_cache import RadixCache
            from sglang.srt.session.streaming_session import StreamingSession
            params = CacheInitParams(disable=False, req_to_token_pool=self.pool,
                                     token_to_kv_pool_allocator=self.alloc, page_size=P)
            # 0.5.15 production with --enable-streaming-session: the wrapper.
            self.cache = StreamingSession(RadixCache(params))
            self.tree = self.cache.inner
            self.sess_obj = self.cache
        elif cfg.swa_window:    # 0.5.23 FULL + SWA (adapters/sglang/swa_unified.py)
            self.cache = self.tree = swa_unified.build(cfg, self.pool, self.alloc)
            self.sess_obj = self.cache.session
        else:
            from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
            params = CacheInitParams(disable=cfg.disable_radix_cache, req_to_token_pool=self.pool,
                                     token_to_kv_pool_allocator=self.alloc, page_size=P,
                                     tree_core_backend="python", **hybrid.cache_params(cfg))
            self.cache = UnifiedRadixCache(params)
            self.tree = self.cache
            self.sess_obj = self.cache.session
        self.ctrl = SessionController(self.cache)
        self.model_config = types.SimpleNamespace(vocab_size=VOCAB, is_encoder_decoder=False)

    def _observe_free(self) -> None:
        """Clear the shadow content of every page upstream's allocator frees (the full
        side's allocator under SWA: the tree's tombstone recovery frees through it)."""
        full = swa_tree.full_allocator(self.alloc)
        full.free = _ShadowClearing(full.free, self.shadow, self.P, by_page=False)
        if getattr(full, "free_page_ids", None) is not None:
            # 0.5.23 paged allocator: free_segment (tree eviction, segment frees; under SWA
            # the full side's `free_full_segment` too) releases page ids here, never
            # through free()
            full.free_page_ids = _ShadowClearing(full.free_page_ids, self.shadow, self.P,
                                                 by_page=True)

    # -- small upstream-named helpers ---------------------------------------------

    def _sid(self, sid: int) -> str:
        return str(sid)

    def _row(self, req):
        return req.req_pool_idx if self.api == "flat" and not self.shared \
            else req.kv.req_pool_idx

    def _lens(self, req):
        """(committed, allocated, protected) of a request."""
        if self.api == "flat" and not self.shared:
            return req.kv_committed_len, self._allocated(req), req.cache_protected_len
        kv = req.kv
        return kv.kv_committed_len, kv.kv_allocated_len, kv.cache_protected_len

    def _flat_record(self, holder):
        """Where a flat-API holder keeps its allocated length and SWA cursor: itself
        (0.5.14-0.5.15) or its `kv` record (0.5.16-0.5.18; None when it holds no KV)."""
        return holder.kv if self.record else holder

    def _allocated(self, holder) -> int:
        rec = self._flat_record(holder)
        return 0 if rec is None else rec.kv_allocated_len

    def _prefix_len(self, req) -> int:
        return len(req.prefix_indices) if self.api == "flat" else req.prefix_len

    def _write_shadow(self, req, start: int, end: int, fill=None) -> None:
        """The emulated forward writes the KV of fill[i] at row position i: an extend's
        input is `req.get_fill_ids()` (prepare_for_extend), a decode's the sampled
        tokens (origin_input_ids + output_ids, the default)."""
        if end <= start:
            return
        if fill is None:
            fill = list(req.origin_input_ids) + list(req.output_ids)
        row = self._row(req)
        idx = self.pool.req_to_token[row, start:end].tolist()
        for i, kv in zip(range(start, end), idx):
            # -1: the request's own token arrays no longer reach position i (upstream
            # rewrote them in place, e.g. a shared origin array trimmed by create_req)
            self.shadow[int(kv)] = fill[i] if i < len(fill) else -1

    def _sampling(self, max_new: int):
        from sglang.srt.sampling.sampling_params import SamplingParams
        sp = SamplingParams(max_new_tokens=max_new, ignore_eos=True)
        sp.normalize(None)
        return sp

    def _tokenized(self, rid: int, tokens, max_new: int, sid: int | None,
                   logprob_start_len=None, priority=None):
        from sglang.srt.managers.io_struct import SessionParams, TokenizedGenerateReqInput
        return TokenizedGenerateReqInput(
            rid=rid_str(rid) if self.entry else str(rid), input_text=None,
            input_ids=array("q", tokens), input_embeds=None,
            mm_inputs=None, token_type_ids=None, sampling_params=self._sampling(max_new),
            return_logprob=logprob_start_len is not None,
            logprob_start_len=-1 if logprob_start_len is None else logprob_start_len,
            top_logprobs_num=0, priority=priority,
            token_ids_logprob=None, stream=False,
            session_params=None if sid is None else SessionParams(id=self._sid(sid)))

    def _evict_from_tree_cache(self, n: int) -> None:
        from sglang.srt.mem_cache.common import evict_from_tree_cache
        evict_from_tree_cache(self.cache, n)

    def _can_alloc_extend(self, prefix: int, end: int) -> bool:
        """alloc_for_extend's eviction (the real evict_from_tree_cache, with upstream's
        over-estimate: +P for paged), then whether the allocator can serve it."""
        n = end - prefix
        self._evict_from_tree_cache(n if self.P == 1 else n + self.P)
        return pages_needed_extend(prefix, end, self.P) * self.P <= self.alloc.available_size()

    def _can_alloc_decode(self, pos: int) -> bool:
        self._evict_from_tree_cache(self.P)
        return pos % self.P != 0 or self.alloc.available_size() >= self.P

    def _maybe_reap(self) -> None:
        """Scheduler loop: SessionController.maybe_reap (its once-a-second gate is
        advanced by a fake clock so it runs after every op)."""
        self.clock += 10.0
        self.ctrl.maybe_reap(self.clock)

    # -- the Backend protocol ---------------------------------------------------------

    def apply(self, op: O.Op) -> str:
        if isinstance(op, (O.AbortQueued, O.PreAbort, O.AbortRunning)) and op.rid not in self.live:
            return "refused"            # abort_request finds no request with this rid
        handler = getattr(self, "_op_" + op.name)
        before = self._borrowers() if self.shared else None
        out = handler(op)
        self._maybe_reap()
        if self.shared:
            self._note_slot_copies(before=before)
        called = shim.calls()
        if called:
            raise StubCalled(f"calls into stand-in modules: {called}")
        return out

    def close(self) -> None:
        pass

    # -- operations ----------------------------------------------------------------
