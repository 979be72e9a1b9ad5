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

import copy
import traceback
from dataclasses import dataclass, field, fields, replace
from typing import Callable, Optional

from kvcheck.spec.abstract import AbstractState, canonical, diff
from kvcheck.spec.config import Config
from kvcheck.spec.invariants import check_state, check_step
from kvcheck.spec.model import ModelError, initial_state, refusal, step, within_accepted
from kvcheck.spec.ops import Op
from kvcheck.spec.progress import Drain, rescues
from kvcheck.spec.state import State
from kvcheck.spec.view import abstract
from kvcheck.spec.violations import Violation

REUSE_EQUAL_VERDICT = True
"""`Lockstep._check_backend` takes the spec's invariant verdict over for a backend step whose
states equal the spec's (tests compare both settings)."""

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
    backend_state: Optional[AbstractState] = None   # the backend's abstract state after op


RELEASE_SAME = "the same"
"""`Beyond.release` where the system under test, alone at a stop, showed what the spec
stopped at."""


def _shorten(said: str, limit: int = 300) -> str:
    """An exception's text cut to about `limit` characters, keeping the sglang line it
    came from (adapters/sglang/run_trace.py `error_text`: "... (at sglang/srt/...)")."""
    if len(said) <= limit:
        return said
    head, sep, at = said.rpartition(" (at sglang/")
    if not sep:
        return said[:limit] + "..."
    return head[:max(limit - len(sep) - len(at), 40)] + "..." + sep + at


def differ_kind(reason: str, release: Optional[str]) -> str:
    """`Beyond.kind` from a stop's reason and the release's verdict there."""
    return reason + ("-raised" if release is not None and release.startswith("raised ") else "")


@dataclass
class Beyond:
    """Under `Config.accept`, where the spec left what the model follows after it took
    upstream's behaviour for an accepted finding: from this step on nothing is compared.
    `reason`: "ModelError" (the spec reached an upstream assertion) or the first invariant
    outside the accepted findings' ACCEPTED_INVARIANTS it broke (`details`: all of them); or
    the system under test's own word that its state is past what the spec follows of it
    (`past_model()`, asked under `Config.accept` only: sglang 0.5.19-0.5.21's shared
    session record, "R1", adapters/sglang/backend.py)."""
    step: int
    op: Op
    reason: str
    details: list = field(default_factory=list)
    release: Optional[str] = None
    """Where a system under test ran beside the spec: what it did at that step, run alone
    (`Lockstep._release_at_stop`): "the same" (it breaks every invariant the spec broke
    there outside the accepted model, or raises the assertion the spec reached), or what it
    showed and which of the spec's it did not. Not
    compared; a stop where it differs is where to look next (a spec mistake past the
    model, as S9 was, or a consequence of the release's own)."""
    assertions: tuple = ()
    """A ModelError's `upstream`: the releases' own wordings of the assertion it reached."""
    release_past: Optional[str] = None
    """Where the system under test, alone at the stop, did not show the same: its own word
    (`past_model()`) that after the step it is past what the spec follows of it (sglang
    0.5.19-0.5.21's shared session record, R1), which explains the difference: not
    counted as differing, and no trace is written for it."""

    @property
    def kind(self) -> str:
        """How differing stops are told apart (the first of each is written as a trace):
        the spec's reason, with "-raised" where the system under test raised there (a
        release's own assertion or crash is never hidden behind an earlier stop of the
        same reason)."""
        return differ_kind(self.reason, self.release)

    @property
    def release_differs(self) -> bool:
        return self.release is not None and self.release != RELEASE_SAME \
            and self.release_past is None

    def render(self) -> str:
        return (f"beyond the accepted findings' model at step {self.step}: {self.op}: "
                f"{self.reason}" + "".join(f"\n  | {d}" for d in self.details[:12])
                + (f"\n  the system under test at that step, alone: {self.release}"
                   if self.release is not None else ""))


@dataclass
class RunResult:
    steps: int
    failure: Optional[Failure]
    records: list = field(default_factory=list)
    beyond: Optional[Beyond] = None
    """Set when the run stopped comparing (`Lockstep.beyond`); steps - beyond.step were
    not compared."""

    @property
    def ok(self) -> bool:
        return self.failure is None


