"""Optional Cython compilation of the explorer's hot path, from the same .py sources
(Cython's pure-Python mode: no .pyx, no second copy of anything; a `.pxd` beside a module
declares C types for it, and the .py still runs interpreted without Cython).

    make cython                                  # build (needs Cython and a C compiler)
    python -m kvcheck.run_compiled explore ARGS...   # `kvcheck ARGS...` on the compiled modules
    make explore-compiled                        # the same for `kvcheck explore`

The extension modules go to build/cython/ (git-ignored) with a manifest of the hashes
of the sources they were built from. `activate()` puts them in front of the sources
only when every hash still matches (a stale build is refused, so an edit of the model is
never shadowed by old machine code); without a build, or without Cython, everything runs
interpreted exactly as before. Besides this module's own entry point, only `kvcheck check`
uses a build: its worker processes activate it, when it matches the sources, before they
import anything of the spec (`kvcheck check --interpreted` does not); every other entry
point (tests, `kvcheck explore`, `fuzz`, ...) is unaffected by a build.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "build" / "cython"
MANIFEST = BUILD / "manifest.json"
MODULES = ("kvcheck/spec/state.py", "kvcheck/spec/allocator.py", "kvcheck/spec/radix_cache.py",
           "kvcheck/spec/caching.py", "kvcheck/spec/token_arrays.py", "kvcheck/spec/sessions.py",
           "kvcheck/spec/finish.py", "kvcheck/spec/forward.py", "kvcheck/spec/admission.py",
           "kvcheck/spec/guards.py", "kvcheck/spec/actions.py", "kvcheck/spec/model.py",
           "kvcheck/spec/abstract.py", "kvcheck/spec/view.py", "kvcheck/spec/invariants_base.py",
           "kvcheck/spec/invariants_pages.py", "kvcheck/spec/invariants_holders.py",
           "kvcheck/spec/invariants_sessions.py", "kvcheck/spec/invariants_tree.py",
           "kvcheck/spec/invariants_hybrid.py", "kvcheck/spec/invariants_step.py",
           "kvcheck/spec/invariants.py", "kvcheck/fast_invariants.py",
           "kvcheck/explore/symmetry.py", "kvcheck/explore/candidates.py",
           "kvcheck/explore/goals.py", "kvcheck/explore/result.py", "kvcheck/explore/expand.py",
           "kvcheck/explore/merge.py", "kvcheck/explore/frontier.py", "kvcheck/explore/search.py")
"""What the explorer spends its time in. spec/pages.py and spec/swa_pool.py stay interpreted:
proofs/ re-executes their functions' code objects on z3 terms."""
DIRECTIVES = {"language_level": 3, "annotation_typing": False, "binding": True}
"""annotation_typing off: an annotation never becomes a C type check, so the compiled
code accepts and returns exactly what the interpreted code does."""


class NotBuilt(Exception):
    """No usable build: the reason, in one line."""


def _name(rel: str) -> str:
    return rel[:-3].replace("/", ".")


def sources(root: Path = ROOT) -> list:
    """MODULES and the Cython declarations (`.pxd`, pure-Python mode) beside them."""
    pxds = [rel[:-3] + ".pxd" for rel in MODULES if (root / (rel[:-3] + ".pxd")).exists()]
    return list(MODULES) + pxds


def source_hashes(root: Path = ROOT) -> dict:
    return {rel: hashlib.sha256((root / rel).read_bytes()).hexdigest() for rel in sources(root)}


JOBS = max(1, min(len(os.sched_getaffinity(0)), 4))
"""Modules translated and compiled at once (one per usable core, at most 4)."""


