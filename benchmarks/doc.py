"""Write a benchmark's output into a section of a markdown file, under the machine it ran
on, so that the figures in docs/speed.md are always the last `make bench` run's:

    python -m benchmarks.doc NAME FILE [--from TEXT] -- COMMAND ...

runs COMMAND, passing its output through as it comes, and, when it exits 0, replaces what
FILE holds between `<!-- bench:NAME -->` and `<!-- /bench:NAME -->` with the machine line
and the output (from the last line that starts with TEXT, with --from) as a code block.
A failed command leaves FILE as it was and exits with the command's status.
"""
from __future__ import annotations

import argparse
import os
import platform
import re
import subprocess
import sys
from pathlib import Path


def machine() -> str:
    """CPU model, cores, memory, OS, Python and torch, and the load average now."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        kib = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f", {kib / 2**20:.0f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    try:
        from importlib.metadata import version
        torch = f", torch {version('torch')}"
    except Exception:
        torch = ""
    return (f"{cpu}, {os.cpu_count()} cores{mem}, {platform.system()} {platform.release()}, "
            f"Python {platform.python_version()}{torch}; load average {os.getloadavg()[0]:.1f}")


def write_section(path: Path, name: str, body: str) -> None:
    begin, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    text = path.read_text()
    pat = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)
    if not pat.search(text):
        raise SystemExit(f"{path}: no {begin} ... {end} section to write")
    path.write_text(pat.sub(lambda _: f"{begin}\n{body.rstrip()}\n{end}", text))


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        raise SystemExit("usage: python -m benchmarks.doc NAME FILE [--from TEXT] -- COMMAND ...")
    i = argv.index("--")
    ap = argparse.ArgumentParser(prog="python -m benchmarks.doc")
    ap.add_argument("name")
    ap.add_argument("file", type=Path)
    ap.add_argument("--from", dest="start", default=None)
    args, cmd = ap.parse_args(argv[:i]), argv[i + 1:]
    before = machine()
    lines = []
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) as p:
        for line in p.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            lines.append(line)
    if p.returncode:
        return p.returncode
    if args.start:
        starts = [k for k, line in enumerate(lines) if line.startswith(args.start)]
        lines = lines[starts[-1]:] if starts else lines
    shown = " ".join("python" if k == 0 and Path(c).name.startswith("python") else c
                     for k, c in enumerate(cmd))
    body = (f"`{shown}` on {before}\n(load average {os.getloadavg()[0]:.1f} at the end)\n\n"
            "```\n" + "".join(lines) + "```")
    write_section(args.file, args.name, body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