class Lockstep:
    """The spec and (optionally) one system under test, advanced together one operation
    at a time; each step is checked as the module docstring says. `run_ops` and the
    Hypothesis machines both drive this, so a step is checked one way everywhere."""

    def __init__(self, cfg: Config, backend=None, backend_name: str = "impl",
                 check_spec: bool = True):
        self.cfg, self.backend, self.backend_name = cfg, backend, backend_name
        self.check_spec = check_spec
        self.state = initial_state(cfg)
        self.prev = abstract(self.state)
        self.steps = 0
        self.last_op: Optional[Op] = None
        self.beyond: Optional[Beyond] = None    # under Config.accept: past what the model follows
        self.fixed = initial_state(replace(cfg, accept=())) if cfg.accept else None
        """Under Config.accept, the fixed spec (no finding accepted) run on the same
        operations while it computes what this one does; None from the first step where
        they differ: an accepted finding's branch was taken (see `_took_upstream`)."""
        self.backend_prev = None    # the backend's abstract state after the last step
        self.backend_same = False   # ... and whether it equalled the spec's (values, ids)
        if backend is not None:
            self.backend_prev = backend.abstract()
            self.backend_same = self.backend_prev == self.prev

    def fork(self) -> "Lockstep":
        """An independent copy to go on from (kvcheck/engines/exhaustive.py): the spec's
        states are never mutated once made (a step returns a new one), so they are shared;
        the backend copies itself where it can (`fork()`: a served sglang release copies
        its bookkeeping in its own process) and is deep-copied otherwise (impl/'s tensors
        and tree copy in process)."""
        other = copy.copy(self)
        fork = getattr(self.backend, "fork", None)
        if fork is not None:        # a backend that copies itself (adapters/sglang: served)
            other.backend = fork()
        elif self.backend is not None:
            # values never mutated in place are shared, not copied: the configuration and
            # the backend's last abstract view (replaced, never changed, by each step)
            # values never mutated in place are shared, not copied
            other.backend = copy.deepcopy(self.backend, {id(self.cfg): self.cfg})
        return other

    def apply(self, op: Op) -> tuple[StepRecord, Optional[Failure]]:
        """Apply op on both sides; on success the lockstep advances."""
        i, cfg = self.steps, self.cfg
        rec = StepRecord(i, op, "", self.prev)
        if self.beyond is not None:
            return rec, None
        reason = refusal(self.state, op)
        if reason is not None:
            return rec, Failure(i, op, DISABLED, "spec",
                                details=[f"the spec's guard refuses this operation here: {reason}"])
        try:
            s, out = step(self.state, op)
        except ModelError as e:
            if self._took_upstream(op, error=e):    # an accepted finding led it there
                self.beyond = self._release_at_stop(Beyond(i, op, "ModelError", [str(e)],
                                                           assertions=e.upstream))
                return rec, None
            return rec, Failure(i, op, SPEC_ASSERTION, "spec", details=[str(e)])
        except Exception as e:  # a defective spec (e.g. a planted spec mutant) crashed
            return rec, Failure(i, op, EXCEPTION, "spec", details=_tb(e))
        b_spec = abstract(s)
        rec = StepRecord(i, op, out, b_spec)
        known, verdict = (), None
        taken = self._took_upstream(op, s, out)
        if self.check_spec:
            vs = check_state(b_spec, cfg) + check_step(self.prev, op, out, b_spec, cfg)
            verdict = vs
            if vs and not taken:    # the fixed spec breaks them too: a defect of the spec
                return rec, _failure(i, op, "spec", vs)
            if not within_accepted(cfg.accept, vs):
                self.beyond = self._release_at_stop(beyond_invariants(i, op, cfg.accept, vs))
                return rec, None    # consequences the model does not follow: stop comparing
            known = accepted(vs)
        if self.backend is not None:
            fail = self._check_backend(i, op, out, b_spec, rec, known, verdict)
            if isinstance(fail, Beyond):    # the release left what the spec follows of it
                self.beyond = fail
                return rec, None
            if fail is not None:
                return rec, fail
        self.state, self.prev, self.steps, self.last_op = s, b_spec, i + 1, op
        return rec, None

    def drain(self, skip: Optional[Callable] = None) -> tuple[list, Optional[Failure]]:
        """`Config.drain`: the scheduler alone from here (spec/progress.py `drain_op`), each
        of its operations applied and checked as any step; P1 when the spec is not idle
        within `drain_bound`. `skip(state, op)`: an operation the run leaves out (a
        recorded finding's trigger, as the walk leaves them out) ends the drain there, with
        no verdict on progress; so does, under `Config.accept`, a client's abort or close
        the drain needs to go on (`rescues`). Returns the steps' records (the failing one
        last) and the failure, if any."""
        records, course = [], Drain(self.state)
        while self.beyond is None and (op := course.next_op(self.state)) is not None:
            if (skip is not None and skip(self.state, op)) or \
                    (self.cfg.accept and rescues(self.state, op)):
                return records, None    # unjudged: a left-out trigger; under --accept, the
                                        # model follows a release's rounds, not its clients
            before = self.state
            rec, fail = self.apply(op)
            records.append(rec)
            if fail is not None:
                return records, fail
            course.applied(op, before, self.state)
        v = None if self.beyond is not None else course.verdict(self.state)
        if v is None:
            return records, None
        last = course.last or self.last_op
        if self.cfg.accept and self.fixed is None:  # after an accepted finding's branch: its
            self.beyond = Beyond(self.steps, last, v.id, [str(v)])  # consequence
            return records, None
        return records, _failure(self.steps, last, "spec", [v])

    def _release_at_stop(self, b: Beyond) -> Beyond:
        """The system under test, alone, on the step where the spec stopped comparing: does
        it break every invariant the spec broke outside the accepted findings' model there
        (or raise the assertion the spec reached)?
        Recorded on the stop (`Beyond.release`), counted by the engines; never a failure."""
        if self.backend is None:
            return b
        prev = self.backend_prev
        try:
            out = self.backend.apply(b.op)
            after = self.backend.abstract()
            vs = list(self.backend.concrete_violations()) + check_state(after, self.cfg)
            if prev is not None:
                vs += check_step(prev, b.op, out, after, self.cfg)
        except Exception as e:  # noqa: BLE001  (upstream raised, e.g. its own assertion)
            said = f"{type(e).__name__}: {e}"
            upstream = (b.details[0].split(":", 1)[0] if b.details else "?",) + b.assertions
            b.release = RELEASE_SAME if b.reason == "ModelError" and \
                any(a in said for a in upstream) else f"raised {_shorten(said)}"
            return b
        ids = {v.id for v in vs}
        shown = f"{', '.join(sorted(ids)) or 'no violation'} (outcome {out!r})"
        if b.reason == "ModelError":    # the spec reached an assertion the release did not
            b.release = f"{shown}; raised nothing"
            return b
        missing = sorted({d.split(" ", 1)[0] for d in b.details} - ids)
        b.release = RELEASE_SAME if not missing else f"{shown}; not {', '.join(missing)}"
        past = getattr(self.backend, "past_model", None)
        if missing and past is not None:
            b.release_past = past()
            if b.release_past:
                b.release += f"; past what the spec follows of it ({b.release_past})"
        return b

    def _check_backend(self, i, op, spec_out, b_spec, rec, known=frozenset(),
                       spec_verdict=None) -> Optional[Failure]:
        """`spec_verdict`: the invariants' violations on the spec's side of this step. When the
        backend's abstract states before and after the step equal the spec's (the same values,
        page and row ids included; about half the steps of a walk), the invariants, pure
        functions of those values, give the same violations, so they are taken over rather
        than evaluated a second time; and the canonical comparison is then trivially equal."""
        backend, name, cfg = self.backend, self.backend_name, self.cfg
        prev, was_same = self.backend_prev, self.backend_same
        try:
            out = backend.apply(op)
            observe = getattr(backend, "observe", None)     # both views from one snapshot
            b_impl, concrete = observe() if observe else (backend.abstract(),
                                                          backend.concrete_violations())
        except Exception as e:  # the system under test crashed: that is a finding
            return Failure(i, op, EXCEPTION, name, details=_tb(e))
        rec.backend_outcome = out
        rec.backend_state = b_impl
        self.backend_prev = b_impl
        past = getattr(backend, "past_model", None) if cfg.accept else None
        why = past() if past is not None else None
        if why:     # e.g. sglang 0.5.19-0.5.21 past U1/U2: two turns on one shared record
            return Beyond(i, op, why.split(":", 1)[0], [f"{name}: {why}"])
        same = self.backend_same = REUSE_EQUAL_VERDICT and b_impl == b_spec
        vs = list(concrete)
        if same and was_same and out == spec_out and spec_verdict is not None and prev is not None:
            vs += spec_verdict                  # the same (before, op, outcome, after) values
        else:
            vs += check_state(b_impl, cfg)
            if prev is not None:
                vs += check_step(prev, op, out, b_impl, cfg)
        vs = [v for v in vs if not _known(v, known)]
        if vs:
            return _failure(i, op, name, vs)
        if out != spec_out:
            return Failure(i, op, OUTCOME_DIVERGENCE, name,
                           details=[f"spec says {spec_out!r}, {name} says {out!r}"])
        if same:
            return None
        ca, cb = canonical(b_spec), canonical(b_impl)
        if ca != cb:
            return Failure(i, op, DIVERGENCE, name, details=diff(ca, cb, "spec", name))
        return None

    def _took_upstream(self, op: Op, s=None, out=None, error=None) -> bool:
        """Whether an accepted finding's branch has been taken, at this step or before:
        the fixed spec, stepped on `op` too, no longer computes what this spec did (its
        state, outcome or upstream assertion `error` differ). Until then any violation,
        or assertion, of this spec is the fixed spec's as well: a defect of the spec,
        reported as without `--accept`."""
        if self.fixed is None:
            return bool(self.cfg.accept)
        try:
            f, f_out = step(self.fixed, op)
            same = error is None and f_out == out and same_state(f, s)
        except ModelError as e:
            f, same = None, error is not None and str(e) == str(error)
        except Exception:       # noqa: BLE001  (it refuses or crashes where this one did not)
            f, same = None, False
        self.fixed = f if same else None
        return not same


