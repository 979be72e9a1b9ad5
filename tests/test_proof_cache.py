"""proofs/cache.py: a proof reruns when a covered source changes, and a warm cache never
hides a failure (a broken spec function or a broken lemma fails the run)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from kvcheck.proofs.cache import ProofCache, cached_unit, function_sources
from kvcheck.proofs.core import Result

ROOT = Path(__file__).resolve().parent.parent
LEMMA = "ceil_align: bounds"


def _tree(tmp: Path) -> Path:
    """A copy of the sources the proofs read, so that the test can edit them: a kvcheck
    package holding spec/ and proofs/ (as installed), imported instead of the checkout's."""
    root = tmp / "tree" / "kvcheck"
    root.mkdir(parents=True)
    shutil.copy(ROOT / "kvcheck" / "__init__.py", root / "__init__.py")
    for sub in ("spec", "proofs"):
        shutil.copytree(ROOT / sub, root / sub, ignore=shutil.ignore_patterns("__pycache__"))
    return root


def _prove(root: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(root.parent))
    return subprocess.run([sys.executable, "-m", "kvcheck.proofs", "--no-crosshair", "--only",
                           LEMMA, "--out", str(root / "out")],
                          cwd=root.parent, env=env, capture_output=True, text=True, timeout=300)


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))


def test_rerun_on_change_and_warm_cache_never_hides_a_failure(tmp_path):
    root = _tree(tmp_path)
    pages, lemmas = root / "spec" / "pages.py", root / "proofs" / "lemmas.py"
    cold = _prove(root)
    assert cold.returncode == 0, cold.stdout + cold.stderr
    assert "reused from the cache" not in cold.stdout
    warm = _prove(root)
    assert warm.returncode == 0 and "2 reused from the cache" in warm.stdout, warm.stdout

    pages.write_text(pages.read_text() + "\n# an edit of a covered source\n")
    changed = _prove(root)
    assert changed.returncode == 0 and "reused from the cache" not in changed.stdout

    good = pages.read_text()                       # cache warm again for this text
    _edit(pages, "return -(-x // p)", "return x // p")      # ceil_div floors: broken
    broken = _prove(root)
    assert broken.returncode == 1, broken.stdout
    assert "NOT as expected" in broken.stdout and "reused" not in broken.stdout

    pages.write_text(good)
    assert _prove(root).returncode == 0            # reruns (the failure was not stored)
    assert "2 reused" in _prove(root).stdout       # warm
    _edit(lemmas, "goal = z3.And(c >= x, c - x < p,", "goal = z3.And(c > x, c - x < p,")
    broken_lemma = _prove(root)
    assert broken_lemma.returncode == 1, broken_lemma.stdout


def test_a_failure_is_never_stored(tmp_path):
    cache = ProofCache(tmp_path / "c.json")
    bad = [Result("u", "lemma", "unknown", 1.0)]
    assert cached_unit(cache, "u", "k", lambda: bad) == bad
    cache.save()
    again = ProofCache(tmp_path / "c.json")
    calls = []
    cached_unit(again, "u", "k", lambda: calls.append(1) or bad)
    assert calls == [1]
    good = [Result("u", "lemma", "proved", 1.0)]
    cached_unit(again, "u", "k", lambda: good)
    assert cached_unit(again, "u", "k", lambda: calls.append(2) or good)[0].cached
    assert cached_unit(again, "u", "other key", lambda: calls.append(3) or good)
    assert calls == [1, 3]


def test_crosshair_rechecks_only_changed_contracts_and_their_callers():
    text = (ROOT / "spec" / "pages.py").read_text()
    before = function_sources(text)
    after = function_sources(text.replace("return (x // p) * p\n\n\ndef row_pages",
                                          "return x - x % p\n\n\ndef row_pages"))
    changed = {n for n in before if before[n] != after[n]}
    assert changed == {"floor_align"}
    after = function_sources(text.replace("return -(-x // p)", "return (x + p - 1) // p"))
    changed = {n for n in before if before[n] != after[n]}
    assert {"ceil_div", "ceil_align", "free_kv_aligned_start", "free_kv_aligned_pages",
            "pages_needed_extend", "owned_tokens", "reserve_chunk_end"} == changed


def test_a_cache_that_cannot_be_written_is_a_warning_not_a_traceback(tmp_path, capsys):
    blocker = tmp_path / "a-file"                 # its folder cannot be made, even by root
    blocker.write_text("")
    cache = ProofCache(blocker / "sub" / "proofs.json")
    cache.put("u", "k", [Result("u", "lemma", "proved", 1.0)])
    cache.save()                                  # no exception
    err = capsys.readouterr().err
    assert err.startswith("kvcheck: warning: proof cache not saved") and len(err.splitlines()) == 1
