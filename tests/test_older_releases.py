"""The releases around the two kvcheck was built on (docs/upstream-findings.md, "Older
releases"): 0.5.14 (before the seed's) driven like 0.5.15 but for SWA, whose tree differs
there; 0.5.16 like 0.5.15 but for the hybrid trees, unified there; 0.5.22 (the first
borrow-era release) like 0.5.23 but for SWA windows that are neither within a page nor
whole pages, whose SWA keep differs there. Each refusal comes before any work; each
release's corpus traces are copies of its neighbour's; the findings they share are
recorded. The tests that drive a release run when its .venv-sglang-VERSION is built
(`make sglang-env SGLANG_VERSIONS=VERSION`)."""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from kvcheck.adapters.sglang.findings import RELEASES
from kvcheck.spec.config import ACCEPTABLE
from kvcheck.adapters.sglang.hybrid import release_tuple
from kvcheck import explore as E
from kvcheck.backends import config_kw, release_era, release_refusal
from kvcheck.check import differential_preset
from kvcheck.engines.configs import draw_config
from kvcheck.engines.draw import RandomDrawer
from kvcheck.spec.config import Config

ROOT = Path(__file__).resolve().parents[1]
UPSTREAM = ROOT / "stateful_tests" / "upstream"
SWA = Config(swa_window=2, swa_num_pages=6)


def test_release_numbers():
    assert release_tuple("0.5.14") == release_tuple("sglang-0.5.14") == (0, 5, 14)
    assert release_tuple("0.5.13.post1") == (0, 5, 13)
    assert release_tuple(None) == release_tuple("sglang") == (999,)
    assert [release_era(f"sglang:{v}") for v in ("0.5.14", "0.5.16", "0.5.21", "0.5.22")] == \
        ["wrapper", "wrapper", "wrapper", "borrow"]
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
    assert names == [sc.name for sc in E.PRESETS["check-sglang-0.5.15"]
                     if sc.name not in ("sglang-swa", "sglang-priority", "sglang-priority-finish",
                                        "sglang-priority-turn", "sglang-priority-round")]
    assert all(release_refusal(sc.cfg, "sglang:0.5.14") is None
               for sc in E.PRESETS["check-sglang-0.5.14"])
    assert RELEASES["0.5.14"] == tuple(f for f in RELEASES["0.5.15"] if f != "U9")


COPIES = {"0.5.14": ("0.5.15", 35), "0.5.16": ("0.5.15", 37), "0.5.17": ("0.5.15", 37),
          "0.5.18": ("0.5.15", 37), "0.5.19": ("0.5.15", 35), "0.5.22": ("0.5.23", 50)}
"""release -> (the release whose upstream traces it copies, how many: those of the
findings it has, RELEASES; 0.5.19's shared session record asserts where U8 leaks; 0.5.14
is not driven with priority scheduling, U9's trigger). A trace whose #meta says
`no_copies` (why) is its release's own and has none."""


def _body(path: Path) -> dict:
    """A trace less its #meta and expected backend, with its recorded adaptations
    (#meta.adapted: {"config.FIELD": value}) undone, so a copy and its original compare."""
    d = json.loads(path.read_text())
    meta = d.pop("#meta")
    for key in meta.get("adapted", {}):
        section, name = key.split(".")
        d[section].pop(name)
    exp = d.get("expect", {})
    if exp.get("backend"):
        exp["backend"] = "X"
    return d


@pytest.mark.parametrize("version", sorted(COPIES))
def test_corpus_copies_are_the_neighbour_release_traces(version):
    source, count = COPIES[version]
    copies = [c for c in sorted(UPSTREAM.glob(f"*-sglang-{version}.json"))
              if "no_copies" not in json.loads(c.read_text())["#meta"]]
    originals = [o for o in sorted(UPSTREAM.glob(f"*-sglang-{source}.json"))
                 if "no_copies" not in json.loads(o.read_text())["#meta"] and (
                     json.loads(o.read_text())["#meta"].get("finding") not in ACCEPTABLE
                     or json.loads(o.read_text())["#meta"]["finding"] in RELEASES[version])]
    assert len(copies) == len(originals) == count
    for c in copies:
        meta = json.loads(c.read_text())["#meta"]
        o = UPSTREAM / meta["copied_from"]
        assert o.name == c.name.replace(version, source)
        assert meta.get("release", f"sglang=={version}") == f"sglang=={version}", c.name
        original = _body(o)
        for key, value in meta.get("adapted", {}).items():
            section, name = key.split(".")
            assert json.loads(c.read_text())[section][name] == value, (c.name, key)
            original[section].pop(name, None)
        assert _body(c) == original, c.name
        exp = json.loads(c.read_text())["expect"]
        assert exp.get("backend") in (None, f"sglang-{version}"), c.name


