"""Window arithmetic of hybrid SWA models (spec/hybrid.py), proved with z3 for a symbolic
page size, window and cursor.

The term is the real `spec.hybrid.swa_evict_target` run on z3 terms (proofs.symexec: it
is re-bound next to spec/pages.py's functions, so it calls the real `floor_align`); each
lemma has negative controls (mutants z3 must refute), like proofs/lemmas.py.
"""
from __future__ import annotations

import z3

from proofs.symexec import REAL, Module
from spec.hybrid import swa_evict_target

HYB = Module({"swa_evict_target": swa_evict_target}, name="spec.pages + swa_evict_target")


def _hyb(label: str, mutant) -> tuple:
    return label, Module({"swa_evict_target": mutant}, name=label)


def _on_hyb(build):
    """run_lemma proves over proofs.symexec.REAL (spec/pages.py alone): prove over HYB."""
    return lambda M: build(HYB if M is REAL else M)


def swa_window_lemma(M):
    """`free_swa_out_of_window_slots`, when it moves the cursor (new > evicted): frees only
    whole pages, never a position of the last max(window, P) tokens, and the cursor stays
    within the computed KV (pre_len <= kv_committed_len): I42's first half is inductive."""
    from proofs.lemmas import S, is_mult, zmax
    ev, pre, w, p, i = z3.Ints("evicted pre_len window P i")
    new = S(M, "swa_evict_target", ev, pre, w, p)
    moved = new > ev
    goal = z3.And(
        z3.Implies(moved, z3.And(is_mult(new, p), new <= pre - zmax(w, p))),
        # a freed position i (evicted <= i < new) lies outside the window
        z3.Implies(z3.And(moved, ev <= i, i < new), i < pre - zmax(w, p)),
        # the cursor after the step (max(evicted, new)) never passes pre_len
        zmax(ev, new) <= pre)
    return [p >= 1, w >= 1, ev >= 0, ev <= pre], goal


def swa_window_progress_lemma(M):
    """With a page-aligned cursor below it, the frontier reaches the last whole page out of
    the window: every page wholly before pre_len - max(window, P) is freed."""
    from proofs.lemmas import S, is_mult, zmax
    ev, pre, w, p = z3.Ints("evicted pre_len window P")
    new = S(M, "swa_evict_target", ev, pre, w, p)
    t = pre - zmax(w, p)
    goal = z3.Implies(ev <= t, t - new < p)
    return [p >= 1, w >= 1, ev >= 0, ev <= pre, is_mult(ev, p)], goal


def _m_no_page_floor(evicted, pre_len, window, p):
    return max(evicted, pre_len - max(window, p))


def _m_window_only(evicted, pre_len, window, p):
    new = max(evicted, pre_len - window)
    return floor_align(new, p) if p > 1 else new  # noqa: F821 (module global)


def _m_ceil(evicted, pre_len, window, p):
    new = max(evicted, pre_len - max(window, p))
    return ceil_align(new, p)  # noqa: F821


def _m_off_by_one(evicted, pre_len, window, p):
    new = max(evicted, pre_len + 1 - max(window, p))
    return floor_align(new, p) if p > 1 else new  # noqa: F821


def _m_no_progress(evicted, pre_len, window, p):
    new = max(evicted, pre_len - max(window, p) - p)
    return floor_align(new, p) if p > 1 else new  # noqa: F821


def make_hybrid_lemmas(Lemma) -> list:
    """The lemmas, as proofs/lemmas.py's `Lemma`s (it appends them to LEMMAS)."""
    return [
        Lemma("SWA window: whole pages out of the window freed, cursor <= pre_len (I42)",
              _on_hyb(swa_window_lemma),
              [_hyb("no page floor", _m_no_page_floor),
               _hyb("window without the page margin", _m_window_only),
               _hyb("ceil instead of floor", _m_ceil),
               _hyb("threshold off by one", _m_off_by_one)]),
        Lemma("SWA window: the frontier reaches the last whole page out of the window",
              _on_hyb(swa_window_progress_lemma),
              [_hyb("one page short", _m_no_progress)]),
    ]
