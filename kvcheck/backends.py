"""Systems under test by name: `spec` (the model alone), `impl` (impl/ on the device
KVCHECK_DEVICE picks), `sglang[:VERSION]` / `sglang-VERSION` (a real release)."""
from __future__ import annotations

from typing import Callable, Optional


class BackendError(ValueError):
    pass


def release_version(name: str) -> Optional[str]:
    """VERSION of `sglang:VERSION` / `sglang-VERSION`, or None (spec, impl, an unversioned
    sglang)."""
    for prefix in ("sglang:", "sglang-"):
        if name.startswith(prefix):
            return name[len(prefix):] or None
    return None


def release_era(name: str):
    """The era a backend fixes ('wrapper' for sglang <= 0.5.21, 'borrow' for 0.5.22+),
    or None when the backend runs either (spec, impl, an unversioned sglang)."""
    version = release_version(name)
    if version is None:
        return None
    from kvcheck.adapters.sglang.hybrid import release_tuple
    parts = release_tuple(version)
    return None if parts == (999,) else "wrapper" if parts <= (0, 5, 21) else "borrow"


def config_kw(name: str, accept=(), spec_enabled=None) -> dict:
    """The generators' configuration constraints for a backend (configs.draw_config keywords):
    its era, `--accept`, and the hybrid models it can drive (the sglang adapter drives the
    Mamba pool on the wrapper era without the lazy track buffer, whose finding M1 is
    checked by its trace (docs/upstream-findings.md), over a plain tree or 0.5.15's
    `MambaRadixCache` (`mamba-tree`), and on the borrow era with the radix cache disabled
    or with its Mamba tree component (`mamba-tree`); SWA on both: on the borrow era
    without prefill-aware SWA, which 0.5.23 pairs only with an all-SWA model and the
    adapter refuses, adapters/sglang/hybrid.py; from 0.5.16 to 0.5.21 neither SWA nor the
    Mamba tree, whose unified trees under the wrapper the spec does not model; on 0.5.22
    SWA windows of whole pages)."""
    era = release_era(name)
    kw = {}
    if era:
        kw["era"] = era
    if spec_enabled is not None:
        kw["spec_enabled"] = spec_enabled
    if accept:
        kw["accept"] = accept
    if name.startswith("sglang"):
        kw["hybrid_kinds"] = (("mamba-no-lazy", "swa", "mamba-tree") if era == "wrapper"
                              else ("mamba-no-radix", "mamba-tree", "swa-no-prefill-aware"))
        from kvcheck.adapters.sglang.hybrid import spec_swa_keep, spec_swa_tree, spec_wrapper_trees
        version = release_version(name)
        if not spec_swa_tree(version):    # refused there (hybrid.refusal)
            kw["hybrid_kinds"] = tuple(k for k in kw["hybrid_kinds"] if k != "swa")
        if era == "wrapper" and not spec_wrapper_trees(version):    # 0.5.16-0.5.21: refused
            kw["hybrid_kinds"] = tuple(k for k in kw["hybrid_kinds"]
                                       if k not in ("swa", "mamba-tree"))
        if not spec_swa_keep(version):    # 0.5.22: whole-page windows only
            kw["hybrid_kinds"] = tuple("swa-window-pages" if k == "swa-no-prefill-aware" else k
                                       for k in kw["hybrid_kinds"])
        kw["tree_off"] = False      # its disabled tree only where "mamba-no-radix" draws it
        from kvcheck.adapters.sglang.hybrid import (admission_rule, filters_before_prefill,
                                                    release_tuple)
        kw["filter_before_prefill"] = filters_before_prefill(version)
        if version:
            kw["admission"] = admission_rule(version)
        if version and release_tuple(version) < (0, 5, 15):
            kw["priority"] = False      # refused there (release.config_refusal)
        if era == "wrapper":        # the release's eviction rule, not drawn
            from kvcheck.adapters.sglang.hybrid import evicts_shortfall
            kw["evict_shortfall"] = evicts_shortfall(version)
    return kw


