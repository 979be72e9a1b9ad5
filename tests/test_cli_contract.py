"""The command-line contract CI relies on: exit 0 nothing found, 1 a finding,
2 a usage or input error reported as ONE line naming the flag or field (and what it
allows) before any work starts, 130 interrupted; never a traceback.

Most cases run in-process through `kvcheck.cli.main` (fast); the ones about memory and
the recursion limit run as subprocesses under a memory ulimit.
"""
from __future__ import annotations

import json
import os
import re
import resource
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from kvcheck import cli

ROOT = Path(__file__).resolve().parents[1]
REG = ROOT / "stateful_tests" / "regressions"
UPSTREAM = ROOT / "stateful_tests" / "upstream"
WORKED = str(REG / "worked_example_5_4.json")
PASS = {"result": "pass"}


def run_main(capsys, argv):
    rc = cli.main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def assert_usage_error(rc, out, err, cmd, needle):
    assert rc == 2, (rc, out, err)
    assert "Traceback" not in out + err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"kvcheck {cmd}: error: "), err
    assert needle in lines[0], (needle, err)


# --- bad arguments: (argv, the flag or field the one line must name) ----------------

BAD_ARGS = [
    (["check", "--backend", "foo"], "unknown backend 'foo'"),
    (["check", "--backend", "sglang:9.9.9"], "no .venv-sglang-9.9.9"),
    (["check", "--backend", "sglang:abc"], "VERSION must be a release number"),
    (["check", "--backend", "sglang:"], "VERSION must be a release number"),
    (["check", "--backend", "sglang-1.x"], "VERSION must be a release number"),
    (["check", "--backend", ""], "unknown backend"),
    (["check", "--examples", "0"], "--examples: must be an integer >= 1"),
    (["check", "--examples", "-5"], "--examples: must be an integer >= 1"),
    (["check", "--examples", "ten"], "--examples"),
    (["check", "--examples", "1.5"], "--examples"),
    (["check", "--out", "/etc/passwd"], "--out: /etc/passwd is a file"),
    (["check", "--out", "/etc/passwd/sub"], "--out"),
    (["check", "--junit-xml", "/tmp"], "--junit-xml: /tmp is a folder"),
    (["check", "--junit-xml", "/nonexistent-dir/x.xml"], "--junit-xml"),
    (["check", "--json", "/nonexistent-dir/x.json"], "--json"),
    (["check", "--bogus"], "unrecognized arguments: --bogus"),
    (["check", "extra"], "unrecognized arguments: extra"),
    (["fuzz", "--seconds", "nan"], "--seconds: must be a finite number > 0"),
    (["fuzz", "--seconds", "inf"], "--seconds"),
    (["fuzz", "--seconds", "-1"], "--seconds"),
    (["fuzz", "--seconds", "0"], "--seconds"),
    (["fuzz", "--seconds", "abc"], "--seconds"),
    (["fuzz", "--seed", "-1"], "--seed: must be an integer in [0, 18446744073709551615]"),
    (["fuzz", "--seed", "x"], "--seed"),
    (["fuzz", "--seed", str(2**64)], "--seed"),
    (["fuzz", "--out", "/etc/passwd"], "--out: /etc/passwd is a file"),
    (["fuzz", "--out", "/proc/kvcheck-out"], "--out: /proc is not writable"),
    (["fuzz", "--backend", "tpu"], "unknown backend 'tpu'"),
    (["fuzz", "--backend", "sglang"], "--backend"),
    (["selftest", "--seconds", "-1"], "--seconds: must be a finite number > 0"),
    (["selftest", "--shrink-replays", "-1"], "--shrink-replays"),
    (["selftest", "--seed", "-3"], "--seed"),
    (["selftest", "--out", "/etc/passwd"], "--out"),
    (["selftest", "--seconds", "1", "no_such_fault"], "unknown fault(s) ['no_such_fault']"),
    (["explore", "--max-states", "0"], "--max-states: must be an integer >= 1"),
    (["explore", "--max-states", "-4"], "--max-states"),
    (["explore", "--max-seconds", "nan"], "--max-seconds"),
    (["explore", "--max-depth", "0"], "--max-depth"),
    (["explore", "--pages", "0"], "--pages"),
    (["explore", "--pages", str(10**12)], "config.num_pages must be an integer in [1, 65536]"),
    (["explore", "--rows", str(10**9)], "config.num_rows must be an integer in [1, 256]"),
    (["explore", "--context", str(2**40)], "config.max_context_len"),
    (["explore", "--page-size", "3", "--context", "8"], "multiple of page_size"),
    (["explore", "--preset", "nope"], "unknown preset 'nope'"),
    (["explore", "--max-new", "-1"], "--max-new"),
    (["explore", "--turns", "a;b"], "--turns"),
    (["explore", "--era", "v3"], "--era"),
    (["explore", "--out", "/etc/passwd"], "--out"),
    (["replay", WORKED, "--backend", "nope"], "unknown backend 'nope'"),
    (["replay", WORKED, "--plant", "nope"], "--plant: unknown planted fault 'nope'"),
    (["replay", WORKED, "--plant", "free_tail_unaligned", "--backend", "spec"], "--plant"),
    (["replay", "/nonexistent.json"], "no such file"),
    (["replay", "/tmp"], "cannot read"),
    (["replay"], "the following arguments are required: trace"),
    (["explain", "I99"], "unknown failure id(s) ['I99']"),
    (["prove", "--fast"], "unrecognized arguments"),
]


