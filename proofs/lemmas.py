"""Page-arithmetic lemmas (z3, unbounded integers, symbolic page size P >= 1).

Each lemma is a function `build(M) -> (hyps, goal)` where M is a copy of spec/pages.py
(`kvcheck.proofs.symexec.Module`): the terms are obtained by running the real spec functions
on z3 terms. A lemma is proved when `hyps and not goal` is unsat. Every lemma has at
least one negative control: the same lemma over a mutated module (floor for ceil, a
missing clamp, an off-by-one) that z3 must refute; a control that is not refuted means
the lemma is too weak to notice that mutation.

Free variables that appear only in the goal (page index `k`, position `i`) are
universally quantified by the unsat check.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import z3

from kvcheck.proofs.core import Result, check, check_control, fmt_model, timed
from kvcheck.proofs.symexec import (Module, REAL, S, SymRange, is_mult, mutate, positive_divisors,
                                   py_floordiv, py_mod, zmax, zmin)


Ints = z3.Ints


# ---------------------------------------------------------------------------
# lemmas
# ---------------------------------------------------------------------------

def ceil_align_lemma(M):
    x, p, m = Ints("x P m")
    c = S(M, "ceil_align", x, p)
    cc = S(M, "ceil_align", c, p)
    goal = z3.And(c >= x, c - x < p, is_mult(c, p), cc == c,
                  # the smallest multiple of P that is >= x
                  z3.Implies(z3.And(is_mult(m, p), m >= x), m >= c),
                  S(M, "ceil_div", x, p) * p == c)
    return [p >= 1], goal


def floor_align_lemma(M):
    x, p, m = Ints("x P m")
    f = S(M, "floor_align", x, p)
    ff = S(M, "floor_align", f, p)
    goal = z3.And(f <= x, x - f < p, is_mult(f, p), ff == f,
                  z3.Implies(z3.And(is_mult(m, p), m <= x), m <= f),
                  # ceil and floor agree exactly on multiples, else differ by P
                  S(M, "ceil_align", x, p) - f == z3.If(is_mult(x, p), 0, p))
    return [p >= 1], goal


def row_pages_lemma(M):
    """row_pages(s, e) is exactly the set of pages holding some position of [s, e)."""
    s, e, p, k = Ints("start end P k")
    R = S(M, "row_pages", s, e, p)
    touched = z3.And(s < e, k * p < e, (k + 1) * p > s)
    goal = z3.And(R.contains(k) == touched,
                  (R.length == 0) == (e <= s))
    return [p >= 1, s >= 0], goal


def free_kv_aligned_lemma(M):
    """_free_kv_aligned(row, target, end): freed positions start at ceil_align(target);
    no freed page holds a position below target; every page wholly inside
    [ceil_align(target), end) is freed; no page at or past end is freed; nothing is
    freed when end <= target."""
    t, e, p, k = Ints("target end P k")
    st = S(M, "free_kv_aligned_start", t, p)
    R = S(M, "free_kv_aligned_pages", t, e, p)
    ca = S(REAL, "ceil_align", t, p)          # the reference, never mutated
    goal = z3.And(
        st == ca,
        z3.Implies(R.contains(k), k * p >= t),
        z3.Implies(z3.And(k * p >= ca, (k + 1) * p <= e), R.contains(k)),
        z3.Implies(R.contains(k), k * p < e),
        z3.Implies(e <= t, R.length == 0),
        z3.Implies(R.length > 0, R.start * p == ca),
    )
    return [p >= 1, t >= 0], goal


def free_segments_lemma(M):
    """free_segments on three disjoint ascending non-empty segments of one row (the
    boundary-page trim of `segment_trim`): every page touched by some segment is emitted
    by exactly one segment, and no other page is emitted."""
    p, k = Ints("P k")
    s = Ints("s1 s2 s3")
    n = Ints("n1 n2 n3")
    hyps = [p >= 1, s[0] >= 0] + [ni >= 1 for ni in n] + \
           [s[i + 1] >= s[i] + n[i] for i in range(2)]
    emitted = []
    prev_end = None
    for i in range(3):
        st, nn = s[i], n[i]
        if prev_end is not None:
            st, nn = S(M, "segment_trim", prev_end, s[i], n[i], p)
        R = S(M, "row_pages", st, st + zmax(nn, 0), p)
        emitted.append(z3.If(R.contains(k), 1, 0))
        prev_end = s[i] + n[i]
    touched = z3.Or(*[S(REAL, "row_pages", s[i], s[i] + n[i], p).contains(k) for i in range(3)])
    goal = (sum(emitted) == z3.If(touched, 1, 0))
    return hyps, goal


def segment_trim_step_lemma(M):
    """The inductive step behind free_segments for any number of segments: after the
    trim a segment emits only pages strictly after the previous segment's last page
    (so after every earlier page), and drops only that shared page."""
    p, k, pe, st, n = Ints("P k prev_end start n")
    ns, nn = S(M, "segment_trim", pe, st, n, p)
    R = S(M, "row_pages", ns, ns + zmax(nn, 0), p)
    orig = S(REAL, "row_pages", st, st + n, p)
    last_prev = py_floordiv(pe - 1, p)
    goal = z3.And(z3.Implies(R.contains(k), k > last_prev),
                  z3.Implies(z3.And(orig.contains(k), z3.Not(R.contains(k))), k == last_prev),
                  z3.Implies(R.contains(k), orig.contains(k)))
    return [p >= 1, pe >= 1, st >= pe, n >= 1], goal


def alloc_extend_lemma(M):
    """alloc_extend(prefix -> seq) consumes ceil(seq/P) - ceil(prefix/P) new pages:
    exactly the pages of [prefix, seq) that [0, prefix) did not touch, so positions
    [prefix, min(seq, ceil_align(prefix))) reuse the partial last page; chunking is
    additive."""
    pre, mid, seq, p = Ints("prefix mid seq P")
    n = S(M, "pages_needed_extend", pre, seq, p)
    ca = S(REAL, "ceil_align", pre, p)
    new_pages = S(REAL, "row_pages", ca, seq, p)
    goal = z3.And(
        n >= 0,
        n == new_pages.length,
        z3.Implies(seq <= ca, n == 0),
        z3.Implies(seq > ca, z3.And(n * p >= seq - ca, n * p < seq - ca + p)),
        S(M, "pages_needed_extend", pre, mid, p) + S(M, "pages_needed_extend", mid, seq, p) == n,
    )
    return [p >= 1, 0 <= pre, pre <= mid, mid <= seq], goal


def alloc_decode_lemma(M):
    """alloc_decode writing position pos takes a new page iff the new length pos + 1 is
    1 mod P (P > 1), i.e. iff a one-token extend needs a page; for P = 1 always."""
    pos, p = Ints("pos P")
    d = S(M, "decode_needs_new_page", pos, p)
    d = d if z3.is_bool(d) else (d != 0)
    goal = z3.And(d == (S(REAL, "pages_needed_extend", pos, pos + 1, p) == 1),
                  z3.Implies(p > 1, d == (py_mod(pos + 1, p) == 1)),
                  z3.Implies(p == 1, d))
    return [p >= 1, pos >= 0], goal


def owned_tokens_lemma(M):
    """owned_tokens(protected, allocated) = P x the pages an owner answers for."""
    pr, a, p = Ints("protected allocated P")
    o = S(M, "owned_tokens", pr, a, p)
    R = S(REAL, "row_pages", pr, a, p)
    goal = z3.And(o >= 0, o == p * R.length)
    return [p >= 1, 0 <= pr, pr <= a, is_mult(pr, p)], goal


def trim_overshoot_lemma(M):
    """_trim_overshoot (DOMAIN 2.8): after capping at target, committed <= allocated <=
    target; the freed pages hold no position below target (so none below committed or
    protected); every freed page was owned; owned = kept + freed, in tokens (no leak, no
    double count). Needs protected <= target (target = len(origin) + finished_len >=
    len(origin) >= protected) and protected page-aligned."""
    c, a, t, pr, p, k = Ints("committed allocated target protected P k")
    c2, a2 = S(M, "trim_overshoot_lengths", c, a, t)
    F = S(M, "free_kv_aligned_pages", t, a, p)
    own = lambda x: S(REAL, "owned_tokens", pr, x, p)
    ca2 = S(REAL, "ceil_align", a2, p)
    goal = z3.And(
        c2 <= a2, a2 <= t, c2 <= c, a2 <= a, c2 == zmin(c, t), a2 == zmin(a, t),
        z3.Implies(F.contains(k), z3.And(k * p >= t, k * p >= c2, k * p >= pr, k * p >= ca2)),
        z3.Implies(F.contains(k), (k + 1) * p <= S(REAL, "ceil_align", a, p)),
        own(a) == own(a2) + p * F.length,
    )
    hyps = [p >= 1, 0 <= pr, pr <= c, c <= a, is_mult(pr, p), pr <= t]
    return hyps, goal


def free_tail_lemma(M):
    """_free_tail on restore (DOMAIN 2.7): slot and request become (prefix, prefix);
    freed pages hold no position below prefix_len; owned = kept + freed; a second restore
    (retry after a budget rejection) frees nothing (I25)."""
    c, a, pl, pr, p, k = Ints("committed allocated prefix_len protected P k")
    c2, a2 = S(M, "free_tail_lengths", c, a, pl)
    F = S(M, "free_kv_aligned_pages", pl, a, p)
    F2 = S(M, "free_kv_aligned_pages", pl, a2, p)
    own = lambda x: S(REAL, "owned_tokens", pr, x, p)
    goal = z3.And(c2 == pl, a2 == pl,
                  z3.Implies(F.contains(k), k * p >= pl),
                  own(a) == own(a2) + p * F.length,
                  F2.length == 0)
    hyps = [p >= 1, 0 <= pr, pr <= pl, pl <= c, c <= a, is_mult(pr, p)]
    return hyps, goal


def retract_retry_lemma(M, require_output: bool = True):
    """Retract retry: prefix_len = min(committed', len(key)) never falls below
    cache_protected_len. committed' is the trimmed committed (_trim_overshoot at
    target = seqlen = len(origin) + len(output)); the retry has input_len = seqlen, so
    len(key) = seqlen - 1. Conditions used: protected <= committed (invariant),
    protected <= len(origin) (the first turn protects a page-aligned prefix of its
    prompt; later turns only grow origin), and len(output) >= 1 (a decoding request
    has sampled a token). Neither page alignment nor the overlap lag is needed:
    committed in {seqlen - 1, seqlen} is allowed, and any committed >= protected works."""
    c, a, pr, origin, out, p = Ints("committed allocated protected origin_len output_len P")
    seqlen = origin + out
    c2, _a2 = S(M, "trim_overshoot_lengths", c, a, seqlen)
    prefix = S(M, "restore_prefix_len", c2, seqlen)
    hyps = [p >= 1, 0 <= pr, pr <= c, c <= a, c <= seqlen, pr <= origin, is_mult(pr, p),
            c >= seqlen - 1]
    if require_output:
        hyps.append(out >= 1)
    else:
        hyps.append(out >= 0)
    goal = z3.And(prefix >= pr, prefix == seqlen - 1)
    return hyps, goal


def chunk_end_lemma(M):
    """A chunk makes progress, stays within the input, and (unless it is the last) ends
    a whole number of pages after its start."""
    pre, inp, cs, p = Ints("prefix input_len chunk_size P")
    e = S(M, "chunk_end", pre, inp, cs, p)
    e_none = S(M, "chunk_end", pre, inp, None, p)
    goal = z3.And(pre < e, e <= inp, z3.Or(e == inp, is_mult(e - pre, p)), e_none == inp,
                  z3.Or(e == inp, e - pre > cs - p))
    return [p >= 1, 0 <= pre, pre < inp, cs >= p], goal


def reserve_chunk_end_lemma(M):
    """Upstream's extend end: within [prefix, input]; the whole input exactly when its
    page-ceiled extend fits the chunk budget; else a page boundary of the sequence no
    more than the budget past the prefix (nothing left: the prefix itself)."""
    pre, inp, cs, p = Ints("prefix input_len chunk_size P")
    e = S(M, "reserve_chunk_end", pre, inp, cs, p)
    e_none = S(M, "reserve_chunk_end", pre, inp, None, p)
    fits = S(M, "ceil_align", inp - pre, p) <= cs
    goal = z3.And(pre <= e, e <= inp, (e == inp) == fits, e_none == inp,
                  z3.Or(e == inp, e == pre, z3.And(is_mult(e, p), e - pre <= cs,
                                                   e - pre > cs - 2 * p)))
    return [p >= 1, 0 <= pre, pre < inp, cs >= 0], goal


def finished_tail_lemma(M):
    """cache_finished_req + the overalloc free (I18): the unaligned tail free
    [floor_align(committed), committed) and the overalloc free
    [ceil_align(committed), allocated) never share a page, and together with the
    inserted keys they cover the owner's pages exactly once."""
    c, a, p, k = Ints("committed allocated P k")
    K = S(M, "floor_align", c, p)
    tail = S(REAL, "row_pages", K, c, p)
    over = S(REAL, "row_pages", S(M, "ceil_align", c, p), a, p)
    owned = S(REAL, "row_pages", K, zmax(S(REAL, "ceil_align", a, p), K), p)
    goal = z3.And(z3.Not(z3.And(tail.contains(k), over.contains(k))),
                  z3.Implies(owned.contains(k), z3.Or(tail.contains(k), over.contains(k))),
                  z3.Implies(z3.Or(tail.contains(k), over.contains(k)), owned.contains(k)))
    return [p >= 1, 0 <= c, c <= a], goal


