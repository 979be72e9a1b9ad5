"""Planted faults in the REAL upstream sglang code (runs inside an sglang venv).

impl/faults.py plants defects in kvcheck's own implementation; this registry plants them
in the published releases, so that the exhaustive check against a release
(`kvcheck explore --preset check-sglang-VERSION --backend sglang:VERSION`) can be shown
to catch a defect of the upstream code, not only of ours. Each fault re-creates a defect
upstream had, or that a comment in upstream's code says the code is written to avoid,
as a small monkeypatch of one upstream method: a wrapper that calls the real method
with one thing changed (an argument, a field hidden for the call, a reference put back
after it). No upstream code is copied.

Activation: KVCHECK_SGLANG_PLANT=name[,name] in the environment of the sglang process;
adapters/sglang/backend.py `process_setup` reads it once per process and calls
`install_from_env`. An unknown name, or a fault that does not apply to the installed
release, is refused (`PlantError`) naming the faults that do. The proxy keys its served
processes by (interpreter, KVCHECK_SGLANG_PLANT), so a planted run never shares a server
with a clean one (adapters/sglang/proxy.py `_server`).

Patches go on classes (never on instances), so the served backend's deep-copy fork
(SglangBackend.fork) and the fresh replay that confirms a failure both run them.

The installers are grouped by the upstream code they patch: faults_session.py (the
session), faults_cache.py (allocator, tree, frees), faults_round.py (the scheduling round);
faults_patch.py wraps one upstream attribute.
"""
from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from typing import Callable

from kvcheck.adapters.sglang.faults_cache import (_free_no_page_dedup, _overalloc_free_floor,
                                                  _split_no_lock_copy)
from kvcheck.adapters.sglang.faults_patch import _ORIGINALS
from kvcheck.adapters.sglang.faults_round import (_round_charge_leak, _admission_lock_dropped,
                                                  _admission_pin_kept,
                                                  _retract_keeps_least_preferred,
                                                  _decode_mem_one_page, _extend_rows_swapped,
                                                  _preempt_takes_finished, _preempt_oldest_first,
                                                  _running_output_unreserved, _admission_not_strict,
                                                  _calc_priority_ignores_priority)
from kvcheck.adapters.sglang.faults_session import (_free_tail_noop, _preabort_restores_slot,
                                                    _free_kv_aligned_floor, _trim_overshoot_noop,
                                                    _finish_keeps_req_row, _close_keeps_tree_lock,
                                                    _lock_not_handed_over,
                                                    _session_held_counts_borrowed,
                                                    _restore_clears_slot,
                                                    _free_tail_slot_untouched, _close_keeps_row,
                                                    _close_keeps_mamba, _ephemeral_slot_no_mamba,
                                                    _close_not_deferred)

ENV = "KVCHECK_SGLANG_PLANT"


class PlantError(ValueError):
    """A planted fault that is unknown, or not applicable to the installed release."""


@dataclass(frozen=True)
class Fault:
    name: str
    releases: tuple          # sglang releases the installer knows the target of
    description: str         # one line: the defect
    source: str              # the upstream PR / comment that says why the code is as it is
    install: Callable[[str], None]   # install(version): patch the class attribute(s)


INSTALLED: list = []         # names installed in this process, in order


BOTH = ("0.5.15", "0.5.23")