def test_0_5_16_refuses_the_hybrid_trees_only():
    mamba_tree = Config(mamba_slots=6, mamba_tree=True)
    for cfg, what in ((SWA, "config.swa_window"), (mamba_tree, "config.mamba_tree")):
        why = release_refusal(cfg, "sglang:0.5.16")
        assert why and why.startswith(what) and "UnifiedRadixCache" in why, why
        assert release_refusal(cfg, "sglang:0.5.15") is None
        assert "UnifiedRadixCache" in (release_refusal(replace(cfg, evict_shortfall=True),
                                                       "sglang:0.5.21") or "")
    assert release_refusal(Config(mamba_slots=6), "sglang:0.5.16") is None
    assert config_kw("sglang:0.5.16")["hybrid_kinds"] == ("mamba-no-lazy",)
    assert config_kw("sglang:0.5.15")["hybrid_kinds"] == ("mamba-no-lazy", "swa", "mamba-tree")
    names = [sc.name for sc in E.PRESETS["check-sglang-0.5.16"]]
    assert names == [sc.name for sc in E.PRESETS["check-sglang-0.5.15"]
                     if sc.name not in ("sglang-swa", "sglang-mamba-tree")]
    assert RELEASES["0.5.16"] == RELEASES["0.5.15"]


def test_0_5_22_refuses_swa_windows_its_keep_differs_on():
    borrow = dict(era="borrow", swa_num_pages=6, page_size=2, max_context_len=64)
    why = release_refusal(Config(swa_window=3, **borrow), "sglang:0.5.22")
    assert why and "max(window, P) = 3" in why and "= 4" in why, why
    for window in (1, 2, 4, 6):         # within a page or whole pages: the same keep
        assert release_refusal(Config(swa_window=window, **borrow), "sglang:0.5.22") is None
    assert release_refusal(Config(swa_window=3, **borrow), "sglang:0.5.23") is None
    kinds = config_kw("sglang:0.5.22")["hybrid_kinds"]
    assert "swa-window-pages" in kinds and "swa-no-prefill-aware" not in kinds
    names = [sc.name for sc in E.PRESETS["check-sglang-0.5.22"]]
    assert names == [sc.name for sc in E.PRESETS["check-sglang-0.5.23"]]
    assert all(release_refusal(sc.cfg, "sglang:0.5.22") is None
               for sc in E.PRESETS["check-sglang-0.5.22"])
    assert RELEASES["0.5.22"] == RELEASES["0.5.23"]


@pytest.mark.parametrize("version", ["0.5.14", "0.5.16", "0.5.17", "0.5.19", "0.5.22"])
def test_generated_configs_are_never_refused(version):
    """The differential run draws only configurations the release runs (a refused one
    would be a skipped sequence, not a checked one)."""
    import random
    kw = config_kw(f"sglang:{version}")
    hybrid_seen = set()
    for seed in range(400):
        cfg = draw_config(RandomDrawer(random.Random(seed)), **kw)
        assert release_refusal(cfg, f"sglang:{version}") is None, (seed, cfg)
        hybrid_seen.add((bool(cfg.swa_window), bool(cfg.mamba_slots), cfg.mamba_tree))
    assert (False, True, False) in hybrid_seen      # a Mamba pool is drawn on each
    assert ((True, False, False) in hybrid_seen) == (version == "0.5.22")


def test_0_5_17_and_0_5_18_are_0_5_16_with_their_eviction_rule():
    for v in ("0.5.17", "0.5.18"):
        scopes, base = E.PRESETS[f"check-sglang-{v}"], E.PRESETS["check-sglang-0.5.16"]
        assert [sc.name for sc in scopes] == [sc.name for sc in base]
        assert all(sc.cfg == replace(b.cfg, evict_shortfall=True) for sc, b in zip(scopes, base))
        assert all(release_refusal(sc.cfg, f"sglang:{v}") is None for sc in scopes)
        assert RELEASES[v] == RELEASES["0.5.16"]


