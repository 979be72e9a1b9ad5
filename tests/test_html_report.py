"""The HTML report of a counterexample: self-contained, and rendered by a real browser
(headless Chromium), where the flagged cell must be the one the invariant names."""
from __future__ import annotations

import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from kvcheck.impl import faults
from kvcheck import cli
from kvcheck.html_report import report_data, write_html_report
from kvcheck.replay import run_replay
from kvcheck.trace import load

ROOT = Path(__file__).resolve().parents[1]
PLANTED = ROOT / "stateful_tests" / "regressions" / "planted"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _named_cell(res):
    """(side, step, page) that the failure's first violation with a page names."""
    v = next(v for v in res.failure.violations if v.page is not None)
    return v.side, res.failure.step, v.page


def _report(tmp_path, fault: str) -> tuple[Path, object]:
    trace = tmp_path / f"{fault}.json"
    shutil.copy(PLANTED / f"{fault}.json", trace)
    with faults.planted(fault):
        res = run_replay(load(trace), "impl")
        path = write_html_report(trace, "impl")
    assert path == trace.with_suffix(".html")
    return path, res


@pytest.mark.parametrize("fault", ["free_tail_unaligned", "cache_unfinished_no_row_rewrite",
                                   "decode_new_page_off_by_one", "evict_ignores_lock",
                                   "free_no_page_dedup", "overalloc_free_from_committed"])
def test_the_grid_flags_the_cell_the_invariant_names(fault):
    """Every planted fault whose violation names a page: the grid's cell for that page
    at the failing step has two owners, or is owned and free (computed from the state,
    not from the violation)."""
    with faults.planted(fault):
        res = run_replay(load(PLANTED / f"{fault}.json"), "impl")
    side, step, page = _named_cell(res)
    data = report_data(load(PLANTED / f"{fault}.json"), res, fault)
    kind, owners = data["grids"][side][step + 1][data["pages"].index(page)]
    assert kind == "conflict", (fault, step, page, kind, owners)
    assert data["failure"]["step"] == step and data["steps"][step + 1]["op"] == str(res.failure.op)


def test_report_is_one_self_contained_file(tmp_path):
    path, res = _report(tmp_path, "free_tail_unaligned")
    text = path.read_text()
    assert "<script src" not in text and "<link" not in text and "http" not in text.lower()
    assert "@DATA@" not in text and '"failure": {"step": 4' in text
    assert text.count("<script") == 2                    # the data and the inline script


def test_replay_html_flag_writes_the_report(tmp_path, capsys):
    out = tmp_path / "r.html"
    assert cli.main(["replay", str(ROOT / "stateful_tests/regressions/worked_example_5_4.json"),
                     "--html", str(out), "-q"]) == 0
    assert f"html report: {out}" in capsys.readouterr().out
    assert '"failure": null' in out.read_text()


class _Cells(HTMLParser):
    """The grid's cells, the detail panel's title and the owner line in a dumped DOM."""

    def __init__(self):
        super().__init__()
        self.cells, self.detail_step, self.grid_side, self._in, self.texts = [], None, None, None, {}

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "td" and "data-page" in a:
            self.cells.append((int(a["data-step"]), int(a["data-page"]), a.get("class", "").split()))
        if tag == "table" and a.get("id") == "grid-table":
            self.grid_side = a.get("data-side")
        if a.get("id") == "detail-title":
            self.detail_step = int(a["data-step"])
        if a.get("id") in ("detail-title", "cell-owners"):
            self._in = a["id"]

    def handle_data(self, data):
        if self._in:
            self.texts[self._in] = self.texts.get(self._in, "") + data

    def handle_endtag(self, tag):
        self._in = None


def _chromium(*args, timeout=120) -> str:
    p = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
                        "--hide-scrollbars", "--no-first-run", "--disable-dev-shm-usage",
                        *args], capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, p.stderr[-2000:]
    return p.stdout


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (.ci/run installs "
                    "Debian's chromium; `apt-get install -y chromium` here)")
@pytest.mark.parametrize("fault", ["free_tail_unaligned", "decode_new_page_off_by_one"])
def test_chromium_renders_the_flagged_cell_where_the_invariant_points(tmp_path, fault):
    path, res = _report(tmp_path, fault)
    side, step, page = _named_cell(res)
    dom = _chromium("--dump-dom", path.as_uri())
    cells = _Cells()
    cells.feed(dom)
    assert cells.grid_side == side and cells.cells, "the page's script did not draw the grid"
    named = [(s, p) for s, p, cls in cells.cells if "named" in cls]
    assert named == [(step, page)]
    classes = next(cls for s, p, cls in cells.cells if (s, p) == (step, page))
    assert "flag" in classes and "k-conflict" in classes
    flagged_here = {p for s, p, cls in cells.cells if s == step and "flag" in cls}
    assert page in flagged_here
    assert cells.detail_step == step and "the failing step" in cells.texts["detail-title"]
    if fault == "free_tail_unaligned":        # what only impl did at the failing step
        assert '<div class="only">free pages: returned 1; 14 free: 1-14</div>' in dom
    # a click target, by address: the state and owners of another step and cell
    dom = _chromium("--dump-dom", path.as_uri() + f"#step={step - 1}&page={page}")
    cells = _Cells()
    cells.feed(dom)
    assert cells.detail_step == step - 1
    assert cells.texts["cell-owners"].startswith(f"page {page}: spec: ")
    shot = tmp_path / "report.png"
    _chromium(f"--screenshot={shot}", "--window-size=1100,900", path.as_uri())
    assert shot.stat().st_size > 10_000 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert re.search(r'id="state-table"', dom)


def test_explore_writes_the_report_beside_each_counterexample(tmp_path, monkeypatch, capsys):
    """A spec defect (H3 unfixed: abort_req clears _inflight whoever asks) found by the
    explorer: its trace gets TRACE.html beside it, replayed on the spec."""
    from spec_patch import plant

    def abort_req_unconditional(s, sid, req):
        sess = s.sessions.get(sid)
        if sess is not None:
            sess.inflight_rid = None
    plant(monkeypatch, "_abort_req", abort_req_unconditional)
    assert cli.main(["explore", "--preset", "tiny", "--quiet", "--out", str(tmp_path)]) == 1
    (trace,) = tmp_path.glob("*.json")
    report = trace.with_suffix(".html")
    assert f"report: {report}" in capsys.readouterr().out
    text = report.read_text()
    assert '"sides": ["spec"]' in text and f'"id": "{load(trace).expect.invariant}"' in text


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed")
def test_chromium_renders_a_failure_where_the_backend_has_no_state(tmp_path):
    """save_keeps_row: impl raises at step 3 (E1), so its column there is 'no state'."""
    path, res = _report(tmp_path, "save_keeps_row")
    assert res.failure.id == "E1" and res.records[-1].backend_state is None
    dom = _chromium("--dump-dom", path.as_uri())
    cells = _Cells()
    cells.feed(dom)
    assert 'data-ready="1"' in dom and cells.detail_step == res.failure.step
    assert {cls[0] for s, p, cls in cells.cells if s == res.failure.step} == {"k-none"}
    assert {cls[0] for s, p, cls in cells.cells if s == res.failure.step - 1} != {"k-none"}
