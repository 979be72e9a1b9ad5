"""Progress: the scheduler left alone drains the system to idle within a bounded number of
rounds.

Safety (spec/invariants.py) says nothing bad happens at a step; some round defects break
no memory invariant at all: a chunked request that is never continued, an aborted one that
keeps its row, KV and lock, a retracted one that is never re-admitted. The drain asks the
question a server answers every time its clients go quiet: with no new request, do the
scheduler's rounds (`Scheduler.event_loop_normal`: a prefill round when one can be formed,
else a decode round) finish or release every request, and do the sessions' closes
(`SessionController._close`, or `maybe_reap` at their timeouts) then leave nothing held?

`drain_op` is that scheduler as a pure function of the state: the next operation it runs.
A run ends idle (no request, no session) within `drain_bound` operations, or P1 names the
request (or session) still holding on. Whatever the drain leaves behind is then checked
by the state invariants like any other state: at idle every page is free or cached,
every row free, every lock dropped.
"""
from __future__ import annotations

from typing import Optional

from kvcheck.spec import mamba_pool, mamba_tree, ops as O, swa_tree
from kvcheck.spec.admission import _add_one_req, _Budget
from kvcheck.spec.allocator import available_size
from kvcheck.spec.finish import calc_priority_order, retraction_order
from kvcheck.spec.actions import enabled
from kvcheck.spec.pages import ceil_align, ceil_div
from kvcheck.spec.state import State
from kvcheck.spec.violations import ModelError, Violation

P1 = ("P1", "drains to idle")
PROGRESS_IDS = dict((P1,))
"""Progress properties by id (P*), beside the invariants' I*: what a report quotes."""

PREFILL, DECODE = "prefill", "decode"


def idle(s: State) -> bool:
    """No request live and no session open: what the drain must reach."""
    return not s.reqs and not s.sessions


def drain_bound(s: State) -> int:
    """How many operations the drain may take from s: for each live request, a round for
    each chunk it has left and each token it may still decode, twice over (prefill and
    decode rounds alternate, and a retracted request prefills again), plus a close for each
    session and a few rounds of slack. A drain that needs more is stuck or livelocked."""
    work = 0
    for r in dict.values(s.reqs):
        chunk = s.cfg.chunk_size or r.seqlen or 1
        chunks = ceil_div(max(r.seqlen - r.extend_end, 1), chunk)
        work += 2 * (chunks + max(r.max_new_tokens - len(r.output), 0) + 1)
    return 2 * work + 2 * len(s.sessions) + 8


def progress_key(s: State) -> tuple:
    """What a drain round must change to count as progress: each live request's phase,
    prefilled length and output, and the open sessions."""
    return (tuple((r.rid, r.phase, r.extend_end, len(r.output)) for r in dict.values(s.reqs)),
            tuple(s.sessions))


def drain_op(s: State, last: Optional[O.Op] = None, stalled: int = 0) -> Optional[O.Op]:
    """The next operation of the scheduler left alone in s, after `last`, when the last
    `stalled` operations made no progress (`progress_key`); None when idle, or stuck.
    Prefill and decode rounds alternate while both have work; where a round of several
    requests is not modelled (hybrid pools, speculative decoding) the requests go one at
    a time. When no round gets anywhere, what holds the memory is let go (`_unblock`).
    Sessions close once no request is live."""
    reqs = list(dict.values(s.reqs))
    if not reqs:
        return next((O.CloseSession(sid) for sid in s.sessions), None)
    queued = [r for r in reqs if r.phase == "queued"]
    if s.cfg.enable_priority_scheduling:
        queued = calc_priority_order(queued)
    waiting = [r.rid for r in reqs if r.phase == "prefill"] + [r.rid for r in queued]
    decoding = [r for r in reqs if r.phase == "decode"]
    if stalled >= (2 if waiting and decoding else 1):
        return _unblock(s, reqs, waiting, decoding)
    order = (PREFILL, DECODE) if _kind(last) != PREFILL or not decoding else (DECODE, PREFILL)
    for kind in order:
        for op in (_prefill_ops(s, waiting) if kind == PREFILL else _decode_ops(s, decoding)):
            if enabled(s, op):
                return op
    return _unblock(s, reqs, waiting, decoding)     # the guards refuse every round


