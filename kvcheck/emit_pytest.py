"""`kvcheck replay TRACE --emit-pytest OUT.py`: the trace as a standalone pytest test,
the way Hypothesis prints a failing example as a program. The test rebuilds the
configuration and the operation list in Python (kvcheck.spec.config, kvcheck.spec.ops) and runs them on
the chosen backend through kvcheck's API (kvcheck.replay.run_replay).

Two styles (`--emit-style`):
- `fixed` (the default): a reproducer for a maintainer's test suite. It asserts the
  correct behaviour, every step passing on the backend, so it fails, with the failure
  printed, while the defect is there and passes once it is fixed. It is named after the
  invariant that fails and the operation where it does
  (`test_I13_holds_at_close_session`).
- `recorded`: a corpus entry. It asserts the trace's recorded expectation as
  `kvcheck replay` judges it (matches_expectation), so it passes while the recorded
  outcome holds, the defect included.
"""
from __future__ import annotations

import re
from pathlib import Path

from kvcheck.replay import expected_failure

STYLES = ("fixed", "recorded")
DEFAULT_STYLE = "fixed"


def _call(name: str, pairs) -> str:
    return f"{name}(" + ", ".join(f"{k}={v!r}" for k, v in pairs) + ")"


def expectation_text(exp, backend: str) -> str:
    want = expected_failure(exp, backend)
    if want is None:
        return f"every step passes on {backend}"
    inv, step, side = want
    return f"{inv} at {'step ' + str(step) if step is not None else 'some step'} on {side or 'any side'}"


def _ident(text: str) -> str:
    return re.sub(r"\W+", "_", text).strip("_")


def test_name(trace, backend: str, source: str, style: str) -> str:
    """`test_<invariant>_holds_at_<operation>` for a fixed-style test of a recorded failure,
    else `test_<the trace file's stem>`."""
    stem = _ident(Path(str(source)).stem) or "trace"
    want = expected_failure(trace.expect, backend)
    if style == "recorded" or want is None:
        return f"test_{stem}"
    inv, step, _ = want
    op = trace.ops[step].name if step is not None and step < len(trace.ops) else "some_step"
    return f"test_{_ident(inv)}_holds_at_{_ident(op)}"


def _assertion(style: str, exp, backend: str) -> tuple:
    """(the module docstring's claim, the test body's check)."""
    if style == "recorded":
        return (f"expects {expectation_text(exp, backend)} (the recorded outcome)",
                f'''    ok = matches_expectation(EXPECT, res.failure, res.backend_name)
    got = res.failure.render() if res.failure else f"all {{res.steps}} steps passed"
    assert ok, "expected {expectation_text(exp, backend)}; got:\\n" + got''')
    recorded = expectation_text(exp, backend)
    return (f"expects every step to pass on {backend} (recorded: {recorded}); it fails "
            "while the defect is there and passes once it is fixed",
            '''    assert res.failure is None, "the defect is still there:\\n" + res.failure.render()''')


def emit_pytest(trace, backend: str, source: str = "trace", style: str = DEFAULT_STYLE) -> str:
    """The text of the test module."""
    if style not in STYLES:
        raise ValueError(f"unknown style {style!r}; use one of {', '.join(STYLES)}")
    fault = trace.meta.get("planted_fault")
    note = ""
    if fault:
        note = (f"\nThe trace was found with impl's planted fault `{fault}` switched on;\n"
                f"this test does not switch it on (kvcheck.impl.faults.planted({fault!r}) does).\n")
    ops = "\n".join(f"    O.{_call(type(op).__name__, op.args())},"
                    for op in trace.ops)
    exp = trace.expect
    claim, body = _assertion(style, exp, backend)
    imports = "matches_expectation, run_replay" if style == "recorded" else "run_replay"
    flag = "" if style == DEFAULT_STYLE else f" --emit-style {style}"
    return f'''"""Replays {source} on {backend}.
{claim[0].upper() + claim[1:]}.
Emitted by `kvcheck replay {source} --backend {backend} --emit-pytest{flag}`.
{note}"""
from kvcheck.replay import {imports}
from kvcheck.trace import Expect, Trace
from kvcheck.spec import ops as O
from kvcheck.spec.config import Config

BACKEND = {backend!r}
CONFIG = {_call("Config", trace.config.to_json().items())}
OPS = [
{ops}
]
EXPECT = {_call("Expect", exp.to_json().items())}


def {test_name(trace, backend, source, style)}():
    res = run_replay(Trace(CONFIG, OPS, EXPECT), BACKEND)
{body}
'''


def write_pytest(trace, out, backend: str, source: str = "trace",
                 style: str = DEFAULT_STYLE) -> Path:
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(emit_pytest(trace, backend, source, style))
    return path
