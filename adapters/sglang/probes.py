"""Probes of the real release's hybrid trees, each built as the adapter builds it and run
beside the spec (the checker's own lockstep): `kvcheck.adapters.sglang.proxy`'s
swa_probe, swa_unified_probe, mamba_tree_probe and queued_borrowed_abort_probe ask the
served release (run_trace) for these; `admission_probe` compares a round's admission with
upstream's unmodified PrefillAdder on a fork. They sit above the backend (they build one), the
trees' helpers below it."""
from __future__ import annotations

from kvcheck.adapters.sglang.backend import SglangBackend
from kvcheck.adapters.sglang.hybrid import holds_mamba, kv_record, swa_allocator, tree_mamba
from kvcheck.adapters.sglang.swa_unified import probe_ops, tree_swa
from kvcheck.checker import run_ops
from kvcheck.spec import ops as O


def swa_probe(cfg) -> dict:
    """Run the real SWA allocator of this release through one request's life on the CPU
    (alloc_extend of 3 tokens, a decode past a page boundary, the window's free_swa of
    the first page, the release's free) and report what its own counters say, so a test
    can show it needs no CUDA and no stand-in (the served release runs it: `run_trace
    --serve`'s `swa_probe`). cfg: page_size 2, swa_window set."""
    import torch
    from kvcheck.adapters.sglang import shim
    alloc, I = swa_allocator(cfg), torch.int64
    shim.arm()
    t = lambda *v: torch.tensor(list(v), dtype=I)  # noqa: E731
    out = alloc.alloc_extend(prefix_lens=t(0), prefix_lens_cpu=t(0), seq_lens=t(3),
                             seq_lens_cpu=t(3), last_loc=t(-1), extend_num_tokens=3)
    dec = alloc.alloc_decode(seq_lens=t(5), seq_lens_cpu=t(5), last_loc=out[-1:] + 1)
    held = torch.cat([out, dec])
    mapped = alloc.full_to_swa_index_mapping[held].tolist()
    alloc.free_swa(out[:2])
    after_window = (alloc.full_available_size(), alloc.swa_available_size())
    alloc.free(held)
    return dict(mapped=mapped, after_window=list(after_window),
                after_free=[alloc.full_available_size(), alloc.swa_available_size()],
                stub_calls=shim.calls())


def mamba_tree_probe(cfg) -> dict:
    """Run the real 0.5.23 `UnifiedRadixCache` with the Mamba component production builds
    for a hybrid SSM model (cfg: borrow era, P = 1, mamba_extra_buffer off, which the
    component requires), over a real `HybridReqToTokenPool` and the stand-in `MambaPool`,
    through PROBE_OPS beside the spec (the checker's own lockstep), and report where the
    Mamba slots are after each op and the first step where the two differ. Shows that it
    constructs and runs on the CPU, and why the adapter refuses the config (module
    docstring)."""
    ops = [O.SubmitRequest(1, (1, 2, 3, 4, 5), 3), O.Schedule(1), O.Decode(1, 9), O.Finish(1),
           O.SubmitRequest(2, (1, 2, 3, 4, 5, 6), 2), O.Schedule(2), O.Finish(2),
           O.OpenSession(1), O.SubmitTurn(1, 3, (7, 8, 9), 3), O.Schedule(3), O.Finish(3),
           O.CloseSession(1)]
    b = SglangBackend(cfg, refuse=False)
    steps = []
    for op in ops:
        b.apply(op)
        a = b.abstract()
        steps.append(dict(op=op.name, mamba_free=list(a.mamba_free), tree=tree_mamba(b),
                          reqs={r.rid: list(r.mamba) for r in a.reqs},
                          slots={t.sid: list(t.mamba) for t in a.slots}))
    copies = list(b.pool.mamba_pool.copies)
    lockstep = run_ops(cfg, ops, SglangBackend(cfg, refuse=False), backend_name=b.name)
    fail = lockstep.failure
    return dict(steps=steps, copies=copies,
                first_divergence=None if fail is None else
                dict(step=fail.step, op=fail.op.name, id=fail.id, side=fail.side,
                     lines=[str(v) for v in fail.violations[:4]] + list(fail.details[:6])))


