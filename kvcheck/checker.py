"""The refinement check: run one operation sequence on the spec and on a system under
test, compare them after every step, and evaluate every invariant on both sides.

spec state --abstract()--> AbstractState --+
                                           +--> canonical() equal?  invariants on each
backend    --abstract()--> AbstractState --+     concrete checks on the backend

A failure names the step, the operation, the invariant (or D1 for a state divergence,
D2 for an outcome divergence, E1 for an exception in the system under test, M1 for an
upstream assertion the spec itself reached) with the owner, the page and the numbers.
"""
from __future__ import annotations

import traceback
from dataclasses import dataclass, field
from typing import Callable, Optional

from spec.abstract import AbstractState, canonical, diff
from spec.config import Config
from spec.invariants import check_state, check_step
from spec.model import ModelError, enabled, initial_state, step
from spec.ops import Op
from spec.view import abstract
from spec.violations import Violation

DIVERGENCE = "D1"
OUTCOME_DIVERGENCE = "D2"
EXCEPTION = "E1"
SPEC_ASSERTION = "M1"
DISABLED = "X1"

FAILURE_NAMES = {
    DIVERGENCE: "state divergence between spec and system under test",
    OUTCOME_DIVERGENCE: "outcome divergence between spec and system under test",
    EXCEPTION: "raised an exception",
    SPEC_ASSERTION: "upstream assertion reached by the spec",
    DISABLED: "operation not enabled in this state",
}


@dataclass
class Failure:
    step: int
    op: Op
    id: str
    side: str
    violations: list = field(default_factory=list)
    details: list = field(default_factory=list)

    @property
    def name(self) -> str:
        if self.violations:
            return self.violations[0].name
        return FAILURE_NAMES.get(self.id, self.id)

    def render(self) -> str:
        lines = [f"FAIL at step {self.step}: {self.op}",
                 f"  {self.id} {self.name} (on {self.side})"]
        for v in self.violations[:12]:
            lines.append(f"  - {v}")
        if len(self.violations) > 12:
            lines.append(f"  ... {len(self.violations) - 12} more")
        for d in self.details[:30]:
            lines.append(f"  | {d}")
        return "\n".join(lines)


@dataclass
class StepRecord:
    index: int
    op: Op
    outcome: str
    spec_state: AbstractState
    backend_outcome: Optional[str] = None


@dataclass
class RunResult:
    steps: int
    failure: Optional[Failure]
    records: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.failure is None


def run_ops(cfg: Config, ops, backend=None, *, backend_name: str = "impl",
            check_spec: bool = True, keep_records: bool = False,
            on_step: Optional[Callable] = None) -> RunResult:
    """Run ops on the spec (and `backend` if given). Stops at the first failure."""
    s = initial_state(cfg)
    a_spec = abstract(s)
    records = []
    if backend is not None:
        backend._kvcheck_prev = backend.abstract()
    for i, op in enumerate(ops):
        if not enabled(s, op):
            return RunResult(i, Failure(i, op, DISABLED, "spec",
                                        details=["the spec's guard refuses this operation here"]), records)
        try:
            s, out = step(s, op)
        except ModelError as e:
            return RunResult(i, Failure(i, op, SPEC_ASSERTION, "spec", details=[str(e)]), records)
        except Exception as e:  # a defective spec (e.g. a planted spec mutant) crashed
            return RunResult(i, Failure(i, op, EXCEPTION, "spec", details=_tb(e)), records)
        b_spec = abstract(s)
        if check_spec:
            vs = check_state(b_spec, cfg) + check_step(a_spec, op, out, b_spec, cfg)
            if vs:
                return RunResult(i, _failure(i, op, "spec", vs), records)
        rec = StepRecord(i, op, out, b_spec)
        if backend is not None:
            fail = _check_backend(i, op, out, b_spec, backend, backend_name, cfg, rec)
            if fail is not None:
                if keep_records:
                    records.append(rec)
                return RunResult(i, fail, records)
        if keep_records:
            records.append(rec)
        if on_step is not None:
            on_step(rec)
        a_spec = b_spec
    return RunResult(len(ops), None, records)


def _tb(e: Exception) -> list:
    tb = traceback.format_exception(type(e), e, e.__traceback__)
    return [f"{type(e).__name__}: {e}"] + [ln.rstrip() for ln in tb[-6:]]


def _failure(i, op, side, vs) -> Failure:
    vs = [Violation(v.id, v.name, v.message, v.owner, v.page, side) for v in vs]
    return Failure(i, op, vs[0].id, side, vs)


def _check_backend(i, op, spec_out, b_spec, backend, name, cfg, rec) -> Optional[Failure]:
    prev = getattr(backend, "_kvcheck_prev", None)
    try:
        out = backend.apply(op)
        b_impl = backend.abstract()
        concrete = backend.concrete_violations()
    except Exception as e:  # the system under test crashed: that is a finding
        return Failure(i, op, EXCEPTION, name, details=_tb(e))
    rec.backend_outcome = out
    backend._kvcheck_prev = b_impl
    vs = list(concrete) + check_state(b_impl, cfg)
    if prev is not None:
        vs += check_step(prev, op, out, b_impl, cfg)
    if vs:
        return _failure(i, op, name, vs)
    if out != spec_out:
        return Failure(i, op, OUTCOME_DIVERGENCE, name,
                       details=[f"spec says {spec_out!r}, {name} says {out!r}"])
    ca, cb = canonical(b_spec), canonical(b_impl)
    if ca != cb:
        return Failure(i, op, DIVERGENCE, name, details=diff(ca, cb, "spec", name))
    return None