def rescues(s: State, op: O.Op) -> bool:
    """Whether a drain operation is a client's or a timeout's (`_unblock`: a close while
    requests are live, an abort, a retraction outside a decode round), not a round the
    scheduler runs by itself."""
    return isinstance(op, (O.AbortQueued, O.AbortRunning, O.Retract)) or \
        (isinstance(op, O.CloseSession) and bool(s.reqs))


def _kind(op) -> Optional[str]:
    if isinstance(op, (O.ScheduleRound, O.Schedule, O.PrefillChunk)):
        return PREFILL
    if isinstance(op, (O.DecodeRound, O.Decode, O.SpecDecode, O.Retract, O.AbortRunning)):
        return DECODE
    return None


def _prefill_ops(s: State, waiting: list):
    """The prefill round over every waiting request in queue order (the chunked request
    first; under priority scheduling the queue is sorted by priority, then entry), else the chunked request's next chunk or a waiting request alone, in that
    order (the first the guard lets run)."""
    if not waiting:
        return
    yield O.ScheduleRound(tuple(waiting))
    for rid in waiting:
        if s.reqs[rid].phase != "prefill":
            yield O.Schedule(rid)
        else:       # 'reserve': the chunked request continues only in a round
            yield O.PrefillChunk(rid) if s.cfg.admission == "pages" else O.ScheduleRound((rid,))


def _decode_ops(s: State, decoding: list):
    """The decode round over the running batch, else one request's step at a time."""
    if not decoding:
        return
    yield O.DecodeRound(tuple(r.rid for r in decoding))
    for r in decoding:
        yield O.SpecDecode(r.rid, 1, 1) if s.cfg.spec_enabled else O.Decode(r.rid)


def _unblock(s: State, reqs: list, waiting: list, decoding: list) -> Optional[O.Op]:
    """No round gets anywhere. In turn: a request longer than the whole pool leaves (upstream
    refuses it at entry: `validate_input_length` with `max_req_input_len` below the pool's
    size; the spec's guard bounds a request by the context length only); a session with no
    live request closes (its client is done, or `maybe_reap` times it out: session KV
    stays pinned until then); the first waiting request the round is refused at gives up
    (`abort_request`), but only when the memory it needs is really held elsewhere
    (`starved`: session KV over-subscribing the pool wedges the queue upstream, issue
    #27024); a decode step short of memory is followed by `retract_decode`'s choice (its
    first victim, or the last request's abort). None: stuck, with memory to spare (P1)."""
    big = next((r for r in reqs if r.phase == "queued"
                and ceil_div(r.seqlen, s.cfg.page_size) > s.cfg.num_pages), None)
    if big is not None:
        return O.AbortQueued(big.rid)
    busy = {r.session for r in reqs}
    sid = next((x for x in s.sessions if x not in busy), None)
    if sid is not None:
        return O.CloseSession(sid)
    r = next((s.reqs[rid] for rid in waiting if starved(s, s.reqs[rid])), None)
    if r is not None:
        return O.AbortQueued(r.rid) if r.phase == "queued" else O.AbortRunning(r.rid)
    if len(decoding) > 1:
        return O.Retract(retraction_order(decoding)[-1].rid)
    return O.AbortRunning(decoding[0].rid) if decoding else None