@pytest.mark.parametrize("argv,needle", BAD_ARGS, ids=[" ".join(a)[:60] for a, _ in BAD_ARGS])
def test_bad_argument_is_one_line_exit_2_before_work(capsys, argv, needle):
    rc, out, err = run_main(capsys, argv)
    assert_usage_error(rc, out, err, argv[0], needle)
    assert out == ""                       # nothing ran


def test_unknown_command_and_no_command(capsys):
    rc, out, err = run_main(capsys, ["frobnicate"])
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "invalid choice" in err
    rc, out, err = run_main(capsys, [])
    assert rc == 2 and "usage: kvcheck" in err


# --- bad trace files: (content, the field the one line must name) -------------------

def trace(**kw):
    return {"config": {}, "ops": [], "expect": PASS, **kw}


def op(name, **fields):
    return {"op": name, **fields}


SUBMIT = dict(rid=1, tokens=[1, 2], max_new_tokens=2)
BAD_TRACES = [
    ("not json", "not JSON"),
    ("", "not JSON"),
    ("[]", "must be a JSON object"),
    ("1" * 5000, "not JSON"),
    (trace(expected=PASS), "unknown field(s) ['expected']"),
    ({"config": {}, "ops": []}, "missing 'expect'"),
    ({"ops": [], "expect": PASS}, "missing 'config'"),
    ({"config": {}, "expect": PASS}, "missing 'ops'"),
    (trace(ops={}), "ops must be an array"),
    (trace(expect={"result": "maybe"}), "expect.result must be one of pass, violation"),
    (trace(expect={"result": "violation"}), "expect: missing 'invariant'"),
    (trace(expect={"result": "violation", "invariant": "I99"}), "expect.invariant must be one of"),
    (trace(expect={"result": "pass", "backend": "tpu"}), "expect.backend must be spec, impl"),
    (trace(expect={"result": "pass", "step": 999}), "expect.step"),
    (trace(ops=[op("open_session", sid=1)], expect={"result": "pass", "step": 999}),
     "expect.step must be an index into ops (0 to 0)"),
    (trace(expect={"result": "pass", "step": -1}), "expect.step"),
    (trace(expect={"result": "pass", "why": 1}), "expect: unknown field(s) ['why']"),
    (trace(expect="pass"), "expect must be an object"),
    (trace(**{"#meta": []}), "#meta must be an object"),
    (trace(**{"#meta": {"format": "itf"}}), "#meta.format must be \"kvcheck-trace\""),
    (trace(**{"#meta": {"format_version": 2}}), "#meta.format_version must be 1"),
    (trace(config=[]), "config must be an object"),
    (trace(config={"page_size": 0}), "config.page_size must be an integer in [1, 64]"),
    (trace(config={"num_pages": 10**12}), "config.num_pages must be an integer in [1, 65536]"),
    (trace(config={"num_rows": 10**9}), "config.num_rows must be an integer in [1, 256]"),
    (trace(config={"max_context_len": 2**40}), "config.max_context_len must be an integer in [2,"),
    (trace(config={"max_context_len": 1}), "config.max_context_len"),
    (trace(config={"page_size": 2, "max_context_len": 7}), "multiple of page_size"),
    (trace(config={"page_size": 4, "chunk_size": 2}), "config.chunk_size (2) must be >= page_size"),
    (trace(config={"chunk_size": "a"}), "config.chunk_size"),
    (trace(config={"max_drafts": 0}), "config.max_drafts"),
    (trace(config={"era": "v3"}), "config.era must be one of wrapper, borrow"),
    (trace(config={"spec_enabled": 1}), "config.spec_enabled must be a boolean"),
    (trace(config={"overlap": "yes"}), "config.overlap"),
    (trace(config={"bogus": 1}), "config: unknown field(s) ['bogus']"),
    (trace(config={"num_pages": 1.5}), "config.num_pages"),
    (trace(ops=[op("teleport")]), "ops[0].op must be one of"),
    (trace(ops=[{"rid": 1}]), "ops[0]: missing 'op'"),
    (trace(ops=[1]), "ops[0] must be an object"),
    (trace(ops=[op("decode")]), "ops[0]: missing 'rid'"),
    (trace(ops=[op("decode", rid="x")]), "ops[0].rid must be an integer"),
    (trace(ops=[op("decode", rid=-1)]), "ops[0].rid must be an integer in [0, 2147483647]"),
    (trace(ops=[op("decode", rid=True)]), "ops[0].rid"),
    (trace(ops=[op("decode", rid=1, token=-5)]), "ops[0].token"),
    (trace(ops=[op("decode", rid=1, extra=2)]), "ops[0]: unknown field(s) ['extra']"),
    (trace(ops=[op("submit_request", rid=1, tokens=[10**30], max_new_tokens=1)]),
     "ops[0].tokens[0] must be an integer in [0, 2147483647]"),
    (trace(ops=[op("submit_request", rid=1, tokens=[-1], max_new_tokens=1)]), "ops[0].tokens[0]"),
    (trace(ops=[op("submit_request", rid=1, tokens=[1, "a"], max_new_tokens=1)]), "ops[0].tokens[1]"),
    (trace(ops=[op("submit_request", rid=1, tokens=[], max_new_tokens=1)]),
     "ops[0].tokens must have 1 to 16384 items, got 0"),
    (trace(ops=[op("submit_request", rid=1, tokens=5, max_new_tokens=1)]), "ops[0].tokens must be an array"),
    (trace(ops=[op("submit_request", rid=1, tokens=[1], max_new_tokens=10**30)]),
     "ops[0].max_new_tokens must be an integer in [1, 16384]"),
    (trace(ops=[op("submit_request", rid=1, tokens=[1], max_new_tokens=0)]), "ops[0].max_new_tokens"),
    (trace(ops=[op("submit_turn", sid=1, rid=1, new_tokens=[], max_new_tokens=1)]),
     "ops[0].new_tokens must have 1 to"),
    (trace(ops=[op("submit_turn", sid=-1, rid=1, new_tokens=[1], max_new_tokens=1)]), "ops[0].sid"),
    (trace(ops=[op("spec_decode", rid=1, drafts=0, accepted=5)]), "ops[0].drafts must be an integer in [1,"),
    (trace(ops=[op("spec_decode", rid=1, drafts=2, accepted=5)]), "accepted must be <= drafts (2)"),
    (trace(ops=[op("spec_decode", rid=1, drafts=9, accepted=1)]),
     "ops[0].drafts must be <= config.max_drafts (3)"),
    (trace(ops=[op("spec_decode", rid=1, drafts=2, accepted=-1)]), "ops[0].accepted"),
    (trace(ops=[op("schedule", rid=1, admit=1)]), "ops[0].admit must be a boolean"),
    (trace(ops=[op("evict", num_tokens=0)]), "ops[0].num_tokens"),
    (trace(ops=[op("open_session", sid=1), op("close_session", sid="1")]), "ops[1].sid"),
]