FAULTS: dict[str, Fault] = {f.name: f for f in (
    Fault("free_tail_noop", BOTH,
          "_free_tail does nothing: the slot's tail past the restored prefix leaks",
          "PR #22862 (_free_tail); try_match_prefix's comment 'Free orphaned tail'",
          _free_tail_noop),
    Fault("preabort_restores_slot", BOTH,
          "find_active_slot ignores to_finish: a pre-aborted turn restores (0.5.23: borrows) the slot",
          "PR #22273 (pre-abort corruption); find_active_slot's docstring", _preabort_restores_slot),
    Fault("free_kv_aligned_floor", BOTH,
          "_free_kv_aligned frees from floor(target) instead of ceil_align(target): a live partial page is freed",
          "_free_kv_aligned's docstring ('partial-page free would corrupt pages still holding "
          "committed tokens')", _free_kv_aligned_floor),
    Fault("trim_overshoot_noop", BOTH,
          "_trim_overshoot does nothing: speculative KV past max_new_tokens stays in the slot",
          "PR #22897 (_trim_overshoot)", _trim_overshoot_noop),
    Fault("finish_keeps_req_row", BOTH,
          "a saved turn keeps its row (0.5.15 save_from_req) / record (0.5.23 detach_kv): "
          "release_kv_cache frees what the slot owns",
          "save_from_req's comment 'Ownership has transferred to the slot. Null *all* of the "
          "req's references'; 0.5.23 Req.detach_kv", _finish_keeps_req_row),
    Fault("close_keeps_tree_lock", BOTH,
          "release_session skips the first turn's tree unlock (0.5.15 dec_lock_ref, 0.5.23 unlock)",
          "SessionSlot.last_node 'for dec_lock_ref on session close'; 0.5.23 "
          "release_session's cache.unlock(slot.lock)", _close_keeps_tree_lock),
    Fault("lock_not_handed_over", ("0.5.23",),
          "_lock_to_slot leaves req.lock set: the admission lock has two holders, released twice",
          "0.5.23 take / _lock_to_slot ('the session takes the request's record and the tree "
          "lock it took at admission')", _lock_not_handed_over),
    Fault("overalloc_free_floor", ("0.5.23",),
          "release_kv_cache frees the overallocation from floor(owned) instead of "
          "ceil_align(owned): the boundary page is freed twice",
          "0.5.23 _release_overallocated_kv_indices' comment ('start_p is aligned ... so it "
          "never shares a page with the tail free_kv_row')", _overalloc_free_floor),
    # 0.5.15 only: 0.5.23 frees rows through free_segment(s) (page representatives, its own
    # page-disjointness assert); its free() runs only when an aux allocation raises
    Fault("free_no_page_dedup", ("0.5.15",),
          "PagedTokenToKVPoolAllocator.free frees index by index: a page is freed once per index",
          "allocator free's unique(free_index // page_size) (DOMAIN.md 1.1, I18)",
          _free_no_page_dedup),
    Fault("restore_clears_slot", ("0.5.15",),
          "restore_to_req clears slot.req_pool_idx: a rejected turn's retry loses the slot's KV",
          "SessionSlot.restore_to_req's NOTE ('intentionally NOT cleared ... idempotent "
          "restoration')", _restore_clears_slot),
    Fault("free_tail_slot_untouched", ("0.5.15",),
          "_free_tail trims the request only, not the slot: a retry frees the same tail twice",
          "_free_tail's slot.kv_allocated_len = prefix_len (PR #22862)",
          _free_tail_slot_untouched),
    Fault("close_keeps_row", ("0.5.15",),
          "release_session does not give the slot's row back to the pool: the row leaks",
          "release_session's free_slots.append(slot.req_pool_idx)", _close_keeps_row),
    Fault("split_no_lock_copy", BOTH,
          "a node split leaves the new upper node unlocked: a holder's path loses its lock",
          "0.5.15 RadixCache._split_node (new_node.lock_ref = child.lock_ref); 0.5.23 "
          "FullComponent.redistribute_on_node_split", _split_no_lock_copy),
    Fault("close_not_deferred", BOTH,
          "SessionController._close releases a streaming session at once while a turn is "
          "in flight: its KV is freed under the running turn",
          "PR #21875 (close deferral); _close's comment ('Freeing now would corrupt the "
          "scheduler')", _close_not_deferred),
    Fault("close_keeps_mamba", BOTH,
          "release_session skips _free_slot_mamba: the slot's mamba state leaks with the session",
          "PR #23496 (mamba leak on close); release_session's _free_slot_mamba(slot)",
          _close_keeps_mamba),
    Fault("ephemeral_slot_no_mamba", ("0.5.15",),
          "a first turn aborted mid-processing: the ephemeral slot does not take the "
          "request's mamba refs, which the abort orphans",
          "0.5.15 try_cache_finished_req's comment ('Also carry the mamba refs over so "
          "_free_slot_mamba can return the ... slots to the mamba pool; otherwise the abort "
          "orphans them')", _ephemeral_slot_no_mamba),
    Fault("session_held_counts_borrowed", ("0.5.15",),
          "session_held_tokens ignores active_pool_idxs: a borrowed slot counted twice while busy",
          "PR #22213 (busy double count); session_held_tokens' docstring",
          _session_held_counts_borrowed),
    Fault("round_charge_leak", BOTH,
          "PrefillAdder._update_prefill_budget skips a round's first admitted request: the "
          "chunk budget leaks across the round",
          "_update_prefill_budget's docstring ('Charge one admitted request against the "
          "prefill budgets')", _round_charge_leak),
    Fault("admission_lock_dropped", BOTH,
          "add_one_req gives the admitted request's persistent tree lock back at once: its "
          "matched prefix is unlocked while it runs",
          "0.5.15 _req_inc_lock_ref; 0.5.23 _commit_prefill_admission's "
          "req.lock = tree_cache.lock(req.last_node)", _admission_lock_dropped),
    Fault("admission_pin_kept", BOTH,
          "add_one_req's temporary pin of the matched prefix (_lock_node) is taken again "
          "after the selection: the prefix stays locked after the round",
          "0.5.23 add_one_req's comment ('The temporary pin excludes this prefix from the "
          "evictable budget'); _lock_node's release in finally", _admission_pin_kept),
    Fault("retract_keeps_least_preferred", ("0.5.23",),
          "retract_decode's victim order reversed: the request with the most output is "
          "retracted first",
          "_get_decode_retraction_order's docstring ('most-preferred to least-preferred to "
          "keep. The retraction loop pops from the end')", _retract_keeps_least_preferred),
    Fault("decode_mem_one_page", BOTH,
          "new_tokens_required_next_decode counts at most one page for the batch: "
          "check_decode_mem passes while the decode batch is short",
          "new_tokens_required_next_decode's page per request whose next token starts one",
          _decode_mem_one_page),
    Fault("preempt_takes_finished", ("0.5.15",),
          "preempt_to_schedule does not skip the finished requests still in the running "
          "batch: a finished request is released a second time",
          "preempt_to_schedule's NOTE on the two-phase finish ('We must skip them here to "
          "avoid a double-free on release_req')", _preempt_takes_finished),
    Fault("preempt_oldest_first", BOTH,
          "preempt_to_schedule breaks a priority tie by the earliest queue entry: the "
          "longest-waiting running request is preempted first",
          "preempt_to_schedule's sort key (priority, -wait_queue_entry_time)",
          _preempt_oldest_first),
    # caught under config.admission 'reserve', where the round's admission is upstream's
    Fault("running_output_unreserved", BOTH,
          "the PrefillAdder reserves nothing for the running batch's remaining output: a "
          "round admits into the decode headroom promised to the running requests",
          "PrefillAdder.__init__'s 'Estimate the offset in the remaining token space' "
          "(_get_running_request_total_token_offset)", _running_output_unreserved),
    Fault("admission_not_strict", BOTH,
          "add_one_req admits a request whose reservation exactly fills what is left",
          "0.5.15 add_one_req's total_tokens >= rem_total_tokens -> NO_TOKEN; 0.5.23 "
          "PrefillBudget.check_prefill's total_tokens < remaining_total",
          _admission_not_strict),
    Fault("calc_priority_ignores_priority", BOTH,
          "calc_priority sorts the waiting queue by entry alone: a round under priority "
          "scheduling considers an earlier low-priority request first",
          "_sort_by_priority_and_fcfs's key (priority * priority_sign, "
          "wait_queue_entry_time)", _calc_priority_ignores_priority),
    Fault("extend_rows_swapped", BOTH,
          "alloc_for_extend gets the batch's rows in reverse order: each request's KV "
          "indices are written into another request's row",
          "alloc_for_extend: alloc_req_slots(...) rows in batch order, then "
          "write_cache_indices per request", _extend_rows_swapped),
)}


