"""The Hypothesis state machine: every operation of spec/ops is a rule.

One machine class, built by `make_machine(backend_factory)`: with no backend it checks
the spec alone (all invariants after every step); with a backend it is the
differential machine (abstract states equal after every step, spec invariants on
both sides, concrete invariants on the backend). A failure raises an AssertionError
whose text is the checker's report; the operations of the failing run are kept in
`LAST_FAILURE` so a driver can write the shrunk trace.

Each rule draws its operation's arguments through the shared table
(`kvcheck.engines.gen.ARGS`, the same one the walk engine uses) with Hypothesis as the
source of choices, so the biases (page boundaries, shared prefixes, full pools) are
defined once. `make test` runs this machine; `kvcheck fuzz --engine hypothesis` too.
"""
from __future__ import annotations

from hypothesis import event, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvcheck.checker import Failure, Lockstep
from kvcheck.engines import profiles  # noqa: F401  (registers the settings profiles)
from kvcheck.engines.gen import (ARGS, MAX_LIVE_REQS, MAX_SESSIONS, Ctx, HypothesisDrawer,
                                 Stats, draw_config)
from spec.model import enabled, step  # noqa: F401  (step: used by benchmarks.bench_diff)

LAST_FAILURE: dict = {}
"""{"config": Config, "ops": [...], "failure": Failure} of the most recent failing run."""

STATS = Stats()
"""Applied steps per operation and outcome, steps and sequences, across all runs of the
process (a driver clears it before a run)."""


@st.composite
def configs(draw, page_sizes=(1, 2, 4), spec_enabled=None, era=None):
    return draw_config(HypothesisDrawer(draw, labelled=False), page_sizes, spec_enabled, era)


