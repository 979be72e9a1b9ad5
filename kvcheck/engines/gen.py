"""Each operation's arguments, drawn from the spec state: `ARGS` has one draw per operation
name (kvcheck.spec.actions.ACTIONS), and both fuzz engines draw from it."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from kvcheck.engines.draw import TOKEN_RANGE, Drawer, draw_evict, draw_length, draw_prompt, one_in
from kvcheck.spec import ops as O
from kvcheck.spec.actions import ACTIONS
from kvcheck.spec.config import Config
from kvcheck.spec.finish import calc_priority_order

MAX_LIVE_REQS = 6
MAX_SESSIONS = 2


@dataclass
class Ctx:
    """What an argument draw may read: the spec state (live objects) and a fresh-id source."""
    state: object
    fresh: Callable[[], int]

    @property
    def cfg(self) -> Config:
        return self.state.cfg

    def rids(self, *phases) -> list:
        return sorted(r.rid for r in self.state.reqs.values() if r.phase in phases)

    def room(self) -> bool:
        return len(self.state.reqs) < MAX_LIVE_REQS


def _pick(name: str):
    """A live request for operation `name`: one in the phases its action acts on."""
    phases = ACTIONS[name].acts_on

    def pick(c: Ctx, d: Drawer):
        rids = c.rids(*phases)
        return d.choice(rids, "rid") if rids else None
    return pick


REFUSED_ONE_IN = 10
"""A client request upstream turns down (`kvcheck.spec.model.refused`) or answers with a stub
(a turn for a session that is not open) is drawn once in this many draws of its op."""


def _refused(d: Drawer, label: str) -> bool:
    return one_in(d, REFUSED_ONE_IN, label)


def _open_session(c: Ctx, d: Drawer):
    sids = sorted(c.state.sessions)
    if sids and _refused(d, "open_in_use"):     # success=False: the id is already open
        return O.OpenSession(d.choice(sids, "sid"))
    return O.OpenSession(c.fresh()) if len(sids) < MAX_SESSIONS else None


def _submit_turn(c: Ctx, d: Drawer):
    s = c.state
    if not c.room():
        return None
    P = c.cfg.page_size
    if _refused(d, "no_session"):       # an aborted stub: the session id is not open
        return O.SubmitTurn(c.fresh(), c.fresh(), draw_prompt(d, P, 1, 10, "new_tokens"),
                            draw_length(d, P, 1, 10, "max_new_tokens"), draw_priority(c, d))
    if not s.sessions:
        return None
    idle = sorted(x for x, v in s.sessions.items() if v.inflight_rid is None)
    # mostly a session that can take a turn; sometimes one in flight (create_req rejects it)
    pool = idle if idle and d.integer(0, 3, "idle") else sorted(s.sessions)
    sid = d.choice(pool, "sid")
    new = draw_prompt(d, P, 1, 10, "new_tokens")
    return O.SubmitTurn(sid, c.fresh(), new, draw_length(d, P, 1, 10, "max_new_tokens"),
                        draw_priority(c, d))


def _submit_request(c: Ctx, d: Drawer):
    if not c.room():
        return None
    P = c.cfg.page_size
    tokens = draw_prompt(d, P, 1, 16, "tokens")
    return O.SubmitRequest(c.fresh(), tokens, draw_length(d, P, 1, 10, "max_new_tokens"),
                           draw_logprob_start(d, P, len(tokens)), draw_priority(c, d))


PRIORITIES = (0, 0, 5, 15, 30, 30)
"""Priority scheduling's priorities, against the default preemption threshold (10):
equal ones (the queue entry breaks ties), differences of 5 and exactly 10 (no
preemption) and of 15, 25 and 30 (preemption)."""


def draw_priority(c: Ctx, d: Drawer) -> int:
    """A request's priority under `config.enable_priority_scheduling`; 0 (nothing drawn)
    without it."""
    if not c.cfg.enable_priority_scheduling:
        return 0
    return d.choice(PRIORITIES, "priority")


def draw_logprob_start(d: Drawer, P: int, prompt_len: int):
    """`logprob_start_len` of a plain request: mostly none, else upstream's default (-1:
    caps a retried request's match at its prompt) or a page-biased start in the prompt."""
    kind = d.choice((None, None, None, -1, "start"), "logprob_start_len")
    return draw_length(d, P, 0, prompt_len, "logprob_start_len") if kind == "start" else kind


def _rid_op(name: str):
    """Operation `name` on a live request its action acts on (no other argument)."""
    cls, pick = ACTIONS[name].op, _pick(name)

    def make(c: Ctx, d: Drawer):
        rid = pick(c, d)
        return None if rid is None else cls(rid)
    return make


