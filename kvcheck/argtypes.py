"""argparse `type=` callables: each checks one flag's value and its allowed range while
the command line is parsed, so a bad value is one line and exit 2 before any work.

    p.add_argument("--rounds", type=positive_int, ...)
    p.add_argument("--out", type=writable_dir, ...)

A callable raises argparse.ArgumentTypeError with the allowed range; argparse names
the flag (`kvcheck fuzz: error: argument --rounds: must be an integer >= 1, got '0'`).
"""
from __future__ import annotations

import argparse
import math
import os
import re
import tempfile
from pathlib import Path

MAX_SEED = 2**64 - 1
BACKEND_RE = re.compile(r"^(spec|impl|sglang(?:[:-](?P<version>.*))?)$")
VERSION_RE = re.compile(r"^[0-9]+(\.[0-9]+){1,3}$")
BACKENDS_HELP = "spec, impl, sglang (the importable one) or sglang:VERSION (e.g. sglang:0.5.15)"


def _int(text: str, lo: int, hi: int | None = None) -> int:
    rng = f"an integer >= {lo}" if hi is None else f"an integer in [{lo}, {hi}]"
    try:
        v = int(text, 10)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"must be {rng}, got {text!r}") from None
    if v < lo or (hi is not None and v > hi):
        raise argparse.ArgumentTypeError(f"must be {rng}, got {text!r}")
    return v


def positive_int(text: str) -> int:
    return _int(text, 1)


def nonnegative_int(text: str) -> int:
    return _int(text, 0)


def seed(text: str) -> int:
    return _int(text, 0, MAX_SEED)


def _float(text: str, lo: float, strict: bool) -> float:
    rng = f"a finite number {'>' if strict else '>='} {lo:g}"
    try:
        v = float(text)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"must be {rng} (seconds), got {text!r}") from None
    if not math.isfinite(v) or v < lo or (strict and v == lo):
        raise argparse.ArgumentTypeError(f"must be {rng} (seconds), got {text!r}")
    return v


def positive_float(text: str) -> float:
    return _float(text, 0.0, strict=True)


def nonnegative_float(text: str) -> float:
    return _float(text, 0.0, strict=False)


def backend(text: str) -> str:
    """A system under test that can run here: spec, impl, or an sglang release that is
    built (.venv-sglang-VERSION) or importable."""
    m = BACKEND_RE.match(text or "")
    if not m:
        raise argparse.ArgumentTypeError(f"unknown backend {text!r}; use {BACKENDS_HELP}")
    version = m.group("version")
    if text.startswith("sglang") and version is not None and not VERSION_RE.match(version):
        raise argparse.ArgumentTypeError(
            f"{text!r}: VERSION must be a release number like 0.5.15, got {version!r}")
    if text.startswith("sglang"):
        from kvcheck.adapters.sglang.proxy import SglangUnavailable, resolve_python
        try:
            resolve_python(version)
        except SglangUnavailable as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    return text


def _nearest_existing(path: Path) -> Path:
    p = path
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def _probe_writable(directory: Path) -> None:
    try:
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as e:
        raise argparse.ArgumentTypeError(f"{directory} is not writable ({e.strerror})") from None


def _named(text: str, what: str) -> None:
    if not text or not text.strip():
        raise argparse.ArgumentTypeError(f"must name a {what}, got {text!r}")
    if "\0" in text:
        raise argparse.ArgumentTypeError(f"a {what} name cannot hold a NUL byte, got {text!r}")


def writable_dir(text: str) -> Path:
    """A folder that exists and is writable, or one that can be created (nothing is
    created here)."""
    _named(text, "folder")
    path = Path(text).expanduser()
    base = _nearest_existing(path.absolute())
    if base == path.absolute() and not base.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a file, not a folder")
    if not base.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: {base} is a file, not a folder")
    _probe_writable(base)
    return path


def writable_file(text: str) -> Path:
    """A file path whose folder exists and is writable (the file is replaced)."""
    _named(text, "file")
    path = Path(text).expanduser()
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a folder, not a file")
    parent = path.absolute().parent
    if not parent.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: folder {parent} does not exist")
    if path.exists() and not os.access(path, os.W_OK):
        raise argparse.ArgumentTypeError(f"{text} is not writable")
    _probe_writable(parent)
    return path


def accept_flag(p) -> None:
    """`--accept`, as check, fuzz and explore take it (kvcheck.backends.parse_accept)."""
    p.add_argument("--accept", metavar="U1,U2,...", default=None,
                   help="recorded upstream findings (docs/upstream-findings.md) whose behaviour "
                        "the spec takes, so a run drives their paths (a sequence they take past "
                        "the model stops being compared and is counted in the report); spec or "
                        "sglang backends only (default: none, the fixed behaviour)")