def release_refusal(cfg, name: str):
    """Why the release `name` (sglang:VERSION) cannot run configuration cfg, known here
    without starting it (`kvcheck.adapters.sglang.backend.config_refusal`: the era, from a
    versioned name, and the hybrid models its adapter drives), or None."""
    if not name.startswith("sglang"):
        return None
    from kvcheck.adapters.sglang.backend import config_refusal
    api = {"wrapper": "flat", "borrow": "borrow"}.get(release_era(name))
    return config_refusal(cfg, api, release_version(name) or name)


def release_config(cfg, name: str):
    """cfg with the rules a release fixes (not a choice of the run) set to that release's:
    on a wrapper-era release, `evict_shortfall` (0.5.17+ evicts only the shortfall). For
    the regression corpus, whose wrapper-era traces were written for 0.5.15's rule: the
    spec then follows the release's rule on both sides. Any other cfg is returned as is."""
    if not name.startswith("sglang") or release_era(name) != "wrapper" or cfg.era != "wrapper":
        return cfg
    from dataclasses import replace

    from kvcheck.adapters.sglang.hybrid import evicts_shortfall
    rule = evicts_shortfall(release_version(name))
    return cfg if cfg.evict_shortfall == rule else replace(cfg, evict_shortfall=rule)


def planted_upstream(name: str) -> dict:
    """For a failure trace's #meta: the planted upstream faults a run against a release had
    ({"sglang_plant": "a,b"}, adapters/sglang/faults.py, $KVCHECK_SGLANG_PLANT), else {}.
    `kvcheck replay` plants them again, so the trace reproduces."""
    if not name.startswith("sglang"):
        return {}
    import os

    from kvcheck.adapters.sglang.faults import ENV
    plant = os.environ.get(ENV, "")
    return {"sglang_plant": plant} if plant else {}


def known_findings(name: str, accept=()):
    """The skip predicate for a release with recorded upstream findings the run does not
    accept (`--accept`), or None."""
    if name.startswith("sglang"):
        from kvcheck.adapters.sglang.findings import known_trigger
        return known_trigger(release_version(name), accept)
    return None


def parse_accept(text: str | None, name: str) -> tuple:
    """`--accept U1,U2`: recorded findings whose upstream behaviour the spec takes.
    Only for the spec alone or a real release (impl/ implements the fixes only)."""
    from kvcheck.spec.config import ACCEPTABLE
    if not text:
        return ()
    ids = tuple(x.strip() for x in text.split(",") if x.strip())
    bad = [x for x in ids if x not in ACCEPTABLE]
    if bad:
        raise BackendError(f"--accept: unknown finding(s) {bad}; known: {', '.join(ACCEPTABLE)}")
    if not (name == "spec" or name.startswith("sglang")):
        raise BackendError(f"--accept applies to --backend spec or sglang[:VERSION], not {name!r} "
                           "(impl/ implements the fixed behaviour only)")
    return ids


def display_name(name: str) -> str:
    """The name `resolve` gives a backend, without importing it (impl/ imports torch)."""
    if name in ("spec", "impl"):
        return name
    version = release_version(name)
    return f"sglang-{version}" if version else "sglang"


def resolve(name: str) -> tuple[Optional[Callable], str]:
    """(factory(cfg) -> Backend, or None for the spec alone; display name)."""
    if name == "spec":
        return None, "spec"
    if name == "impl":
        from kvcheck.adapters.impl import ImplBackend
        return ImplBackend, "impl"
    if name == "sglang" or name.startswith("sglang:") or name.startswith("sglang-"):
        version = release_version(name)
        from kvcheck.adapters.sglang.proxy import SglangUnavailable, make_backend

        def factory(cfg):
            try:
                return make_backend(cfg, version)
            except SglangUnavailable as e:
                raise BackendError(str(e)) from None
        return factory, display_name(name)
    raise BackendError(f"unknown backend {name!r}: use spec, impl, sglang, sglang:VERSION "
                       "or sglang-VERSION")