def build(out=print) -> Path:
    """Compile MODULES into BUILD (a setuptools build_ext in a subprocess, one module per
    usable core at once)."""
    try:
        import Cython  # noqa: F401
    except ImportError:
        raise NotBuilt("Cython is not installed (pip install 'Cython>=3.1,<3.3')") from None
    BUILD.mkdir(parents=True, exist_ok=True)
    script = f"""
import sys
from setuptools import Extension, setup
from Cython.Build import cythonize
exts = [Extension(name, [src]) for name, src in {[(_name(m), m) for m in MODULES]!r}]
setup(name="kvcheck-compiled", script_args=["build_ext", "--build-lib", {str(BUILD)!r},
      "--build-temp", {str(BUILD / "tmp")!r}, "--parallel", {str(JOBS)!r}],
      ext_modules=cythonize(exts, compiler_directives={DIRECTIVES!r},
                            build_dir={str(BUILD / "c")!r}, quiet=True, nthreads={JOBS}))
"""
    hashes = source_hashes()
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(script)
    p = subprocess.run([sys.executable, f.name], cwd=ROOT, capture_output=True, text=True)
    Path(f.name).unlink()
    if p.returncode != 0:
        raise NotBuilt(f"the Cython build failed: {(p.stderr or p.stdout).strip()[-800:]}")
    MANIFEST.write_text(json.dumps(hashes, indent=1))
    out(f"compiled {len(MODULES)} modules into {BUILD.relative_to(ROOT)}")
    return BUILD


def check_build() -> None:
    """Raise NotBuilt unless a build exists and matches the current sources."""
    if not MANIFEST.exists():
        raise NotBuilt("no compiled build (run `make cython`)")
    built = json.loads(MANIFEST.read_text())
    stale = [m for m, h in source_hashes().items() if built.get(m) != h]
    if stale:
        raise NotBuilt(f"the compiled build is stale ({', '.join(stale)} changed since); "
                       "run `make cython` again")
    for rel in MODULES:
        pkg, mod = BUILD / Path(rel).parent, Path(rel).stem
        if not list(pkg.glob(f"{mod}.*.so")) + list(pkg.glob(f"{mod}.*.pyd")):
            raise NotBuilt(f"the compiled build lacks {rel}; run `make cython` again")


def activate() -> None:
    """Put the compiled modules in front of the sources (before any of them is imported)."""
    check_build()
    loaded = [_name(m) for m in MODULES if _name(m) in sys.modules]
    if loaded:
        raise RuntimeError(f"activate() after {loaded} were imported interpreted")
    # kvcheck and each subpackage with the build's folder first on its __path__, all of them before any
    # runs its __init__ (kvcheck.explore's imports the spec's modules at once)
    fresh = []
    for pkg in dict.fromkeys(_name(m).rsplit(".", 1)[0] for m in MODULES):
        where = str(BUILD / pkg.replace(".", "/"))
        if pkg in sys.modules:
            sys.modules[pkg].__path__.insert(0, where)
            continue
        spec = importlib.util.find_spec(pkg)
        spec.submodule_search_locations.insert(0, where)
        module = sys.modules[pkg] = importlib.util.module_from_spec(spec)
        parent, _, child = pkg.rpartition(".")
        setattr(sys.modules[parent], child, module)
        fresh.append((spec, module))
    for spec, module in fresh:
        spec.loader.exec_module(module)


def is_compiled(module) -> bool:
    return not str(getattr(module, "__file__", "")).endswith(".py")


def c_compiler() -> str | None:
    """The C compiler setuptools would call (Python's configured CC, else cc), if found."""
    import shutil
    import sysconfig
    cc = (sysconfig.get_config_var("CC") or "cc").split()
    return shutil.which(cc[0]) if cc else None


def setup(out=print) -> int:
    """`make venv`'s last step: the build wherever a C compiler is present (a build that
    is current is kept), else one line saying the explorer runs interpreted. Never fails
    the set-up: the interpreted explorer gives the same results."""
    try:
        check_build()
        out(f"kvcheck: the compiled explorer in {BUILD.relative_to(ROOT)} is current")
        return 0
    except NotBuilt:
        pass
    if c_compiler() is None:
        out("kvcheck: no C compiler found: the explorer runs interpreted (about 1.7x the CPU; "
            "`make cython` builds it once there is one)")
        return 0
    out("kvcheck: compiling the explorer with Cython (about 2 minutes on 2 cores) ...")
    try:
        build(out)
    except NotBuilt as e:
        out(f"kvcheck: the explorer runs interpreted: {e}")
    return 0


def main(argv=None) -> int:
    """`python -m kvcheck.compiled build` (`make cython`), `setup` (`make venv`)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv == ["setup"]:
        return setup()
    if argv != ["build"]:
        print("usage: python -m kvcheck.compiled build|setup   (to run on the build: "
              "python -m kvcheck.run_compiled ARGS...)", file=sys.stderr)
        return 2
    try:
        build()
    except NotBuilt as e:
        print(f"kvcheck.compiled: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