@pytest.mark.parametrize("content,needle", BAD_TRACES, ids=[n[:50] for _, n in BAD_TRACES])
def test_bad_trace_is_one_line_exit_2(tmp_path, capsys, content, needle):
    f = tmp_path / "t.json"
    f.write_text(content if isinstance(content, str) else json.dumps(content))
    rc, out, err = run_main(capsys, ["replay", str(f), "--backend", "spec"])
    assert_usage_error(rc, out, err, "replay", needle)
    assert str(f) in err                   # names the file
    assert out == ""


def test_at_least_80_bad_inputs():
    assert len(BAD_ARGS) + len(BAD_TRACES) >= 80


# --- subprocesses: recursion and memory ----------------------------------------------

def _limit_memory():
    gib = 2**30
    resource.setrlimit(resource.RLIMIT_AS, (3 * gib, 3 * gib))


def run_limited(*args, cwd=ROOT, timeout=240):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "kvcheck.cli", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=timeout, preexec_fn=_limit_memory, env=env)


NESTED = "[" * 200_000 + "]" * 200_000
SUBPROCESS_TRACES = [
    ("nested", NESTED, "nested too deeply"),
    ("nested-meta", '{"#meta": ' + NESTED + ', "config": {}, "ops": [], "expect": {"result": "pass"}}',
     "nested too deeply"),
    ("num_pages", json.dumps(trace(config={"num_pages": 10**12})), "config.num_pages"),
    ("num_rows", json.dumps(trace(config={"num_rows": 10**9})), "config.num_rows"),
    ("max_context_len", json.dumps(trace(config={"max_context_len": 2**40})), "config.max_context_len"),
]