def _abort_op(name: str):
    """A client abort: of a live request its action acts on, or sometimes of a rid that is
    not live (`abort_request` finds nothing: refused)."""
    cls, live = ACTIONS[name].op, _rid_op(name)

    def make(c: Ctx, d: Drawer):
        return cls(c.fresh()) if _refused(d, "abort_gone") else live(c, d)
    return make


def _schedule(c: Ctx, d: Drawer):
    rid = _pick("schedule")(c, d)
    return None if rid is None else O.Schedule(rid, d.choice((True, True, True, False), "admit"))


def draw_order(d: Drawer, items: list, k: int, label: str) -> list:
    """k of items in a drawn order (a round's policy order, a batch's order)."""
    pool, out = list(items), []
    for _ in range(k):
        out.append(pool.pop(d.integer(0, len(pool) - 1, label)))
    return out


def _schedule_round(c: Ctx, d: Drawer):
    """A prefill round: the chunked request first when one is in flight (the round
    continues it), then waiting requests in a drawn policy order (a turn beside its
    session's rejected stub, plain requests on shared prefixes), sometimes cut by the
    round's other budgets (under priority scheduling the drawn requests in
    `calc_priority`'s order). One request a round with SWA or Mamba pools."""
    queued, chunked = c.rids("queued"), c.rids("prefill")
    if c.cfg.hybrid and chunked:
        return None
    head = [d.choice(chunked, "chunked")] if chunked else []
    most = 1 if c.cfg.hybrid else len(queued)
    if not head and not queued:
        return None
    drawn = draw_order(d, queued, d.integer(0 if head else 1, most), "round_order")
    if c.cfg.enable_priority_scheduling:        # calc_priority sorts the queue first
        drawn = [r.rid for r in calc_priority_order([c.state.reqs[rid] for rid in drawn])]
    rids = head + drawn
    if not rids:
        return None
    limit = d.integer(0, len(rids), "limit") if one_in(d, 4, "round_limited") else None
    return O.ScheduleRound(tuple(rids), limit)


def _decode_round(c: Ctx, d: Drawer):
    """A decode round over the running batch in a drawn batch order (`retract_decode`
    picks its victims from it when memory is short)."""
    rids = c.rids("decode")
    if not rids or c.cfg.spec_enabled or c.cfg.hybrid:
        return None
    return O.DecodeRound(tuple(draw_order(d, rids, len(rids), "batch_order")))


def _decode(c: Ctx, d: Drawer):
    rid = _pick("decode")(c, d)
    if rid is None or c.cfg.spec_enabled:
        return None
    return O.Decode(rid, d.integer(*TOKEN_RANGE, "token"))


def _spec_decode(c: Ctx, d: Drawer):
    rid = _pick("spec_decode")(c, d)
    if rid is None or not c.cfg.spec_enabled:
        return None
    drafts = d.integer(1, c.cfg.max_drafts, "drafts")
    return O.SpecDecode(rid, drafts, d.integer(0, drafts, "accepted"),
                        d.integer(*TOKEN_RANGE, "token"))


def _close_session(c: Ctx, d: Drawer):
    sids = sorted(c.state.sessions)
    if sids and _refused(d, "close_unknown"):   # "does not exist, cannot delete"
        return O.CloseSession(c.fresh())
    return O.CloseSession(d.choice(sids, "sid")) if sids else None


def _evict(c: Ctx, d: Drawer):
    ev = c.state.evictable_size
    return O.Evict(draw_evict(d, c.cfg.page_size, ev)) if ev > 0 else None


ARGS: dict[str, Callable[[Ctx, Drawer], Optional[O.Op]]] = {
    "open_session": _open_session,
    "submit_turn": _submit_turn,
    "submit_request": _submit_request,
    "schedule": _schedule,
    "prefill_chunk": _rid_op("prefill_chunk"),
    "decode": _decode,
    "spec_decode": _spec_decode,
    "finish": _rid_op("finish"),
    "abort_queued": _abort_op("abort_queued"),
    "queue_reject": _rid_op("queue_reject"),
    "pre_abort": _abort_op("pre_abort"),
    "abort_running": _abort_op("abort_running"),
    "retract": _rid_op("retract"),
    "close_session": _close_session,
    "evict": _evict,
    "schedule_round": _schedule_round,
    "decode_round": _decode_round,
}
"""op name -> draw(ctx, drawer) -> an op with its arguments, or None when the state has
no object to act on: one entry per action of kvcheck.spec.actions.ACTIONS (a request is
picked among its `acts_on` phases). The walk draws its swarm in this order: a new entry
goes last, so the other draws stay as they were."""
assert set(ARGS) == set(ACTIONS), (
    f"gen.ARGS needs one drawer per action: missing {sorted(set(ACTIONS) - set(ARGS))}, "
    f"unknown {sorted(set(ARGS) - set(ACTIONS))}")