def starved(s: State, r) -> bool:
    """Whether a waiting request's next prefill cannot fit what the pools have free or
    evictable: a queued request's own admission alone in a round refuses it; the chunked
    request's: no free row, no Mamba slot, or fewer KV (or SWA) tokens than its next
    chunk."""
    if (r.row is None and not s.free_rows) or mamba_pool.mamba_short(s, r):
        return True
    if s.cfg.mamba_tree and (len(s.mamba_free_slots) <= mamba_pool.mamba_needed(s, r) or
                             (mamba_tree.chunk_refusal(s, r) if r.phase == "prefill" else
                              mamba_tree.cow_refusal(s, r))):
        return True     # the match's (or the chunk's) copy-on-write takes a slot too
    if r.phase == "queued":
        return _refused_alone(s, r.rid)
    left = r.seqlen - r.extend_end
    need = ceil_align(min(left, s.cfg.chunk_size or left), s.cfg.page_size)
    return available_size(s) + s.evictable_size < need or swa_tree.swa_admission_short(s, need)


def _refused_alone(s: State, rid: int) -> bool:
    """A queued request's own admission, alone in a round (`_add_one_req` on a copy: its
    match, the lock the match takes, which pins what it matched, then every budget of the
    round: rows, KV, SWA, Mamba) turns it down."""
    t = s.clone()
    try:
        return _add_one_req(t, t.reqs[rid], _Budget(t), refused=False) is None
    except ModelError:
        return False


class Drain:
    """One drain's course from a state: its bound, the operations applied, the last one
    and how many in a row made no progress (`progress_key`), which `drain_op` reads. The
    spec-alone drain (`drained`) and the lockstep's (`kvcheck.checker.Lockstep.drain`)
    both walk it."""

    def __init__(self, s: State) -> None:
        self.bound, self.steps, self.last, self.stalled = drain_bound(s), 0, None, 0

    def next_op(self, s: State) -> Optional[O.Op]:
        """The next drain operation from s; None when s is idle, the bound is reached or
        nothing applies."""
        if idle(s) or self.steps >= self.bound:
            return None
        return drain_op(s, self.last, self.stalled)

    def applied(self, op: O.Op, before: State, after: State) -> None:
        self.steps += 1
        self.last = op
        self.stalled = self.stalled + 1 if progress_key(after) == progress_key(before) else 0

    def verdict(self, s: State) -> Optional[Violation]:
        """P1 when the drain ended with s not idle."""
        return None if idle(s) else not_drained(s, self.steps, self.bound)


def drained(s: State) -> tuple[Optional[Violation], int]:
    """The drain from s on the spec alone (the explorer's progress check, `Scope.progress`):
    (P1's violation or None, the drain operations applied). A drain operation the spec
    refuses or that reaches an upstream assertion ends it unjudged (the explorer finds
    those through the operations themselves)."""
    from kvcheck.spec.model import step
    course = Drain(s)
    while (op := course.next_op(s)) is not None:
        try:
            after, _ = step(s, op)
        except (ModelError, ValueError):
            return None, course.steps
        course.applied(op, s, after)
        s = after
    return course.verdict(s), course.steps


def not_drained(s: State, steps: int, bound: int) -> Violation:
    """P1 on a state the drain did not bring to idle: the request that holds the others up
    (the chunked request, else the head of the queue, else the first running one: its
    phase and progress), else the first session still open."""
    reqs = list(dict.values(s.reqs))
    r = next((x for phase in ("prefill", "queued", "decode") for x in reqs if x.phase == phase),
             None)
    stuck = steps < bound
    how = f"no operation of the scheduler applies after {steps}" if stuck else \
        f"still live after {steps} (bound {bound})"
    if r is not None:
        return Violation(*P1, f"{how} drain rounds: {r.phase}, {len(r.output)}/{r.max_new_tokens} "
                         f"output tokens, kv {r.committed}/{r.allocated}, row {r.row}"
                         + (", marked to finish" if r.to_finish else ""), f"req {r.rid}")
    sid = next(iter(s.sessions))
    return Violation(*P1, f"{how} drain rounds: session still open", f"session {sid}")
