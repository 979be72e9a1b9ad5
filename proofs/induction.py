"""1-induction over abstract counters: every operation preserves the accounting identity
(I1) `available + evictable + protected + session_held + uncached == total`, row
conservation (I4) and `cache_protected_len <= committed <= allocated` (I6, I9).

The state is split into a *focus*: one request and the slot of its session (every
operation touches at most one request and one slot), and the *rest*: the other owners'
contributions `Sr` (session_held) and `Ur` (uncached) and rows `Ro`, which the operation
does not change. Tree content is two counters, evictable `E` and protected `Pt`: a lock
or unlock moves an arbitrary amount between them (z3 chooses it), an insert adds to
`E`, an eviction moves from `E` to available `A`. Every page computation (pages an
extend consumes, pages a range free releases, owned tokens, the trims) is the z3 term of
the real spec/pages.py function (kvcheck.proofs.symexec), so the induction is about the same
arithmetic the spec runs. Each operation follows docs/semantics.md.

The invariant is the conjunction of the target invariants and the auxiliary ones
(AUX). `run_induction()` proves, for every operation, Inv(s) and guard and step(s, s')
=> Inv(s'). A failure prints the counterexample to induction as a concrete pre-state,
the operation and its choices. The negative controls drop one auxiliary invariant (it
must then fail: the auxiliary invariant is needed) or mutate a spec function.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import z3

from kvcheck.proofs.core import Result, check, check_control, fmt_model, timed
from kvcheck.proofs.symexec import REAL, Module, mutate, positive_divisors, py_mod, symbolic

FREE = 0
QUEUED = 1
PREFILL = 2
DECODE = 3

INT_VARS = ("P", "T", "NR", "A", "E", "Pt", "Sr", "Ur", "FR", "Ro",
            "rq", "c", "a", "pl", "sc", "sa", "spl")
BOOL_VARS = ("spec", "row", "bor", "strm", "sx")


def fresh_state(tag: str) -> dict:
    s = {v: z3.Int(f"{tag}{v}") for v in INT_VARS}
    s.update({v: z3.Bool(f"{tag}{v}") for v in BOOL_VARS})
    return s


class Ctx:
    """Arithmetic of one proof: the spec functions (possibly mutated) on z3 terms."""

    def __init__(self, module: Module):
        self.M = module

    def f(self, name, *args):
        return symbolic(name, *args, module=self.M)

    def owned(self, prot, alloc, P):
        return self.f("owned_tokens", prot, alloc, P)

    def freed(self, start, end, P):
        """Tokens released by free(row[start:end]): whole pages (unique(index // P))."""
        return P * self.f("row_pages", start, end, P).length

    def freed_aligned(self, target, end, P):
        return P * self.f("free_kv_aligned_pages", target, end, P).length


def active(s):
    return s["rq"] >= PREFILL


def session_held(s, C: Ctx):
    counted = z3.And(s["sx"], z3.Not(z3.And(active(s), s["bor"])))
    return s["Sr"] + z3.If(counted, C.owned(s["spl"], s["sa"], s["P"]), 0)


def uncached(s, C: Ctx):
    return s["Ur"] + z3.If(active(s), C.owned(s["pl"], s["a"], s["P"]), 0)


def targets(s, C: Ctx) -> dict:
    P = s["P"]
    return {
        "I1 accounting identity": s["A"] + s["E"] + s["Pt"] + session_held(s, C) + uncached(s, C) == s["T"],
        "I4 row conservation": s["FR"] + s["Ro"] + z3.If(z3.And(s["row"], z3.Not(s["bor"])), 1, 0)
        + z3.If(s["sx"], 1, 0) == s["NR"],
        "I6/I9 request protected <= committed <= allocated": z3.Implies(
            active(s), z3.And(0 <= s["pl"], s["pl"] <= s["c"], s["c"] <= s["a"], s["row"])),
        "I6/I9 slot protected <= committed <= allocated": z3.Implies(
            s["sx"], z3.And(0 <= s["spl"], s["spl"] <= s["sc"], s["sc"] <= s["sa"])),
        "counters non-negative": z3.And(*[s[v] >= 0 for v in ("A", "E", "Pt", "Sr", "Ur", "FR", "Ro")]),
    }


AUX_DOC = {
    "X1 protected page-aligned (I8)":
        "cache_protected_len % P == 0 for the request and the slot",
    "X2 borrower coherence":
        "a borrowing request holds the slot's row, the slot exists, the request is the "
        "session's attached streaming turn",
    "X3 borrowed slot lags its borrower":
        "while the borrower runs: slot.protected == req.protected and slot.allocated <= "
        "req.allocated (restore sets both to prefix_len; the request only grows)",
    "X4 rows of queued/finished requests":
        "a queued request holds a row only as the slot's borrower; a finished one none",
    "X5 no overallocation without spec (I7)":
        "without speculative decoding a running request has committed == allocated",
    "X6 prefill has no overallocation":
        "between prefill chunks committed == allocated",
}


def aux(s) -> dict:
    P = s["P"]
    return {
        "X1 protected page-aligned (I8)": z3.And(z3.Implies(active(s), py_mod(s["pl"], P) == 0),
                                                 z3.Implies(s["sx"], py_mod(s["spl"], P) == 0)),
        "X2 borrower coherence": z3.Implies(s["bor"], z3.And(s["row"], s["sx"], s["strm"], s["rq"] >= QUEUED)),
        "X3 borrowed slot lags its borrower": z3.Implies(z3.And(active(s), s["bor"]),
                                                         z3.And(s["spl"] == s["pl"], s["sa"] <= s["a"])),
        "X4 rows of queued/finished requests": z3.And(
            z3.Implies(z3.And(s["rq"] == QUEUED, s["row"]), s["bor"]),
            z3.Implies(s["rq"] == FREE, z3.And(z3.Not(s["row"]), z3.Not(s["bor"])))),
        "X5 no overallocation without spec (I7)": z3.Implies(z3.And(z3.Not(s["spec"]), active(s)), s["c"] == s["a"]),
        "X6 prefill has no overallocation": z3.Implies(s["rq"] == PREFILL, s["c"] == s["a"]),
    }


def frame(s) -> list:
    """Constants and the state domain."""
    return [s["P"] >= 1, s["NR"] >= 1, s["rq"] >= FREE, s["rq"] <= DECODE]


# ---------------------------------------------------------------------------
# operations: each returns (guard list, post-state, nondeterministic choices)
# ---------------------------------------------------------------------------

@dataclass
class Step:
    guard: list
    post: dict
    choices: dict


def _ints(tag, *names):
    return [z3.Int(f"{tag}.{n}") for n in names]


def _chunk(C, start, inp, cs, use, P):
    return z3.If(use, C.f("chunk_end", start, inp, cs, P), C.f("chunk_end", start, inp, None, P))


def _extend(C, s, t, start, end, g, tag):
    """alloc_for_extend [start, end): evict z, then consume pages_needed_extend pages."""
    P = s["P"]
    (z,) = _ints(tag, "evicted")
    n = C.f("pages_needed_extend", start, end, P)
    g += [0 <= z, z <= t["E"], t["A"] + z >= n * P]
    t["E"] = t["E"] - z
    t["A"] = t["A"] + z - n * P
    return {"evicted": z}


def _lock_move(s, t, g, tag, lock=True, unlock=True):
    """Some amount moves E -> Pt (inc_lock_ref) and/or Pt -> E (dec_lock_ref)."""
    x, y = _ints(tag, "unlocked", "locked")
    if not unlock:
        g.append(x == 0)
    if not lock:
        g.append(y == 0)
    g += [0 <= x, x <= t["Pt"]]
    t["Pt"], t["E"] = t["Pt"] - x, t["E"] + x
    g += [0 <= y, y <= t["E"]]
    t["E"], t["Pt"] = t["E"] - y, t["Pt"] + y
    return {"unlocked": x, "locked": y}


def op_submit(s, C, tag):
    t = dict(s)
    strm = z3.Bool(f"{tag}.streaming")
    g = [s["rq"] == FREE]
    t.update(rq=z3.IntVal(QUEUED), row=z3.BoolVal(False), bor=z3.BoolVal(False), strm=strm)
    return Step(g, t, {"streaming": strm})


def op_schedule_radix(s, C, tag):
    """Radix match (plain, first streaming turn, or a pre-aborted turn detached from its
    slot), admission, first chunk; the last chunk makes it a decoding request."""
    P = s["P"]
    t = dict(s)
    m, inp, cs = _ints(tag, "match", "input_len", "chunk_size")
    use, detach = z3.Bool(f"{tag}.chunked"), z3.Bool(f"{tag}.detach")
    g = [s["rq"] == QUEUED, z3.Not(s["row"]),
         z3.Implies(z3.And(s["strm"], s["sx"]), detach),
         inp >= 1, 0 <= m, m <= inp - 1, py_mod(m, P) == 0, cs >= P, s["FR"] >= 1]
    ch = _lock_move(s, t, g, tag, unlock=False)
    e = _chunk(C, m, inp, cs, use, P)
    ch.update(_extend(C, s, t, m, e, g, tag))
    t.update(FR=s["FR"] - 1, row=z3.BoolVal(True), bor=z3.BoolVal(False), c=e, a=e, pl=m,
             rq=z3.If(e == inp, DECODE, PREFILL), strm=z3.And(s["strm"], z3.Not(detach)))
    ch.update(match=m, input_len=inp, chunk_size=cs, chunked=use, detach=detach)
    return Step(g, t, ch)


def op_schedule_restore(s, C, tag, admit: bool):
    """Later streaming turn: restore_to_req, prefix_len = min(committed, input_len - 1),
    the assert prefix_len >= slot.protected (taken as the guard: where it fails the
    scheduler stops), _free_tail on slot and request, then admission."""
    P = s["P"]
    t = dict(s)
    inp, cs = _ints(tag, "input_len", "chunk_size")
    use = z3.Bool(f"{tag}.chunked")
    prefix = C.f("restore_prefix_len", s["sc"], inp)
    g = [s["rq"] == QUEUED, s["strm"], s["sx"], z3.Implies(s["row"], s["bor"]),
         inp >= 1, cs >= P, prefix >= s["spl"]]
    sc2, sa2 = C.f("free_tail_lengths", s["sc"], s["sa"], prefix)
    t["A"] = s["A"] + C.freed_aligned(prefix, s["sa"], P)
    t.update(sc=sc2, sa=sa2, row=z3.BoolVal(True), bor=z3.BoolVal(True), c=prefix, a=prefix, pl=s["spl"])
    ch = {"input_len": inp, "chunk_size": cs, "chunked": use}
    if admit:
        e = _chunk(C, prefix, inp, cs, use, P)
        ch.update(_extend(C, s, t, prefix, e, g, tag))
        t.update(c=e, a=e, rq=z3.If(e == inp, DECODE, PREFILL))
    return Step(g, t, ch)


def op_cache_unfinished(s, C, tag):
    """Inner radix path of cache_unfinished_req (not for a slot borrower): insert the
    page-aligned fill_ids[:committed], free the duplicates [protected, new_prefix),
    re-match, move the lock; cache_protected_len = len(keys)."""
    P = s["P"]
    t = dict(s)
    (np_,) = _ints(tag, "new_prefix")
    K = C.f("floor_align", s["c"], P)
    g = [active(s), z3.Not(s["bor"]), s["pl"] <= np_, np_ <= K, py_mod(np_, P) == 0]
    t["A"] = s["A"] + C.freed(s["pl"], np_, P)
    t["E"] = s["E"] + (K - np_)
    ch = _lock_move(s, t, g, tag)
    t["pl"] = K
    ch["new_prefix"] = np_
    return Step(g, t, ch)


def op_prefill_chunk(s, C, tag):
    P = s["P"]
    t = dict(s)
    inp, cs = _ints(tag, "input_len", "chunk_size")
    use = z3.Bool(f"{tag}.chunked")
    g = [s["rq"] == PREFILL, inp > s["c"], cs >= P]
    e = _chunk(C, s["c"], inp, cs, use, P)
    ch = _extend(C, s, t, s["c"], e, g, tag)
    t.update(c=e, a=z3.If(e > s["a"], e, s["a"]), rq=z3.If(e == inp, DECODE, PREFILL))
    ch.update(input_len=inp, chunk_size=cs, chunked=use)
    return Step(g, t, ch)


def op_decode(s, C, tag):
    P = s["P"]
    t = dict(s)
    (z,) = _ints(tag, "evicted")
    need = C.f("decode_needs_new_page", s["c"], P)
    g = [s["rq"] == DECODE, z3.Not(s["spec"]), 0 <= z, z <= s["E"],
         s["A"] + z >= z3.If(need, P, 0)]
    t["E"] = s["E"] - z
    t["A"] = s["A"] + z - z3.If(need, P, 0)
    c2 = s["c"] + 1
    t.update(c=c2, a=z3.If(s["a"] >= c2, s["a"], c2))
    return Step(g, t, {"evicted": z})


def op_spec_decode(s, C, tag):
    P = s["P"]
    t = dict(s)
    d, acc = _ints(tag, "drafts", "accepted")
    need = s["c"] + 2 * (d + 1)
    g = [s["rq"] == DECODE, s["spec"], d >= 1, 0 <= acc, acc <= d]
    t2 = dict(t)
    ch = _extend(C, s, t2, s["a"], need, g2 := [], tag)
    grow = need > s["a"]
    g.append(z3.Implies(grow, z3.And(*g2)))
    t["A"] = z3.If(grow, t2["A"], s["A"])
    t["E"] = z3.If(grow, t2["E"], s["E"])
    t.update(a=z3.If(grow, need, s["a"]), c=s["c"] + acc + 1)
    ch.update(drafts=d, accepted=acc)
    return Step(g, t, ch)


def op_lookahead(s, C, tag):
    """Overlap / spec verify in flight at finish and retract: the last token's KV."""
    P = s["P"]
    t = dict(s)
    (z,) = _ints(tag, "evicted")
    ok = z3.Bool(f"{tag}.allocated")
    need = z3.And(s["c"] >= s["a"], C.f("decode_needs_new_page", s["c"], P))
    g = [s["rq"] == DECODE, 0 <= z, z <= s["E"],
         z3.Implies(z3.And(ok, need), s["A"] + z >= P)]
    prepared = z3.Or(s["c"] < s["a"], ok)
    t["E"] = s["E"] - z
    t["A"] = s["A"] + z - z3.If(z3.And(ok, need), P, 0)
    t.update(c=z3.If(prepared, s["c"] + 1, s["c"]),
             a=z3.If(z3.And(prepared, s["c"] >= s["a"]), s["c"] + 1, s["a"]))
    return Step(g, t, {"evicted": z, "allocated": ok})


def _release_plain(s, C, t, g, tag, insert: bool):
    """cache_finished_req (+ overalloc free + row free) of a non-borrowing request."""
    P = s["P"]
    K = C.f("floor_align", s["c"], P)
    ch = {}
    if insert:
        (np_,) = _ints(tag, "new_prefix")
        g += [s["pl"] <= np_, np_ <= K, py_mod(np_, P) == 0]
        t["A"] = t["A"] + C.freed(s["pl"], np_, P)
        t["E"] = t["E"] + (K - np_)
        ch["new_prefix"] = np_
    else:
        t["A"] = t["A"] + C.freed(s["pl"], K, P)
    t["A"] = t["A"] + C.freed(K, s["c"], P)                                   # unaligned tail
    t["A"] = t["A"] + C.freed(C.f("ceil_align", s["c"], P), s["a"], P)         # overalloc
    ch.update(_lock_move(s, t, g, tag, lock=False))
    t["FR"] = t["FR"] + 1
    t.update(row=z3.BoolVal(False), bor=z3.BoolVal(False))
    return ch


def _reset(t, rq):
    t.update(rq=z3.IntVal(rq), c=z3.IntVal(0), a=z3.IntVal(0), pl=z3.IntVal(0),
             row=z3.BoolVal(False), bor=z3.BoolVal(False))


def op_release_plain(s, C, tag, kind: str):
    """finish / abort_running / retract of a plain (or detached, or
    first-turn-without-slot in the borrow era) request."""
    t = dict(s)
    g = [active(s) if kind == "abort" else s["rq"] == DECODE, z3.Not(s["bor"])]
    if kind != "abort":
        g.append(z3.Not(s["strm"]))      # an attached streaming turn saves into its slot
    ch = _release_plain(s, C, t, g, tag, insert=(kind != "retract"))
    _reset(t, QUEUED if kind == "retract" else FREE)
    return Step(g, t, ch)


def op_save_streaming(s, C, tag, retract: bool):
    """release_kv_cache of an attached streaming turn (finish, or retract with fixed
    H4): _trim_overshoot(target), save_from_req (first turn copies protected and the
    lock; later turns keep the slot's), slot.committed = min(target, slot.allocated).
    ASSUMPTION: target = len(origin) + finished_len >= cache_protected_len (the first
    turn protects a page-aligned prefix of its prompt; origin only grows)."""
    P = s["P"]
    t = dict(s)
    (tg,) = _ints(tag, "target")
    g = [s["rq"] == DECODE, s["strm"], z3.Or(s["bor"], z3.Not(s["sx"])), tg >= s["pl"]]
    c2, a2 = C.f("trim_overshoot_lengths", s["c"], s["a"], tg)
    t["A"] = s["A"] + C.freed_aligned(tg, s["a"], P)
    t.update(sx=z3.BoolVal(True), sa=a2, sc=z3.If(tg <= a2, tg, a2),
             spl=z3.If(s["sx"], s["spl"], s["pl"]))
    _reset(t, QUEUED if retract else FREE)
    return Step(g, t, {"target": tg})


def _release_session(s, C, t, g, tag, alloc):
    P = s["P"]
    ch = _lock_move(s, t, g, tag, lock=False)
    t["A"] = t["A"] + C.freed(s["spl"], alloc, P)
    t["FR"] = t["FR"] + 1
    t["sx"] = z3.BoolVal(False)
    return ch


def op_abort_streaming_wrapper(s, C, tag):
    """Wrapper era mid-abort of an attached turn: ephemeral slot if none, slot.allocated
    = max(slot, req), release_session (frees [protected, allocated), returns the row)."""
    t = dict(s)
    g = [active(s), s["strm"], z3.Or(s["bor"], z3.Not(s["sx"]))]
    sx = s["sx"]
    s2 = dict(s)
    s2["spl"] = z3.If(sx, s["spl"], s["pl"])
    s2["sa"] = z3.If(sx, s["sa"], s["a"])
    alloc = z3.If(s2["sa"] >= s["a"], s2["sa"], s["a"])
    ch = _release_session(s2, C, t, g, tag, alloc)
    # an ephemeral slot takes over the request's row: the row is released once
    t["FR"] = t["FR"]
    _reset(t, FREE)
    t["sx"] = z3.BoolVal(False)
    return Step(g, t, ch)


def op_abort_streaming_borrow(s, C, tag):
    """Borrow era mid-abort of a borrowing turn: the slot's lock is dropped, the slot
    removed without freeing, the request released like a plain request."""
    t = dict(s)
    g = [active(s), s["bor"]]
    ch = _lock_move(s, t, g, tag + ".slot", lock=False)
    t["sx"] = z3.BoolVal(False)
    s2 = dict(s)
    s2["E"], s2["Pt"] = t["E"], t["Pt"]
    ch.update(_release_plain(s2, C, t, g, tag, insert=True))
    _reset(t, FREE)
    return Step(g, t, ch)


def op_abort_queued(s, C, tag):
    """A queued request leaves; a retracted streaming turn drops its parked slot."""
    t = dict(s)
    rel = z3.Bool(f"{tag}.retracted")
    g = [s["rq"] == QUEUED, z3.Implies(rel, z3.And(s["sx"], s["strm"]))]
    t2 = dict(t)
    ch = _release_session(s, C, t2, g2 := [], tag, s["sa"])
    g.append(z3.Implies(rel, z3.And(*g2)))
    for k in ("A", "E", "Pt", "FR", "sx"):
        t[k] = z3.If(rel, t2[k], s[k])
    _reset(t, FREE)
    ch["retracted"] = rel
    return Step(g, t, ch)


def op_close_session(s, C, tag):
    """release_session when no turn of the session is queued or running."""
    t = dict(s)
    g = [s["sx"], z3.Not(z3.And(s["rq"] >= QUEUED, s["strm"]))]
    ch = _release_session(s, C, t, g, tag, s["sa"])
    return Step(g, t, ch)


def op_evict(s, C, tag):
    t = dict(s)
    (z,) = _ints(tag, "num_tokens")
    g = [0 <= z, z <= s["E"]]
    t["E"], t["A"] = s["E"] - z, s["A"] + z
    return Step(g, t, {"num_tokens": z})


OPS: dict[str, Callable] = {
    "submit_turn / submit_request": op_submit,
    "schedule (radix match, admitted)": op_schedule_radix,
    "schedule (slot restore + _free_tail, rejected)": lambda s, C, t: op_schedule_restore(s, C, t, False),
    "schedule (slot restore + _free_tail, admitted)": lambda s, C, t: op_schedule_restore(s, C, t, True),
    "cache_unfinished_req (inner radix)": op_cache_unfinished,
    "prefill_chunk": op_prefill_chunk,
    "decode": op_decode,
    "spec_decode": op_spec_decode,
    "overlap lookahead (finish/retract)": op_lookahead,
    "finish (plain: cache_finished_req)": lambda s, C, t: op_release_plain(s, C, t, "finish"),
    "retract (plain)": lambda s, C, t: op_release_plain(s, C, t, "retract"),
    "abort_running (plain / borrow era first turn)": lambda s, C, t: op_release_plain(s, C, t, "abort"),
    "finish (streaming: _trim_overshoot + save_from_req)": lambda s, C, t: op_save_streaming(s, C, t, False),
    "retract (streaming, fixed H4)": lambda s, C, t: op_save_streaming(s, C, t, True),
    "abort_running (streaming, wrapper era)": op_abort_streaming_wrapper,
    "abort_running (streaming borrower, borrow era)": op_abort_streaming_borrow,
    "abort_queued": op_abort_queued,
    "close_session (release_session)": op_close_session,
    "evict": op_evict,
}


def inductive_step(op_name: str, module: Module = REAL, drop_aux: str | None = None):
    """(hyps, goal) of Inv(s) and guard and step => Inv(s')."""
    C = Ctx(module)
    s = fresh_state("")
    st = OPS[op_name](s, C, op_name.split(" ")[0])
    post = st.post
    invs = lambda x: {**targets(x, C), **{k: v for k, v in aux(x).items() if k != drop_aux}}
    hyps = frame(s) + list(invs(s).values()) + st.guard
    goal = z3.And(*[z3.And(v) for v in invs(post).values()])
    return hyps, goal, s, st


def describe_cti(op_name: str, model: dict, s: dict, st: Step) -> str:
    pre = {k: model.get(str(v)) for k, v in s.items() if str(v) in model}
    choices = {k: model.get(str(v)) for k, v in st.choices.items() if str(v) in model}
    rq = {0: "none", 1: "queued", 2: "prefill", 3: "decode"}.get(pre.get("rq"), pre.get("rq"))
    return (f"counterexample to induction: op {op_name} with {choices} from state "
            f"request[{rq}] committed={pre.get('c')} allocated={pre.get('a')} "
            f"protected={pre.get('pl')} row={pre.get('row')} borrows={pre.get('bor')} "
            f"streaming={pre.get('strm')}; slot exists={pre.get('sx')} committed={pre.get('sc')} "
            f"allocated={pre.get('sa')} protected={pre.get('spl')}; P={pre.get('P')} "
            f"available={pre.get('A')} evictable={pre.get('E')} protected_size={pre.get('Pt')} "
            f"rest session_held={pre.get('Sr')} rest uncached={pre.get('Ur')} total={pre.get('T')} "
            f"free_rows={pre.get('FR')} spec={pre.get('spec')}")


def cti_to_ops(op_name: str, model: dict):
    """A trace of spec/ops.py operations reaching a counterexample, where one can be
    built. The induction proves every operation here, so no counterexample is left to
    replay; for the controls (a dropped auxiliary invariant, a mutated spec function)
    the counterexample is a state the real spec cannot reach or a spec that does not
    exist, so there is no trace either: returns None."""
    return None


PAGE_SIZES = (1, 2, 3, 4, 5, 8, 16)
"""The induction is checked for each of these page sizes (every other quantity, the
counters and all lengths, unbounded). With P symbolic the identity step is nonlinear
and z3 does not finish within its resource limit; the page arithmetic the steps use is proved
for symbolic P in proofs/lemmas.py."""


def prove_op(op_name: str, module: Module = REAL, drop_aux: str | None = None,
             page_sizes=PAGE_SIZES, control: bool = False):
    """The induction step of one operation, for each page size; a negative `control`
    (a mutant module or a dropped auxiliary invariant) gets the control retry."""
    with positive_divisors() as pd:
        hyps, goal, s, st = inductive_step(op_name, module, drop_aux)
    goal = z3.And(goal, pd.obligation())
    solve = check_control if control else check
    for P in page_sizes:
        status, model = solve(hyps + [s["P"] == P], goal, split=False,
                              logic="QF_LIA")  # P concrete: linear
        if status != "proved":
            detail = describe_cti(op_name, model, s, st) if model else f"P={P}: {status}"
            return status, model, detail
    return "proved", None, f"P in {list(page_sizes)}"


# negative controls: (label, op, module, dropped aux)
CONTROLS = [
    ("aux X1 dropped (protected page-aligned)", "cache_unfinished_req (inner radix)", REAL,
     "X1 protected page-aligned (I8)"),
    ("aux X3 dropped (borrowed slot lags its borrower)", "abort_running (streaming, wrapper era)", REAL,
     "X3 borrowed slot lags its borrower"),
    ("aux X2 dropped (borrower coherence)", "finish (streaming: _trim_overshoot + save_from_req)", REAL,
     "X2 borrower coherence"),
    ("aux X4 dropped (queued rows)", "abort_queued", REAL,
     "X4 rows of queued/finished requests"),
    ("aux X5 dropped (no overallocation without spec)", "decode", REAL,
     "X5 no overallocation without spec (I7)"),
    ("aux X6 dropped (prefill has no overallocation)", "prefill_chunk", REAL,
     "X6 prefill has no overallocation"),
    ("overalloc free from floor_align(committed)", "finish (plain: cache_finished_req)",
     mutate("ceil_align -> floor", ceil_align=lambda x, p: (x // p) * p), None),
    ("_trim_overshoot frees from target (no ceil_align)", "finish (streaming: _trim_overshoot + save_from_req)",
     mutate("free start unaligned", free_kv_aligned_start=lambda target, p: target), None),
    ("_free_tail keeps slot allocated", "schedule (slot restore + _free_tail, admitted)",
     mutate("free_tail no clamp", free_tail_lengths=lambda c, a, pl: (min(c, pl), a)), None),
    ("extend counts floor(prefix/P)", "schedule (slot restore + _free_tail, admitted)",
     mutate("floor prefix", pages_needed_extend=lambda prefix, seq, p: ceil_div(seq, p) - prefix // p), None),  # noqa: F821
    ("decode: (pos + 1) % P == 1", "decode",
     mutate("decode upstream formula", decode_needs_new_page=lambda pos, p: (pos + 1) % p == 1), None),
]


def units() -> list[tuple[str, Callable[[], list[Result]]]]:
    """Every induction step and control as (name, run): what proofs/cache.py caches."""
    out = []
    for name in OPS:
        out.append((f"induction: {name}", lambda name=name: [timed(
            f"induction: {name}", "induction", "proved", lambda: prove_op(name))]))
    for label, op, mod, drop in CONTROLS:
        n = f"induction: {op} / control: {label}"
        out.append((n, lambda n=n, op=op, mod=mod, drop=drop: [timed(
            n, "control", "refuted", lambda: prove_op(op, mod, drop, control=True))]))
    return out


def run_induction() -> list[Result]:
    return [r for _, run in units() for r in run()]