def queued_borrowed_abort_probe(cfg) -> dict:
    """Finding M2 (docs/upstream-findings.md) on the real 0.5.23, outside the lockstep (the
    runs drive it too: `release_queued_mamba`): a session's second turn
    borrows its slot's record at the match (`try_match_prefix`: `req.kv = slot.kv`, which
    holds a Mamba state), is turned down and stays queued; the client aborts it. Upstream's
    `Scheduler.abort_request`, waiting-queue branch (scheduler.py l.5696-5721; inline
    there, replicated by the backend's `abort_queued`): `_release_aborted_request` (`session.abort_req()`),
    then, the request holding a Mamba state, `release_kv_cache(req, checkpoint=False)`,
    whose `claim_kv_row` -> `try_cache_finished_req` sees no FINISH_ABORT on the queued
    request and finishes it: `finish_req` makes the aborted turn the session's req_nodes.
    Reports req_nodes before and after, and the next turn's prompt. cfg: borrow era,
    mamba_slots, mamba_tree or disable_radix_cache; or the wrapper era (0.5.15, the tree
    `MambaRadixCache` or a plain `RadixCache`): a turn restored from its slot holds the
    slot's row and `mamba_pool_idx`, `abort_request` (l.3905-3910, no session call first:
    H5) calls `release_kv_cache(req, is_insert=False)`, and the wrapper's
    `try_cache_finished_req` takes the same finish path."""
    b = SglangBackend(cfg)
    for op in [O.OpenSession(1), O.SubmitTurn(1, 1, (1, 2, 3), 2), O.Schedule(1), O.Decode(1, 7),
               O.SubmitTurn(1, 2, (4, 5), 2), O.Schedule(1 + 1, admit=False)]:
        b.apply(op)
    req, sess = b.live[2].req, b.ctrl.get(b._sid(1))
    slot, kv = b._slots()[b._sid(1)], kv_record(req)
    out = dict(borrowed=kv_record(slot) is kv or slot.req_pool_idx == req.req_pool_idx,
               holds_kv=b._row(req) is not None, holds_mamba=holds_mamba(kv),
               req_nodes_before=[str(int(r)) for r in sess.req_nodes])
    b.apply(O.AbortQueued(2))       # (0.5.23: _release_aborted_request), "For mamba radix cache"
    out.update(req_nodes_after=[str(int(r)) for r in sess.req_nodes], inflight=bool(sess._inflight),
               slot_kept=b._sid(1) in b._slots())
    b.apply(O.SubmitTurn(1, 3, (6,), 2))
    out["next_prompt"] = [int(t) for t in b.live[3].req.origin_input_ids]
    return out


def swa_unified_probe(cfg, names=None) -> dict:
    """Run the real 0.5.23 FULL + SWA `UnifiedRadixCache` (built as `build`) through each
    `probe_ops` sequence beside the spec (the checker's own lockstep, the adapter's refusal
    lifted for the probe), and report, per sequence, the SWA read-back after each op (the
    nodes' SWA values and locks, the holders' cursors and lock boundaries) and the first
    step where the two sides differ."""
    out = {}
    for name, ops in probe_ops().items():
        if names and name not in names:
            continue
        b = SglangBackend(cfg, refuse=False)
        steps = []
        for op in ops:
            outcome = b.apply(op)
            a = b.abstract()
            steps.append(dict(
                op=op.name, outcome=outcome, tree=tree_swa(b.cache),
                reqs={r.rid: [r.committed, r.protected, r.swa_evicted_seqlen, r.swa_evict_floor]
                      for r in a.reqs},
                slots={t.sid: [t.committed, t.protected, t.swa_evicted_seqlen,
                               t.swa_uuid_for_lock and list(t.swa_uuid_for_lock)]
                       for t in a.slots},
                swa_free=len(a.swa_free_pages), concrete=[str(v) for v in b.concrete_violations()]))
        lock = run_ops(cfg, ops, SglangBackend(cfg, refuse=False), backend_name=b.name)
        fail = lock.failure
        out[name] = dict(steps=steps, first_divergence=None if fail is None else dict(
            step=fail.step, op=fail.op.name, id=fail.id, side=fail.side,
            lines=[str(v) for v in fail.violations[:4]] + list(fail.details[:8])))
    return out


def upstream_admission(backend, op) -> tuple:
    """Which of a prefill round's requests the release's own admission takes: on a fork
    of `backend`, upstream's unmodified `PrefillAdder` loop (`add_chunked_req` for the
    chunked request, then per waiting request `init_next_round_input` and `add_one_req`
    until its verdict is not CONTINUE; the scheduler's row check before each match), where
    the adapter runs the spec's admission test (README.md, "What the spec decides
    otherwise"). The rids in its `can_run_list`, in order."""
    from sglang.srt.managers.schedule_policy import AddReqResult
    fork = backend.fork()
    rids = list(op.rids) if isinstance(op, O.ScheduleRound) else [op.rid]
    adder = fork._prefill_adder()
    for rid in rids:
        L = fork.live[rid]
        if L.phase == "prefill":
            fork._checkpoint_chunk(L)
            adder.add_chunked_req(L.req)
            continue
        if len(adder.can_run_list) >= fork.pool.available_size():
            break                       # get_num_allocatable_reqs: batch_is_full
        L.req.init_next_round_input(fork.cache)
        if adder.add_one_req(L.req, has_chunked_req=False,
                             truncation_align_size=None) != AddReqResult.CONTINUE:
            break
    taken = {id(r) for r in adder.can_run_list}
    return tuple(rid for rid in rids if id(fork.live[rid].req) in taken)


def admission_probe(cfg, ops) -> list:
    """Replay `ops` on the release as the adapter drives it and, before each admitting
    prefill round, ask `upstream_admission` what the release's own admission takes:
    [(step, op, the adapter's admitted rids (the spec's rule), upstream's)] for every
    round where the two differ."""
    backend = SglangBackend(cfg)
    out = []
    for i, op in enumerate(ops):
        admits = isinstance(op, O.ScheduleRound) and op.limit is None or \
            isinstance(op, O.Schedule) and op.admit
        upstream = upstream_admission(backend, op) if admits else None
        before = {rid: L.phase for rid, L in backend.live.items()}
        backend.apply(op)
        if upstream is None:
            continue
        rids = op.rids if isinstance(op, O.ScheduleRound) else (op.rid,)
        spec = tuple(r for r in rids if before.get(r) == "prefill" or
                     r not in backend.live or backend.live[r].phase != "queued")
        if spec != upstream:
            out.append((i, op.to_json(), spec, upstream))
    return out
