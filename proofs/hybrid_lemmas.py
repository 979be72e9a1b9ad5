"""Window arithmetic of hybrid SWA models (spec/swa_pool.py), proved with z3 for a symbolic
page size, window and cursor.

The term is the real `kvcheck.spec.swa_pool.swa_evict_target` run on z3 terms (kvcheck.proofs.symexec: it
is re-bound next to spec/pages.py's functions, so it calls the real `floor_align`); each
lemma has negative controls (mutants z3 must refute), like proofs/lemmas.py.
"""
from __future__ import annotations

import z3

from kvcheck.proofs.symexec import REAL, Module, S, is_mult, zmax
from kvcheck.spec.fields import MAX_PAGE_SIZE
from kvcheck.spec.swa_pool import swa_evict_target, swa_evict_target_borrow, swa_keep

HYB = Module({"swa_evict_target": swa_evict_target, "swa_keep": swa_keep,
              "swa_evict_target_borrow": swa_evict_target_borrow},
             name="kvcheck.spec.pages + kvcheck.spec.swa_pool's window arithmetic")


def _hyb(label: str, mutant, name: str = "swa_evict_target") -> tuple:
    return label, Module({"swa_keep": swa_keep, name: mutant}, name=label)


def _on_hyb(build):
    """run_lemma proves over kvcheck.proofs.symexec.REAL (spec/pages.py alone): prove over HYB."""
    return lambda M: build(HYB if M is REAL else M)


def swa_window_lemma(M):
    """`free_swa_out_of_window_slots`, when it moves the cursor (new > evicted): frees only
    whole pages, never a position of the last max(window, P) tokens, and the cursor stays
    within the computed KV (pre_len <= kv_committed_len): I42's first half is inductive."""
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
    ev, pre, w, p = z3.Ints("evicted pre_len window P")
    new = S(M, "swa_evict_target", ev, pre, w, p)
    t = pre - zmax(w, p)
    goal = z3.Implies(ev <= t, t - new < p)
    return [p >= 1, w >= 1, ev >= 0, ev <= pre, is_mult(ev, p)], goal


def swa_window_borrow_lemma(M):
    """Borrow era (0.5.23), when the cursor moves: it moves to a page boundary within
    pre_len, and a key that ends at page_floor(pre_len) keeps at least `window` tokens of
    live SWA behind it (why 0.5.23 keeps `ceil_align(max(window, P), P)`: with 0.5.15's
    `max(window, P)` a window that is not a multiple of P loses up to P - 1 of them).
    For each page size of Config's range, as its own linear case (a symbolic P makes the
    two floors and the ceil nonlinear, which z3 does not settle in a minute)."""
    ev, pre, w, p = z3.Ints("evicted pre_len window P")

    def case(k):
        new = S(M, "swa_evict_target_borrow", ev, pre, w, k)
        moved = new > ev
        key_end = S(M, "floor_align", pre, k)
        return z3.And(z3.Implies(moved, z3.And(is_mult(new, k), key_end - new >= w)),
                      zmax(ev, new) <= pre)
    goal = z3.And([z3.Implies(p == k, case(k)) for k in range(1, MAX_PAGE_SIZE + 1)])
    return [p >= 1, p <= MAX_PAGE_SIZE, w >= 1, ev >= 0, ev <= pre], goal


def _m_borrow_as_0515(evicted, pre_len, window, p):
    return floor_align(max(evicted, pre_len - max(window, p)), p)  # noqa: F821


def _m_borrow_window_only(evicted, pre_len, window, p):
    return floor_align(max(evicted, pre_len - window), p)  # noqa: F821


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
        Lemma("SWA window (0.5.23): a page-floored key keeps a whole window of live SWA",
              _on_hyb(swa_window_borrow_lemma),
              [_hyb("0.5.15's keep max(window, P)", _m_borrow_as_0515, "swa_evict_target_borrow"),
               _hyb("keep the window alone", _m_borrow_window_only,
                    "swa_evict_target_borrow")]),
    ]
