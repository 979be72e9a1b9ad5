"""The operation vocabulary: one set of frozen dataclasses that every driver speaks.

The Hypothesis machines, the explorer, the z3 counterexample printer, trace replay,
the impl/ adapter and the upstream adapters all apply exactly these operations, in
scheduler granularity (DOMAIN.md section 2). Each op serialises to a JSON object
`{"op": <name>, ...fields}` and back.

Request ids (`rid`) and session ids (`sid`) are chosen by the trace; page and row ids
are not part of the vocabulary (they are the system's own and compared up to renaming).
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Annotated, ClassVar, Optional

from kvcheck.spec.fields import (MAX_DRAFTS, MAX_ID, MAX_ROUND, Id, Ids, LogprobStart, Priority,
                         Range, TokenCount, TokenId, Tokens, field_error)


class OpError(ValueError):
    """A malformed operation in a trace."""


@dataclass(frozen=True)
class Op:
    name: ClassVar[str] = "op"
    quiet: ClassVar[frozenset] = frozenset()
    """Fields a trace omits at their default (added after traces were written without
    them; an older trace reads back unchanged)."""

    def args(self) -> list:
        """(field, value) of each field a trace and a report show: every one but the
        quiet fields at their default."""
        return [(f.name, getattr(self, f.name)) for f in fields(self)
                if not (f.name in self.quiet and getattr(self, f.name) == f.default)]

    def to_json(self) -> dict:
        return {"op": self.name,
                **{k: list(v) if isinstance(v, tuple) else v for k, v in self.args()}}

    def __str__(self) -> str:
        return f"{self.name}({', '.join(f'{k}={v!r}' for k, v in self.args())})"


@dataclass(frozen=True)
class OpenSession(Op):
    """`SessionController.open`: a streaming session; no KV is touched."""
    name: ClassVar[str] = "open_session"
    sid: Id


@dataclass(frozen=True)
class SubmitTurn(Op):
    """`Session.create_req`: the next turn = checkpoint tokens + new_tokens.
    Rejected (an aborted 1-token stub with `to_finish` set) while a turn is in flight."""
    name: ClassVar[str] = "submit_turn"
    quiet: ClassVar[frozenset] = frozenset({"priority"})
    sid: Id
    rid: Id
    new_tokens: Tokens
    max_new_tokens: TokenCount
    priority: Priority = 0
    """The turn's `priority` (needs `config.enable_priority_scheduling` when not 0)."""


@dataclass(frozen=True)
class SubmitRequest(Op):
    """A plain non-session request (shares the radix tree with sessions).
    `logprob_start_len`: returned logprobs from there (None: none); it caps the prefix
    match (`_compute_max_prefix_len`). A streaming turn's is overridden to -1 by
    `init_next_round_input`, so `submit_turn` has none."""
    name: ClassVar[str] = "submit_request"
    quiet: ClassVar[frozenset] = frozenset({"priority"})
    rid: Id
    tokens: Tokens
    max_new_tokens: TokenCount
    logprob_start_len: LogprobStart = None
    priority: Priority = 0
    """The request's `priority` (needs `config.enable_priority_scheduling` when not 0)."""


@dataclass(frozen=True)
class Schedule(Op):
    """Match prefix, admit (persistent lock), `alloc_for_extend` of the first chunk.
    `admit=False`: the match runs, the admission is rejected (budget); a later
    Schedule retries. The model also rejects when rows or KV do not suffice."""
    name: ClassVar[str] = "schedule"
    rid: Id
    admit: bool = True


@dataclass(frozen=True)
class ScheduleRound(Op):
    """One prefill round (`Scheduler._get_new_batch_prefill_raw`) over the requests it
    considers, in the policy's order: the chunked request first when one is in flight
    (`add_chunked_req`), then each waiting request is matched (`init_next_round_input`)
    and admitted (`PrefillAdder.add_one_req`: its lock, the round's shared row, KV and
    chunk budgets) until one is refused or a budget is spent; then one
    `ScheduleBatch.init_new(can_run_list).prepare_for_extend()` allocates rows and KV for
    the whole batch in its order and runs the session hooks, and the batch's result is
    processed request by request. `limit`: the round's other budgets (running reserve,
    `max_prefill_tokens`, ...) refuse the request at that index after its match (None:
    only the modelled budgets refuse). `schedule(rid, admit)` is the round of one."""
    name: ClassVar[str] = "schedule_round"
    rids: Ids
    limit: Optional[Annotated[int, Range(0, MAX_ROUND)]] = None


@dataclass(frozen=True)
class PrefillChunk(Op):
    """The next chunk of a chunked prefill (`cache_unfinished_req(chunked=True)` first)."""
    name: ClassVar[str] = "prefill_chunk"
    rid: Id


@dataclass(frozen=True)
class Decode(Op):
    """One decode step: `alloc_for_decode` for the last sampled token, sample `token`."""
    name: ClassVar[str] = "decode"
    rid: Id
    token: TokenId = 1


@dataclass(frozen=True)
class DecodeRound(Op):
    """One decode round over the running batch, in batch order
    (`Scheduler.update_running_batch`): when `check_decode_mem` fails, `retract_decode`
    retracts victims in its own order (fewest output tokens first, then the longest
    prompt) until the rest fits; then `prepare_for_decode` allocates for every request
    left in one call, the forward writes each one's last token, and the result appends
    the sampled token (1) to each and finishes those at max_new_tokens, in batch order."""
    name: ClassVar[str] = "decode_round"
    rids: Ids