@pytest.mark.parametrize("name,content,needle", SUBPROCESS_TRACES, ids=[c[0] for c in SUBPROCESS_TRACES])
def test_hostile_trace_in_a_subprocess_under_a_memory_limit(tmp_path, name, content, needle):
    f = tmp_path / "t.json"
    f.write_text(content)
    p = run_limited("replay", str(f))      # default backend impl: nothing may be allocated
    assert p.returncode == 2, p.stdout + p.stderr
    assert "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert p.stderr.startswith("kvcheck replay: error: ") and needle in p.stderr


# --- X1 names the guard that refused -------------------------------------------------

@pytest.mark.parametrize("ops,config,reason", [
    ([op("decode", rid=3)], {}, "request 3 does not exist"),
    ([op("queue_reject", rid=3)], {}, "request 3 does not exist"),
    ([op("submit_request", **SUBMIT), op("decode", rid=1)], {},
     "request 1 is queued, this operation needs it decode"),
    ([op("submit_request", **SUBMIT), op("submit_request", **SUBMIT)], {}, "request 1 already exists"),
    ([op("submit_request", **SUBMIT), op("schedule", rid=1), op("spec_decode", rid=1, drafts=1, accepted=0)],
     {}, "config.spec_enabled is false"),
    ([op("submit_request", rid=1, tokens=[1] * 60, max_new_tokens=10)], {}, "do not fit config.max_context_len=64"),
])
def test_x1_names_the_refusing_guard(tmp_path, capsys, ops, config, reason):
    f = tmp_path / "t.json"
    f.write_text(json.dumps(trace(ops=ops, config=config)))
    rc, out, err = run_main(capsys, ["replay", str(f), "--backend", "spec", "-q"])
    assert rc == 1 and "X1" in out and reason in out, out + err


