"""`kvcheck replay TRACE --emit-pytest OUT.py`: the trace as a standalone pytest test,
the way Hypothesis prints a failing example as a program. The test rebuilds the
configuration and the operation list in Python (kvcheck.spec.config, kvcheck.spec.ops), runs them on the
chosen backend through kvcheck's API (kvcheck.replay.run_replay) and asserts the
trace's expectation as `kvcheck replay` judges it (matches_expectation): it passes
where the expectation holds and fails, with the failure printed, where it does not.
"""
from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

from kvcheck.replay import expected_failure


def _call(name: str, pairs) -> str:
    return f"{name}(" + ", ".join(f"{k}={v!r}" for k, v in pairs) + ")"


def expectation_text(exp, backend: str) -> str:
    want = expected_failure(exp, backend)
    if want is None:
        return f"every step passes on {backend}"
    inv, step, side = want
    return f"{inv} at {'step ' + str(step) if step is not None else 'some step'} on {side or 'any side'}"


def emit_pytest(trace, backend: str, source: str = "trace") -> str:
    """The text of the test module."""
    stem = re.sub(r"\W+", "_", Path(str(source)).stem).strip("_") or "trace"
    fault = trace.meta.get("planted_fault")
    note = ""
    if fault:
        note = (f"\nThe trace was found with impl's planted fault `{fault}` switched on;\n"
                f"this test does not switch it on (kvcheck.impl.faults.planted({fault!r}) does).\n")
    ops = "\n".join(f"    O.{_call(type(op).__name__, [(f.name, getattr(op, f.name)) for f in fields(op)])},"
                    for op in trace.ops)
    exp = trace.expect
    return f'''"""Replays {source} on {backend}; expects {expectation_text(exp, backend)}.
Emitted by `kvcheck replay {source} --backend {backend} --emit-pytest`.
{note}"""
from kvcheck.replay import matches_expectation, run_replay
from kvcheck.trace import Expect, Trace
from kvcheck.spec import ops as O
from kvcheck.spec.config import Config

BACKEND = {backend!r}
CONFIG = {_call("Config", trace.config.to_json().items())}
OPS = [
{ops}
]
EXPECT = {_call("Expect", exp.to_json().items())}


def test_{stem}():
    res = run_replay(Trace(CONFIG, OPS, EXPECT), BACKEND)
    ok = matches_expectation(EXPECT, res.failure, res.backend_name)
    got = res.failure.render() if res.failure else f"all {{res.steps}} steps passed"
    assert ok, "expected {expectation_text(exp, backend)}; got:\\n" + got
'''


def write_pytest(trace, out, backend: str, source: str = "trace") -> Path:
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(emit_pytest(trace, backend, source))
    return path