class KVMachine(RuleBasedStateMachine):
    backend_factory = None      # set by make_machine
    backend_name = "impl"
    config_strategy = configs()

    def __init__(self):
        super().__init__()
        self.cfg = None
        self.lock = None
        self.ops: list = []
        self.next_id = 1

    @property
    def s(self):
        """The spec state (None before set-up): the live bundles are read off it."""
        return None if self.lock is None else self.lock.state

    @property
    def backend(self):
        return None if self.lock is None else self.lock.backend

    # -- set-up -------------------------------------------------------------
    @initialize(data=st.data())
    def setup(self, data):
        cfg = data.draw(type(self).config_strategy, label="config")
        self.cfg = cfg
        STATS.sequences += 1
        factory = type(self).backend_factory
        self.lock = Lockstep(cfg, factory(cfg) if factory is not None else None,
                             self.backend_name)
        event(f"P={cfg.page_size} spec={cfg.spec_enabled} overlap={cfg.overlap} era={cfg.era}")

    def teardown(self):
        if self.backend is not None and hasattr(self.backend, "close"):
            self.backend.close()

    # -- the one place an op is applied -----------------------------------
    skip = None                 # (state, op) -> reason to leave op out (a recorded finding)

    def _fresh(self) -> int:
        self.next_id += 1
        return self.next_id

    def draw_and_apply(self, name: str, data) -> None:
        """Draw operation `name`'s arguments from the shared table, then apply it."""
        op = ARGS[name](Ctx(self.s, self._fresh), HypothesisDrawer(data.draw))
        if op is not None:
            self.apply(op)

    def apply(self, op):
        if not enabled(self.s, op):
            event("skipped: not enabled")
            return
        if self.skip is not None:
            reason = type(self).skip(self.s, op)
            if reason:
                event(f"skipped: recorded finding {reason}")
                return
        self.ops.append(op)
        rec, fail = self.lock.apply(op)
        if fail is not None:
            self._fail(fail)
        STATS.record(op, rec.outcome)
        event(f"op {op.name} -> {rec.outcome}")

    def _fail(self, failure: Failure):
        LAST_FAILURE.clear()
        LAST_FAILURE.update(config=self.cfg, ops=list(self.ops), failure=failure)
        raise AssertionError(failure.render())

    def has(self, *phases) -> bool:
        return self.s is not None and any(r.phase in phases for r in self.s.reqs.values())

    @staticmethod
    def rare(data, one_in: int = 3) -> bool:
        """Hypothesis cannot weight rules; the ops that end or reset things (close,
        aborts, opening, plain requests, eviction) go ahead one time in `one_in`, so that
        sequences get deep enough for multi-turn sessions, retracts and spec steps."""
        return data.draw(st.integers(0, one_in - 1), label="go") == 0

    # -- rules: one per operation (arguments: kvcheck.engines.gen.ARGS) -------------
    @precondition(lambda self: self.s is not None and len(self.s.sessions) < MAX_SESSIONS)
    @rule(data=st.data())
    def open_first_session(self, data):
        if not self.s.sessions:
            self.draw_and_apply("open_session", data)

    @precondition(lambda self: self.s is not None and len(self.s.sessions) < MAX_SESSIONS)
    @rule(data=st.data())
    def open_session(self, data):
        if self.rare(data, 6):
            self.draw_and_apply("open_session", data)

    @precondition(lambda self: self.s is not None and self.s.sessions and len(self.s.reqs) < MAX_LIVE_REQS)
    @rule(data=st.data())
    def submit_turn(self, data):
        idle = any(v.inflight_rid is None for v in self.s.sessions.values())
        if idle or self.rare(data, 4):
            self.draw_and_apply("submit_turn", data)

    @precondition(lambda self: self.s is not None and len(self.s.reqs) < MAX_LIVE_REQS)
    @rule(data=st.data())
    def submit_request(self, data):
        if self.rare(data, 5):
            self.draw_and_apply("submit_request", data)

    @precondition(lambda self: self.has("queued"))
    @rule(data=st.data())
    def schedule(self, data):
        self.draw_and_apply("schedule", data)

    @precondition(lambda self: self.has("prefill"))
    @rule(data=st.data())
    def prefill_chunk(self, data):
        self.draw_and_apply("prefill_chunk", data)

    @precondition(lambda self: self.has("decode") and not self.cfg.spec_enabled)
    @rule(data=st.data())
    def decode(self, data):
        self.draw_and_apply("decode", data)

    @precondition(lambda self: self.has("decode") and self.cfg.spec_enabled)
    @rule(data=st.data())
    def spec_decode(self, data):
        self.draw_and_apply("spec_decode", data)

    @precondition(lambda self: self.has("decode"))
    @rule(data=st.data())
    def finish(self, data):
        self.draw_and_apply("finish", data)

    @precondition(lambda self: self.has("queued"))
    @rule(data=st.data())
    def abort_queued(self, data):
        if self.rare(data, 5):
            self.draw_and_apply("abort_queued", data)

    @precondition(lambda self: self.has("queued"))
    @rule(data=st.data())
    def pre_abort(self, data):
        if self.rare(data, 5):
            self.draw_and_apply("pre_abort", data)

    @precondition(lambda self: self.has("prefill", "decode"))
    @rule(data=st.data())
    def abort_running(self, data):
        if self.rare(data):
            self.draw_and_apply("abort_running", data)

    @precondition(lambda self: self.has("decode"))
    @rule(data=st.data())
    def retract(self, data):
        self.draw_and_apply("retract", data)

    @precondition(lambda self: self.s is not None and self.s.sessions)
    @rule(data=st.data())
    def close_session(self, data):
        if self.rare(data, 6):
            self.draw_and_apply("close_session", data)

    @precondition(lambda self: self.s is not None and self.s.evictable_size > 0)
    @rule(data=st.data())
    def evict(self, data):
        if self.rare(data):
            self.draw_and_apply("evict", data)

    @invariant()
    def spec_state_checked(self):
        # evaluated in apply() after every step on both sides; this hook only guards
        # against a run that never set up.
        assert self.s is None or self.cfg is not None


def make_machine(backend_factory=None, name: str = "impl", config_strategy=None, skip=None):
    attrs = {"backend_factory": staticmethod(backend_factory) if backend_factory else None,
             "backend_name": name, "skip": staticmethod(skip) if skip else None}
    cls = type(f"KVMachine_{name if backend_factory else 'spec'}", (KVMachine,), attrs)
    if config_strategy is not None:
        cls.config_strategy = config_strategy
    return cls