@pytest.mark.parametrize("ops,outcome", [
    ([op("submit_turn", sid=5, rid=1, new_tokens=[1], max_new_tokens=1)], "stub"),
    ([op("close_session", sid=2)], "refused"),
    ([op("open_session", sid=1), op("open_session", sid=1)], "refused"),
    ([op("abort_running", rid=4)], "refused"),
    ([op("pre_abort", rid=4)], "refused"),
    ([op("abort_queued", rid=4)], "refused"),
])
def test_client_requests_upstream_turns_down_are_answered_not_x1(ops, outcome):
    """A client may send these; upstream answers (no change, or an aborted stub), and
    impl/ must answer the same and change nothing else."""
    from kvcheck.adapters.impl import ImplBackend
    from kvcheck.checker import run_ops
    from kvcheck.spec.config import Config
    from kvcheck.spec.ops import op_from_json
    cfg = Config()
    res = run_ops(cfg, [op_from_json(o) for o in ops], ImplBackend(cfg), keep_records=True)
    assert res.ok, res.failure.render()
    last = res.records[-1]
    assert last.outcome == last.backend_outcome == outcome
    if outcome == "refused":            # nothing changed, on either side
        from kvcheck.spec.model import initial_state
        from kvcheck.spec.view import abstract
        before = res.records[-2].spec_state if len(res.records) > 1 else abstract(initial_state(cfg))
        assert last.spec_state == last.backend_state == before


def test_refusal_and_enabled_agree_with_one_guard():
    from kvcheck.spec import ops as O
    from kvcheck.spec.config import Config
    from kvcheck.spec.model import enabled, initial_state, refusal, step
    s = initial_state(Config())
    probes = [O.Decode(1), O.OpenSession(1), O.SubmitRequest(1, (1, 2), 2), O.Schedule(1),
              O.Evict(1), O.CloseSession(1), O.Finish(1)]
    for _ in range(3):
        for p in probes:
            assert enabled(s, p) == (refusal(s, p) is None)
        s, _ = step(s, next(p for p in probes if enabled(s, p)))


# --- replays that need context -------------------------------------------------------

def test_planted_trace_replays_with_its_fault_switched_on(capsys):
    rc, out, err = run_main(capsys, ["replay", str(REG / "planted" / "free_tail_unaligned.json"), "-q"])
    assert rc == 0, out + err
    assert "planted fault free_tail_unaligned switched on" in out and "-> as expected" in out


def test_plant_flag_switches_a_fault_on(capsys):
    rc, out, err = run_main(capsys, ["replay", WORKED, "-q", "--plant", "free_tail_unaligned"])
    assert "planted fault free_tail_unaligned switched on in impl (--plant)" in out


def test_upstream_trace_is_not_passed_off_as_expected_on_impl(capsys):
    f = str(UPSTREAM / "h3-sglang-0.5.15.json")
    rc, out, err = run_main(capsys, ["replay", f, "-q", "--backend", "impl"])
    assert "as expected" not in out and "not checked here" in out and "--backend sglang:0.5.15" in out


def test_upstream_trace_defaults_to_its_release_or_names_the_flag(capsys, monkeypatch):
    from kvcheck.adapters.sglang import proxy
    monkeypatch.delenv("KVCHECK_SGLANG_PYTHON", raising=False)
    if proxy.venv_python("0.5.15").exists():
        pytest.skip("sglang 0.5.15 is built here; the release itself runs it")
    rc, out, err = run_main(capsys, ["replay", str(UPSTREAM / "h3-sglang-0.5.15.json"), "-q"])
    assert_usage_error(rc, out, err, "replay", "recorded on sglang-0.5.15")
    assert "--backend impl" in err


# --- where files go ------------------------------------------------------------------

def test_fuzz_writes_nothing_in_the_working_directory(tmp_path):
    cwd, out = tmp_path / "cwd", tmp_path / "out"
    cwd.mkdir()
    p = run_limited("fuzz", "--seconds", "1", "--seed", "1", "--backend", "spec", "--out", str(out),
                    cwd=cwd)
    assert p.returncode == 0, p.stderr
    assert list(cwd.iterdir()) == []


# --- help, version, explain ----------------------------------------------------------

def test_help_documents_exit_codes_and_failure_ids(capsys):
    rc, out, err = run_main(capsys, ["--help"])
    assert rc == 0
    for code in ("0 ", "1 ", "2 ", "130", "141"):
        assert re.search(rf"^\s+{code}", out, re.M), code
    assert "kvcheck explain ID" in out


def test_version(capsys):
    rc, out, err = run_main(capsys, ["--version"])
    assert rc == 0 and re.match(r"kvcheck \d+\.\d+", out)


