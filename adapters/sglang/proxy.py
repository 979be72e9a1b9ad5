"""The checker-side Backend for a real sglang release.

sglang (with its pinned torch) lives in its own venv, .venv-sglang-VERSION, built by
adapters/sglang/make_env.sh. `SglangProxy` runs `python -m kvcheck.adapters.sglang.run_trace
--serve` with that venv's interpreter and speaks the JSON-lines protocol to it; every
`apply` returns upstream's outcome and caches the abstract state and concrete
violations that came back with it. One server process per interpreter is kept and
re-initialised for each new backend (imports take ~6 s; a re-init takes milliseconds).

`make_backend(cfg, version)` is what `--backend sglang[:VERSION]` should call:
  * VERSION given: .venv-sglang-VERSION/bin/python (or $KVCHECK_SGLANG_PYTHON);
  * no VERSION: the sglang importable in this interpreter, in-process; else
    $KVCHECK_SGLANG_PYTHON; else the only .venv-sglang-* venv present.
"""
from __future__ import annotations

import atexit
import copy
import importlib.util
import json
import os
import subprocess
import sys
import weakref
from pathlib import Path

from kvcheck.spec.abstract import AbstractState
from kvcheck.spec.config import Config
from kvcheck.spec.ops import Op
from kvcheck.spec.violations import Violation

ROOT = Path(__file__).resolve().parents[2]


class SglangUnavailable(RuntimeError):
    """No usable sglang interpreter for the release asked for."""


def venv_python(version: str) -> Path:
    return ROOT / f".venv-sglang-{version}" / "bin" / "python"


def available_versions() -> list[str]:
    return sorted(p.name[len(".venv-sglang-"):] for p in ROOT.glob(".venv-sglang-*")
                  if (p / "bin" / "python").exists())


def resolve_python(version: str | None) -> str | None:
    """The interpreter to run, or None for in-process."""
    env = os.environ.get("KVCHECK_SGLANG_PYTHON")
    if version:
        py = venv_python(version)
        if py.exists():
            return str(py)
        if env:
            return env
        raise SglangUnavailable(
            f"no .venv-sglang-{version}; build it with `adapters/sglang/make_env.sh {version}` "
            f"(present: {available_versions() or 'none'})")
    if importlib.util.find_spec("sglang") is not None:
        return None
    if env:
        return env
    found = available_versions()
    if len(found) == 1:
        return str(venv_python(found[0]))
    raise SglangUnavailable(
        "no sglang importable here; name a release (--backend sglang:0.5.15) or build one "
        f"with adapters/sglang/make_env.sh VERSION (present: {found or 'none'})")


class _Server:
    def __init__(self, python: str):
        env = dict(os.environ)
        env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
        env.setdefault("TRITON_INTERPRET", "1")
        env.pop("SGLANG_USE_CPU_ENGINE", None)
        # `kvcheck coverage --backend sglang:V` names a coverage rc file: measure the server
        rc = os.environ.get("KVCHECK_SGLANG_COVERAGE")
        under = [python, "-m", "coverage", "run", f"--rcfile={rc}"] if rc else [python]
        self.proc = subprocess.Popen(
            under + ["-m", "kvcheck.adapters.sglang.run_trace", "--serve"], cwd=str(ROOT), env=env,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            text=True, bufsize=1)
        self.dropped: list[int] = []    # handles of proxies gone, sent with the next call

    def call(self, msg: dict) -> dict:
        if self.dropped:
            msg = {**msg, "drop": self.dropped}
            self.dropped = []
        if self.proc.poll() is not None:
            raise RuntimeError(f"sglang server exited with status {self.proc.returncode}")
        self.proc.stdin.write(json.dumps(msg) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"sglang server closed the pipe (status {self.proc.poll()})")
        return json.loads(line)

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps({"cmd": "close"}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=5)
            except Exception:
                self.proc.kill()


_SERVERS: dict[tuple, _Server] = {}
"""(interpreter, $KVCHECK_SGLANG_PLANT) -> its served process: the server reads the planted
faults (adapters/sglang/faults.py) once, at start, so a run with a fault never reuses a
clean server, nor a clean run a planted one."""


@atexit.register
def _stop_all() -> None:
    for s in _SERVERS.values():
        s.stop()
    _SERVERS.clear()


