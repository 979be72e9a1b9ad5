"""Upstream's own request entry: the release's `Scheduler.handle_generate_request`,
`abort_request`, `open_session` and `close_session`, run on a `Scheduler` object that holds
only what those methods read (`SchedulerShell`). What each attribute stands for is listed
in SHELL; README.md in this directory ("Fidelity boundary") names it as glue.

`managers/scheduler.py` imports the server's process, grammar and HTTP modules at top
level; the shim stands in for them (shim.THIRD_PARTY, shim.SGLANG_INTERNAL), and `import_scheduler` runs before the
shim is armed, so those stand-ins are only ever imported, never called.
"""
from __future__ import annotations

import importlib
import types


ENTRY_RELEASES = ("0.5.15", "0.5.22", "0.5.23")
"""The releases whose entry methods the shell holds every attribute for; on the others the
adapter's glue stands in for the entry (README.md, "Fidelity boundary")."""


def import_scheduler():
    """managers/scheduler.py, or None where it does not import on this set-up."""
    try:
        return importlib.import_module("sglang.srt.managers.scheduler")
    except Exception:       # noqa: BLE001  (any import failure: the entry is not driven)
        return None


def rid_str(rid: int) -> str:
    """A request id upstream sees. `abort_request` matches by prefix
    (`req.rid.startswith(recv_req.rid)`, 0.5.23 scheduler.py l.5688): ids of one width are
    prefix-free, as production's uuids are ("1" would abort "10")."""
    return f"{rid:08d}"


def _discard(*args, **kwargs) -> None:
    """What the scheduler sends out (abort outputs to the tokenizer manager): no client
    listens."""


class _NoGrammar:
    """GrammarManager with no grammar backend: no request is held for a grammar
    (`process_req_with_grammar` False), so every one goes to the waiting queue; an abort
    finds nothing in the grammar queue."""

    def process_req_with_grammar(self, req) -> bool:
        return False

    def abort_requests(self, recv_req) -> None:
        return None


class _NoBeams:
    """BeamCoordinator without beam search (beam_width 1): nothing to retire."""

    def retire_group(self, req) -> None:
        return None


def _server_args():
    """The process's ServerArgs (release.process_setup publishes them): 0.5.22+ reads the
    operator's input through runtime_context, where 0.5.14-0.5.21 keep a global."""
    try:
        from sglang.srt.runtime_context import get_server_args
    except ImportError:
        from sglang.srt.server_args import get_global_server_args as get_server_args
    return get_server_args()


def _shell_attributes(backend) -> dict:
    """SHELL: the attributes upstream's entry methods read, for one single-rank scheduler
    without disaggregation, grammar, multimodal, HiCache, metrics or beams. The pools,
    tree, allocator and session controller are the backend's real ones."""
    from sglang.srt.disaggregation.utils import DisaggregationMode
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    cfg = backend.cfg
    return dict(
        session_controller=backend.ctrl, tree_cache=backend.cache,
        token_to_kv_pool_allocator=backend.alloc,
        waiting_queue=[], running_batch=None, last_batch=None, cur_batch=None, chunked_req=None,
        result_queue=[], enable_continuous_input_polling=False,
        enable_session_radix_cache=False, tokenizer=None,
        model_config=types.SimpleNamespace(vocab_size=backend.model_config.vocab_size,
                                           hf_eos_token_id=None, is_encoder_decoder=False),
        disaggregation_mode=DisaggregationMode.NULL, spec_algorithm=SpeculativeAlgorithm.NONE,
        enable_overlap=False, metrics_reporter=types.SimpleNamespace(enable_metrics=False),
        kv_events_publisher=types.SimpleNamespace(enable_kv_cache_events=False),
        dllm_config=None, mm_receiver=None, enable_hicache_storage=False, enable_lmcache=False,
        grammar_manager=_NoGrammar(), beam_coordinator=_NoBeams(), send_abort_output=_discard,
        ipc_channels=types.SimpleNamespace(
            send_to_tokenizer=types.SimpleNamespace(send_output=_discard)),
        enable_priority_scheduling=cfg.enable_priority_scheduling,
        schedule_low_priority_values_first=False, abort_on_priority_when_disabled=False,
        max_queued_requests=None, processed_tokens_counter=0,
        # init_req_max_new_tokens' clamps (prompt length, KV capacity) are left open: the
        # spec's requests keep the max_new_tokens the client sent (README.md, "What the
        # spec decides otherwise")
        max_new_tokens_limit=None, max_req_len=1 << 30, max_req_input_len=1 << 30,
        max_total_num_tokens=1 << 30, kv_shard_widening=1, page_size=backend.P,
        sliding_window_size=None, chunked_prefill_size=None,
        server_args=_server_args(),
        # 0.5.14-0.5.19: the process's ranks as one record
        ps=types.SimpleNamespace(pp_rank=0, tp_rank=0, attn_cp_rank=0),
    )


class Entry:
    """Upstream's request entry on a shell scheduler. The adapter keeps the waiting queue
    and running batch (its rounds read them); each call hands the shell the requests it
    reads and takes back what upstream did with them."""

    def __init__(self, backend, sch_mod) -> None:
        self.sch = object.__new__(sch_mod.Scheduler)
        for name, value in _shell_attributes(backend).items():
            setattr(self.sch, name, value)

    def open_session(self, sid: str):
        from sglang.srt.managers.io_struct import OpenSessionReqInput
        return self.sch.open_session(OpenSessionReqInput(
            capacity_of_str_len=1 << 20, session_id=sid, streaming=True))

    def close_session(self, sid: str) -> None:
        from sglang.srt.managers.io_struct import CloseSessionReqInput
        self.sch.close_session(CloseSessionReqInput(session_id=sid))

    def submit(self, recv_req):
        """handle_generate_request: the request it put on the waiting queue."""
        queue = self.sch.waiting_queue = []
        self.sch.handle_generate_request(recv_req)
        if len(queue) != 1:
            raise RuntimeError(f"handle_generate_request queued {len(queue)} requests "
                               f"for one ({recv_req.rid})")
        return queue[0]

    def abort(self, rid: int, waiting: list) -> list:
        """abort_request(AbortReq(rid)) over the adapter's waiting queue (in order), with
        an empty running batch: the waiting requests it popped (abort method 1)."""
        from sglang.srt.managers.io_struct import AbortReq
        sch = self.sch
        sch.waiting_queue = list(waiting)
        sch.running_batch = types.SimpleNamespace(reqs=[])
        sch.abort_request(AbortReq(rid=rid_str(rid)))
        kept = {id(r) for r in sch.waiting_queue}
        sch.waiting_queue, sch.running_batch = [], None
        return [r for r in waiting if id(r) not in kept]
