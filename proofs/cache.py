"""Proof results cached by the hash of the sources they cover.

A proof unit (one lemma with its negative controls, one induction step or control,
one CrossHair contract) is keyed by a SHA-256 over everything its outcome depends on:
the text of the files it reads (spec/pages.py, the proof module, proofs/core.py and
proofs/symexec.py), the unit's name, and the versions of Python, z3 and CrossHair.
Editing spec/pages.py or a proof module changes the key, so the unit runs again.

The cache never hides a failure: only a unit whose every result is as expected
(`Result.ok`) is stored, and a stored entry is reused only under an identical key.
It lives under the project's output directory (`failures/.kvcheck-cache/proofs.json`
by default, git-ignored); `--no-cache` bypasses it.
"""
from __future__ import annotations

import ast
import hashlib
import json
import os
import sys
import tempfile
from dataclasses import asdict
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Callable

from kvcheck.proofs.core import Result

ROOT = Path(__file__).resolve().parent.parent
CACHE_FILE = Path(".kvcheck-cache") / "proofs.json"
"""Relative to the output directory (kvcheck's --out, `failures/` by default)."""
FORMAT = 1


def _version(dist: str) -> str:
    try:
        return version(dist)
    except PackageNotFoundError:
        return "absent"


def toolchain() -> str:
    """What the outcome depends on besides the sources: the solvers and the interpreter."""
    return (f"python {sys.version_info[:3]}; z3 {_version('z3-solver')}; "
            f"crosshair {_version('crosshair-tool')}; format {FORMAT}")


def digest(*texts: str) -> str:
    h = hashlib.sha256()
    for t in texts:
        h.update(t.encode())
        h.update(b"\0")
    return h.hexdigest()


def source_key(*relpaths: str, root: Path = ROOT) -> str:
    """The hash of the files a proof covers (paths relative to the project root)."""
    return digest(toolchain(), *(f"{p}\n{(root / p).read_text()}" for p in relpaths))


def function_sources(module_text: str) -> dict[str, str]:
    """Each top-level function's source, with the sources of the module's functions it
    calls (transitively) appended: a contract's outcome depends on its callees too."""
    tree = ast.parse(module_text)
    funcs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    calls = {name: {c.id for c in ast.walk(fn) if isinstance(c, ast.Name) and c.id in funcs}
             for name, fn in funcs.items()}

    def closure(name):
        seen, todo = set(), [name]
        while todo:
            n = todo.pop()
            if n not in seen:
                seen.add(n)
                todo.extend(calls[n])
        return sorted(seen)

    prelude = "\n".join(ast.get_source_segment(module_text, n) or "" for n in tree.body
                        if not isinstance(n, ast.FunctionDef))   # imports, constants
    return {name: "\n".join([prelude] + [ast.get_source_segment(module_text, funcs[n]) or ""
                                          for n in closure(name)])
            for name in funcs}


class ProofCache:
    """{unit name: {"key": hash, "results": [Result as dict, ...]}} in one JSON file."""

    def __init__(self, path: Path | None):
        self.path = path
        self.entries: dict = {}
        self.hits = 0
        if path is not None and path.exists():
            try:
                data = json.loads(path.read_text())
                if data.get("format") == FORMAT:
                    self.entries = data.get("units", {})
            except (OSError, ValueError):
                self.entries = {}      # unreadable: start afresh, it is only a cache

    @property
    def enabled(self) -> bool:
        return self.path is not None

    def get(self, unit: str, key: str) -> list[Result] | None:
        e = self.entries.get(unit)
        if not self.enabled or not e or e.get("key") != key:
            return None
        results = [Result(**r) for r in e["results"]]
        if not results or not all(r.ok for r in results):
            return None                # defensive: a stored failure is never reused
        self.hits += 1
        for r in results:
            r.cached = True
        return results

    def put(self, unit: str, key: str, results: list[Result]) -> None:
        if not self.enabled:
            return
        if results and all(r.ok for r in results):
            self.entries[unit] = {"key": key, "results": [_stored(r) for r in results]}
        else:
            self.entries.pop(unit, None)

    def save(self) -> None:
        """Write the cache; one that cannot be written (a read-only folder, a full disk)
        is said on stderr: the results are already reported, a cache is only a cache."""
        if not self.enabled:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".proofs-", suffix=".json")
            with os.fdopen(fd, "w") as f:
                json.dump({"format": FORMAT, "units": self.entries}, f, indent=1, sort_keys=True)
            os.replace(tmp, self.path)     # atomic: a concurrent run never reads half a file
        except OSError as e:
            print(f"kvcheck: warning: proof cache not saved to {self.path}: "
                  f"{e.strerror or e}", file=sys.stderr, flush=True)


def _stored(r: Result) -> dict:
    d = asdict(r)
    d["cached"] = False
    return d


def cached_unit(cache: ProofCache | None, unit: str, key: str,
                run: Callable[[], list[Result]]) -> list[Result]:
    """The unit's results from the cache under the same key, else run and store them."""
    if cache is not None:
        hit = cache.get(unit, key)
        if hit is not None:
            return hit
    results = run()
    if cache is not None:
        cache.put(unit, key, results)
    return results


def cache_at(out_dir: Path | str | None) -> ProofCache:
    """The cache under an output directory; None: disabled (`--no-cache`)."""
    return ProofCache(None if out_dir is None else Path(out_dir) / CACHE_FILE)
