"""Trace files: one JSON object holding a configuration, an operation list and the
expected outcome. Shaped after the ITF format of Apalache and Quint where it costs
little (a `#meta` object; `states` with `#meta.index` when a trace records them).

    {
      "#meta": {"format": "kvcheck-trace", "format_version": 1, "source": "fuzz", ...},
      "config": {"page_size": 4, ...},
      "ops": [{"op": "open_session", "sid": 1}, ...],
      "expect": {"result": "pass"}
             or {"result": "violation", "invariant": "I2", "step": 7, "backend": "impl"}
    }

The format is kvcheck/schema.py's JSON Schema (published as docs/trace.schema.json,
generated from spec/ops.py and spec/config.py). Every error while reading a trace is a
TraceError whose one-line message names the file, the field and what it allows; nothing
here lets a traceback reach the user.
"""
from __future__ import annotations

import json
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from kvcheck.schema import FORMAT, FORMAT_VERSION, first_error
from kvcheck.spec.config import Config, ConfigError
from kvcheck.spec.ops import OpError, op_from_json


class TraceError(ValueError):
    pass


MAX_OPS = 100_000
"""The most operations a trace may hold: a replay runs about 1,000 a second (fuzz's
traces hold tens; a longer one is a mistake or an attack, not a counterexample)."""
MAX_BYTES = 64 << 20
"""The largest trace file read (100,000 operations take about 8 MiB)."""


@dataclass
class Expect:
    result: str = "pass"                # "pass" | "violation"
    invariant: Optional[str] = None     # e.g. "I2", "C1", "D1"
    step: Optional[int] = None          # with config.drain, past the ops: a drain step
    backend: Optional[str] = None       # the side it fails on ("spec", "impl", ...)

    def to_json(self) -> dict:
        out = {"result": self.result}
        for k in ("invariant", "step", "backend"):
            if getattr(self, k) is not None:
                out[k] = getattr(self, k)
        return out


@dataclass
class Trace:
    config: Config
    ops: list
    expect: Expect = field(default_factory=Expect)
    meta: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        meta = {"format": FORMAT, "format_version": FORMAT_VERSION, **self.meta}
        return {"#meta": meta, "config": self.config.to_json(),
                "ops": [op.to_json() for op in self.ops], "expect": self.expect.to_json()}

    def dumps(self) -> str:
        head = json.dumps({k: v for k, v in self.to_json().items() if k != "ops"}, indent=2)
        ops = ",\n".join("    " + json.dumps(op.to_json()) for op in self.ops)
        return head[:-2] + ',\n  "ops": [\n' + ops + "\n  ]\n}\n"

    def save(self, path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(self.dumps())
        tmp.replace(path)
        return path


def beyond_trace(cfg: Config, ops, beyond, meta: dict) -> Trace:
    """The trace of a run that stopped comparing past the accepted findings' model
    (`kvcheck.checker.Beyond`, at its last operation): expected to pass up to the stop,
    whose text (both sides' verdicts there) goes into `#meta.beyond`."""
    return Trace(cfg, list(ops), Expect("pass"), {**meta, "beyond": beyond.render()})


def failure_trace(cfg: Config, ops, failure, meta: dict) -> Trace:
    """The trace of a run that failed: its operations and, as the expectation, the failure
    (`kvcheck.checker.Failure`: id, step, side)."""
    return Trace(cfg, list(ops), Expect("violation", failure.id, failure.step, failure.side), meta)


def parse(data, where: str = "trace") -> Trace:
    if not isinstance(data, dict):
        raise TraceError(f"{where}: a trace must be a JSON object, got {type(data).__name__}")
    from kvcheck.itf_read import from_itf, is_itf
    if is_itf(data):                     # `kvcheck replay --itf`'s output, read back
        try:
            data = from_itf(data)
        except ValueError as e:
            raise TraceError(f"{where}: {e}") from None
    if isinstance(data.get("ops"), list) and len(data["ops"]) > MAX_OPS:
        raise TraceError(f"{where}: ops has {len(data['ops']):,} operations, more than the "
                         f"{MAX_OPS:,} a replay takes (about {MAX_OPS // 1000} s at 1,000 a "
                         "second); split the trace or shrink it")
    err = first_error(data)
    if err:
        if err.startswith("trace: missing 'expect'"):
            err += (' (every trace records what a replay must show: {"result": "pass"} or '
                    '{"result": "violation", "invariant": ID, "step": N})')
        raise TraceError(f"{where}: {err}")
    try:
        cfg = Config.from_json(data["config"])
        ops = []
        for i, raw in enumerate(data["ops"]):
            ops.append(op_from_json(raw))
    except ConfigError as e:
        raise TraceError(f"{where}: {e}") from None
    except OpError as e:
        raise TraceError(f"{where}: ops[{i}]: {e}") from None
    meta, exp = data.get("#meta", {}), Expect(**data["expect"])
    err = _cross_error(cfg, ops, exp)
    if err:
        raise TraceError(f"{where}: {err}")
    return Trace(cfg, ops, exp, {k: v for k, v in meta.items()
                                 if k not in ("format", "format_version")})


def _cross_error(cfg: Config, ops: list, exp: Expect):
    """What the schema cannot state: a field bounded by another part of the trace."""
    for i, op in enumerate(ops):
        drafts = getattr(op, "drafts", None)
        if drafts is not None and drafts > cfg.max_drafts:
            return f"ops[{i}].drafts must be <= config.max_drafts ({cfg.max_drafts}), got {drafts}"
    if exp.step is not None and exp.step >= len(ops) and not cfg.drain:
        return (f"expect.step must be an index into ops (0 to {len(ops) - 1}), got {exp.step}"
                if ops else "expect.step: the trace has no operations")
    return None


def load(path) -> Trace:
    path = Path(path)
    try:
        st = path.stat()
    except FileNotFoundError:
        raise TraceError(f"{path}: no such file") from None
    except OSError as e:
        raise TraceError(f"{path}: cannot read: {e.strerror or e}") from None
    if not stat.S_ISREG(st.st_mode) and not stat.S_ISDIR(st.st_mode):
        raise TraceError(f"{path}: not a regular file (a device, pipe or socket has no end "
                         "to read to)")
    if st.st_size > MAX_BYTES:
        raise TraceError(f"{path}: {st.st_size:,} bytes, more than the {MAX_BYTES:,} a trace "
                         f"may have (about {MAX_OPS:,} operations)")
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise TraceError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise TraceError(f"{path}: cannot read: {e}") from None
    try:
        data = json.loads(text)
    except RecursionError:
        raise TraceError(f"{path}: not a trace: JSON nested too deeply") from None
    except ValueError as e:     # JSONDecodeError, or an integer of over 4300 digits
        raise TraceError(f"{path}: not JSON: {e}") from None
    return parse(data, str(path))
