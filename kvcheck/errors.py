"""Shared command-line plumbing: the usage error and the project's corpus folders."""
from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REGRESSIONS = ROOT / "stateful_tests" / "regressions"
UPSTREAM = ROOT / "stateful_tests" / "upstream"


class UsageError(Exception):
    """Bad arguments or input: reported as one line, exit 2."""