def _server(python: str) -> _Server:
    """The served interpreter, started once per planted-fault set and kept."""
    from kvcheck.adapters.sglang.faults import ENV     # no sglang import: installers import it
    key = (python, os.environ.get(ENV, ""))
    server = _SERVERS.get(key)
    if server is None or server.proc.poll() is not None:
        server = _SERVERS[key] = _Server(python)
    return server


def _probe(cmd: str, cfg: Config, version: str, **fields) -> dict:
    """kvcheck.adapters.sglang.hybrid.<cmd> (or swa_unified.<cmd>) run by the served release
    VERSION; `fields` go along in the request."""
    python = resolve_python(version)
    reply = _server(python).call({"cmd": cmd, "config": cfg.to_json(), **fields})
    if "error" in reply:
        raise RuntimeError(f"[sglang-{version}] {reply['error']}")
    return reply


def swa_probe(cfg: Config, version: str) -> dict:
    return _probe("swa_probe", cfg, version)


def mamba_tree_probe(cfg: Config, version: str) -> dict:
    return _probe("mamba_tree_probe", cfg, version)


def swa_unified_probe(cfg: Config, version: str, names=None) -> dict:
    return _probe("swa_unified_probe", cfg, version, names=names)


def queued_borrowed_abort_probe(cfg: Config, version: str) -> dict:
    return _probe("queued_borrowed_abort_probe", cfg, version)


class SglangProxy:
    """Backend protocol over a served sglang venv."""

    def __init__(self, cfg: Config, version: str | None = None, python: str | None = None,
                 refuse: bool = True):
        """refuse=False: the served backend runs a config its release refuses (a probe or
        a campaign that examines why, e.g. SWA on 0.5.23: adapters/sglang/swa_unified.py)."""
        from kvcheck.adapters.sglang.wire import state_from_json, violation_from_json
        self._state_from_json, self._viol_from_json = state_from_json, violation_from_json
        self.cfg = cfg
        python = python or resolve_python(version)
        if python is None:
            raise SglangUnavailable("sglang is importable in-process; use make_backend()")
        server = self._server = _server(python)
        msg = {"cmd": "init", "config": cfg.to_json(), "version": version}
        if not refuse:
            msg["refuse"] = False
        reply = server.call(msg)
        if "error" in reply:
            raise SglangUnavailable(reply["error"])
        self.name = reply["backend"]
        self.version = reply["version"]
        self.api = reply["api"]
        self._own(reply["handle"])
        snap = server.call({"cmd": "state", "handle": self._handle})
        self._take(snap)

    def _own(self, handle: int) -> None:
        """Address the served backend `handle`; when this proxy goes, the server is told
        (with its next request) to drop it."""
        self._handle = handle
        weakref.finalize(self, self._server.dropped.append, handle)

    def fork(self) -> "SglangProxy":
        """An independent copy (the served release's bookkeeping deep-copied in its own
        process: SglangBackend.fork), for the exhaustive walk."""
        reply = self._server.call({"cmd": "fork", "handle": self._handle})
        if "error" in reply:
            raise RuntimeError(f"[{self.name}] fork: {reply['error']}")
        other = copy.copy(self)
        other._viol = list(self._viol)
        other._own(reply["handle"])
        return other

    def _take(self, reply: dict) -> None:
        self._state = self._state_from_json(reply["state"])
        self._viol = [self._viol_from_json(v) for v in reply["violations"]]
        self._past = reply.get("past_model")

    def apply(self, op: Op) -> str:
        reply = self._server.call({"cmd": "apply", "op": op.to_json(), "handle": self._handle})
        if "error" in reply:
            raise RuntimeError(f"[{self.name}] {reply['error']}")
        self._take(reply)
        return reply["outcome"]

    def abstract(self) -> AbstractState:
        return self._state

    def concrete_violations(self) -> list[Violation]:
        return list(self._viol)

    def past_model(self):
        """The served release's `SglangBackend.past_model` after the last step."""
        return self._past

    def close(self) -> None:
        pass


def make_backend(cfg: Config, version: str | None = None):
    """`--backend sglang[:VERSION]`."""
    python = resolve_python(version)
    if python is None:
        from kvcheck.adapters.sglang.backend import SglangBackend
        return SglangBackend(cfg, expect_version=version)
    return SglangProxy(cfg, version=version, python=python)
