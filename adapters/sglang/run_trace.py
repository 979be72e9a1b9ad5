"""Replay a kvcheck trace against the installed sglang (run with an sglang venv's python).

    PYTHONPATH=/work/main .venv-sglang-0.5.15/bin/python -m kvcheck.adapters.sglang.run_trace T.json
    ... -m kvcheck.adapters.sglang.run_trace --serve        # JSON-lines protocol on stdin/stdout

Trace: a JSON object with "config" (Config.to_json()) and "ops" (op.to_json() each);
other keys are ignored. Output (one JSON document on stdout):
    {"backend": "sglang-0.5.15", "version": ..., "api": "flat"|"borrow",
     "initial": {"state": ..., "violations": [...]},
     "steps": [{"op": ..., "outcome": ..., "state": ..., "violations": [...]}
               | {"op": ..., "error": "..."}],          # an exception ends the replay
     "stub_calls": [...], "elapsed_s": ...}
Exit status 0 when every op ran (whatever the states are: comparing them with the spec
is the checker's job), 3 when an op raised, 2 for an unusable trace or release.

--serve: one JSON request per line, one JSON reply per line:
    {"cmd": "init", "config": {...}, "version": "0.5.15"?}
                                    -> {"ok": true, "backend": ..., "handle": H}
    {"cmd": "apply", "op": {...}, "handle": H?} -> {"outcome": ..., "state": ..., "violations": [...]}
    {"cmd": "state", "handle": H?}  -> {"state": ..., "violations": [...]}
    {"cmd": "fork", "handle": H?}   -> {"handle": H2}: an independent copy of backend H
                                       (SglangBackend.fork), for the exhaustive walk
    {"cmd": "handles"}              -> {"handles": [H, ...]}: the backends kept
    {"cmd": "close"}                -> {"ok": true}
Every backend made by init or fork is kept under its handle (never reused) until a
request names it in "drop": [H, ...] (dropped before the request runs); a request without
"handle" addresses the latest init's backend. Any failure answers
{"error": "...", "kind": "ExceptionName"}; an "error" reads `Type: message (at
sglang/srt/FILE:LINE in FUNCTION: SOURCE)` where sglang raised it (`error_text`).
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
import traceback


def error_text(e: BaseException) -> str:
    """An exception as the checker reports it: its type and message, and where in sglang
    it was raised (the innermost frame under `sglang/srt/`, installed or a checkout: file,
    line, function and source), so that a bare `assert` still names its upstream line."""
    text = type(e).__name__ + (f": {e}" if str(e) else "")
    mark = f"{os.sep}sglang{os.sep}srt{os.sep}"
    frames = [f for f in traceback.extract_tb(e.__traceback__) if mark in f.filename]
    if frames:
        f = frames[-1]
        where = f.filename[f.filename.rindex(mark) + 1:]
        text += f" (at {where}:{f.lineno} in {f.name}: {(f.line or '').strip()})"
    return text


def _snapshot(backend) -> dict:
    from kvcheck.adapters.sglang.wire import state_to_json, violation_to_json
    return {"state": state_to_json(backend.abstract()),
            "violations": [violation_to_json(v) for v in backend.concrete_violations()],
            "past_model": backend.past_model()}


def replay(trace: dict, version: str | None = None) -> tuple[dict, int]:
    from kvcheck.spec.config import Config
    from kvcheck.spec.ops import op_from_json
    from kvcheck.adapters.sglang.backend import SglangBackend
    from kvcheck.adapters.sglang import shim

    t0 = time.monotonic()
    cfg = Config.from_json(trace["config"])
    ops = [op_from_json(o) for o in trace["ops"]]
    backend = SglangBackend(cfg, expect_version=version)
    out = {"backend": backend.name, "version": backend.version, "api": backend.api,
           "initial": _snapshot(backend), "steps": []}
    rc = 0
    for op in ops:
        try:
            outcome = backend.apply(op)
            out["steps"].append({"op": op.to_json(), "outcome": outcome, **_snapshot(backend)})
        except Exception as e:  # the checker reports it as a divergence at this step
            out["steps"].append({"op": op.to_json(), "error": error_text(e),
                                 "traceback": traceback.format_exc(limit=8)})
            rc = 3
            break
    out["stub_calls"] = shim.calls()
    out["elapsed_s"] = round(time.monotonic() - t0, 3)
    backend.close()
    return out, rc


def serve(stdin=sys.stdin, stdout=sys.stdout) -> int:
    from kvcheck.spec.config import Config
    from kvcheck.spec.ops import op_from_json
    backends: dict = {}          # handle -> SglangBackend
    latest = None                # the latest init's handle
    handles = iter(range(1, 1 << 62))
    for line in stdin:
        line = line.strip()
        if not line:
            continue
        try:
            msg = json.loads(line)
            for h in msg.get("drop", ()):
                backends.pop(h, None)
            cmd = msg.get("cmd")
            if cmd in ("apply", "state", "fork"):
                h = msg.get("handle", latest)
                if h not in backends:
                    raise LookupError(f"no backend under handle {h!r} (dropped, or no init yet)")
                backend = backends[h]
            if cmd == "init":
                from kvcheck.adapters.sglang.backend import SglangBackend
                backend = SglangBackend(Config.from_json(msg["config"]),
                                        expect_version=msg.get("version"),
                                        refuse=msg.get("refuse", True))
                latest = next(handles)
                backends[latest] = backend
                reply = {"ok": True, "backend": backend.name, "version": backend.version,
                         "api": backend.api, "handle": latest}
            elif cmd == "apply":
                outcome = backend.apply(op_from_json(msg["op"]))
                reply = {"outcome": outcome, **_snapshot(backend)}
            elif cmd == "state":
                reply = _snapshot(backend)
            elif cmd == "fork":
                h2 = next(handles)
                backends[h2] = backend.fork()
                reply = {"handle": h2}
            elif cmd == "handles":
                reply = {"handles": sorted(backends)}
            elif cmd in ("swa_probe", "mamba_tree_probe", "queued_borrowed_abort_probe",
                         "swa_unified_probe"):
                from kvcheck.adapters.sglang import probes
                from kvcheck.adapters.sglang.backend import process_setup
                cfg = Config.from_json(msg["config"])
                process_setup(cfg.page_size, cfg.spec_enabled)
                if cmd == "swa_unified_probe":      # adapters/sglang/probes.py
                    reply = probes.swa_unified_probe(cfg, msg.get("names"))
                else:
                    reply = getattr(probes, cmd)(cfg)
            elif cmd == "close":
                for b in backends.values():
                    b.close()
                reply = {"ok": True}
                stdout.write(json.dumps(reply) + "\n")
                stdout.flush()
                return 0
            else:
                reply = {"error": f"unknown command {cmd!r}", "kind": "ProtocolError"}
        except Exception as e:
            reply = {"error": error_text(e), "kind": type(e).__name__,
                     "traceback": traceback.format_exc(limit=8)}
        stdout.write(json.dumps(reply) + "\n")
        stdout.flush()
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kvcheck.adapters.sglang.run_trace")
    ap.add_argument("trace", nargs="?", help="trace JSON file")
    ap.add_argument("--serve", action="store_true", help="JSON-lines protocol on stdin")
    ap.add_argument("--version", help="refuse to run unless this sglang release is installed")
    ap.add_argument("--out", help="write the result JSON here instead of stdout")
    args = ap.parse_args(argv)
    logging.disable(logging.WARNING)   # upstream logs every session open/close at INFO+
    # stdout carries the protocol: keep upstream's prints (pretty_print on OOM) off it.
    real_stdout = sys.stdout
    sys.stdout = sys.stderr
    try:
        if args.serve:
            return serve(sys.stdin, real_stdout)
        if not args.trace:
            ap.error("a trace file or --serve is required")
        with open(args.trace) as f:
            trace = json.load(f)
        try:
            result, rc = replay(trace, args.version)
        except Exception as e:
            result, rc = {"error": f"{type(e).__name__}: {e}", "kind": type(e).__name__}, 2
        text = json.dumps(result)
        if args.out:
            with open(args.out, "w") as f:
                f.write(text)
        else:
            real_stdout.write(text + "\n")
        return rc
    finally:
        sys.stdout = real_stdout


if __name__ == "__main__":
    sys.exit(main())
