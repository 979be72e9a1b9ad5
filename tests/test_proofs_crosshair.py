"""Spec-only property tests run under Hypothesis' `crosshair` backend (hypothesis-crosshair):
the inputs come from CrossHair's symbolic execution instead of random draws."""
from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvcheck.spec.pages import (ceil_align, floor_align, free_kv_aligned_pages, owned_tokens,
                        pages_needed_extend, row_pages)

settings.register_profile(
    "crosshair",
    backend="crosshair",
    max_examples=40,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)
CROSSHAIR = settings.get_profile("crosshair")

sizes = st.integers(min_value=1, max_value=64)
lengths = st.integers(min_value=0, max_value=10_000)


@CROSSHAIR
@given(x=lengths, p=sizes)
def test_align_brackets(x, p):
    lo, hi = floor_align(x, p), ceil_align(x, p)
    assert lo <= x <= hi
    assert hi - lo in (0, p)
    assert lo % p == 0 and hi % p == 0


@CROSSHAIR
@given(target=lengths, end=lengths, p=sizes)
def test_free_kv_aligned_never_below_target(target, end, p):
    r = free_kv_aligned_pages(target, end, p)
    if len(r):
        assert r.start * p == ceil_align(target, p)
        assert r.start * p >= target
        assert (r.stop - 1) * p < end
    else:
        assert end <= ceil_align(target, p)


@CROSSHAIR
@given(prefix=lengths, extra=lengths, p=sizes)
def test_extend_pages_and_owned(prefix, extra, p):
    seq = prefix + extra
    n = pages_needed_extend(prefix, seq, p)
    assert n == len(row_pages(ceil_align(prefix, p), seq, p))
    prot = floor_align(prefix, p)
    assert owned_tokens(prot, seq, p) == p * len(row_pages(prot, seq, p))


def test_crosshair_backend_is_symbolic():
    """Negative control: a needle random testing would not hit in 40 draws; the
    crosshair backend solves for it, so the profile really runs symbolically."""
    import pytest

    @CROSSHAIR
    @given(x=st.integers(min_value=0, max_value=10**6), p=sizes)
    def needle(x, p):
        assert ceil_align(x, p) != 777_777

    with pytest.raises(AssertionError):
        needle()
