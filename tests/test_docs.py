"""The documents say what the code does: docs/cli.md is the parser's own `--help`,
docs/invariants.md lists every invariant of spec/invariants.py under its id and name, and
the README's exit codes are kvcheck/cli.py's."""
from __future__ import annotations

import re
from pathlib import Path

from kvcheck import cli, clidoc
from kvcheck.spec.invariants import STATE_INVARIANTS, STEP_INVARIANTS

ROOT = Path(__file__).resolve().parents[1]


def test_cli_doc_is_the_parsers_help():
    assert clidoc.DOC.read_text() == clidoc.render(), \
        "docs/cli.md is stale: run `python -m kvcheck.clidoc --write`"


def test_cli_doc_names_every_command():
    text = clidoc.DOC.read_text()
    for name, _ in clidoc.parsers():
        assert f"## {name}\n" in text


def test_invariants_table_matches_the_spec():
    rows = {}
    for line in (ROOT / "docs" / "invariants.md").read_text().splitlines():
        m = re.match(r"\| (I\d+) \| (.+?) \| (state|step) \|", line)
        if m:
            rows[m.group(1)] = (m.group(2), m.group(3))
    want = {i.id: (i.name, "state") for i in STATE_INVARIANTS}
    want.update({i.id: (i.name, "step") for i in STEP_INVARIANTS})
    assert rows == want


def test_readme_exit_codes_are_the_clis():
    text = (ROOT / "README.md").read_text()
    codes = {int(c) for c in re.findall(r"^\| (\d+) \| ", text, re.M)}
    assert codes == {cli.EXIT_OK, cli.EXIT_FINDING, cli.EXIT_USAGE, cli.EXIT_INTERRUPTED,
                     cli.EXIT_PIPE}


def test_make_bench_writes_its_sections_of_speed_md(tmp_path):
    from benchmarks import doc
    text = (ROOT / "docs" / "speed.md").read_text()
    for name in ("summary", "coverage"):
        assert f"<!-- bench:{name} -->" in text and f"<!-- /bench:{name} -->" in text
    f = tmp_path / "speed.md"
    f.write_text("a\n<!-- bench:x -->\nold\n<!-- /bench:x -->\nb\n")
    assert doc.main(["x", str(f), "--from", "== t", "--", "python3", "-c",
                     "print('progress'); print('== t'); print('row 1')"]) == 0
    assert f.read_text().startswith("a\n<!-- bench:x -->\n`python -c")
    assert "```\n== t\nrow 1\n```\n<!-- /bench:x -->\nb\n" in f.read_text()


def test_every_relative_link_resolves():
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", doc.read_text()):
            if "://" not in target:
                assert (doc.parent / target).exists(), f"{doc.name}: {target}"
