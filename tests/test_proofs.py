"""proofs/: the z3 encodings are the spec functions (concrete cross-check), every lemma
and induction step is proved, every negative control refuted."""
from __future__ import annotations

import itertools
import random

import pytest
import z3

import kvcheck.spec.pages as pages
from kvcheck.proofs import Result, ok, report
from kvcheck.proofs import induction as I
from kvcheck.proofs import lemmas as L
from kvcheck.proofs.symexec import REAL, SymRange, mutate, symbolic

# ---------------------------------------------------------------------------
# the symbolic terms evaluate to what the Python functions return
# ---------------------------------------------------------------------------

SIGNATURES = {
    "ceil_div": ("x", "p"),
    "ceil_align": ("x", "p"),
    "floor_align": ("x", "p"),
    "row_pages": ("start", "end", "p"),
    "free_kv_aligned_start": ("target", "p"),
    "free_kv_aligned_pages": ("target", "end", "p"),
    "pages_needed_extend": ("prefix", "seq", "p"),
    "decode_needs_new_page": ("pos", "p"),
    "owned_tokens": ("protected", "allocated", "p"),
    "trim_overshoot_lengths": ("committed", "allocated", "target"),
    "free_tail_lengths": ("committed", "allocated", "prefix_len"),
    "restore_prefix_len": ("committed", "input_len"),
    "chunk_end": ("prefix", "input_len", "chunk_size", "p"),
    "reserve_chunk_end": ("prefix", "input_len", "chunk_size", "p"),
    "segment_trim": ("prev_end", "start", "n", "p"),
}


def _eval(term, sub):
    v = z3.simplify(z3.substitute(term, *sub))
    if z3.is_bool(v):
        return z3.is_true(v)
    return v.as_long()


def _as_python(val, sub):
    if isinstance(val, tuple):
        return tuple(_as_python(v, sub) for v in val)
    if isinstance(val, SymRange):
        return list(range(_eval(val.start, sub), _eval(val.stop, sub)))
    return _eval(val, sub)


def _concrete(name, args):
    out = getattr(pages, name)(*args)
    return list(out) if isinstance(out, range) else out


def test_every_spec_function_is_covered():
    public = {n for n, f in vars(pages).items() if callable(f) and getattr(f, "__module__", "") == pages.__name__}
    assert public == set(SIGNATURES)


@pytest.mark.parametrize("name", sorted(SIGNATURES))
def test_symbolic_term_matches_python(name):
    params = SIGNATURES[name]
    syms = [z3.Int(p) for p in params]
    args = list(syms)
    chunk_none = name in ("chunk_end", "reserve_chunk_end")
    term = symbolic(name, *args)
    term_none = symbolic(name, syms[0], syms[1], None, syms[3]) if chunk_none else None
    rng = random.Random(name)
    values = list(range(-3, 13))
    cases = [tuple(rng.choice(values) for _ in params) for _ in range(300)]
    cases += list(itertools.product(range(0, 6), repeat=len(params)))[:400]
    checked = 0
    for case in cases:
        if "p" in params and case[params.index("p")] < 1:
            continue
        sub = [(s, z3.IntVal(v)) for s, v in zip(syms, case)]
        assert _as_python(term, sub) == _concrete(name, case), (name, case)
        if chunk_none:
            c2 = (case[0], case[1], None, case[3])
            assert _as_python(term_none, sub) == _concrete(name, c2), (name, c2)
        checked += 1
    assert checked > 100


def test_module_copy_and_mutant_leave_spec_untouched():
    m = mutate("x", ceil_div=lambda x, p: x // p)
    assert m.concrete("ceil_align")(5, 4) == 4          # the mutant is seen by callers
    assert pages.ceil_align(5, 4) == 8                  # the real module is unchanged
    assert REAL.concrete("ceil_align")(5, 4) == 8
    assert "range" not in vars(pages)


# ---------------------------------------------------------------------------
# lemmas and their controls
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("lem", L.LEMMAS, ids=lambda l: l.name[:40])
def test_lemma_proved_and_controls_refuted(lem):
    results = L.run_lemma(lem)
    proof, controls = results[0], results[1:]
    assert proof.status == "proved", proof.detail
    assert proof.seconds < 30
    assert controls, "every lemma has a negative control"
    for c in controls:
        assert c.status == "refuted", c.name
        assert c.model, "a refutation carries its counterexample"


# ---------------------------------------------------------------------------
# induction
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("op", list(I.OPS))
def test_induction_step(op):
    status, model, detail = I.prove_op(op)
    assert status == "proved", detail


@pytest.mark.parametrize("label,op,mod,drop", I.CONTROLS, ids=[c[0] for c in I.CONTROLS])
def test_induction_control_refuted(label, op, mod, drop):
    status, model, detail = I.prove_op(op, mod, drop, control=True)
    assert status == "refuted"
    assert detail.startswith("counterexample to induction: op ")
    assert I.cti_to_ops(op, model) is None


def test_every_aux_invariant_is_needed():
    dropped = {c[3] for c in I.CONTROLS if c[3]}
    assert dropped == set(I.AUX_DOC)


# ---------------------------------------------------------------------------
# report / exit status
# ---------------------------------------------------------------------------

def test_report_and_ok():
    good = [Result("a", "lemma", "proved", 0.1), Result("b", "control", "refuted", 0.2, "refuted")]
    assert ok(good)
    text = report(good)
    assert "proved" in text and "refuted" in text and "2/2 as expected" in text
    bad = good + [Result("c", "control", "proved", 0.1, "refuted")]
    assert not ok(bad)
    assert "NOT as expected" in report(bad)
    assert not ok([])


def test_a_control_left_unknown_runs_again_with_larger_budgets(monkeypatch):
    """Negative controls (lemmas and induction) get one retry at CONTROL_RETRY times every
    budget when z3 answers unknown; a proof never does."""
    import kvcheck.proofs.core as C
    calls = []

    def fake(hyps, goal, **kw):
        calls.append(kw)
        return ("unknown", None) if len(calls) == 1 else ("refuted", {"x": 1})
    monkeypatch.setattr(C, "check", fake)
    assert C.check_control([], None, split=False) == ("refuted", {"x": 1})
    assert len(calls) == 2
    assert calls[1]["rlimits"] == tuple(C.CONTROL_RETRY * r for r in C.RLIMIT_ATTEMPTS)
    assert calls[1]["rlimit_whole"] == C.CONTROL_RETRY * C.RLIMIT_WHOLE
    assert calls[1]["split"] is False
    calls.clear()
    monkeypatch.setattr(C, "check", lambda h, g, **kw: calls.append(kw) or ("refuted", {}))
    C.check_control([], None)
    assert len(calls) == 1, "a control answered at once is not run again"
