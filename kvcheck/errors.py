"""Shared command-line plumbing: the usage error and the project's corpus folders."""
from __future__ import annotations

from importlib import resources
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
"""The checkout's root (in an installed wheel: site-packages): only checkout tools
(mutation, compiled, schema's published copy) read from it; the product reads its data
below through importlib.resources and writes to the current folder or --out."""
CORPUS = Path(str(resources.files("kvcheck.stateful_tests"))).resolve()
REGRESSIONS = CORPUS / "regressions"
UPSTREAM = CORPUS / "upstream"


class UsageError(Exception):
    """Bad arguments or input: reported as one line, exit 2."""