@dataclass(frozen=True)
class SpecDecode(Op):
    """A speculative step: over-allocate for `drafts`, accept `accepted` (+1 bonus)."""
    name: ClassVar[str] = "spec_decode"
    rid: Id
    drafts: Annotated[int, Range(1, MAX_DRAFTS)]
    accepted: Annotated[int, Range(0, MAX_DRAFTS)]
    """At most `drafts` (checked with the trace) and `config.max_drafts` (the guard)."""
    token: TokenId = 1


@dataclass(frozen=True)
class Finish(Op):
    """Normal finish (length or stop): `release_kv_cache`."""
    name: ClassVar[str] = "finish"
    rid: Id


@dataclass(frozen=True)
class AbortQueued(Op):
    """Abort a request still in the waiting queue (popped, never running now)."""
    name: ClassVar[str] = "abort_queued"
    rid: Id


@dataclass(frozen=True)
class QueueReject(Op):
    """`Scheduler._add_request_to_queue` refuses a request as it enters (or, retracted,
    re-enters) the waiting queue: `_set_or_validate_priority` (a priority while priority
    scheduling is off) or `_abort_on_queued_limit` (the queue is full). It leaves as a
    queued abort does (0.5.22+: through `_release_aborted_request`)."""
    name: ClassVar[str] = "queue_reject"
    rid: Id


@dataclass(frozen=True)
class PreAbort(Op):
    """Set `to_finish = FINISH_ABORT` on a queued request before it is matched."""
    name: ClassVar[str] = "pre_abort"
    rid: Id


@dataclass(frozen=True)
class AbortRunning(Op):
    """Mid-abort: `FINISH_ABORT` on a running request (prefill or decode), then release."""
    name: ClassVar[str] = "abort_running"
    rid: Id


@dataclass(frozen=True)
class Retract(Op):
    """Retract a decoding request under memory pressure (`release_req`,
    `reset_for_retract`); it goes back to the waiting queue for a retry."""
    name: ClassVar[str] = "retract"
    rid: Id


@dataclass(frozen=True)
class CloseSession(Op):
    """`SessionController._close`: deferred while a turn is in flight."""
    name: ClassVar[str] = "close_session"
    sid: Id


@dataclass(frozen=True)
class Evict(Op):
    """`tree_cache.evict(EvictParams(num_tokens))`."""
    name: ClassVar[str] = "evict"
    num_tokens: Annotated[int, Range(1, MAX_ID)]


OP_TYPES: dict[str, type[Op]] = {
    cls.name: cls
    for cls in (OpenSession, SubmitTurn, SubmitRequest, Schedule, PrefillChunk, Decode,
                SpecDecode, Finish, AbortQueued, PreAbort, AbortRunning, Retract,
                CloseSession, Evict, QueueReject, ScheduleRound, DecodeRound)
}
OP_NAMES = tuple(OP_TYPES)


ROUNDS = (ScheduleRound, DecodeRound)


def acting_rids(op: Op) -> tuple:
    """The requests an operation acts on: a round's, in its order, or the one `rid`."""
    if isinstance(op, ROUNDS):
        return op.rids
    rid = getattr(op, "rid", None)
    return () if rid is None else (rid,)


def op_from_json(data: dict) -> Op:
    """Build one operation from its JSON object; every error names the operation and the
    field. Each field's type and range come from its declaration (spec/fields.py); a
    trace file is checked against the same declarations by kvcheck/schema.py first."""
    if not isinstance(data, dict):
        raise OpError(f"an operation must be a JSON object, got {data!r}")
    name = data.get("op")
    if name not in OP_TYPES:
        raise OpError(f"unknown operation {name!r}; known: {', '.join(OP_NAMES)}")
    cls = OP_TYPES[name]
    declared = {f.name: f for f in fields(cls)}
    unknown = sorted(set(data) - set(declared) - {"op"})
    if unknown:
        raise OpError(f"{name}: unknown field(s) {unknown}")
    missing = [n for n, f in declared.items() if n not in data and f.default is f.default_factory]
    if missing:                                   # no default: required (both MISSING)
        raise OpError(f"{name}: missing field {missing[0]!r}")
    kwargs = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items() if k != "op"}
    op = cls(**kwargs)
    err = field_error(op, name) or cross_field_error(op)
    if err:
        raise OpError(err)
    return op


def cross_field_error(op: Op):
    """A constraint between two fields of one operation, which a per-field range cannot
    state; None when it holds."""
    if isinstance(op, SpecDecode) and op.accepted > op.drafts:
        return f"spec_decode.accepted must be <= drafts ({op.drafts}), got {op.accepted}"
    if isinstance(op, (ScheduleRound, DecodeRound)) and len(set(op.rids)) != len(op.rids):
        return f"{op.name}.rids must name each request once, got {list(op.rids)}"
    if isinstance(op, ScheduleRound) and op.limit is not None and op.limit > len(op.rids):
        return f"schedule_round.limit must be <= len(rids) ({len(op.rids)}), got {op.limit}"
    if isinstance(op, SubmitRequest) and (op.logprob_start_len or 0) > len(op.tokens):
        return (f"submit_request.logprob_start_len must be <= len(tokens) ({len(op.tokens)}), "
                f"got {op.logprob_start_len}")
    return None


OUTCOMES = ("ok", "rejected", "oom", "deferred", "stub", "refused")
"""What applying an enabled op reports; spec and system under test must agree.
ok: done. rejected: `schedule` admission refused (match ran). oom: `decode`,
`spec_decode` or `prefill_chunk` found no KV after eviction (nothing changed).
deferred: `close_session` while a turn is in flight. stub: `submit_turn` rejected by
`create_req` (an aborted stub is queued), or for a session that is not open.
refused: a client request upstream turns down without a change (`kvcheck.spec.model.refused`:
open_session of an id in use, close_session of one not open, an abort of a request
that is not live)."""
