"""sglang 0.5.14, the release before the seed's (docs/upstream-findings.md, "Older releases"):
driven like 0.5.15 but for SWA, whose tree differs there and is refused before any work;
its corpus traces are copies of 0.5.15's; the findings it shares are recorded. The last
test drives the release itself when .venv-sglang-0.5.14 is built (`make sglang-env
SGLANG_VERSIONS=0.5.14`)."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from adapters.sglang.findings import RELEASES
from adapters.sglang.hybrid import release_tuple
from kvcheck import explore as E
from kvcheck.backends import config_kw, release_era, release_refusal
from kvcheck.check import differential_preset
from spec.config import Config

ROOT = Path(__file__).resolve().parents[1]
UPSTREAM = ROOT / "stateful_tests" / "upstream"
SWA = Config(swa_window=2, swa_num_pages=6)


def test_release_numbers():
    assert release_tuple("0.5.14") == release_tuple("sglang-0.5.14") == (0, 5, 14)
    assert release_tuple("0.5.13.post1") == (0, 5, 13)
    assert release_tuple(None) == release_tuple("sglang") == (999,)
    assert [release_era(f"sglang:{v}") for v in ("0.5.14", "0.5.21", "0.5.22")] == \
        ["wrapper", "wrapper", "borrow"]
    assert release_era("sglang") is None


def test_swa_is_refused_before_0_5_15_only():
    why = release_refusal(SWA, "sglang:0.5.14")
    assert why and "0.5.14's SWARadixCache" in why and "Older releases" in why
    assert release_refusal(SWA, "sglang:0.5.15") is None
    assert release_refusal(Config(), "sglang:0.5.14") is None
    assert "swa" not in config_kw("sglang:0.5.14")["hybrid_kinds"]
    assert "swa" in config_kw("sglang:0.5.15")["hybrid_kinds"]


def test_preset_is_0_5_15s_without_swa():
    assert differential_preset("sglang:0.5.14") == "check-sglang-0.5.14"
    names = [sc.name for sc in E.PRESETS["check-sglang-0.5.14"]]
    assert names == [sc.name for sc in E.PRESETS["check-sglang-0.5.15"] if sc.name != "sglang-swa"]
    assert all(release_refusal(sc.cfg, "sglang:0.5.14") is None
               for sc in E.PRESETS["check-sglang-0.5.14"])
    assert RELEASES["0.5.14"] == RELEASES["0.5.15"]


def _body(path: Path) -> dict:
    d = json.loads(path.read_text())
    d.pop("#meta")
    exp = d.get("expect", {})
    if exp.get("backend"):
        exp["backend"] = "X"
    return d


def test_corpus_copies_are_the_0_5_15_traces():
    copies = sorted(UPSTREAM.glob("*-sglang-0.5.14.json"))
    originals = sorted(UPSTREAM.glob("*-sglang-0.5.15.json"))
    assert len(copies) == len(originals) == 28
    for c in copies:
        meta = json.loads(c.read_text())["#meta"]
        o = UPSTREAM / meta["copied_from"]
        assert o.name == c.name.replace("0.5.14", "0.5.15")
        assert _body(c) == _body(o), c.name
        exp = json.loads(c.read_text())["expect"]
        assert exp.get("backend") in (None, "sglang-0.5.14"), c.name


@pytest.mark.skipif(not (ROOT / ".venv-sglang-0.5.14" / "bin" / "python").exists(),
                    reason="no .venv-sglang-0.5.14 (make sglang-env SGLANG_VERSIONS=0.5.14)")
def test_the_release_shows_u3_and_refuses_swa():
    from adapters.sglang.proxy import make_backend
    from kvcheck.checker import run_ops
    from kvcheck.trace import load
    t = load(UPSTREAM / "h5-sglang-0.5.14.json")
    res = run_ops(t.config, t.ops, make_backend(t.config, "0.5.14"), backend_name="sglang-0.5.14")
    f = res.failure
    assert f is not None and (f.id, f.step) == (t.expect.invariant, t.expect.step) == ("I20", 2)
    with pytest.raises(Exception, match="SWARadixCache"):
        make_backend(replace(SWA, era="wrapper"), "0.5.14")


def test_planted_upstream_faults_apply_to_0_5_14_as_to_0_5_15():
    from adapters.sglang import faults
    assert faults.applicable("0.5.14") == faults.applicable("0.5.15")
    assert "free_tail_slot_untouched" in faults.applicable("0.5.14")
    faults.validate(["free_tail_slot_untouched"], "0.5.14")
    with pytest.raises(faults.PlantError, match="does not apply to sglang 0.5.14"):
        faults.validate(["lock_not_handed_over"], "0.5.14")      # 0.5.23's borrow code only