def test_every_subcommand_has_a_description_an_example_and_each_default_stated_once():
    import argparse
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert {"check", "fuzz", "replay", "explore", "prove", "selftest", "explain"} <= set(sub.choices)
    for name, p in sub.choices.items():
        assert "example:\n  kvcheck " + name in p.description, name
        fmt = p.formatter_class(prog=p.prog)
        for a in p._actions:
            if a.option_strings and a.dest != "help":
                assert a.help, (name, a.option_strings)
                text = fmt._get_help_string(a)
                stated = text.replace("%(default)s", "").count("default")
                has_default = a.default not in (None, False, [])
                assert stated == 1 if has_default else stated <= 1, (name, a.option_strings, text)
        page = p.format_help()
        assert "None" not in page, (name, [ln for ln in page.splitlines() if "None" in ln])


def test_every_engine_is_in_each_engine_flags_help():
    from kvcheck.engines import ENGINES
    for cmd in ("check", "fuzz", "selftest"):
        page = cli.build_parser()._subparsers._group_actions[0].choices[cmd].format_help()
        flat = " ".join(page.split())
        for engine in ENGINES:
            assert f"{engine} (" in flat, (cmd, engine)


def test_every_environment_variable_read_is_in_the_top_level_help(capsys):
    """Every KVCHECK_* variable the sources read is listed in `kvcheck --help`."""
    from kvcheck.preflight import ENV_VARS
    read = set()
    for d in ("kvcheck", "adapters", "impl", "spec", "proofs"):
        for f in (ROOT / d).rglob("*.py"):
            read |= set(re.findall(r"[\"'](KVCHECK_[A-Z_]+)[\"']", f.read_text()))
    internal = {"KVCHECK_SGLANG_COVERAGE", "KVCHECK_MUTATION_EXAMPLES"}   # set by kvcheck for its children
    assert read - internal <= set(ENV_VARS), read - internal - set(ENV_VARS)
    rc, out, err = run_main(capsys, ["--help"])
    for name in ENV_VARS:
        assert re.search(rf"^  {name}\s", out, re.M), name


def test_explain_lists_and_explains_every_failure_id(capsys):
    from kvcheck.failures import failure_ids
    rc, out, err = run_main(capsys, ["explain"])
    assert rc == 0
    for fid in ("I1", "I20", "C1", "C5", "L1", "L2", "D1", "D2", "E1", "M1", "X1"):
        assert re.search(rf"^\s+{fid}\s", out, re.M), fid
    rc, out, err = run_main(capsys, ["explain", "I20", "X1"])
    assert rc == 0 and out.startswith("I20: ") and "\nX1: " in out
    assert set(failure_ids()) >= {"I1", "X1"}


def test_every_concrete_check_id_emitted_is_explained():
    from kvcheck.failures import CONCRETE_CHECKS
    emitted = set()
    for f in (ROOT / "impl" / "checks.py", ROOT / "adapters" / "sglang" / "concrete.py"):
        emitted |= set(re.findall(r'(?:Finding|Violation)\("([CL]\d+)"', f.read_text()))
    assert emitted and emitted <= set(CONCRETE_CHECKS), emitted - set(CONCRETE_CHECKS)


# --- the schema ----------------------------------------------------------------------

def test_published_schema_is_generated_from_the_source():
    from kvcheck.schema import PUBLISHED, published_text
    assert PUBLISHED.read_text() == published_text(), \
        "docs/trace.schema.json is stale: run `python -m kvcheck.schema --write`"


def test_every_corpus_trace_matches_the_published_schema():
    from jsonschema import Draft202012Validator
    schema = json.loads((ROOT / "docs" / "trace.schema.json").read_text())
    v = Draft202012Validator(schema)
    files = sorted((ROOT / "stateful_tests").rglob("*.json"))
    assert len(files) > 30
    for f in files:
        errs = list(v.iter_errors(json.loads(f.read_text())))
        assert not errs, (f, errs[0].message)


