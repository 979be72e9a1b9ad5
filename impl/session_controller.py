"""Session and SessionController (upstream session/session_controller.py), streaming only.

Fixed H3: the session remembers *which* request is in flight, and abort_req(req) clears
the mark only for that request.
"""
from __future__ import annotations

from typing import Optional

from kvcheck.impl import faults
from kvcheck.impl.schedule_batch import FINISH_ABORT, Req


class Session:
    def __init__(self, session_id: int, streaming: bool = True):
        self.session_id = session_id
        self.streaming = streaming
        self.req_nodes: dict = {}              # rid -> the last successfully finished Req
        self.close_on_finish = False
        self._inflight: Optional[Req] = None
        self.closed = False

    @property
    def inflight(self) -> bool:
        return self._inflight is not None

    def checkpoint(self) -> list:
        if not self.req_nodes:
            return []
        (last,) = self.req_nodes.values()
        return last.origin_input_ids + last.output_ids[: last.finished_len if last.finished_len is not None else len(last.output_ids)]

    def create_req(self, rid: int, new_tokens, max_new_tokens: int) -> Req:
        if self.close_on_finish or self.closed:
            # a closing session hands out a plain aborted request (not attached)
            req = Req(rid, [0], max_new_tokens, session=None, streaming=False, rejected=True)
            req.to_finish = FINISH_ABORT
            return req
        if self._inflight is not None:
            req = Req(rid, [0], max_new_tokens, session=self, streaming=True, rejected=True)
            req.to_finish = FINISH_ABORT
            return req
        assert len(self.req_nodes) <= 1
        req = Req(rid, self.checkpoint() + list(new_tokens), max_new_tokens, session=self, streaming=True)
        self._inflight = req
        return req

    def finish_req(self, req: Req) -> None:
        self._inflight = None
        for old in self.req_nodes.values():
            old.session = None
        self.req_nodes = {req.rid: req}

    def abort_req(self, req: Req) -> None:
        if self._inflight is req or "abort_req_unconditional" in faults.ACTIVE:
            self._inflight = None


class SessionController:
    def __init__(self, tree_cache):
        self.tree_cache = tree_cache           # StreamingSession
        self.sessions: dict[int, Session] = {}

    def open(self, session_id: int) -> bool:
        if session_id is None or session_id in self.sessions:
            return False
        self.sessions[session_id] = Session(session_id, streaming=True)
        return True

    def _close(self, session_id: int) -> str:
        session = self.sessions[session_id]
        if session.streaming and session.inflight and "close_not_deferred" not in faults.ACTIVE:
            session.close_on_finish = True
            return "deferred"
        for old in session.req_nodes.values():
            old.session = None
        self.tree_cache.release_session(session_id)
        session.closed = True
        del self.sessions[session_id]
        return "ok"

    def close(self, session_id: int) -> str:
        if session_id not in self.sessions:     # "session id ... does not exist, cannot delete"
            return "refused"
        return self._close(session_id)

    def maybe_reap(self) -> None:
        """The scheduler loop's `maybe_reap`, after each round: every deferred close whose
        turn has ended is carried out."""
        for session_id, session in list(self.sessions.items()):
            if session.close_on_finish and not session.inflight:
                self._close(session_id)
