"""The named scopes (`kvcheck explore --preset NAME`, `--list-presets`), read from the data
file presets.toml beside this module (its header says how an entry reads)."""
from __future__ import annotations

import tomllib
from dataclasses import fields, replace
from importlib import resources

from kvcheck.explore.scope import Scope
from kvcheck.spec.config import Config

SCOPE_FIELDS = frozenset(f.name for f in fields(Scope)) - {"cfg"}


def _values(entry: dict) -> dict:
    """An entry's Scope fields, TOML's arrays as the tuples a Scope holds."""
    def tup(v):
        return tuple(tup(x) for x in v) if isinstance(v, list) else v
    unknown = set(entry) - SCOPE_FIELDS
    if unknown:
        raise ValueError(f"presets.toml: unknown scope field(s) {sorted(unknown)}")
    return {k: tup(v) for k, v in entry.items()}


def _scope(entry: dict, scopes: dict, presets: dict) -> Scope:
    entry = dict(entry)
    like, config = entry.pop("like", None), entry.pop("config", {})
    if like is None:
        return Scope(cfg=Config(**config), **_values(entry))
    base = scopes[like] if isinstance(like, str) else preset_scope(like[0], like[1], presets)
    cfg = replace(base.cfg, **config) if config else base.cfg     # replace re-validates
    return replace(base, cfg=cfg, **_values(entry))


def _derived(table: dict, presets: dict) -> tuple:
    """A preset written as a table: another's scopes, less `drop`, `config` changed in each
    and `scope_config[NAME]` in that one."""
    drop, config = set(table.get("drop", ())), table.get("config", {})
    per_scope = table.get("scope_config", {})
    out = []
    for sc in presets[table["from"]]:
        if sc.name in drop:
            continue
        kw = {**config, **per_scope.get(sc.name, {})}
        out.append(replace(sc, cfg=replace(sc.cfg, **kw)) if kw else sc)
    return tuple(out)


def load(text: str) -> tuple[dict, dict]:
    """(the named base scopes, the presets in file order) of presets.toml's text."""
    data = tomllib.loads(text)
    scopes = {name: _scope({"name": name, **e}, {}, {}) for name, e in data["scope"].items()}
    presets: dict[str, tuple] = {}
    for name, p in data["preset"].items():
        presets[name] = (_derived(p, presets) if isinstance(p, dict) else
                         tuple(_scope(e, scopes, presets) for e in p))
    return scopes, presets


def preset_scope(preset: str, name: str, presets: dict | None = None) -> Scope:
    """The scope of that name in a preset."""
    return next(sc for sc in (PRESETS if presets is None else presets)[preset] if sc.name == name)


SCOPES, PRESETS = load(resources.files("kvcheck.explore").joinpath("presets.toml").read_text())
HYBRID_SCOPE = SCOPES["check-hybrid"]
HYBRID_BORROW_SCOPE = SCOPES["hybrid-borrow"]
MAMBA_TREE_SCOPE = SCOPES["mamba-tree"]
P1_SCOPE = SCOPES["p1"]
TWO_SESSIONS_SCOPE = SCOPES["two-sessions"]
