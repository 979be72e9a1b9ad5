"""The import layers ([tool.importlinter] in pyproject.toml): `lint-imports` keeps every
contract on the tree, and breaks the layers contract when a module imports upward (a copy
of the package with one upward import planted in the checker core)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from kvcheck.errors import ROOT

LINT = Path(sys.executable).with_name("lint-imports")
LINKED = ("spec", "impl", "adapters", "proofs", "stateful_tests")


def lint(cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(cwd))     # this tree's kvcheck, not the installed one
    return subprocess.run([str(LINT), "--no-cache", "--config", str(cwd / "pyproject.toml")],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_the_layer_contracts_hold():
    p = lint(ROOT)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "Contracts: 4 kept, 0 broken." in p.stdout


def test_an_upward_import_breaks_the_layers_contract(tmp_path):
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    pkg = tmp_path / "kvcheck"
    shutil.copytree(ROOT / "kvcheck", pkg, symlinks=True,
                    ignore=shutil.ignore_patterns("__pycache__", *LINKED))
    for name in LINKED:         # the subpackages as in the checkout: links to the real folders
        (pkg / name).symlink_to(ROOT / name, target_is_directory=True)
    checker = pkg / "checker.py"
    checker.write_text(checker.read_text() + "\n\ndef _upward():\n    from kvcheck import cli  # noqa\n")
    p = lint(tmp_path)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "kvcheck.checker is not allowed to import kvcheck.cli" in p.stdout
    assert "Contracts: 2 kept, 2 broken." in p.stdout      # the layers, and the cycle it makes
