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


def files_written(folder: Path, pattern: str = "*") -> list:
    """Files under `folder` (recursively) written since the command started
    (kvcheck.clock): what an interrupted command lists as written."""
    from kvcheck import clock
    try:
        found = [p for p in folder.rglob(pattern)
                 if p.is_file() and p.stat().st_mtime >= clock.STARTED_WALL - 1e-3
                 and not any(x.startswith(".") for x in p.relative_to(folder).parts)]
    except OSError:
        return []
    return sorted(found)
