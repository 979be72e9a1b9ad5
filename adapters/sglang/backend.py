"""The real, published sglang KV bookkeeping driven as a kvcheck Backend.

Runs INSIDE an sglang venv (adapters/sglang/make_env.sh VERSION): every pool, allocator,
radix tree, StreamingSession, SessionSlot, Req, Session, SessionController and the
ScheduleBatch / mem_cache.common helpers are upstream's own objects. What this file
emulates is the scheduler glue around them (admission, chunking, decode results,
overlap lookahead, speculative over-allocation, retraction, deferred-close reaping);
each emulated step is a small method named after the upstream function it stands in
for. README.md in this directory states that fidelity boundary.

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
import copyreg
import importlib
import importlib.metadata
import os
import sys
import types
from array import array

from kvcheck.spec import ops as O
from kvcheck.spec.abstract import (AbstractState, NodeView, ReqView, SessionView, SlotView, build_content,
                           with_lru_ranks)
from kvcheck.spec.config import Config, ConfigError
from kvcheck.spec.model import resolve_logprob_start
from kvcheck.spec.pages import ceil_div, chunk_end, pages_needed_extend
from kvcheck.spec.violations import Violation

from kvcheck.adapters.sglang import hybrid, shim, swa_tree, swa_unified

VOCAB = 32000
SAMPLED_TOKEN = 1          # what the prefill forward samples (kvcheck.spec.model.SAMPLED_TOKEN)
TESTED = {"0.5.15": "flat", "0.5.23": "borrow"}
"""The releases each API shape was built on (others are checked: docs/upstream-findings.md)."""


class UnsupportedRelease(RuntimeError):
    """An installed sglang whose bookkeeping API this adapter does not know."""


class StubCalled(RuntimeError):
    """A stand-in module was called: real behaviour would have been replaced."""


# ---------------------------------------------------------------------------
# process set-up and era detection
# ---------------------------------------------------------------------------

_SETUP: dict = {}


def installed_version() -> str:
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        raise UnsupportedRelease(
            f"no sglang in {sys.executable}; build one with adapters/sglang/make_env.sh VERSION")


def detect_api() -> str:
    """'flat' | 'borrow', from the entry points the release actually has."""
    ss = __import__("sglang.srt.session.streaming_session", fromlist=["x"])
    common = __import__("sglang.srt.mem_cache.common", fromlist=["x"])
    StreamingSession = getattr(ss, "StreamingSession", None)
    if StreamingSession is None:
        raise UnsupportedRelease("sglang.srt.session.streaming_session.StreamingSession "
                                 "is missing (streaming sessions start in 0.5.11)")
    if hasattr(StreamingSession, "take"):
        for name in ("checkpoint_kv_cache", "release_kv_cache"):
            if not hasattr(common, name):
                raise UnsupportedRelease(f"borrow-era StreamingSession.take exists but "
                                         f"sglang.srt.mem_cache.common.{name} is missing")
        return "borrow"
    batch = __import__("sglang.srt.managers.schedule_batch", fromlist=["x"])
    for name in ("try_cache_finished_req", "try_match_prefix", "release_session"):
        if not hasattr(StreamingSession, name):
            raise UnsupportedRelease(f"wrapper-era StreamingSession.{name} is missing")
    controller = __import__("sglang.srt.session.session_controller", fromlist=["x"])
    for cls, field in ((controller.Session, "committed_origin_len"),
                       (batch.Req, "full_untruncated_fill_ids")):
        if field not in cls.__init__.__code__.co_names:
            raise UnsupportedRelease(
                f"{cls.__name__}.{field} is missing: the adapter reads a session's checkpoint "
                "and a request's fill array through it (0.5.14+); 0.5.11-0.5.13 keep them "
                "otherwise and are not driven")
    if not hasattr(common, "maybe_cache_unfinished_req"):
        raise UnsupportedRelease("sglang.srt.mem_cache.common.maybe_cache_unfinished_req "
                                 "is missing")
    import inspect
    if unified_plain():
        urc = __import__("sglang.srt.mem_cache.unified_radix_cache", fromlist=["x"])
        if "prompt_key" in inspect.getsource(urc.UnifiedRadixCache):
            raise UnsupportedRelease(
                "the UnifiedRadixCache this release builds for every model splits a finished "
                "request's inserted path at the prompt boundary (a second insert of the "
                "page-aligned prompt: 0.5.20 unified_radix_cache.py cache_finished_req, "
                "prompt_key at l.1030; 0.5.21 insert_req, l.1062) while its sessions keep the wrapper design (no "
                "StreamingSession.take); the spec splits there in the borrow era only "
                "(spec/hybrid.py prompt_split_on), so its wrapper era would differ from this "
                "release in the tree's shape and what eviction frees: sglang 0.5.20-0.5.21 "
                "are not driven (docs/upstream-findings.md, \"Releases between\")")
    return "flat"


def component_type():
    """`ComponentType` (0.5.22+ `unified_cache.components.base`, 0.5.19
    `unified_cache.component_type`)."""
    try:
        from sglang.srt.mem_cache.unified_cache.components.base import ComponentType
    except ImportError:
        from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
    return ComponentType


def unified_plain() -> bool:
    """Whether the release's registry builds a UnifiedRadixCache for a plain model
    (0.5.19+: `default_radix_cache_factory` ends in `_create_unified_radix_cache`), where
    0.5.11-0.5.18 fall back to `RadixCache(params)` (0.5.18 registry.py l.167)."""
    import inspect
    try:
        registry = importlib.import_module("sglang.srt.mem_cache.registry")
    except ImportError:
        return False
    factory = getattr(registry, "default_radix_cache_factory", None)
    return factory is not None and "RadixCache(params)" not in inspect.getsource(factory)


def process_setup(page_size: int, spec_enabled: bool) -> dict:
    """Import shim, global server args, single-rank stand-in, the planted faults of
    $KVCHECK_SGLANG_PLANT. Once per process; the global server args are re-published
    when the page size changes."""
    if not _SETUP:
        os.environ.setdefault("TRITON_INTERPRET", "1")   # 0.5.11-0.5.21 paged kernels
        try:
            import triton  # noqa: F401  (real triton present?)
            stub_triton = False
        except ImportError:
            stub_triton = True
        shim.install(stub_triton=stub_triton)
        version = installed_version()
        api = detect_api()
        # planted faults (adapters/sglang/faults.py), read once per process: an unknown
        # name or one the release does not have refuses the backend (PlantError)
        from kvcheck.adapters.sglang import faults
        planted = faults.install_from_env(version)
        # 0.5.16-0.5.18: the flat API with a request's allocated length and SWA cursor
        # in `req.kv` (a ReqKvInfo; None once released), copied into and out of the slot
        ss = importlib.import_module("sglang.srt.session.streaming_session")
        record = api == "flat" and "kv" in getattr(ss.SessionSlot, "__dataclass_fields__", {})
        # 0.5.19-0.5.21: every KV field of a request (row, lengths, Mamba refs) in its
        # `req.kv`, never None; the slot takes the first turn's record (`Req.detach_kv`)
        # and a later turn runs on the slot's (`restore_to_req`: `req.kv = self.kv`)
        batch = importlib.import_module("sglang.srt.managers.schedule_batch")
        shared = api == "flat" and hasattr(batch.Req, "detach_kv")
        _SETUP.update(version=version, api=api, stub_triton=stub_triton, planted=planted,
                      record=record, shared=shared, unified=api == "flat" and unified_plain())
        if api == "flat":
            # Req.set_finish_with_abort asks the TP group for the rank only to decide
            # whether to log; a single-rank scheduler is rank 0.
            import sglang.srt.managers.schedule_batch as sb
            if getattr(sb, "get_tensor_model_parallel_rank", None) is not None:
                sb.get_tensor_model_parallel_rank = lambda: 0
    from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler
    args = ServerArgs(model_path="dummy", page_size=page_size,
                      attention_backend="torch_native")
    if spec_enabled:
        # release_kv_cache asserts committed == allocated unless a speculative
        # algorithm is configured (speculative decoding over-allocates).
        args.speculative_algorithm = "EAGLE"
    hybrid.seed_server_args(args)
    set_global_server_args_for_scheduler(args)
    import sglang.srt.managers.schedule_batch as sb
    if getattr(sb, "get_tensor_model_parallel_rank", None) is None:
        # 0.5.16+: Req.set_finish_with_abort reads get_parallel().tp_rank (a single-rank
        # scheduler is rank 0); 0.5.16-0.5.21 keep the override record without a setter
        from sglang.srt.runtime_context import get_parallel
        par = get_parallel()
        if hasattr(par, "override_permanently"):
            par.override_permanently(tp_rank=0)
        else:
            par._overrides["tp_rank"] = 0
    return dict(_SETUP)


# ---------------------------------------------------------------------------
# the backend
# ---------------------------------------------------------------------------

class _Live:
    """The scheduler's knowledge of one live request (what the glue tracks)."""

    def __init__(self, rid: int, req, streaming: bool, rejected: bool):
        self.rid = rid
        self.req = req
        self.streaming = streaming
        self.rejected = rejected
        self.phase = "queued"
        self.locked = False
        self.batch = None


