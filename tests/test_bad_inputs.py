"""The table of bad inputs, arguments, environment variables and interrupts (issue 37),
each with its exit code and message, beside tests/test_cli_contract.py's BAD_ARGS and
BAD_TRACES (together at least 150 rows):

- a bad value, environment variable, folder or file: exit 2, one line
  `kvcheck CMD: error: ...` naming it, before any work (nothing on stdout). These run
  in-process through `kvcheck.cli.main`, so the table is quick.
- Ctrl-C at a moment of a command (imports, prove, workers, a long replay, ...): exit
  130, no traceback, and the last line says it was interrupted. These need a process
  each, so there are few of them.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvcheck import cli
from kvcheck.procs import usable_cores
from kvcheck.trace import MAX_OPS

from test_cli_contract import BAD_ARGS, BAD_TRACES, assert_usage_error, run_main

ROOT = Path(__file__).resolve().parents[1]
REG = ROOT / "stateful_tests" / "regressions"
WORKED = str(REG / "worked_example_5_4.json")
TOO_MANY = usable_cores() + 1
WORK = ("fuzz", "--rounds", "5")       # a command that would run if nothing stopped it

# (argv, environment variables to set, the needle of the one error line)
ENV_CASES = [
    (["replay", WORKED], {"KVCHECK_DEVICE": "tpu"}, "KVCHECK_DEVICE='tpu': must be cpu, cuda or cuda:N"),
    (list(WORK), {"KVCHECK_DEVICE": "tpu"}, "KVCHECK_DEVICE='tpu'"),
    (["check"], {"KVCHECK_DEVICE": "tpu"}, "KVCHECK_DEVICE='tpu'"),
    (["selftest"], {"KVCHECK_DEVICE": "tpu"}, "KVCHECK_DEVICE='tpu'"),
    (["explore"], {"KVCHECK_DEVICE": "tpu"}, "KVCHECK_DEVICE='tpu'"),
    (["prove"], {"KVCHECK_DEVICE": "tpu"}, "KVCHECK_DEVICE='tpu'"),
    (["coverage"], {"KVCHECK_DEVICE": "tpu"}, "KVCHECK_DEVICE='tpu'"),
    (["replay", WORKED], {"KVCHECK_DEVICE": "gpu"}, "KVCHECK_DEVICE='gpu'"),
    (["replay", WORKED], {"KVCHECK_DEVICE": "CPU"}, "KVCHECK_DEVICE='CPU'"),
    (["replay", WORKED], {"KVCHECK_DEVICE": "cpu "}, "KVCHECK_DEVICE='cpu '"),
    (["replay", WORKED], {"KVCHECK_DEVICE": "cuda:x"}, "KVCHECK_DEVICE='cuda:x'"),
    (["replay", WORKED], {"KVCHECK_DEVICE": "cuda:-1"}, "KVCHECK_DEVICE='cuda:-1'"),
    (["replay", WORKED], {"KVCHECK_DEVICE": "mps"}, "KVCHECK_DEVICE='mps'"),
    (["replay", WORKED], {"KVCHECK_DEVICE": "cuda:99"}, "KVCHECK_DEVICE=cuda:99"),
    (["replay", WORKED], {"KVCHECK_SGLANG_PYTHON": "/nonexistent/python"},
     "KVCHECK_SGLANG_PYTHON='/nonexistent/python': not an executable file"),
    (list(WORK), {"KVCHECK_SGLANG_PYTHON": "/etc/passwd"}, "KVCHECK_SGLANG_PYTHON='/etc/passwd'"),
    (list(WORK), {"KVCHECK_SGLANG_PYTHON": "/tmp"}, "KVCHECK_SGLANG_PYTHON='/tmp'"),
    (["replay", WORKED], {"KVCHECK_SGLANG_PLANT": "nope"}, "KVCHECK_SGLANG_PLANT: unknown upstream fault(s) ['nope']"),
    (list(WORK), {"KVCHECK_SGLANG_PLANT": "free_tail_noop,bogus"}, "unknown upstream fault(s) ['bogus']"),
    (["check"], {"KVCHECK_SGLANG_PLANT": "x"}, "KVCHECK_SGLANG_PLANT"),
]
CUDA_CASES = [
    (["replay", WORKED], {"KVCHECK_DEVICE": "cuda"}, "KVCHECK_DEVICE=cuda: torch sees no CUDA device"),
    (list(WORK), {"KVCHECK_DEVICE": "cuda"}, "torch sees no CUDA device"),
    (list(WORK), {"KVCHECK_DEVICE": "cuda:0"}, "torch sees no CUDA device"),
]


def _cuda() -> bool:
    import torch
    return torch.cuda.is_available()


ARG_CASES = [
    # empty names: once they meant the working directory
    (["check", "--out", ""], "--out: must name a folder, got ''"),
    (["fuzz", "--out", ""], "--out: must name a folder"),
    (["selftest", "--out", ""], "--out: must name a folder"),
    (["explore", "--out", ""], "--out: must name a folder"),
    (["prove", "--out", ""], "--out: must name a folder"),
    (["check", "--out", "  "], "--out: must name a folder"),
    (["check", "--out", "a\0b"], "--out: a folder name cannot hold a NUL byte"),
    (["check", "--json", ""], "--json: must name a file"),
    (["check", "--junit-xml", ""], "--junit-xml: must name a file"),
    (["replay", WORKED, "--html", ""], "--html: must name a file"),
    (["replay", WORKED, "--emit-pytest", ""], "--emit-pytest: must name a file"),
    (["replay", WORKED, "--itf", ""], "--itf: must name a file"),
    # folders that cannot be written, even by root
    (["check", "--out", "/sys/kvcheck"], "--out: /sys is not writable"),
    (["fuzz", "--out", "/sys/kvcheck/deeper"], "--out: /sys is not writable"),
    (["explore", "--out", "/proc/kvcheck"], "--out: /proc is not writable"),
    (["prove", "--out", "/sys/kvcheck"], "--out: /sys is not writable"),
    (["check", "--json", "/sys/kvcheck.json"], "--json: /sys is not writable"),
    (["replay", WORKED, "--html", "/proc/x.html"], "--html: /proc is not writable"),
    (["replay", WORKED, "--itf", "/etc/passwd/x"], "--itf"),
    # worker counts beyond the machine
    (["fuzz", "--workers", "100000"], f"--workers 100000: this machine has {usable_cores()} usable core(s)"),
    (["fuzz", "--workers", str(TOO_MANY)], f"use at most {usable_cores()}"),
    (["selftest", "--workers", "100000"], "--workers 100000"),
    (["check", "--jobs", "100000"], f"--jobs 100000: this machine has {usable_cores()} usable core(s)"),
    (["check", "--jobs", str(TOO_MANY)], "--jobs"),
    (["check", "--jobs", "0"], "--jobs: must be an integer >= 1"),
    (["fuzz", "--workers", "0"], "--workers: must be an integer >= 1"),
    (["fuzz", "--workers", "-2"], "--workers"),
    # conflicting flags, and counts too small to mean anything
    (["explore", "--compare", "--no-symmetry"], "--compare runs with and without symmetry reduction"),
    (["explore", "--no-symmetry", "--compare", "--preset", "tiny"], "--no-symmetry contradicts it"),
    (["check", "--examples", "1"], "--examples 1: the differential part needs at least 20 sequences"),
    (["check", "--examples", "19"], "--examples 19"),
    (["check", "--engine", "guided", "--examples", "59"], "at least 60 sequences of the guided engine"),
    (["check", "--engine", "hypothesis", "--examples", "4"], "of the hypothesis engine"),
    (["check", "--engine", "nope"], "--engine: invalid choice"),
    (["fuzz", "--engine", "random"], "--engine: invalid choice"),
    # the time limit is a positive number of seconds
    (["prove", "--crosshair-time-limit", "0"], "--crosshair-time-limit: must be a finite number > 0"),
    (["prove", "--crosshair-time-limit", "-1"], "--crosshair-time-limit"),
    (["prove", "--crosshair-time-limit", "nan"], "--crosshair-time-limit"),
    (["prove", "--crosshair-time-limit", "inf"], "--crosshair-time-limit"),
    (["check", "--crosshair-time-limit", "soon"], "--crosshair-time-limit"),
    (["replay", WORKED, "--emit-style", "old"], "--emit-style: invalid choice"),
    # a Ray cluster that is not there: said within seconds, not after a 30 s Ray log
    (["fuzz", "--ray", "127.0.0.1:1"], "--ray 127.0.0.1:1: no Ray cluster answers at 127.0.0.1:1"),
    (["fuzz", "--ray", "ray://127.0.0.1:1"], "no Ray cluster answers at 127.0.0.1:1"),
    (["fuzz", "--ray", "localhost:1"], "no Ray cluster answers at localhost:1"),
    (["fuzz", "--ray", "no-port"], "ADDRESS must be HOST:PORT, ray://HOST:PORT or auto"),
    (["fuzz", "--ray", "host:99999"], "ADDRESS must be HOST:PORT"),
    (["fuzz", "--ray", "host:0"], "ADDRESS must be HOST:PORT"),
    (["fuzz", "--ray", "http://x:1"], "ADDRESS must be HOST:PORT"),
    (["fuzz", "--ray", "auto"], "--ray auto: no running Ray cluster found"),
    (["fuzz", "--ray", "a b:1"], "ADDRESS must be HOST:PORT"),
]


class WorkStarted(Exception):
    pass


@pytest.fixture
def no_work(monkeypatch):
    """The checks before any work passed: the case fails at once instead of running the
    command (an exploration, a campaign) it should have refused."""
    from kvcheck import preflight
    real = preflight.preflight

    def checked(args):
        real(args)
        raise WorkStarted(f"kvcheck {args.cmd}: accepted, the work would start")
    monkeypatch.setattr(preflight, "preflight", checked)


@pytest.fixture
def no_ray_cluster(monkeypatch, tmp_path):
    from kvcheck import preflight
    monkeypatch.setattr(preflight, "RAY_CLUSTER_FILE", tmp_path / "no-cluster")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)


@pytest.mark.parametrize("argv,env,needle", ENV_CASES, ids=[f"{a[0]} {e}"[:60] for a, e, _ in ENV_CASES])
def test_a_bad_environment_variable_is_one_line_exit_2_before_work(capsys, monkeypatch, no_work,
                                                                    argv, env, needle):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    rc, out, err = run_main(capsys, argv)
    assert_usage_error(rc, out, err, argv[0], needle)
    assert out == ""


@pytest.mark.parametrize("argv,env,needle", CUDA_CASES, ids=[" ".join(a)[:40] for a, _, _ in CUDA_CASES])
def test_cuda_without_cuda_is_one_line_exit_2(capsys, monkeypatch, no_work, argv, env, needle):
    if _cuda():
        pytest.skip("torch sees a CUDA device here")
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    rc, out, err = run_main(capsys, argv)
    assert_usage_error(rc, out, err, argv[0], needle)


@pytest.mark.parametrize("argv,needle", ARG_CASES, ids=[" ".join(a)[:60] for a, _ in ARG_CASES])
def test_a_bad_argument_is_one_line_exit_2_before_work(capsys, no_ray_cluster, no_work, argv, needle):
    t0 = time.monotonic()
    rc, out, err = run_main(capsys, argv)
    assert_usage_error(rc, out, err, argv[0], needle)
    assert out == ""
    assert time.monotonic() - t0 < 15             # the Ray probe waits 3 s at most


def test_a_default_out_folder_that_cannot_be_written_is_exit_2_not_a_failed_part(capsys, monkeypatch,
                                                                                 no_work):
    """A read-only project folder: `--out` left at its default (argparse checks only a
    typed value) is checked before any work."""
    monkeypatch.setattr(cli, "FAILURES", Path("/sys/kvcheck-failures"))
    for cmd in (["check"], list(WORK), ["prove"], ["selftest"]):
        rc, out, err = run_main(capsys, cmd)
        assert_usage_error(rc, out, err, cmd[0], "--out /sys/kvcheck-failures")
        assert "name a writable folder with --out" in err


# --- files given as traces ----------------------------------------------------------

def _fifo(tmp_path):
    p = tmp_path / "fifo"
    os.mkfifo(p)
    return p


def _sparse(tmp_path):
    p = tmp_path / "huge.json"
    with open(p, "wb") as f:
        f.truncate(65 << 20)                   # 65 MiB, no disk used
    return p


def _many_ops(tmp_path):
    p = tmp_path / "many.json"
    p.write_text(json.dumps({"config": {}, "ops": [{"op": "open_session", "sid": 1}] * (MAX_OPS + 1),
                             "expect": {"result": "pass"}}))
    return p


def _binary(tmp_path):
    p = tmp_path / "bin.json"
    p.write_bytes(b"\xff\xfe\x00garbage")
    return p


def _loop(tmp_path):
    p = tmp_path / "loop.json"
    p.symlink_to(p)
    return p


def _itf(tmp_path, **meta):
    p = tmp_path / "t.itf.json"
    p.write_text(json.dumps({"#meta": {"format": "ITF", **meta}, "vars": [], "states": []}))
    return p


def _itf_no_states(tmp_path):
    p = tmp_path / "n.itf.json"
    p.write_text(json.dumps({"#meta": {"format": "ITF", "config": {}, "expect": {"result": "pass"}}}))
    return p


def _itf_bad_state(tmp_path):
    p = tmp_path / "s.itf.json"
    p.write_text(json.dumps({"#meta": {"format": "ITF", "config": {}, "expect": {"result": "pass"}},
                             "states": [{}, {"op": "decode"}]}))
    return p


FILE_CASES = [
    ("/dev/zero", lambda t: Path("/dev/zero"), "not a regular file"),
    ("/dev/null", lambda t: Path("/dev/null"), "not a regular file"),
    ("/dev/urandom", lambda t: Path("/dev/urandom"), "not a regular file"),
    ("fifo", _fifo, "not a regular file"),
    ("65 MiB", _sparse, "more than the 67,108,864 a trace may have"),
    ("too many ops", _many_ops, f"ops has {MAX_OPS + 1:,} operations, more than the {MAX_OPS:,}"),
    ("not utf-8", _binary, "cannot read"),
    ("symlink loop", _loop, "cannot read"),
    ("ITF without config", lambda t: _itf(t, expect={"result": "pass"}), "an ITF file without #meta.config"),
    ("ITF without expect", lambda t: _itf(t, config={}), "an ITF file without #meta.expect"),
    ("ITF without ops or states", _itf_no_states, "an ITF file without #meta.ops or states"),
    ("ITF bad state op", _itf_bad_state, "states[1].op is not an operation variant"),
    ("ITF bad config", lambda t: _itf(t, config={"page_size": 0}, expect={"result": "pass"}, ops=[]),
     "config.page_size must be an integer in [1, 64]"),
]


@pytest.mark.parametrize("name,make,needle", FILE_CASES, ids=[c[0] for c in FILE_CASES])
def test_a_bad_trace_file_is_one_line_exit_2_before_work(tmp_path, capsys, name, make, needle):
    path = make(tmp_path)
    t0 = time.monotonic()
    rc, out, err = run_main(capsys, ["replay", str(path), "--backend", "spec"])
    assert_usage_error(rc, out, err, "replay", needle)
    assert time.monotonic() - t0 < 20, "read before it was refused"


# --- interrupts ----------------------------------------------------------------------

def _popen(*argv):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "kvcheck.cli", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)


def _wait_for(p, stream, text, timeout=120):
    """Read `stream` line by line until one holds `text` (the moment to interrupt)."""
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        line = getattr(p, stream).readline()
        if not line:
            break
        seen.append(line)
        if text in line:
            return seen
    raise AssertionError(f"never saw {text!r}: {''.join(seen)[-2000:]}")


def _long_trace(tmp_path):
    p = tmp_path / "long.json"
    p.write_text(json.dumps({"config": {}, "ops": [{"op": "open_session", "sid": 1},
                                                   {"op": "close_session", "sid": 1}] * 20_000,
                             "expect": {"result": "pass"}}))
    return p


# (name, argv (tmp_path -> list), the stream and text to wait for, or seconds to wait)
INTERRUPTS = [
    ("during the imports", lambda t: ["fuzz", "--rounds", "50", "--out", str(t)], None, 0.4),
    ("fuzz in a campaign", lambda t: ["fuzz", "--seconds", "60", "--out", str(t)],
     ("stderr", "kvcheck fuzz: backend"), 1.0),
    ("fuzz with workers", lambda t: ["fuzz", "--seconds", "60", "--workers", str(min(2, usable_cores())),
                                     "--out", str(t)], ("stderr", "kvcheck fuzz: backend"), 3.0),
    ("prove in z3", lambda t: ["prove", "--no-cache", "--out", str(t)], ("stderr", "ok   "), 0.5),
    ("explore", lambda t: ["explore", "--preset", "check", "--out", str(t)], ("stderr", "[explore"), 0.5),
    ("a long quiet replay", lambda t: ["replay", str(_long_trace(t)), "-q", "--backend", "spec"],
     None, 6.0),
]


@pytest.mark.parametrize("name,argv,wait,delay", INTERRUPTS, ids=[c[0] for c in INTERRUPTS])
def test_ctrl_c_at_any_moment_exits_130_without_a_traceback(tmp_path, name, argv, wait, delay):
    p = _popen(*argv(tmp_path))
    seen: list = []
    try:
        if wait is not None:
            seen = _wait_for(p, *wait)
        time.sleep(delay)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=120)
    finally:
        p.kill()
    err = "".join(seen) + err if wait and wait[0] == "stderr" else err
    assert p.returncode == 130, (p.returncode, out[-2000:], err[-2000:])
    assert "Traceback" not in err, err[-3000:]
    assert "interrupted" in err.strip().splitlines()[-1], err[-2000:]
    if name == "explore":                        # what it wrote, here nothing
        assert "kvcheck explore: interrupted; no trace written" in out, out[-2000:]


def test_an_interrupted_prove_keeps_the_units_that_finished(tmp_path):
    p = _popen("prove", "--no-crosshair", "--out", str(tmp_path))
    try:
        _wait_for(p, "stderr", "ok   ")
        _wait_for(p, "stderr", "ok   ")
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=120)
    finally:
        p.kill()
    assert p.returncode == 130, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("kvcheck prove: interrupted: ") and "new results saved in" in last, last
    cache = json.loads((tmp_path / ".kvcheck-cache" / "proofs.json").read_text())
    assert cache["units"]


def test_a_check_that_a_ctrl_c_reached_raises_keyboard_interrupt():
    """kvcheck's checks run with z3's own SIGINT handler off (`ctrl_c`); a Ctrl-C that
    arrived during one (recorded by ctrl_c_stops_z3's watcher), or one z3 caught itself
    (unknown, "interrupted from keyboard"), raises KeyboardInterrupt instead of reading as
    an undecided proof."""
    import z3

    from kvcheck.proofs import core

    class Solver:
        def __init__(self, answer, reason="unknown"):
            self.answer, self.reason, self.params = answer, reason, {}

        def set(self, key, value):
            self.params[key] = value

        def check(self):
            return self.answer

        def reason_unknown(self):
            return self.reason

    caught = Solver(z3.unknown, "interrupted from keyboard")
    with pytest.raises(KeyboardInterrupt):
        core.checked(caught)
    assert caught.params == {"ctrl_c": False}
    assert core.checked(Solver(z3.sat)) == z3.sat
    core._CTRL_C.set()              # the watcher saw a SIGINT during the check
    try:
        with pytest.raises(KeyboardInterrupt):
            core.checked(Solver(z3.sat))
    finally:
        core._CTRL_C.clear()


def test_an_interrupt_a_library_turned_into_another_error_exits_130(capsys, monkeypatch):
    def imports(args):
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as e:
            raise RuntimeError("__set_name__ of a dataclass field") from e
    monkeypatch.setattr(cli, "cmd_explain", imports)
    rc, out, err = run_main(capsys, ["explain"])
    assert rc == 130 and err.strip() == "kvcheck explain: interrupted"


def test_the_table_has_at_least_150_rows():
    rows = (len(BAD_ARGS) + len(BAD_TRACES) + len(ENV_CASES) + len(CUDA_CASES) + len(ARG_CASES)
            + 1 + len(FILE_CASES) + len(INTERRUPTS) + 3)
    assert rows >= 150, rows


def test_what_an_interrupted_command_lists_as_written(tmp_path, monkeypatch):
    """Files under the output folder written since the command started, hidden folders
    (the proof cache) left out."""
    from kvcheck import clock
    from kvcheck.errors import files_written
    old = tmp_path / "old.json"
    old.write_text("{}")
    os.utime(old, (1, 1))
    monkeypatch.setattr(clock, "STARTED_WALL", time.time())
    (tmp_path / "new.json").write_text("{}")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "deep.json").write_text("{}")
    (tmp_path / ".kvcheck-cache").mkdir()
    (tmp_path / ".kvcheck-cache" / "proofs.json").write_text("{}")
    assert files_written(tmp_path, "*.json") == [tmp_path / "new.json", tmp_path / "sub" / "deep.json"]
    assert files_written(tmp_path / "missing") == []


def test_a_ctrl_c_lost_in_a_z3_destructor_reaches_the_main_thread_quietly(capsys):
    """Ctrl-C can land in z3's `AstRef.__del__` (the garbage collector mid-proof), where
    ctypes wraps it and Python would print "Exception ignored ... Traceback" and drop it:
    kvcheck's hook (main() installs it for every command) raises it in the main thread
    instead and prints nothing."""
    import ctypes
    import time
    from types import SimpleNamespace
    from kvcheck.cli import _ctrl_c_reaches_main, interrupt_in_destructor
    lost = SimpleNamespace(exc_value=ctypes.ArgumentError("argument 1: KeyboardInterrupt: "),
                           exc_type=ctypes.ArgumentError, exc_traceback=None, err_msg=None,
                           object=None)
    assert interrupt_in_destructor(lost)
    assert not interrupt_in_destructor(SimpleNamespace(exc_value=AttributeError("ctx")))
    with pytest.raises(KeyboardInterrupt):
        _ctrl_c_reaches_main(lost)
        for _ in range(100):
            time.sleep(0.01)
    assert capsys.readouterr().err == ""
    seen = []
    _ctrl_c_reaches_main(SimpleNamespace(exc_value=AttributeError("ctx")), default=seen.append)
    assert len(seen) == 1