STATE_FIELDS = tuple(f.name for f in fields(State) if f.name != "cfg")


def same_state(a: State, b: State) -> bool:
    """Equal spec states, whatever their configurations' `accept`."""
    return all(getattr(a, k) == getattr(b, k) for k in STATE_FIELDS)


def beyond_invariants(i: int, op: Op, accept, vs) -> Beyond:
    """The stop at step i: the spec's violations outside the accepted findings' set."""
    out = [v for v in vs if not within_accepted(accept, (v,))]
    return Beyond(i, op, out[0].id, [str(v) for v in out])


def run_ops(cfg: Config, ops, backend=None, *, backend_name: str = "impl",
            check_spec: bool = True, keep_records: bool = False,
            on_step: Optional[Callable] = None, skip: Optional[Callable] = None) -> RunResult:
    """Run ops on the spec (and `backend` if given). Stops at the first failure. `skip(state,
    op)`: an operation the run leaves out (a release's recorded finding's trigger, as the
    engines leave them out, `kvcheck.backends.known_findings`) ends the run there, unjudged,
    in the operations and in the drain alike; a shrinker that passes it keeps a failure from
    being shrunk onto a recorded finding."""
    lock = Lockstep(cfg, backend, backend_name, check_spec)
    records = []
    for i, op in enumerate(ops):
        if skip is not None and skip(lock.state, op):
            return RunResult(i, None, records)
        rec, fail = lock.apply(op)
        if keep_records and (fail is None or fail.side != "spec"):
            records.append(rec)
        if fail is not None:
            return RunResult(i, fail, records)
        if lock.beyond is not None:
            return RunResult(len(ops), None, records, lock.beyond)
        if on_step is not None:
            on_step(rec)
    if not cfg.drain:
        return RunResult(len(ops), None, records)
    drained, fail = lock.drain(skip)
    if keep_records:    # as above: a step the spec itself failed is not kept (P1 is no step)
        spec_step = fail is not None and fail.side == "spec" and fail.id != "P1"
        records += drained[:-1] if spec_step else drained
    if fail is not None:
        return RunResult(lock.steps, fail, records)
    if on_step is not None:
        for rec in drained:
            on_step(rec)
    return RunResult(len(ops) + len(drained), None, records, lock.beyond)


def _tb(e: Exception) -> list:
    tb = traceback.format_exception(type(e), e, e.__traceback__)
    return [f"{type(e).__name__}: {e}"] + [ln.rstrip() for ln in tb[-6:]]


def _failure(i, op, side, vs) -> Failure:
    vs = [Violation(v.id, v.name, v.message, v.owner, v.page, side) for v in vs]
    return Failure(i, op, vs[0].id, side, vs)


def accepted(spec_violations) -> frozenset:
    """`Config.accept`: the spec takes upstream's recorded behaviour, so the invariants it
    breaks itself at a step are that behaviour; the same (id, owner) on the system under
    test is not a finding. Anything else (another invariant, another owner, a state or
    outcome divergence) still is."""
    return frozenset((v.id, v.owner) for v in spec_violations)


def _known(v, known) -> bool:
    """Accepted: the spec shows it too; or a concrete check (C*, or an upstream leak check
    L*: only a concrete state can show them) while the spec itself is in a state its
    invariants reject."""
    return (v.id, v.owner) in known or (bool(known) and v.id[:1] in ("C", "L"))