def test_schema_follows_a_field_declaration():
    from kvcheck.schema import trace_schema
    from kvcheck.spec.fields import MAX_PAGES
    s = trace_schema()["$defs"]
    assert s["config"]["properties"]["num_pages"]["maximum"] == MAX_PAGES
    assert s["spec_decode"]["required"] == ["op", "rid", "drafts", "accepted"]
    assert s["submit_turn"]["properties"]["new_tokens"]["minItems"] == 1


# --- CI formats ----------------------------------------------------------------------

LOWERED_FLOOR = ("import sys; import kvcheck.check as C; C.MIN_EXAMPLES.clear(); "
                 "from kvcheck.cli import main; sys.exit(main(sys.argv[1:]))")


@pytest.fixture(scope="module")
def failing_check(tmp_path_factory):
    """One small `check` whose differential part fails (too few sequences to reach every
    operation: the floor `check --examples` keeps is lowered for it), with every CI
    format switched on."""
    d = tmp_path_factory.mktemp("ci")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GITHUB_ACTIONS": "true"}
    p = subprocess.run([sys.executable, "-c", LOWERED_FLOOR, "check", "--backend", "spec",
                        "--examples", "2", "--skip-explore", "--skip-proofs", "--out", str(d / "f"),
                        "--junit-xml", str(d / "r.xml"), "--json", str(d / "r.json")],
                       capture_output=True, text=True, cwd=d, timeout=300, env=env)
    return p, d


def test_check_junit_xml_has_a_case_per_part_and_trace(failing_check):
    p, d = failing_check
    assert p.returncode == 1, p.stdout + p.stderr
    root = ET.parse(d / "r.xml").getroot()
    cases = root.findall(".//testcase")
    names = {c.get("name") for c in cases}
    corpus = {f.stem for f in REG.glob("*.json")}
    assert corpus <= names
    failed = [c for c in cases if c.find("failure") is not None]
    assert len(failed) == 1 and "NOT REACHED" in failed[0].find("failure").text
    assert root.get("failures") == "1"


def test_check_json_summary(failing_check):
    p, d = failing_check
    s = json.loads((d / "r.json").read_text())
    assert s["ok"] is False and s["backend"] == "spec" and "seeds" in s
    assert [x["name"] for x in s["parts"]][0].startswith("regression corpus")
    assert all("seconds" in x for x in s["parts"]) and len(s["traces"]) >= len(list(REG.glob("*.json")))
    assert len(s["failures"]) == 1


def test_check_github_annotations(failing_check):
    p, d = failing_check
    ann = [ln for ln in p.stdout.splitlines() if ln.startswith("::error ")]
    assert len(ann) == 1 and "title=kvcheck%3A differential" in ann[0], p.stdout


def test_workflow_is_valid_and_runs_check_and_nightly_fuzz():
    import yaml
    wf = yaml.safe_load((ROOT / ".github" / "workflows" / "kvcheck.yml").read_text())
    on = wf.get("on", wf.get(True))            # YAML 1.1 reads a bare `on` as true
    assert "pull_request" in on and "schedule" in on
    steps = {name: " ".join(str(s.get("run", "")) + str(s.get("uses", "")) for s in job["steps"])
             for name, job in wf["jobs"].items()}
    assert any("make check" in s for s in steps.values())
    fuzz = next(s for s in steps.values() if "make fuzz" in s)
    assert "upload-artifact" in fuzz and "failures" in yaml.safe_dump(wf)


def test_a_closed_output_pipe_exits_141_without_a_traceback(tmp_path):
    """`kvcheck fuzz ... | head -1`: the reader goes away before the report is printed."""
    p = subprocess.Popen([sys.executable, "-m", "kvcheck.cli", "fuzz", "--backend", "spec",
                          "--rounds", "20", "--seed", "1", "--out", str(tmp_path)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    p.stdout.close()                      # the reader is gone before the first line
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == 141, err
    assert "Traceback" not in err and "BrokenPipeError" not in err, err


def test_an_interrupt_anywhere_in_a_command_exits_130(capsys, monkeypatch):
    def interrupted(args):
        raise KeyboardInterrupt
    monkeypatch.setattr(cli, "cmd_explain", interrupted)
    rc, out, err = run_main(capsys, ["explain"])
    assert rc == 130 and err.strip() == "kvcheck explain: interrupted"