def requested(env: dict | None = None) -> tuple:
    """The names in KVCHECK_SGLANG_PLANT, in order, without blanks or repeats."""
    text = (os.environ if env is None else env).get(ENV, "")
    out: list = []
    for n in (x.strip() for x in text.split(",")):
        if n and n not in out:
            out.append(n)
    return tuple(out)


SAME_CODE = {"0.5.14": "0.5.15", "0.5.16": "0.5.15", "0.5.17": "0.5.15", "0.5.18": "0.5.15",
             "0.5.22": "0.5.23"}
"""A release whose patched methods are another's, as the installers know them: 0.5.14's
and 0.5.16's StreamingSession, SessionSlot, RadixCache and paged allocator methods have
0.5.15's names and arguments (0.5.16's slot keeps its allocated length in `slot.kv`, which
`free_tail_slot_untouched` reads there; so do 0.5.17's and 0.5.18's), 0.5.22's have
0.5.23's. `python -m benchmarks.bench_sglang_faults --versions V`: 12 of 12 caught on each
of 0.5.14 and 0.5.16-0.5.18, 9 of 9 on 0.5.22 (adapters/sglang/README.md); the clean
release passes every scope. Those runs predate `close_keeps_mamba` and
`ephemeral_slot_no_mamba`, which need a scope whose session slot holds Mamba state:
0.5.16-0.5.18's presets have none."""


def code_of(version: str) -> str:
    """The release whose code a fault's `releases` and installer name for `version`."""
    return SAME_CODE.get(version, version)


def applicable(version: str) -> list:
    return sorted(n for n, f in FAULTS.items() if code_of(version) in f.releases)


def validate(names, version: str) -> None:
    for n in names:
        if n not in FAULTS:
            raise PlantError(f"{ENV}: unknown planted fault {n!r}; known for sglang {version}: "
                             f"{', '.join(applicable(version))}")
        if code_of(version) not in FAULTS[n].releases:
            raise PlantError(f"{ENV}: planted fault {n!r} does not apply to sglang {version} "
                             f"(only {', '.join(FAULTS[n].releases)}); known for {version}: "
                             f"{', '.join(applicable(version))}")


def install(names, version: str) -> tuple:
    """Validate, then install each named fault once (idempotent); the names installed."""
    validate(names, version)
    for n in names:
        if n not in INSTALLED:
            FAULTS[n].install(code_of(version))
            INSTALLED.append(n)
    return tuple(INSTALLED)


def install_from_env(version: str) -> tuple:
    return install(requested(), version)


def uninstall() -> None:
    """Put every patched upstream attribute back (in-process tests)."""
    for (module, cls, attr), orig in _ORIGINALS.items():
        mod = importlib.import_module(module)
        setattr(mod if cls is None else getattr(mod, cls), attr, orig)
    _ORIGINALS.clear()
    INSTALLED.clear()