class _ShadowClearing:
    """An allocator's `free` (token indices) or `free_page_ids` (page ids), wrapped to
    drop the freed pages' shadow content first. An object holding the bound method and
    the shadow, not a closure, so that a deep copy of the backend (a fork of the
    exhaustive walk) frees through the copy's allocator into the copy's shadow."""

    def __init__(self, real, shadow: dict, page_size: int, by_page: bool):
        self.real, self.shadow, self.P, self.by_page = real, shadow, page_size, by_page

    def __call__(self, ids):
        if ids is not None and ids.numel() > 0:
            div = 1 if self.by_page else self.P
            for page in set((ids.to("cpu").long() // div).tolist()):
                for o in range(self.P):
                    self.shadow.pop(page * self.P + o, None)
        return self.real(ids)


def config_refusal(cfg: Config, api: str | None, version: str) -> str | None:
    """Why a release of this `api` ('flat' | 'borrow'; None: not known yet) cannot run
    cfg, or None: the other era's design, or a hybrid model this adapter does not drive
    (adapters/sglang/hybrid.py). The backend refuses such a config at start; `check`'s
    corpus skips such a trace."""
    era = {"flat": "wrapper", "borrow": "borrow"}.get(api)
    if era and cfg.era != era:
        return (f"config.era is {cfg.era!r} but sglang {version} is a {era}-era release; "
                f"run this trace with era={era!r}")
    rule = hybrid.evicts_shortfall(version)
    if api == "flat" and cfg.evict_shortfall != rule:
        return (f"config.evict_shortfall is {cfg.evict_shortfall} but sglang {version}'s "
                f"evict_from_tree_cache evicts {'only the shortfall' if rule else 'the whole need'} "
                "(0.5.14-0.5.16 the whole need, 0.5.17+ the shortfall); run this trace with "
                f"evict_shortfall={rule}")
    return hybrid.refusal(cfg, api, version)


def _copy_instance_dict(self, memo):
    """__deepcopy__ for an upstream class whose __getattr__ forwards to an attribute
    (0.5.15's StreamingSession -> self.inner): copy.deepcopy's default rebuilds the
    object empty and asks it for __setstate__, which __getattr__ looks up on the missing
    `inner` forever. The instance dictionary is copied as the default would."""
    cls = type(self)
    y = cls.__new__(cls)
    memo[id(self)] = y
    y.__dict__.update(copy.deepcopy(self.__dict__, memo))
    return y


_SCANNED_MODULES = [0]


def _same_module(name: str):
    return importlib.import_module(name)


# a module an upstream object keeps as an attribute (0.5.15's SWA tree) is the same module
# in the copy: deepcopy asks copyreg how to rebuild it, and importing it again gives it back
copyreg.pickle(types.ModuleType, lambda m: (_same_module, (m.__name__,)))


def _make_forwarders_copyable() -> None:
    """Give every loaded upstream class that defines __getattr__ (and keeps an instance
    dictionary) that copier. Called before each fork (a scan only when modules were loaded
    since the last): copying changes nothing else."""
    if len(sys.modules) == _SCANNED_MODULES[0]:
        return
    _SCANNED_MODULES[0] = len(sys.modules)
    for name, mod in list(sys.modules.items()):
        if mod is None or not name.startswith("sglang."):
            continue
        for cls in list(vars(mod).values()):
            if (isinstance(cls, type) and cls.__module__ == name and "__getattr__" in vars(cls)
                    and "__deepcopy__" not in vars(cls) and "__slots__" not in vars(cls)):
                cls.__deepcopy__ = _copy_instance_dict


class SglangBackend:
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
        self._build()
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

    def _tokenized(self, rid: int, tokens, max_new: int, sid: int | None):
        from sglang.srt.managers.io_struct import SessionParams, TokenizedGenerateReqInput
        return TokenizedGenerateReqInput(
            rid=str(rid), input_text=None, input_ids=array("q", tokens), input_embeds=None,
            mm_inputs=None, token_type_ids=None, sampling_params=self._sampling(max_new),
            return_logprob=False, logprob_start_len=-1, top_logprobs_num=0,
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

    def _op_open_session(self, op):
        from sglang.srt.managers.io_struct import OpenSessionReqInput
        out = self.ctrl.open(OpenSessionReqInput(capacity_of_str_len=1 << 20,
                                                 session_id=self._sid(op.sid), streaming=True))
        return "ok" if out.success else "refused"   # "already exist, cannot open"

    def _op_submit_turn(self, op):
        """Scheduler.handle_generate_request, session branch."""
        sid = self._sid(op.sid)
        t = self._tokenized(op.rid, op.new_tokens, op.max_new_tokens, op.sid)
        session = self.ctrl.get(sid)
        if session is not None and not session.close_on_finish:
            req = session.create_req(t, tokenizer=None, vocab_size=VOCAB)
            stub = req.to_finish is not None
            self.live[op.rid] = _Live(op.rid, req, streaming=True, rejected=stub)
            return "stub" if stub else "ok"
        # session closing (or unknown): a plain Req aborted at once, no session attached
        from sglang.srt.managers.schedule_batch import Req
        req = Req(str(op.rid), None, t.input_ids, t.sampling_params, vocab_size=VOCAB)
        req.tokenizer = None
        req.set_finish_with_abort(f"Invalid request: close was requested for session {sid}"
                                  if session is not None else
                                  f"Invalid request: session id {sid} does not exist")
        self.live[op.rid] = _Live(op.rid, req, streaming=False, rejected=True)
        return "stub"

    def _op_submit_request(self, op):
        from sglang.srt.managers.schedule_batch import Req
        t = self._tokenized(op.rid, op.tokens, op.max_new_tokens, None)
        req = Req(str(op.rid), None, t.input_ids, t.sampling_params, vocab_size=VOCAB,
                  return_logprob=op.logprob_start_len is not None)
        req.tokenizer = None
        # handle_generate_request's logprob_start_len resolution (glue); upstream's own
        # init_next_round_input then caps the prefix match with it
        req.logprob_start_len = resolve_logprob_start(op.logprob_start_len, len(op.tokens))
        self.live[op.rid] = _Live(op.rid, req, streaming=False, rejected=False)
        return "ok"

    def _op_schedule(self, op):
        """get_new_batch_prefill for one waiting request: match, PrefillAdder admission
        (persistent lock, row and KV budget), then prepare_for_extend of the first chunk."""
        L = self.live[op.rid]
        req = L.req
        req.init_next_round_input(self.cache)                 # match_prefix
        if self.shared:
            self._note_slot_copies(restored=req)
        prefix = self._prefix_len(req)
        if not op.admit:
            return self._rejected(req)
        input_len = len(req.origin_input_ids) + len(req.output_ids)
        end = chunk_end(prefix, input_len, self.cfg.chunk_size, self.P)
        self._lock(L)                                         # _req_inc_lock_ref
        no_row = self._row(req) is None and self.pool.available_size() == 0
        need = pages_needed_extend(prefix, end, self.P) * self.P
        if no_row or hybrid.mamba_short(self.pool, req, self.cache if self.cfg.mamba_tree else None) or \
                need > self.alloc.available_size() + swa_tree.tree_sizes(self.cache)[0] or \
                (self.cfg.swa_window and need > swa_tree.swa_budget(self.cache, self.alloc)):
            self._unlock(L)
            return self._rejected(req)
        self._extend(L, prefix, end)
        L.phase = "prefill"
        if end == input_len:
            self._prefill_result(L)
        return "ok"

    def _rejected(self, req) -> str:
        """A request the round does not add (0.5.23 `get_new_batch_prefill`, "revert
        matched mamba idx"): the staged copy-on-write is dropped and a request without a
        session gives its copy-on-write slot back."""
        if self.cfg.mamba_tree:
            hybrid.revert_cow(self.pool, req)
        return "rejected"

    def _op_prefill_chunk(self, op):
        """The chunked request's next round: cache_unfinished_req(chunked=True) (0.5.23:
        stash_chunked_request), then get_new_batch_prefill's init_next_round_input() (no
        re-match; its refresh_fill_ids) and PrefillAdder.add_chunked_req, which sizes the
        chunk by the fill array, `len(req.full_untruncated_fill_ids)`; then the chunk's
        prepare_for_extend. The fill array is upstream's own: under U1/U2 a later turn's
        create_req rewrites a live turn's arrays in place (_share_token_arrays)."""
        L = self.live[op.rid]
        req = L.req
        self._cache_unfinished(L, chunked=True)
        req.init_next_round_input()
        prefix = self._chunk_prefix(L)
        input_len = len(req.full_untruncated_fill_ids)
        end = chunk_end(prefix, input_len, self.cfg.chunk_size, self.P)
        if not self._can_alloc_extend(prefix, end):
            return "oom"
        self._extend(L, prefix, end)
        if end == input_len:
            self._prefill_result(L)
        return "ok"

    def _op_decode(self, op):
        """prepare_for_decode (alloc_for_decode of the last sampled token's slot), the
        forward writes that token's KV, then the result appends the sampled token."""
        L = self.live[op.rid]
        req = L.req
        pos = self._lens(req)[0]
        if not self._can_alloc_decode(pos):
            return "oom"
        self._prepare_for_decode(L)
        self._write_shadow(req, pos, pos + 1)
        req.output_ids.append(op.token)
        self._check_finished(L)
        return "ok"

    def _check_finished(self, L) -> None:
        """Result processing: a request whose output reaches max_new_tokens finishes in
        the same step (Req.check_finished -> release_kv_cache)."""
        if len(L.req.output_ids) >= L.req.sampling_params.max_new_tokens:
            self._finish(L)

    def _op_spec_decode(self, op):
        """Emulated speculative step (the fidelity boundary: upstream's EAGLE worker is
        not run): over-allocate [allocated, committed + 2*(drafts+1)) like an extend,
        then accept `accepted` drafts plus the bonus token."""
        L = self.live[op.rid]
        req = L.req
        committed, allocated, _ = self._lens(req)
        need = committed + 2 * (op.drafts + 1)
        if need > allocated:
            if not self._can_alloc_extend(allocated, need):
                return "oom"
            self._alloc_range(req, allocated, need)
            self._set_lens(req, allocated=need)
        self._swa_decode_step(L)
        req.output_ids.extend([op.token] * (op.accepted + 1))
        self._set_lens(req, committed=committed + op.accepted + 1)
        self._write_shadow(req, committed, committed + op.accepted + 1)
        self._check_finished(L)
        return "ok"

    def _op_finish(self, op):
        """process_batch_result_decode for a finished request: the finish reason, then
        release_kv_cache."""
        self._finish(self.live[op.rid])
        return "ok"

    def _finish(self, L) -> None:
        """Result processing of a finished request (check_finished), then release."""
        from sglang.srt.managers.schedule_batch import FINISH_LENGTH, FINISH_MATCHED_TOKEN
        req = L.req
        self._lookahead(L)
        max_new = req.sampling_params.max_new_tokens
        if len(req.output_ids) >= max_new:
            req.finished_reason = FINISH_LENGTH(length=max_new)
        else:
            req.finished_reason = FINISH_MATCHED_TOKEN(matched=req.output_ids[-1])
        req.finished_len = min(len(req.output_ids), max_new)
        self._release(L)

    def _op_abort_queued(self, op):
        """Scheduler.abort_request, waiting-queue branch: the request is popped."""
        L = self.live.pop(op.rid)
        if self.api == "borrow":
            self._abort_queued_borrow(L)
        if self.cfg.mamba_slots:            # "For mamba radix cache"
            hybrid.release_queued_mamba(L.req, self.cache)
        return "ok"

    def _op_queue_reject(self, op):
        """Scheduler._add_request_to_queue refuses the request (_set_or_validate_priority
        or _abort_on_queued_limit): 0.5.15 returns with no cache or session call;
        0.5.22+ calls _release_aborted_request, as the waiting-queue abort does."""
        return self._op_abort_queued(op)

    def _op_pre_abort(self, op):
        """A fresh request: upstream's own `Req.set_finish_with_abort` (the validation
        aborts of handle_generate_request; one-token prompt). A retracted one: abort
        method 3 (`to_finish` only) landed in the iteration that retracted it."""
        from sglang.srt.managers.schedule_batch import FINISH_ABORT
        req = self.live[op.rid].req
        if req.is_retracted:
            req.to_finish = FINISH_ABORT()
        else:
            req.set_finish_with_abort("kvcheck: pre_abort")
        return "ok"

    def _op_abort_running(self, op):
        """abort_request on a running request: to_finish, promoted by
        update_finish_state at result processing, then release_kv_cache."""
        from sglang.srt.managers.schedule_batch import FINISH_ABORT
        L = self.live[op.rid]
        L.req.to_finish = FINISH_ABORT()
        L.req.update_finish_state()
        self._release(L)
        return "ok"

    def _op_retract(self, op):
        """ScheduleBatch.retract_decode for one request: release_req (the real
        module-level function: release_kv_cache(is_insert=False), evict,
        reset_for_retract); the request goes back to the waiting queue."""
        L = self.live[op.rid]
        self._lookahead(L)
        self._release_req(L)
        L.phase = "queued"
        L.locked = False
        L.batch = None
        return "ok"

    def _op_close_session(self, op):
        from sglang.srt.managers.io_struct import CloseSessionReqInput
        sid = self._sid(op.sid)
        known = self.ctrl.get(sid) is not None
        self.ctrl.close(CloseSessionReqInput(session_id=sid))
        if not known:                   # "session id ... does not exist, cannot delete"
            return "refused"
        s = self.ctrl.get(sid)
        return "deferred" if s is not None and s.close_on_finish else "ok"

    def _op_evict(self, op):
        from sglang.srt.mem_cache.base_prefix_cache import EvictParams
        self.cache.evict(EvictParams(num_tokens=op.num_tokens))
        return "ok"

    # -- era-specific glue -------------------------------------------------------------

    def _lock(self, L) -> None:
        req = L.req
        if self.api == "flat":
            result = self.cache.inc_lock_ref(req.last_node)
            if self.cfg.swa_window:     # PrefillAdder._req_inc_lock_ref (is_hybrid_swa)
                req.swa_uuid_for_lock = result.swa_uuid_for_lock
        else:
            req.lock = self.cache.lock(req.last_node)
        L.locked = True

    def _unlock(self, L) -> None:
        req = L.req
        if self.api == "flat" and self.cfg.swa_window:
            from sglang.srt.mem_cache.base_prefix_cache import DecLockRefParams
            self.cache.dec_lock_ref(req.last_node,
                                    DecLockRefParams(swa_uuid_for_lock=req.swa_uuid_for_lock))
        elif self.api == "flat":
            self.cache.dec_lock_ref(req.last_node)
        else:
            lock = req.lock
            req.lock = None
            self.cache.unlock(lock)
        L.locked = False

    def _extend(self, L, prefix: int, end: int) -> None:
        """set_extend_range / extend_end, then ScheduleBatch.prepare_for_extend
        (alloc_for_extend: row, evict, allocator, write_cache_indices)."""
        from sglang.srt.managers.schedule_batch import ScheduleBatch
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
        req = L.req
        if self.api == "flat" and hasattr(req, "set_extend_range"):
            req.set_extend_range(prefix, end)
        elif self.api == "flat":    # 0.5.11-0.5.14: PrefillAdder's fill_len + extend_input_len
            req.set_extend_input_len(end - prefix)
            req.fill_len = end
        else:
            req.extend_end = end
        batch = ScheduleBatch.init_new([req], self.pool, self.alloc, self.cache,
                                       self.model_config, False, SpeculativeAlgorithm.NONE)
        batch.prepare_for_extend()
        if self.cfg.prefill_aware_swa:  # get_new_batch_prefill: model_runner.prefill_aware_swa
            req.kv.swa_evict_floor = req.extend_end
        L.batch = batch
        self._write_shadow(req, prefix, end, list(req.get_fill_ids()))

    def _chunk_prefix(self, L) -> int:
        return self._prefix_len(L.req)

    def _prefill_result(self, L) -> None:
        """process_batch_result_prefill: a pre-aborted request finishes here; otherwise
        one token is sampled and the prompt is cached (cache_unfinished_req)."""
        req = L.req
        if req.to_finish is not None:
            req.update_finish_state()
            self._release(L)
            return
        req.output_ids.append(SAMPLED_TOKEN)
        if len(req.output_ids) >= req.sampling_params.max_new_tokens:
            self._finish(L)         # check_finished: released before any cache_unfinished_req
            return
        self._cache_unfinished(L, chunked=False)
        L.phase = "decode"

    def _cache_unfinished(self, L, chunked: bool) -> None:
        from sglang.srt.mem_cache import common
        if self.api == "flat":
            if chunked:
                common.maybe_cache_unfinished_req(L.req, self.cache, chunked=True)
            else:
                common.maybe_cache_unfinished_req(L.req, self.cache)
        else:
            common.checkpoint_kv_cache(L.req, self.cache)

    def _release(self, L) -> None:
        """release_kv_cache; the request leaves the scheduler."""
        from sglang.srt.mem_cache.common import release_kv_cache
        if self.api == "flat":
            release_kv_cache(L.req, self.cache)
        else:
            release_kv_cache(L.req, self.cache, checkpoint=True)
        L.locked = False
        self.live.pop(L.rid, None)

    def _release_req(self, L) -> None:
        from sglang.srt.managers import schedule_batch as sb
        from sglang.srt.server_args import get_global_server_args
        import inspect
        params = inspect.signature(sb.release_req).parameters
        kwargs = dict(req=L.req, remaing_req_count=0, req_to_token_pool=self.pool,
                      token_to_kv_pool_allocator=self.alloc, tree_cache=self.cache)
        if "server_args" in params:      # 0.5.15; retired (raises) in 0.5.23
            kwargs["server_args"] = get_global_server_args()
        if "hisparse_coordinator" in params:
            kwargs["hisparse_coordinator"] = None
        sb.release_req(**kwargs)

    def _abort_queued_borrow(self, L) -> None:
        """0.5.22+ Scheduler.abort_request, waiting-queue branch: the popped request
        goes through _release_aborted_request, whose session part is
        `req.session.abort_req()` (unconditional) for a streaming request."""
        req = L.req
        if req.session is not None and getattr(req.session, "streaming", True):
            req.session.abort_req()

    def _set_lens(self, req, committed=None, allocated=None) -> None:
        target = req if self.api == "flat" and not self.shared else req.kv
        if committed is not None:
            target.kv_committed_len = committed
        if allocated is not None:
            (self._flat_record(req) if self.api == "flat" else target).kv_allocated_len = allocated

    def _sync_batch(self, L) -> None:
        """The scheduler's merge/filter keeps the running batch's per-request tensors in
        step with the request; one batch per request here, so re-derive them."""
        import torch
        b, req = L.batch, L.req
        committed = self._lens(req)[0]
        b.seq_lens = torch.tensor([committed], dtype=torch.int64)
        b.seq_lens_cpu = torch.tensor([committed], dtype=torch.int64)
        b.orig_seq_lens = torch.tensor([committed], dtype=torch.int32)
        b.req_pool_indices = torch.tensor([self._row(req)], dtype=torch.int64)
        if hasattr(b, "req_pool_indices_cpu"):
            b.req_pool_indices_cpu = torch.tensor([self._row(req)], dtype=torch.int64)

    def _prepare_for_decode(self, L) -> None:
        self._sync_batch(L)
        self._stamp_forward_iter(L)
        L.batch.prepare_for_decode()

    def _stamp_forward_iter(self, L) -> None:
        """The scheduler's forward counter on the batch (`maybe_evict_swa`'s maintenance
        step, `forward_iter % SGLANG_SWA_EVICTION_INTERVAL`): one per decode step."""
        self.forward_iter = getattr(self, "forward_iter", -1) + 1
        L.batch.forward_iter = self.forward_iter

    def _swa_decode_step(self, L) -> None:
        """The emulated speculative step's share of prepare_for_decode under SWA:
        upstream's `ScheduleBatch.maybe_evict_swa` in decode mode, then
        `decode_batch_idx += 1`."""
        if not self.cfg.swa_window:
            return
        from sglang.srt.model_executor.forward_batch_info import ForwardMode
        self._sync_batch(L)
        self._stamp_forward_iter(L)
        L.batch.forward_mode = ForwardMode.DECODE
        L.batch.maybe_evict_swa()
        L.req.decode_batch_idx += 1

    def _alloc_range(self, req, start: int, end: int) -> None:
        """Allocate row positions [start, end) with upstream's helpers (alloc_token_slots
        / alloc_paged_token_slots_extend) and write them into req_to_token."""
        import torch
        try:    # 0.5.16+: the allocation helpers moved to mem_cache.allocation
            from sglang.srt.mem_cache import allocation as common
        except ImportError:
            from sglang.srt.mem_cache import common
        row = self._row(req)
        n = end - start
        if self.P == 1:
            out = common.alloc_token_slots(self.cache, n)
        else:
            last = self.pool.req_to_token[row, start - 1:start].to(torch.int64) if start > 0 \
                else torch.tensor([-1], dtype=torch.int64)
            pl = torch.tensor([start], dtype=torch.int64)
            sl = torch.tensor([end], dtype=torch.int64)
            out = common.alloc_paged_token_slots_extend(
                tree_cache=self.cache, prefix_lens=pl, prefix_lens_cpu=pl, seq_lens=sl,
                seq_lens_cpu=sl, last_loc=last, extend_num_tokens=n)
        self.pool.write((row, slice(start, end)), out.to(torch.int32))

    def _lookahead(self, L) -> None:
        """Overlap scheduling (and a speculative verify in flight): the step after the
        last one is already prepared, so the last token's KV exists at finish/retract."""
        req = L.req
        if not (self.cfg.overlap or self.cfg.spec_enabled):
            return
        committed, allocated, _ = self._lens(req)
        seqlen = len(req.origin_input_ids) + len(req.output_ids)
        if committed >= seqlen:
            return
        if committed >= allocated:
            if not self._can_alloc_decode(committed):
                return
            self._prepare_for_decode(L)
        else:
            self._set_lens(req, committed=committed + 1)
        self._write_shadow(req, committed, committed + 1)

    # -- observation ------------------------------------------------------------------

    def _slots(self) -> dict:
        if self.api == "flat":
            return self.sess_obj.slots
        return self.sess_obj.slots

    def _slot_kv(self, slot, sid=None):
        """(row, committed, allocated, protected, last_node) of a session slot."""
        if self.api == "flat" and self.shared:
            kv = slot.kv
            row = kv.req_pool_idx if kv.holds_kv else None
            lens = self.slot_copy.get(sid) or \
                (kv.kv_committed_len, kv.kv_allocated_len, kv.cache_protected_len)
            return (row, *lens, slot.last_node)
        if self.api == "flat":
            return (slot.req_pool_idx, slot.kv_committed_len, self._allocated(slot),
                    slot.cache_protected_len, slot.last_node)
        kv = slot.kv
        return (kv.req_pool_idx if kv.holds_kv else None, kv.kv_committed_len,
                kv.kv_allocated_len, kv.cache_protected_len, self._slot_anchor_node(slot))

    def _borrowers(self) -> dict:
        """0.5.19-0.5.21: sid -> the rids of the live requests that run on that slot's record."""
        out = {}
        for sid, slot in self._slots().items():
            out[sid] = {rid for rid, L in self.live.items() if L.req.kv is slot.kv}
        return out

    def _note_slot_copies(self, restored=None, before=None) -> None:
        """0.5.19-0.5.21 keep one `ReqKvInfo` per session: the slot takes the first turn's
        record at its finish (`save_from_req`: `req.detach_kv()`) and a later turn runs on
        it from its match (`restore_to_req`: `req.kv = self.kv`) until its finish, retract
        or abort detaches it back. 0.5.14-0.5.18 (and the wrapper-era spec) keep the slot's
        lengths in the slot and copy them out to the turn at the match (`restore_to_req`,
        then `_free_tail` trims both) and back at its finish or retract (`save_from_req`),
        so while a turn runs the slot shows what it held at the turn's match. This keeps
        that view: `restored` (a request just matched) records its record's lengths for
        the slot it borrows; at the end of an operation (`before`: the borrowers when it
        began) a slot one of whose borrowers handed the record back, or that nobody
        borrows, shows its record as it is. The turn's own lengths, upstream's live record,
        are compared through the request's view; pages, rows and locks are upstream's."""
        now = self._borrowers()
        for sid, slot in self._slots().items():
            kv = slot.kv
            lens = (kv.kv_committed_len, kv.kv_allocated_len, kv.cache_protected_len)
            if restored is not None:
                if restored.kv is kv:
                    self.slot_copy[sid] = lens
                    others = sorted(rid for rid, L in self.live.items()
                                    if L.req is not restored and L.req.kv is kv)
                    if others and self._shared_with is None:    # see past_model
                        self._shared_with = (f"R1: request {int(restored.rid)} matched session "
                                             f"{sid}'s record while requests {others} hold it "
                                             "(0.5.19 shares it; the wrapper-era spec "
                                             "copies it)")
                continue
            was = (before or {}).get(sid, set()) | self._restored.get(sid, set())
            if not now[sid] or was - now[sid]:
                self.slot_copy[sid] = lens
        for sid in [sid for sid in self.slot_copy if sid not in now]:
            del self.slot_copy[sid]
        for slot in self._slots().values():     # every record a slot held (past_model)
            if not any(slot.kv is r for r in self._records):
                self._records.append(slot.kv)
        live = [L.req.kv for L in self.live.values()]
        self._records = [r for r in self._records
                         if any(r is s.kv for s in self._slots().values())
                         or any(r is k for k in live)]
        if restored is None:
            self._restored = {}
        else:                                   # `was` at the end of this operation
            for sid, slot in self._slots().items():
                if restored.kv is slot.kv:
                    self._restored.setdefault(sid, set()).add(int(restored.rid))

    def past_model(self):
        """Why the release's state is past what the spec follows of it (None: it is not).
        0.5.19-0.5.21 keep one `ReqKvInfo` per session, which the slot and the turn that
        runs on it share (`restore_to_req`: `req.kv = self.kv`); 0.5.14-0.5.18, whose
        bookkeeping the wrapper-era spec follows, copy it into and out of the turn. With
        one turn on it at a time the two designs free, keep and lock the same pages and
        rows (the slot's lengths are shown as the copy would hold them,
        `_note_slot_copies`). They part where a record is held by two live requests, by a
        request no longer attached to its slot's session, or by a request after its slot
        was released (0.5.19's `release_session` frees the record's live range and takes
        its row, `req_to_token_pool.free(slot)`, under the request still running on it):
        each needs two live turns in one session, which only accepted U1 or U2 make
        (docs/upstream-findings.md, "Releases between", R1). There a turn's decode, restore
        or release acts on the other's lengths (0.5.23's shared record, which the spec
        models in the borrow era only), so nothing is compared from there on; the
        checker counts it as beyond the accepted findings' model (`Lockstep.beyond`)."""
        if not self.shared:
            return None
        if self._shared_with is not None:
            return self._shared_with
        slots = self._slots()
        for sid, slot in slots.items():
            holders = [rid for rid, L in self.live.items() if L.req.kv is slot.kv]
            if len(holders) > 1:
                return (f"R1: session {sid}'s record is held by requests {sorted(holders)} "
                        "(0.5.19 shares it; the wrapper-era spec copies it)")
            for rid in holders:
                s = self.live[rid].req.session
                if s is None or str(s.session_id) != str(sid):
                    return (f"R1: request {rid} holds session {sid}'s record, detached from "
                            "that session")
        current = [slot.kv for slot in slots.values()]
        for rid, L in self.live.items():
            kv = L.req.kv
            if any(kv is r for r in self._records) and not any(kv is r for r in current):
                return (f"R1: request {rid} runs on the record of a session slot released "
                        "under it")
        return None

    def _slot_anchor_node(self, slot):
        lock = getattr(slot, "lock", None)
        return getattr(lock, "node", None) if lock is not None else None

    def _free_page_census(self) -> list:
        import torch
        alloc = swa_tree.full_allocator(self.alloc)
        if hasattr(alloc, "get_all_free_pages"):
            t = alloc.get_all_free_pages()
        else:
            parts = [alloc.free_pages]
            rel = getattr(alloc, "release_pages", None)
            if rel is not None and len(rel):
                parts.append(rel)
            t = torch.cat(parts)
        return [int(x) for x in t.tolist()]

    # The tree: 0.5.15 RadixCache TreeNode objects (requests point at the node object);
    # 0.5.22+ UnifiedTreeNode in a TreeCore arena (requests and TreeLocks hold NodeIds;
    # the KV indices and lock counts live in the node's per-component data, FULL here).

    def _root(self):
        return self.tree.root_node if self.radix else self.cache.tree_core.root_node

    def _nid(self, node):
        """What requests and locks use to name a tree node."""
        return id(node) if self.radix else node.id

    def _node_value(self, node):
        if self.radix:
            return node.value
        return node.component(component_type().FULL).value

    def _node_lock_ref(self, node) -> int:
        if self.radix:
            return swa_tree.lock_ref(node) if self.cfg.swa_window or self.cfg.mamba_tree \
                else int(node.lock_ref)
        return int(node.component(component_type().FULL).lock_ref)

    def _node_views(self) -> tuple[list, dict]:
        P = self.P
        root = self._root()
        out, paths = [], {self._nid(root): ()}
        stack = [root]
        while stack:
            n = stack.pop()
            for child in n.children.values():
                key = tuple(int(t) for t in child.key.raw_token_ids()) \
                    if hasattr(child.key, "raw_token_ids") else tuple(child.key)
                path = paths[self._nid(n)] + key
                paths[self._nid(child)] = path
                value = self._node_value(child)
                vals = value.tolist() if value is not None else []
                pages = tuple(int(vals[i]) // P for i in range(0, len(vals), P))
                out.append(NodeView(path=path, parent=paths[self._nid(n)], pages=pages,
                                    lock_ref=self._node_lock_ref(child),
                                    **hybrid.node_mamba(self.cfg, child)))
                stack.append(child)
        leaves, priority = self._eviction_order()
        out = with_lru_ranks(out, {paths[self._nid(n)]: priority(n) for n in leaves})
        out.sort(key=lambda v: v.path)
        return out, paths

    def _eviction_order(self):
        """(the evictable leaves, the priority evict() pops them by), both upstream's own.
        0.5.15 `RadixCache.evict` heaps `(eviction_strategy.get_priority(n), n)` over
        `evictable_leaves` (LRU: `last_access_time`; a tie falls to `TreeNode.__lt__`,
        which says neither is less: heap order). 0.5.23 `FullComponent._evict_device_start`
        heaps `(session_ref_eviction_strategy(n), n)` over the tree core's
        `evictable_device_leaves` (LRU: the `last_access_time` counter; with session radix
        caching, session-referenced nodes last)."""
        if self.api == "flat" and (self.cfg.swa_window or self.cfg.mamba_tree):
            return swa_tree.eviction_order(self.tree)
        if self.radix:
            return list(self.tree.evictable_leaves), self.tree.eviction_strategy.get_priority
        core = self.cache.tree_core
        [full] = [c for c in core.components if c.component_type == component_type().FULL]
        full._ensure_eviction_strategy()
        return list(core.evictable_device_leaves), full.session_ref_eviction_strategy

    def _req_anchor(self, node, paths: dict, sid_hint, locked: bool):
        """A radix anchor (root included) through which the request holds no lock is
        stale and reported as None (docs/semantics.md, the abstract view)."""
        a = self._anchor(node, paths, sid_hint)
        return a if locked or (a is not None and a[0] == "virtual") else None

    def _anchor(self, node, paths: dict, sid_hint):
        if node is None:
            return None
        if self.radix:
            if node is self.tree.root_node:
                return ("root",)
            if id(node) in paths:
                return ("node", paths[id(node)])
        elif isinstance(node, int):
            if node == self._root().id:
                return ("root",)
            if node in paths:
                return ("node", paths[node])
            return ("detached", f"node id {node}")
        for sid, slot in self._slots().items():
            if getattr(slot, "virtual_node", None) is node:
                return ("virtual", int(sid))
        if type(node).__name__ == "_VirtualNode" or getattr(self.cache, "is_virtual_node",
                                                            lambda n: False)(node):
            return ("virtual", sid_hint)
        return ("detached", type(node).__name__)

    def _row_pages(self, row, allocated: int) -> tuple:
        if row is None:
            return ()
        P = self.P
        vals = self.pool.req_to_token[row, : ceil_div(allocated, P) * P].tolist()
        out = []
        for k in range(ceil_div(allocated, P)):
            page = int(vals[k * P]) // P
            out.append(None if page == 0 else page)
        return tuple(out)

    def _session_views(self) -> list:
        out = []
        for sid, s in sorted(self.ctrl.sessions.items(), key=lambda kv: int(kv[0])):
            checkpoint = ()
            if s.req_nodes:
                [node] = s.req_nodes.values()
                last = node.req
                olen = s.committed_origin_len
                origin = list(last.origin_input_ids)
                if olen is not None:
                    origin = origin[:olen]
                checkpoint = tuple(origin) + tuple(
                    last.output_ids[: last.sampling_params.max_new_tokens])
            inflight = bool(getattr(s, "_inflight", False)) if hasattr(s, "_inflight") \
                else getattr(s, "_inflight_req", None) is not None
            out.append(SessionView(sid=int(sid), inflight=inflight,
                                   checkpoint=tuple(int(t) for t in checkpoint),
                                   close_pending=bool(s.close_on_finish)))
        return out

    def abstract(self) -> AbstractState:
        cfg = self.cfg
        nodes, paths = self._node_views()
        reqs = []
        for rid in sorted(self.live):
            L = self.live[rid]
            req = L.req
            committed, allocated, protected = self._lens(req)
            row = self._row(req)
            session = req.session
            sid = int(session.session_id) if session is not None else None
            reqs.append(ReqView(
                rid=rid, session=sid, streaming=L.streaming, rejected=L.rejected,
                phase=L.phase,
                fill_ids=tuple(int(t) for t in list(req.origin_input_ids) + list(req.output_ids)),
                origin_len=len(req.origin_input_ids),
                max_new_tokens=req.sampling_params.max_new_tokens, row=self._arow(row),
                committed=committed, allocated=allocated, protected=protected,
                anchor=self._req_anchor(req.last_node, paths, sid, self._locked(L)),
                locked=self._locked(L),
                to_finish=req.to_finish is not None, is_retracted=bool(req.is_retracted),
                committed_freed=bool(self._flag(req, "kv_committed_freed")),
                overallocated_freed=bool(self._flag(req, "kv_overallocated_freed")),
                row_pages=self._row_pages(row, allocated), mamba=hybrid.mamba_refs(req),
                fill=(tuple(int(t) for t in req.full_untruncated_fill_ids)
                      if cfg.aliases_token_arrays else None),
                **self._swa_fields(req)))
        slots = []
        for sid, slot in sorted(self._slots().items(), key=lambda kv: int(kv[0])):
            row, committed, allocated, protected, last_node = self._slot_kv(slot, sid)
            slots.append(SlotView(sid=int(sid), row=self._arow(row), committed=committed,
                                  allocated=allocated, protected=protected,
                                  last_node=self._anchor(last_node, paths, int(sid)),
                                  row_pages=self._row_pages(row, allocated),
                                  mamba=hybrid.mamba_refs(slot),
                                  **self._swa_fields(slot, paths)))
        P = self.P

        def read(page, offset):
            return self.shadow.get(page * P + offset)

        return AbstractState(
            page_size=P, num_pages=cfg.num_pages, num_rows=cfg.num_rows,
            free_pages=tuple(sorted(self._free_page_census())),
            free_rows=tuple(sorted(self._arow(int(r)) for r in self.pool.free_slots)),
            nodes=tuple(nodes), reqs=tuple(reqs), slots=tuple(slots),
            sessions=tuple(self._session_views()),
            evictable_size=swa_tree.tree_sizes(self.cache)[0],
            protected_size=swa_tree.tree_sizes(self.cache)[1],
            content=build_content(P, nodes, reqs, slots, read),
            **self._hybrid_view())

    def _hybrid_view(self) -> dict:
        out = hybrid.hybrid_view(self.cfg, self.pool)
        if self.cfg.swa_window:
            out.update(swa_tree.swa_view(self.cfg, self.alloc), mamba_slots=self.cfg.mamba_slots)
        return out

    def _swa_fields(self, holder, paths=None) -> dict:
        """A holder's SWA cursor and (a slot, `paths` given) its SWA lock boundary."""
        if not self.cfg.swa_window:
            return {}
        if self.api != "flat":
            out = swa_unified.swa_fields(holder)
            if paths is None:                   # a request: its pending SWA branch
                out["swa_branching_seqlen"] = swa_unified.branching_seqlen(holder)
            if paths is not None:
                node = swa_unified.uuid_node(self.cache, swa_unified.lock_uuid(
                    getattr(holder, "lock", None)))
                out["swa_uuid_for_lock"] = None if node is None else \
                    self._anchor(node.id, paths, None)
            return out
        out = swa_tree.swa_fields(self._flat_record(holder))
        if paths is not None:
            node = swa_tree.uuid_node(self.tree, getattr(holder, "swa_uuid_for_lock", None))
            out["swa_uuid_for_lock"] = None if node is None else self._anchor(node, paths, None)
        return out

    def _locked(self, L) -> bool:
        """Whether the request itself holds a tree lock. 0.5.15: the glue's record of
        the persistent admission lock. 0.5.22+: `req.lock` (a TreeLock; None once the
        session took it, or on a virtual node)."""
        return L.locked if self.api == "flat" else L.req.lock is not None

    def _arow(self, row):
        return None if row is None else int(row) - self.row_base

    def _flag(self, req, name):
        """`kv_committed_freed` / `kv_overallocated_freed`: on the request (0.5.14-0.5.15),
        on its record (0.5.22+); 0.5.16-0.5.18 have neither (a released request's `kv` is
        None, and it has left the scheduler)."""
        if self.api == "flat":
            return getattr(req, name, False)
        return getattr(req.kv, name, False)

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
