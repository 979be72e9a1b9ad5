"""CI formats of a `kvcheck check` run: JUnit XML (`--junit-xml`), a JSON summary
(`--json`) and GitHub Actions annotations (printed when GITHUB_ACTIONS=true).

A run is a list of `Case`s: one per part (corpus, differential, exploration, proofs, ...)
and one per corpus trace; a failed case's text is the counterexample summary.
"""
from __future__ import annotations

import json
import os
import re
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

TRACE_LINE = re.compile(r"trace:\s+(\S+\.json)")


@dataclass
class Case:
    suite: str          # "parts" or the part a trace belongs to
    name: str
    ok: bool
    seconds: float
    text: str = ""
    file: Optional[str] = None
    traces: list = field(default_factory=list)
    cpu: Optional[float] = None     # a part's CPU seconds (its own process's)

    @classmethod
    def part(cls, name, ok, seconds, detail, cpu=None) -> "Case":
        return cls("parts", name, ok, seconds, detail, traces=TRACE_LINE.findall(detail), cpu=cpu)


def junit_xml(cases: list, total_seconds: float) -> str:
    suites = {}
    for c in cases:
        suites.setdefault(c.suite, []).append(c)
    root = ET.Element("testsuites", name="kvcheck check", tests=str(len(cases)),
                      failures=str(sum(not c.ok for c in cases)), time=f"{total_seconds:.3f}")
    for sname, cs in suites.items():
        s = ET.SubElement(root, "testsuite", name=sname, tests=str(len(cs)),
                          failures=str(sum(not c.ok for c in cs)),
                          time=f"{sum(c.seconds for c in cs):.3f}")
        for c in cs:
            attrs = {"classname": f"kvcheck.{sname}", "name": c.name, "time": f"{c.seconds:.3f}"}
            if c.file:
                attrs["file"] = c.file
            tc = ET.SubElement(s, "testcase", **attrs)
            if not c.ok:
                first = c.text.strip().splitlines()[0] if c.text.strip() else "failed"
                ET.SubElement(tc, "failure", message=first[:200]).text = c.text
            elif c.text:
                ET.SubElement(tc, "system-out").text = c.text
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def json_summary(cases: list, total_seconds: float, **run) -> str:
    parts = [c for c in cases if c.suite == "parts"]
    return json.dumps({
        "ok": all(c.ok for c in cases) and not run.get("interrupted"),
        "seconds": round(total_seconds, 3),
        **run,
        "parts": [{"name": c.name, "ok": c.ok, "seconds": round(c.seconds, 3),
                   **({} if c.cpu is None else {"cpu_seconds": round(c.cpu, 3)}),
                   "detail": c.text, "traces": c.traces} for c in parts],
        "traces": [{"part": c.suite, "file": c.file, "ok": c.ok, "seconds": round(c.seconds, 3),
                    "detail": c.text} for c in cases if c.suite != "parts"],
        "failures": [asdict(c) for c in cases if not c.ok],
    }, indent=2) + "\n"


def _escape(text: str, prop: bool = False) -> str:
    text = text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    return text.replace(":", "%3A").replace(",", "%2C") if prop else text


def github_annotations(cases: list) -> list:
    """`::error file=...,title=...::message` lines for the failed cases."""
    lines = []
    for c in cases:
        if c.ok:
            continue
        f = c.file or (c.traces[0] if c.traces else None)
        loc = f"file={_escape(os.path.relpath(f), True)}," if f else ""
        lines.append(f"::error {loc}title={_escape('kvcheck: ' + c.name, True)}::"
                     f"{_escape(c.text or 'failed')}")
    return lines


def write_reports(cases: list, total_seconds: float, junit: Optional[Path] = None,
                  summary: Optional[Path] = None, out=print, **run) -> None:
    if junit:
        Path(junit).write_text(junit_xml(cases, total_seconds))
    if summary:
        Path(summary).write_text(json_summary(cases, total_seconds, **run))
    if os.environ.get("GITHUB_ACTIONS") == "true":
        for line in github_annotations(cases):
            out(line)
