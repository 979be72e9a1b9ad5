"""The installed sglang release: its version and API era, the process-wide set-up the
adapter needs (server args, the shim), the configurations it refuses, and what makes its
objects copyable for fork."""
from __future__ import annotations

import copy
import copyreg
import importlib
import importlib.metadata
import os
import sys
import types

from kvcheck.spec.config import Config

from kvcheck.adapters.sglang import hybrid, shim

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
                "(spec/swa_tree.py prompt_split_on), so its wrapper era would differ from this "
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
        # retract_decode's release_req evicts `remaining * SGLANG_RETRACT_DECODE_STEPS`
        # tokens after each victim (0.5.15 schedule_batch.py l.1608, 0.5.23 l.2390), a
        # look-ahead eviction the spec's decode round does not model (README.md, "What
        # the spec decides otherwise"): the releases run with it off
        os.environ["SGLANG_RETRACT_DECODE_STEPS"] = "0"
        # 0.5.22+'s calc_priority touches every waiting request's prefix each 32nd round
        # (`_touch_waiting_prefixes`: LRU times, node splits), which the spec does not
        # model (README.md, "What the spec decides otherwise" 10): off
        os.environ["SGLANG_ENABLE_WAITING_PREFIX_REFRESH"] = "0"
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
        # upstream's request entry (entry.py), imported before the shim is armed, on the
        # releases its shell scheduler was built and checked against (ENTRY_RELEASES)
        from kvcheck.adapters.sglang.entry import ENTRY_RELEASES, import_scheduler
        scheduler = import_scheduler() if version in ENTRY_RELEASES else None
        _SETUP.update(version=version, api=api, stub_triton=stub_triton, planted=planted,
                      record=record, shared=shared, unified=api == "flat" and unified_plain(),
                      scheduler=scheduler)
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
        ranks = dict(tp_rank=0, pp_rank=0, attn_cp_rank=0) if _SETUP["scheduler"] \
            else dict(tp_rank=0)    # open_session reads the pipeline and CP ranks too
        if hasattr(par, "override_permanently"):
            par.override_permanently(**ranks)
        else:
            par._overrides.update(ranks)
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
        self.entered = 0        # priority scheduling: the queue entry (the adapter's clock)


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
    if cfg.enable_priority_scheduling and version and hybrid.release_tuple(version) < (0, 5, 15):
        return (f"config.enable_priority_scheduling: sglang {version}'s preempt_to_schedule "
                "sizes the request by its last round's extend_input_len, where 0.5.15+, which "
                "the spec follows, reads its fill ids less its last match")
    if (cfg.enable_priority_scheduling or cfg.admission != "pages") and version and \
            cfg.filter_before_prefill != hybrid.filters_before_prefill(version):
        rule = hybrid.filters_before_prefill(version)
        return (f"config.filter_before_prefill is {cfg.filter_before_prefill} but sglang "
                f"{version} {'filters' if rule else 'does not filter'} the finished requests "
                "out of the running batch before each prefill round (0.5.23+ does); run this "
                f"trace with filter_before_prefill={rule}")
    if cfg.admission != "pages" and version and cfg.admission != hybrid.admission_rule(version):
        return (f"config.admission is {cfg.admission!r} but sglang {version}'s prefill round is "
                f"{hybrid.admission_rule(version)!r} (0.5.23 adds back the rows the round's "
                "requests hold and checks the budget before each match); run this trace with "
                f"admission={hybrid.admission_rule(version)!r} or 'pages'")
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
