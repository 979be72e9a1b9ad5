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
from kvcheck.engines.configs import draw_config
from kvcheck.engines.draw import HypothesisDrawer
from kvcheck.engines.gen import ARGS, MAX_LIVE_REQS, MAX_SESSIONS, Ctx
from kvcheck.engines.stats import Stats, paths_of
from kvcheck.spec.actions import ACTIONS
from kvcheck.spec.model import enabled, step  # noqa: F401  (step: used by benchmarks.bench_diff)

LAST_FAILURE: dict = {}
"""{"config": Config, "ops": [...], "failure": Failure} of the most recent failing run."""

STATS = Stats()
"""Applied steps per operation and outcome, steps and sequences, across all runs of the
process (a driver clears it before a run)."""


@st.composite
def configs(draw, page_sizes=(1, 2, 4), spec_enabled=None, era=None, accept=(), hybrid=None,
            hybrid_kinds=(), tree_off=True):
    return draw_config(HypothesisDrawer(draw, labelled=False), page_sizes, spec_enabled, era,
                       accept, hybrid, hybrid_kinds, tree_off)


def _op_rule(name: str, guard, one_in: int = 1):
    """The rule for operation `name`: when `guard` holds, go ahead one time in `one_in`
    (Hypothesis cannot weight rules: the ops that end or reset things are made rare so
    sequences get deep), then draw the arguments from the shared table and apply."""
    @precondition(guard)
    @rule(data=st.data())
    def op_rule(self, data):
        if one_in == 1 or self.rare(data, one_in):
            self.draw_and_apply(name, data)
    op_rule.__name__ = name
    return op_rule


def _rid_rule(name: str, one_in: int = 1, spec_enabled=None):
    """The rule for operation `name`, which acts on a live request: while one is in a
    phase its action acts on (`ACTIONS[name].acts_on`) and, where given, the config's
    `spec_enabled` is that (decode or spec_decode steps)."""
    phases = ACTIONS[name].acts_on
    assert phases, f"{name} acts on no live request"
    if spec_enabled is None:
        return _op_rule(name, lambda self: self.has(*phases), one_in)
    return _op_rule(name, lambda self: (self.has(*phases)
                                        and bool(self.cfg.spec_enabled) == spec_enabled), one_in)


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
        if self.lock.beyond is not None:    # nothing is compared past it
            STATS.not_compared += 1
            return
        if not enabled(self.s, op):
            event("skipped: not enabled")
            return
        if self.skip is not None:
            reason = type(self).skip(self.s, op)
            if reason:
                event(f"skipped: recorded finding {reason}")
                return
        self.ops.append(op)
        paths = paths_of(self.s, op)
        rec, fail = self.lock.apply(op)
        if fail is not None:
            self._fail(fail)
        if self.lock.beyond is not None:
            STATS.record_beyond(self.lock.beyond.reason, 1)
            return
        STATS.record(op, rec.outcome, paths)
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

    # -- rules: one per operation (arguments: kvcheck.engines.gen.ARGS; an operation on a
    # live request runs while one is in a phase it acts on, kvcheck.spec.actions) -------
    @precondition(lambda self: self.s is not None and len(self.s.sessions) < MAX_SESSIONS)
    @rule(data=st.data())
    def open_first_session(self, data):
        if not self.s.sessions:
            self.draw_and_apply("open_session", data)

    @precondition(lambda self: self.s is not None and self.s.sessions and len(self.s.reqs) < MAX_LIVE_REQS)
    @rule(data=st.data())
    def submit_turn(self, data):
        idle = any(v.inflight_rid is None for v in self.s.sessions.values())
        if idle or self.rare(data, 4):
            self.draw_and_apply("submit_turn", data)

    open_session = _op_rule("open_session", lambda self: self.s is not None
                            and len(self.s.sessions) < MAX_SESSIONS, one_in=6)
    submit_request = _op_rule("submit_request", lambda self: self.s is not None
                              and len(self.s.reqs) < MAX_LIVE_REQS, one_in=5)
    schedule = _rid_rule("schedule")
    schedule_round = _op_rule("schedule_round", lambda self: self.has("queued", "prefill"))
    decode_round = _op_rule("decode_round", lambda self: self.has("decode")
                            and not self.cfg.spec_enabled and not self.cfg.hybrid)
    prefill_chunk = _rid_rule("prefill_chunk")
    decode = _rid_rule("decode", spec_enabled=False)
    spec_decode = _rid_rule("spec_decode", spec_enabled=True)
    finish = _rid_rule("finish")
    abort_queued = _rid_rule("abort_queued", one_in=5)
    queue_reject = _rid_rule("queue_reject", one_in=5)
    pre_abort = _rid_rule("pre_abort", one_in=5)
    abort_running = _rid_rule("abort_running", one_in=3)
    retract = _rid_rule("retract")
    close_session = _op_rule("close_session", lambda self: self.s is not None and self.s.sessions,
                             one_in=6)
    evict = _op_rule("evict", lambda self: self.s is not None and self.s.evictable_size > 0,
                     one_in=3)

    @invariant()
    def spec_state_checked(self):
        # evaluated in apply() after every step on both sides; this hook only guards
        # against a run that never set up.
        assert self.s is None or self.cfg is not None


for _name, _action in ACTIONS.items():     # an operation on a live request with no rule above
    if _action.acts_on and _name not in vars(KVMachine):   # runs while one is in its phases
        setattr(KVMachine, _name, _rid_rule(_name))
assert all(n in vars(KVMachine) for n in ACTIONS), "KVMachine needs a rule per operation"


def make_machine(backend_factory=None, name: str = "impl", config_strategy=None, skip=None):
    attrs = {"backend_factory": staticmethod(backend_factory) if backend_factory else None,
             "backend_name": name, "skip": staticmethod(skip) if skip else None}
    cls = type(f"KVMachine_{name if backend_factory else 'spec'}", (KVMachine,), attrs)
    if config_strategy is not None:
        cls.config_strategy = config_strategy
    return cls
