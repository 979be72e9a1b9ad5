"""The token arrays requests share: origin_input_ids aliased across a session's turns
(`_share_token_arrays`) and full_untruncated_fill_ids (divergences O1/O2,
docs/upstream-findings.md).

The fill is a third token array per request: `create_req` carries req_nodes' request's onto
the new turn (`carry_fill`) and `refresh_fill_ids` extends by a length rule only. The match,
the extend's forward and an unfinished insert read it (0.5.23: a finished insert too); under
accepted U1/U2 a later turn's create_req rewrites a live turn's prompt in place but not its
fill array, so the two may part. Without U1/U2 no other live request holds a request's
arrays, so the fill always reads as origin + output.
"""
from __future__ import annotations

from typing import Optional

from kvcheck.spec.state import Req, Session, State


def _aliases_arrays(s: State) -> bool:
    """`Config.aliases_token_arrays`: live requests share token arrays in place."""
    return s.cfg.aliases_token_arrays


def _share_token_arrays(s: State, array: int, origin: tuple) -> None:
    """Upstream `Session._share_token_arrays`: the new turn's origin_input_ids is the
    checkpoint request's (req_nodes') array, trimmed to the committed length and
    extended in place, so every live request still on that array now reads the new
    turn's prompt. A turn built on an earlier checkpoint is on an earlier request's
    array and keeps its prompt: one session can hold several arrays."""
    for r in s.reqs.values():
        if r.array_of == array:
            r.origin = origin


def carried_fill(fill: tuple, committed_fill_len: int, committed_origin_len: int,
                 out_tail: tuple, new_tokens: tuple) -> tuple:
    """`Session._share_token_arrays`' `carry_fill` (0.5.15 and 0.5.23 alike): req_nodes'
    request's fill array is trimmed to `committed_fill_len` in place; if what it holds
    past the committed origin (`baked`) is a prefix's length of the last output, it is
    extended in place by the rest of that output and the new input and becomes the new
    turn's fill. Returns (the array's tokens after, carried?)."""
    kept = fill[:committed_fill_len]
    baked = len(kept) - committed_origin_len
    if 0 <= baked <= len(out_tail):
        return kept + out_tail[baked:] + new_tokens, True
    return kept, False


def refreshed_fill(fill: tuple, origin: tuple, output) -> Optional[tuple]:
    """`Req.refresh_fill_ids` (0.5.15 `_refresh_fill_ids`): the outputs already in the
    fill are inferred from lengths alone; if that count is possible the array is
    extended in place by the rest (the tokens after, returned), else None: upstream
    rebuilds a private `origin + output`. (Its aliasing branch, fill *is* origin, needs
    pipeline parallelism: not driven.)"""
    have = len(fill) - len(origin)
    if 0 <= have <= len(output):
        return fill + tuple(output[have:])
    return None


def _write_fill(s: State, fid: Optional[int], tokens: tuple, own: Optional[Req] = None) -> None:
    """An in-place change of fill array `fid` (`own`: the request acting on it): every
    session whose req_nodes' request holds it reads the change; under accepted U1/U2
    (`_aliases_arrays`) every other live request on it too."""
    if own is not None:
        own.fill = tokens
    if fid is None:
        return
    for sid, x in list(dict.items(s.sessions)):        # read first: copy only holders
        if x.last_fill == fid:
            s.sessions[sid].fill = tokens
    if _aliases_arrays(s):
        for rid, r in list(dict.items(s.reqs)):
            if r.fill_of == fid and r is not own:
                s.reqs[rid].fill = tokens


def _new_fill_id(s: State, rid: int) -> int:
    """An id for a request's private fill array once a session holds it: the rid, or past
    every id in use if that is taken (an array the request left behind, still shared)."""
    used = {r.fill_of for r in dict.values(s.reqs)} | \
        {x.last_fill for x in dict.values(s.sessions)}
    used.discard(None)
    return rid if rid not in used else max(used | {rid}) + 1


def refresh_fill(s: State, req: Req) -> None:
    """`refresh_fill_ids` (`init_next_round_input`, the chunked request's next round;
    0.5.23's `release_kv_cache` before a finished insert). A rebuild leaves the shared
    array; a session whose req_nodes' request this is follows it to the new one
    (`last_req.full_untruncated_fill_ids`)."""
    tokens = refreshed_fill(req.fill, req.origin, req.output)
    if tokens is not None:
        if tokens != req.fill:
            _write_fill(s, req.fill_of, tokens, req)
        return
    req.fill, req.fill_of = req.fill_ids, None
    for sid, x in list(dict.items(s.sessions)):
        if req.req_nodes and x.last_rid == req.rid:
            if req.fill_of is None:
                req.fill_of = _new_fill_id(s, req.rid)
            x = s.sessions[sid]
            x.last_fill, x.fill = req.fill_of, req.fill


def _carry_fill(s: State, sess: Session, new_tokens: tuple) -> tuple:
    """create_req's carry_fill: (the new turn's fill, its array id); an empty private
    array (None) when it is not carried. Requires a checkpoint (`committed_origin_len`
    set by a finish_req)."""
    out_tail = sess.checkpoint[len(sess.committed_origin):]
    tokens, carried = carried_fill(sess.fill, sess.committed_fill_len,
                                   len(sess.committed_origin), out_tail, new_tokens)
    _write_fill(s, sess.last_fill, tokens)
    return (tokens, sess.last_fill) if carried else ((), None)


def fill_key(s: State, req: Req, finished: bool) -> tuple:
    """The tokens a tree insert keys req's KV by: `full_untruncated_fill_ids`, except
    0.5.15's `cache_finished_req`, which keys by `origin_input_ids + output_ids`
    (radix_cache.py l.451; 0.5.23's release refreshes the fill and checkpoints it)."""
    return req.fill_ids if finished and s.cfg.era == "wrapper" else req.fill
