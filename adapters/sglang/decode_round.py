"""A decode round of SglangBackend (`decode_round`): upstream's own update_running_batch
over the merged running batch, `check_decode_mem` and, on a shortfall, `retract_decode`,
whose releases run the victim's overlap lookahead first (`_RetractHook`)."""
from __future__ import annotations

import copy

from kvcheck.adapters.sglang.release import SAMPLED_TOKEN


class _RetractHook:
    """The running batch's `release_req` during `retract_decode`: the victim's overlap
    lookahead (`Drive._lookahead`, the step already prepared under overlap scheduling),
    then upstream's own `ScheduleBatch.release_req`."""

    def __init__(self, drive, batch, by_req: dict):
        self.drive, self.batch, self.by_req = drive, batch, by_req

    def __call__(self, idx, *args, **kwargs):
        from sglang.srt.managers.schedule_batch import ScheduleBatch
        self.drive._lookahead(self.by_req[id(self.batch.reqs[idx])])
        return ScheduleBatch.release_req(self.batch, idx, *args, **kwargs)


class DecodeRound:
    """The decode round's operation and steps (a mixin of Drive)."""

    def _op_decode_round(self, op):
        """update_running_batch and a decode step over the running batch, all upstream's:
        the batch merged from the requests' own (`merge_batch`), its `check_decode_mem`,
        `retract_decode` when that fails (each victim through `_RetractHook`), then the
        batch's `prepare_for_decode` (one eviction and `alloc_for_decode` for the whole
        batch); the forward's KV and the result in batch order."""
        lives = [self.live[rid] for rid in op.rids]
        self._filter_batch()
        batch = self._merged_batch(lives)
        out = "ok"
        if not batch.check_decode_mem():
            lives = self._retract_decode(batch, lives)
            out = "oom"
        if lives:
            pos = [self._lens(L.req)[0] for L in lives]
            self.forward_iter = getattr(self, "forward_iter", -1) + 1
            batch.forward_iter = self.forward_iter
            batch.prepare_for_decode()
            for L, p in zip(lives, pos):
                self._write_shadow(L.req, p, p + 1)
        for L in lives:
            L.req.output_ids.append(SAMPLED_TOKEN)
        for L in lives:
            self._check_finished(L)
        return out

    def _merged_batch(self, lives: list):
        """The running batch: each request's own batch (tensors re-derived,
        `_sync_batch`) merged into one by upstream's `merge_batch`, as the scheduler's
        running batch grows by each prefill batch."""
        for L in lives:
            self._sync_batch(L)
        whole = self._batch_copy(lives[0].batch)
        for L in lives[1:]:
            whole.merge_batch(L.batch)
        return whole

    @staticmethod
    def _batch_copy(batch):
        """A batch that merge_batch / filter_batch may rebind or extend (0.5.15's
        `merge_batch` extends its lists in place) without touching `batch`."""
        one = copy.copy(batch)
        one.sampling_info = copy.copy(batch.sampling_info)
        for name, value in vars(batch).items():
            if isinstance(value, list):
                setattr(one, name, list(value))
        return one

    def _retract_decode(self, batch, lives: list) -> list:
        """Upstream's `ScheduleBatch.retract_decode` (0.5.15 `schedule_batch.py` l.2470,
        0.5.23 l.3451): its victim order, victims until the rest fits, the last one
        aborted; each victim's release goes through `_RetractHook`. The requests left, in
        the order upstream's `filter_batch` keeps them."""
        from sglang.srt.server_args import get_global_server_args
        by_req = {id(L.req): L for L in lives}
        batch.release_req = _RetractHook(self, batch, by_req)
        args = (get_global_server_args(),) if self.api == "flat" else ()
        retracted, _, aborted = batch.retract_decode(*args)
        for req in retracted + aborted:
            self._retracted(by_req[id(req)])
        for req in retracted:       # update_running_batch re-queues them
            self._enqueue(by_req[id(req)])
        for req in aborted:         # FINISH_ABORT: only an abort output is sent
            self.live.pop(by_req[id(req)].rid)
        return [by_req[id(req)] for req in batch.reqs]