# ---------------------------------------------------------------------------
# mutants (negative controls)
# ---------------------------------------------------------------------------

def _m_ceil_div_floor(x, p):
    return x // p


def _m_floor_align_ceil(x, p):
    return -(-x // p) * p


def _m_row_pages_drop_last(start, end, p):
    if end <= start:
        return range(0)
    return range(start // p, end // p)


def _m_row_pages_extra(start, end, p):
    if end <= start:
        return range(0)
    return range(start // p, (end - 1) // p + 2)


def _m_kv_start_unaligned(target, p):
    return target


def _m_kv_start_floor(target, p):
    return (target // p) * p


def _m_kv_pages_no_guard_off_by_one(target, end, p):
    if end <= target:
        return range(0)
    return row_pages(free_kv_aligned_start(target, p), end + 1, p)  # noqa: F821 (module global)


def _m_segment_no_trim(prev_end, start, n, p):
    return start, n


def _m_segment_trim_wrong_page(prev_end, start, n, p):
    if start // p == prev_end // p:
        boundary = (start // p + 1) * p
        return boundary, n - (boundary - start)
    return start, n


def _m_pages_floor_prefix(prefix, seq, p):
    return ceil_div(seq, p) - prefix // p  # noqa: F821


def _m_pages_tokens(prefix, seq, p):
    return ceil_div(seq - prefix, p)  # noqa: F821


def _m_decode_upstream_formula(pos, p):
    return (pos + 1) % p == 1


def _m_decode_off_by_one(pos, p):
    return pos % p == 1


def _m_owned_unaligned(protected, allocated, p):
    return allocated - protected


def _m_trim_no_alloc_clamp(committed, allocated, target):
    return min(committed, target), allocated


def _m_trim_no_commit_clamp(committed, allocated, target):
    return committed, min(allocated, target)


def _m_free_tail_no_alloc_clamp(committed, allocated, prefix_len):
    return min(committed, prefix_len), allocated


def _m_restore_key_off_by_one(committed, input_len):
    return min(committed, input_len) - 1


def _m_restore_no_reserve(committed, input_len):
    return min(committed, input_len)


def _m_chunk_no_page_trunc(prefix, input_len, chunk_size, p):
    if chunk_size is None:
        return input_len
    return min(input_len, prefix + chunk_size // p)


def _m_chunk_no_clamp(prefix, input_len, chunk_size, p):
    if chunk_size is None:
        return input_len
    return prefix + (chunk_size // p) * p


def _m_reserve_no_cut_back(prefix, input_len, chunk_size, p):
    if chunk_size is None or ceil_align(input_len - prefix, p) <= chunk_size:  # noqa: F821 (rebound)
        return input_len
    return prefix + chunk_size // p * p


def _m_reserve_raw_fit(prefix, input_len, chunk_size, p):
    if chunk_size is None or input_len - prefix <= chunk_size:
        return input_len
    return max(prefix, (prefix + chunk_size // p * p) // p * p)


def _m_ceil_align_floor(x, p):
    return (x // p) * p


@dataclass
class Lemma:
    name: str
    build: Callable
    controls: list  # (label, Module or callable returning (hyps, goal))


def _mut(label, **kw):
    return (label, mutate(label, **kw))


LEMMAS: list[Lemma] = [
    Lemma("ceil_align: bounds, multiple, smallest, idempotent", ceil_align_lemma,
          [_mut("ceil_div uses floor", ceil_div=_m_ceil_div_floor)]),
    Lemma("floor_align: bounds, multiple, largest, idempotent", floor_align_lemma,
          [_mut("floor_align uses ceil", floor_align=_m_floor_align_ceil)]),
    Lemma("row_pages = pages touched by [start, end)", row_pages_lemma,
          [_mut("row_pages drops the partial last page", row_pages=_m_row_pages_drop_last),
           _mut("row_pages one page too many", row_pages=_m_row_pages_extra)]),
    Lemma("_free_kv_aligned: starts at ceil_align(target), nothing below target, "
          "whole pages of [ceil_align(target), end) freed", free_kv_aligned_lemma,
          [_mut("free start = target (no ceil_align)", free_kv_aligned_start=_m_kv_start_unaligned),
           _mut("free start = floor_align(target)", free_kv_aligned_start=_m_kv_start_floor),
           _mut("free end off by one", free_kv_aligned_pages=_m_kv_pages_no_guard_off_by_one)]),
    Lemma("free_segments: each page emitted exactly once (3 segments)", free_segments_lemma,
          [_mut("no boundary trim", segment_trim=_m_segment_no_trim),
           _mut("trim tests prev_end // P (off by one)", segment_trim=_m_segment_trim_wrong_page)]),
    Lemma("free_segments step: trimmed segment emits only pages after the previous one",
          segment_trim_step_lemma,
          [_mut("no boundary trim", segment_trim=_m_segment_no_trim),
           _mut("trim tests prev_end // P (off by one)", segment_trim=_m_segment_trim_wrong_page)]),
    Lemma("alloc_extend: new pages = ceil(seq/P) - ceil(prefix/P), partial page reused",
          alloc_extend_lemma,
          [_mut("floor(prefix/P)", pages_needed_extend=_m_pages_floor_prefix),
           _mut("ceil((seq - prefix)/P)", pages_needed_extend=_m_pages_tokens)]),
    Lemma("alloc_decode: new page iff new length = 1 mod P (always for P = 1)", alloc_decode_lemma,
          [_mut("(pos + 1) % P == 1 (wrong for P = 1)", decode_needs_new_page=_m_decode_upstream_formula),
           _mut("pos % P == 1", decode_needs_new_page=_m_decode_off_by_one)]),
    Lemma("owned_tokens = P x owned pages", owned_tokens_lemma,
          [_mut("allocated not ceil_aligned", owned_tokens=_m_owned_unaligned)]),
    Lemma("_trim_overshoot postconditions (DOMAIN 2.8)", trim_overshoot_lemma,
          [_mut("allocated not clamped", trim_overshoot_lengths=_m_trim_no_alloc_clamp),
           _mut("committed not clamped", trim_overshoot_lengths=_m_trim_no_commit_clamp),
           _mut("free start = target (no ceil_align)", free_kv_aligned_start=_m_kv_start_unaligned)]),
    Lemma("_free_tail postconditions and idempotent restore (DOMAIN 2.7, I25)", free_tail_lemma,
          [_mut("slot allocated not clamped", free_tail_lengths=_m_free_tail_no_alloc_clamp),
           _mut("free start = floor_align(prefix)", free_kv_aligned_start=_m_kv_start_floor)]),
    Lemma("retract retry: prefix_len >= cache_protected_len", retract_retry_lemma,
          [_mut("key = input_len, then -1 (off by one)", restore_prefix_len=_m_restore_key_off_by_one),
           _mut("no logit reserve: min(committed, input_len)", restore_prefix_len=_m_restore_no_reserve),
           ("hypothesis dropped: len(output) >= 1", lambda: retract_retry_lemma(REAL, require_output=False))]),
    Lemma("chunk_end: progress, bounded, whole pages", chunk_end_lemma,
          [_mut("chunk not truncated to pages", chunk_end=_m_chunk_no_page_trunc),
           _mut("chunk end not clamped to input", chunk_end=_m_chunk_no_clamp)]),
    Lemma("reserve_chunk_end: the whole input iff it fits, else a page boundary within the "
          "budget", reserve_chunk_end_lemma,
          [_mut("end not cut back to a page boundary", reserve_chunk_end=_m_reserve_no_cut_back),
           _mut("raw extend against the budget (not page-ceiled)",
                reserve_chunk_end=_m_reserve_raw_fit)]),
    Lemma("finish frees: unaligned tail and overalloc never share a page (I18)", finished_tail_lemma,
          [_mut("overalloc free from floor_align(committed)", ceil_align=_m_ceil_align_floor)]),
]


from kvcheck.proofs.hybrid_lemmas import make_hybrid_lemmas  # noqa: E402

LEMMAS += make_hybrid_lemmas(Lemma)
"""Hybrid models: the SWA window arithmetic (proofs/hybrid_lemmas.py)."""


def run_lemma(lem: Lemma) -> list[Result]:
    out = []

    def prove():
        with positive_divisors() as pd:
            hyps, goal = lem.build(REAL)
        st, model = check(hyps, z3.And(goal, pd.obligation()), divisors=pd.divs)
        detail = "" if st == "proved" else f"counterexample: {fmt_model(model or {})}"
        return st, model, detail
    out.append(timed(lem.name, "lemma", "proved", prove))
    for label, ctl in lem.controls:
        def refute(ctl=ctl):
            with positive_divisors() as pd:
                hyps, goal = lem.build(ctl) if isinstance(ctl, Module) else ctl()
            goal_ = z3.And(goal, pd.obligation())
            st, model = check_control(hyps, goal_, divisors=pd.divs)
            detail = f"counterexample: {fmt_model(model)}" if model else ""
            return st, model, detail
        out.append(timed(f"{lem.name} / control: {label}", "control", "refuted", refute))
    return out


def run_lemmas() -> list[Result]:
    results = []
    for lem in LEMMAS:
        results.extend(run_lemma(lem))
    return results
