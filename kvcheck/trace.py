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

Every error while reading a trace is a TraceError whose message names the file and
the place; nothing here lets a traceback reach the user.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from spec.config import Config, ConfigError
from spec.ops import Op, OpError, op_from_json

FORMAT = "kvcheck-trace"
FORMAT_VERSION = 1


class TraceError(ValueError):
    pass


@dataclass
class Expect:
    result: str = "pass"                # "pass" | "violation"
    invariant: Optional[str] = None     # e.g. "I2", "C1", "D1"
    step: Optional[int] = None
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


def parse(data, where: str = "trace") -> Trace:
    if not isinstance(data, dict):
        raise TraceError(f"{where}: a trace must be a JSON object, got {type(data).__name__}")
    meta = data.get("#meta", {})
    if not isinstance(meta, dict):
        raise TraceError(f"{where}: '#meta' must be an object")
    if meta.get("format", FORMAT) != FORMAT:
        raise TraceError(f"{where}: not a kvcheck trace (format {meta.get('format')!r})")
    if meta.get("format_version", FORMAT_VERSION) != FORMAT_VERSION:
        raise TraceError(f"{where}: unsupported format_version {meta.get('format_version')!r} "
                         f"(this kvcheck reads {FORMAT_VERSION})")
    for key in ("config", "ops"):
        if key not in data:
            raise TraceError(f"{where}: missing {key!r}")
    try:
        cfg = Config.from_json(data["config"])
    except (ConfigError, TypeError) as e:
        raise TraceError(f"{where}: config: {e}") from None
    if not isinstance(data["ops"], list):
        raise TraceError(f"{where}: 'ops' must be a list")
    ops = []
    for i, raw in enumerate(data["ops"]):
        try:
            ops.append(op_from_json(raw))
        except OpError as e:
            raise TraceError(f"{where}: ops[{i}]: {e}") from None
    exp = data.get("expect", {"result": "pass"})
    if not isinstance(exp, dict) or exp.get("result") not in ("pass", "violation"):
        raise TraceError(f"{where}: 'expect' must be {{\"result\": \"pass\"}} or "
                         f"{{\"result\": \"violation\", \"invariant\": ..., \"step\": ...}}")
    unknown = set(exp) - {"result", "invariant", "step", "backend"}
    if unknown:
        raise TraceError(f"{where}: expect: unknown field(s) {sorted(unknown)}")
    if exp["result"] == "violation" and not isinstance(exp.get("invariant"), str):
        raise TraceError(f"{where}: expect: a violation names its invariant id")
    if exp.get("step") is not None and not isinstance(exp.get("step"), int):
        raise TraceError(f"{where}: expect.step must be an integer")
    return Trace(cfg, ops, Expect(**exp), {k: v for k, v in meta.items()
                                           if k not in ("format", "format_version")})


def load(path) -> Trace:
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise TraceError(f"{path}: no such file") from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as e:
        raise TraceError(f"{path}: cannot read: {e}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise TraceError(f"{path}: not JSON: {e}") from None
    return parse(data, str(path))