def test_0_5_19_is_0_5_18s_scopes_and_findings():
    """0.5.19 keeps the wrapper era's bookkeeping on a shared record (tests/test_shared_record.py)."""
    assert differential_preset("sglang:0.5.19") == "check-sglang-0.5.19"
    assert E.PRESETS["check-sglang-0.5.19"] == E.PRESETS["check-sglang-0.5.18"]
    # its shared record asserts (`kv is slot.kv`) where 0.5.14-0.5.18 leak (U8)
    assert RELEASES["0.5.19"] == tuple(f for f in RELEASES["0.5.18"] if f != "U8")
    assert "0.5.20" not in RELEASES and "0.5.21" not in RELEASES        # refused
    assert "check-sglang-0.5.20" not in E.PRESETS
    assert release_era("sglang:0.5.19") == "wrapper"
    assert config_kw("sglang:0.5.19")["evict_shortfall"] is True


def _venv(version):
    return pytest.mark.skipif(
        not (ROOT / f".venv-sglang-{version}" / "bin" / "python").exists(),
        reason=f"no .venv-sglang-{version} (make sglang-env SGLANG_VERSIONS={version})")


def _shows_as_recorded(version, name, invariant, step):
    """The release's corpus trace `name` fails as it records (invariant, step)."""
    from kvcheck.adapters.sglang.proxy import make_backend
    from kvcheck.checker import run_ops
    from kvcheck.trace import load
    t = load(UPSTREAM / f"{name}-sglang-{version}.json")
    res = run_ops(t.config, t.ops, make_backend(t.config, version),
                  backend_name=f"sglang-{version}")
    f = res.failure
    assert f is not None and (f.id, f.step) == (t.expect.invariant, t.expect.step) == \
        (invariant, step)
    return t


@_venv("0.5.14")
def test_the_release_shows_u3_and_refuses_swa():
    from kvcheck.adapters.sglang.proxy import make_backend
    _shows_as_recorded("0.5.14", "h5", "I20", 2)
    with pytest.raises(Exception, match="SWARadixCache"):
        make_backend(replace(SWA, era="wrapper"), "0.5.14")


def test_planted_upstream_faults_apply_to_their_neighbours_code():
    from kvcheck.adapters.sglang import faults
    for v in ("0.5.14", "0.5.16", "0.5.17", "0.5.18"):
        assert faults.applicable(v) == faults.applicable("0.5.15"), v
    assert faults.applicable("0.5.22") == faults.applicable("0.5.23")
    assert faults.applicable("0.5.21") == []            # a refused release: none
    assert faults.applicable("0.5.19") == []    # its code is neither 0.5.15's nor 0.5.23's
    with pytest.raises(faults.PlantError, match="does not apply to sglang 0.5.21"):
        faults.validate(["close_keeps_row"], "0.5.21")
    faults.validate(["lock_not_handed_over"], "0.5.22")
    assert "free_tail_slot_untouched" in faults.applicable("0.5.14")
    faults.validate(["free_tail_slot_untouched"], "0.5.14")
    with pytest.raises(faults.PlantError, match="does not apply to sglang 0.5.14"):
        faults.validate(["lock_not_handed_over"], "0.5.14")      # 0.5.23's borrow code only


@_venv("0.5.16")
def test_0_5_16_shows_m2_on_a_mamba_pool_and_refuses_the_mamba_tree():
    from kvcheck.adapters.sglang.proxy import make_backend
    t = _shows_as_recorded("0.5.16", "m2-queued-restored-abort", "I28", 6)
    with pytest.raises(Exception, match="UnifiedRadixCache"):
        make_backend(replace(t.config, mamba_tree=True), "0.5.16")


@_venv("0.5.22")
def test_0_5_22_keeps_max_window_page_and_refuses_other_windows():
    """borrow_swa_window_slides (window 5 on 2-token pages): 0.5.22 keeps 5 SWA tokens
    behind pre_len where the spec (0.5.23) keeps 6, D1 at step 8 when run past the
    refusal; the refusal names both."""
    from kvcheck.adapters.sglang.proxy import SglangProxy, make_backend
    from kvcheck.checker import run_ops
    from kvcheck.trace import load
    t = load(ROOT / "stateful_tests" / "regressions" / "borrow_swa_window_slides.json")
    assert (t.config.swa_window, t.config.page_size) == (5, 2)
    with pytest.raises(Exception, match=r"max\(window, P\) = 5 .* = 6"):
        make_backend(t.config, "0.5.22")
    res = run_ops(t.config, t.ops, SglangProxy(t.config, "0.5.22", refuse=False),
                  backend_name="sglang-0.5.22")
    assert res.failure is not None and (res.failure.id, res.failure.step) == ("D1", 8)
    assert "swa_evicted_seqlen" in res.failure.render()
