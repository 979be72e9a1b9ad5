"""The HTML report of a counterexample: one self-contained file (inline style and
script, no network) beside its trace.

It shows the page x step owner grid of each side (cells coloured by owner; a cell with
two owners, or owned and free, flagged), the operation list with both outcomes, the
failure with its one-line meaning and its owner/page/numbers, and, for the step or cell
clicked (or `#step=N` in the address), the full state of both sides at that step with
the differing fields marked and what changed since the previous step. All content is
computed here from kvcheck.render; the page's script only lays it out.
"""
from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Optional

from kvcheck.render import FLAGS, OWNER_KINDS, grid_rows, owner_grid, state_table, step_lines
from kvcheck.replay import ReplayResult, matches_expectation, run_replay, step_labels


def report_data(trace, res: ReplayResult, title: str) -> dict:
    """Everything the page shows, as plain JSON data."""
    labels = step_labels(res)
    pages, grids = [], {}
    for side in res.sides:
        side_pages, cols = owner_grid(res.states(side))
        pages += [p for p in side_pages if p not in pages]
        grids[side] = cols
    for side, cols in grids.items():   # every side's grid over the same pages
        grids[side] = [None if c is None else {p: c.get(p, ("leak", "no state")) for p in pages}
                       for c in cols]
    rows = grid_rows(pages, list(grids.values()))
    grids = {side: [None if c is None else [c[p] for p in pages] for c in cols]
             for side, cols in grids.items()}
    f = res.failure
    failure = None
    if f is not None:
        failure = {"step": f.step, "op": str(f.op), "id": f.id, "name": f.name, "side": f.side,
                   "details": list(f.details),
                   "violations": [{"id": v.id, "name": v.name, "message": v.message,
                                   "owner": v.owner, "page": v.page, "side": v.side}
                                  for v in f.violations]}
    return {
        "title": title,
        "config": trace.config.to_json(),
        "sides": list(res.sides),
        "labels": labels,
        "pages": pages,
        "rows": [list(r) for r in rows],
        "grids": grids,
        "kinds": {k: [name, c] for k, (name, c) in {**OWNER_KINDS, **FLAGS}.items()},
        "steps": [step_data(res, i) for i in range(-1, len(res.records))],
        "failure": failure,
        "expect": trace.expect.to_json(),
        "as_expected": matches_expectation(trace.expect, f, res.backend_name),
    }


def step_data(res: ReplayResult, i: int) -> dict:
    """One column: the operation, both outcomes, each side's changes, the full states."""
    rec = res.records[i] if i >= 0 else None
    states = {side: res.state_at(side, i) for side in res.sides}
    changes = {}
    if i >= 0:
        for side in res.sides:
            a, b = res.state_at(side, i - 1), states[side]
            changes[side] = step_lines(a, b) if a is not None and b is not None else None
    present = [s for s in res.sides if states[s] is not None]
    table = state_table(*[states[s] for s in present]) if present else []
    return {"op": str(rec.op) if rec else "initial state",
            "outcomes": {} if rec is None else
            {"spec": rec.outcome, **({res.backend_name: rec.backend_outcome}
                                     if res.backend_name != "spec" else {})},
            "changes": changes, "table_sides": present,
            "table": [list(row) for row in table]}


def render_html(data: dict) -> str:
    payload = json.dumps(data).replace("</", "<\\/")
    return (_PAGE.replace("@TITLE@", html.escape(data["title"]))
            .replace("@STYLE@", _STYLE).replace("@SCRIPT@", _SCRIPT)
            .replace("@DATA@", payload))


def write_html_report(trace_path, backend: str = "impl", out=None,
                      result: Optional[ReplayResult] = None) -> Path:
    """Replay the trace on `backend` (or take the finished `result`) and write the
    report; by default TRACE.html beside TRACE.json. Returns the path written."""
    from kvcheck.trace import load
    trace_path = Path(trace_path)
    trace = load(trace_path)
    res = result if result is not None else run_replay(trace, backend)
    path = Path(out) if out else trace_path.with_suffix(".html")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_html(report_data(trace, res, trace_path.name)))
    return path


_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>kvcheck: @TITLE@</title>
<style>@STYLE@</style></head>
<body>
<header><h1>kvcheck counterexample: <span id="title"></span></h1><div id="summary"></div><div id="config"></div></header>
<section id="failure"></section>
<div class="cols">
<section id="grid-box"><h2>Who owns each page, after each step <span id="side-buttons"></span></h2>
<div id="legend"></div><div id="grid"></div></section>
<section id="ops-box"><h2>Operations</h2><div id="ops"></div></section>
</div>
<section id="detail"></section>
<noscript>This report lays itself out with its inline script; the data is in the
script element "kvcheck-data".</noscript>
<script type="application/json" id="kvcheck-data">@DATA@</script>
<script>@SCRIPT@</script>
</body></html>
"""

_STYLE = """
body{font:13px/1.35 system-ui,-apple-system,"Segoe UI",sans-serif;margin:14px 18px;color:#1b1b1b}
h1{font-size:18px;margin:0 0 2px} h2{font-size:14px;margin:10px 0 6px}
#summary{color:#444} #config{color:#777;font-size:11px;font-family:monospace}
#failure{border-left:5px solid #c62828;background:#fdecea;padding:6px 10px;margin:10px 0}
#failure .head{font-weight:600;font-size:14px}
#failure ul{margin:4px 0 0 18px;padding:0} #failure summary{cursor:pointer;color:#555;margin-top:3px}
#failure.pass{border-color:#2e7d32;background:#e8f5e9}
.cols{display:flex;gap:22px;align-items:flex-start;flex-wrap:wrap}
table{border-collapse:collapse}
#grid td,#grid th{width:26px;height:20px;text-align:center;padding:0;font:12px monospace}
#grid th{font-weight:600;cursor:pointer} #grid th.page{width:48px;text-align:right;padding-right:6px}
#grid td{border:1px solid #fff;cursor:pointer}
.k-free{background:#eceff1;color:#90a4ae}
.k-node{background:#c8e6c9} .k-node_locked{background:#43a047;color:#fff}
.k-slot{background:#90caf9} .k-req{background:#ffcc80}
.k-conflict{background:#d32f2f;color:#fff;font-weight:700;box-shadow:inset 0 0 0 2px #7f0000}
.k-leak{background:#b39ddb;font-weight:700}
.k-none{background:repeating-linear-gradient(45deg,#fff,#fff 3px,#ddd 3px,#ddd 5px)}
#grid td.named{outline:3px solid #000;outline-offset:-1px}
#grid .sel{box-shadow:inset 0 0 0 2px #1565c0} #grid th.sel{background:#bbdefb}
#grid th.failstep{color:#c62828}
#legend{max-width:430px;margin-bottom:4px} #legend span{display:inline-block;margin-right:10px}
#legend i{display:inline-block;width:14px;height:12px;vertical-align:middle;margin-right:3px;border:1px solid #bbb}
#ops td,#ops th{border-bottom:1px solid #e0e0e0;padding:2px 8px;text-align:left;font-size:12px}
#ops td.op{font-family:monospace;word-break:break-word} #ops-box{flex:1 1 420px;min-width:380px}
#ops tr{cursor:pointer} #ops tr.sel{background:#bbdefb} #ops tr.failrow td{color:#b71c1c;font-weight:600}
#ops td.diverge{background:#ffcdd2}
button{font:12px system-ui;margin-left:4px;padding:1px 8px;border:1px solid #90a4ae;background:#fff;border-radius:3px;cursor:pointer}
button.on{background:#1565c0;color:#fff;border-color:#1565c0}
#detail{margin-top:14px;border-top:2px solid #90a4ae}
#detail pre{font:12px monospace;background:#f5f5f5;padding:6px 8px;margin:4px 0;white-space:pre-wrap}
#detail table td,#detail table th{font:12px monospace;padding:1px 8px;border-bottom:1px solid #eee;text-align:left;vertical-align:top}
#detail tr.m-star td{background:#ffebee} #detail tr.m-tilde td{background:#fff8e1}
#detail td.mark{font-weight:700;color:#c62828}
.muted{color:#777}
#detail pre .only{background:#ffcdd2;font-weight:700}
"""

_SCRIPT = r"""
(function(){
const D = JSON.parse(document.getElementById('kvcheck-data').textContent);
const F = D.failure;
let side = F && D.sides.includes(F.side) ? F.side : D.sides[D.sides.length-1];
let sel = {step: F ? F.step : D.labels.length-2, page: null};
const el = (t, a, kids) => { const e = document.createElement(t);
  for (const [k, v] of Object.entries(a||{})) { if (k === 'text') e.textContent = v; else e.setAttribute(k, v); }
  (kids||[]).forEach(c => e.appendChild(c)); return e; };
const named = new Set((F ? F.violations : []).filter(v => v.page !== null && v.id === F.id)
  .map(v => v.side + '|' + F.step + '|' + v.page));

function header(){
  document.getElementById('title').textContent = D.title;
  const n = D.labels.length - 1;
  document.getElementById('summary').textContent = 'sides: ' + D.sides.join(' vs ') + '; ' + n +
    ' step(s) run; expected ' + JSON.stringify(D.expect) + ' -> ' + (D.as_expected ? 'as expected' : 'NOT as expected');
  document.getElementById('config').textContent = 'config ' + JSON.stringify(D.config);
  const box = document.getElementById('failure');
  if (!F) { box.className = 'pass'; box.appendChild(el('div', {class: 'head', text: 'PASS: every invariant held and the states agreed'})); return; }
  box.appendChild(el('div', {class: 'head', text: F.id + ' ' + F.name + ' (on ' + F.side + ') at step ' + F.step + ': ' + F.op}));
  const item = v => { const where = [v.side, v.owner, v.page !== null ? 'page ' + v.page : null].filter(x => x).join('; ');
    return el('li', {text: v.id + ' ' + v.name + ' [' + where + ']: ' + v.message}); };
  const ul = el('ul', {id: 'violations'});
  F.violations.filter(v => v.id === F.id).forEach(v => ul.appendChild(item(v)));
  F.details.forEach(d => ul.appendChild(el('li', {text: d})));
  box.appendChild(ul);
  const rest = F.violations.filter(v => v.id !== F.id);
  if (rest.length) { const ids = [...new Set(rest.map(v => v.id))].join(', ');
    const more = el('details', {}, [el('summary', {text: rest.length + ' more violation(s) at this step: ' + ids})]);
    const ul2 = el('ul'); rest.forEach(v => ul2.appendChild(item(v))); more.appendChild(ul2); box.appendChild(more); }
}

function sideButtons(){
  const b = document.getElementById('side-buttons'); b.textContent = '';
  if (D.sides.length < 2) { b.appendChild(el('span', {class: 'muted', text: '(' + side + ')'})); return; }
  D.sides.forEach(s => { const x = el('button', {class: s === side ? 'on' : '', text: s});
    x.onclick = () => { side = s; draw(); }; b.appendChild(x); });
}

function legend(){
  const l = document.getElementById('legend');
  for (const [k, [name, c]] of Object.entries(D.kinds)) {
    l.appendChild(el('span', {}, [el('i', {class: 'k-' + k}), document.createTextNode(c + ' ' + name)])); }
}

function grid(){
  const g = document.getElementById('grid'); g.textContent = '';
  const cols = D.grids[side];
  const t = el('table', {id: 'grid-table', 'data-side': side});
  const hr = el('tr', {}, [el('th', {class: 'page', text: 'page'})]);
  D.labels.forEach((lab, j) => { const st = j - 1;
    const th = el('th', {'data-step': st, title: D.steps[j].op, text: lab === 'init' ? 'i' : lab});
    if (F && st === F.step) th.classList.add('failstep');
    if (st === sel.step) th.classList.add('sel');
    th.onclick = () => select(st, null); hr.appendChild(th); });
  t.appendChild(hr);
  D.rows.forEach(([label, r]) => { const p = D.pages[r]; const tr = el('tr', {}, [el('th', {class: 'page', text: label})]);
    cols.forEach((col, j) => { const st = j - 1;
      const cell = col ? col[r] : ['none', side + ' has no state here'];
      const td = el('td', {class: 'k-' + cell[0], 'data-page': p, 'data-step': st, title: 'page ' + label + ', step ' + D.labels[j] + ': ' + cell[1],
                           text: cell[0] === 'none' ? '' : D.kinds[cell[0]][1]});
      if (cell[0] === 'conflict' || cell[0] === 'leak') td.classList.add('flag');
      if (named.has(side + '|' + st + '|' + p)) td.classList.add('named');
      if (st === sel.step && p === sel.page) td.classList.add('sel');
      td.onclick = () => select(st, p); tr.appendChild(td); });
    t.appendChild(tr); });
  g.appendChild(t);
}

function ops(){
  const o = document.getElementById('ops'); o.textContent = '';
  const t = el('table', {}, [el('tr', {}, [el('th', {text: 'step'}), el('th', {text: 'operation'}),
    ...D.sides.map(s => el('th', {text: s}))])]);
  D.steps.forEach((s, j) => { if (j === 0) return; const st = j - 1;
    const outs = D.sides.map(x => s.outcomes[x] === null || s.outcomes[x] === undefined ? '-' : (s.outcomes[x] || '-'));
    const tr = el('tr', {'data-step': st}, [el('td', {text: st}), el('td', {class: 'op', text: s.op}),
      ...outs.map(x => el('td', {text: x}))]);
    if (outs.length > 1 && outs[0] !== outs[1]) tr.lastChild.classList.add('diverge');
    if (F && st === F.step) tr.classList.add('failrow');
    if (st === sel.step) tr.classList.add('sel');
    tr.onclick = () => select(st, null); t.appendChild(tr); });
  o.appendChild(t);
}

function detail(){
  const d = document.getElementById('detail'); d.textContent = '';
  const j = sel.step + 1, s = D.steps[j];
  d.appendChild(el('h2', {id: 'detail-title', 'data-step': sel.step,
    text: (sel.step < 0 ? 'Initial state' : 'Step ' + sel.step + ': ' + s.op) +
          (F && sel.step === F.step ? '  (the failing step)' : '')}));
  if (sel.page !== null) { const r = D.pages.indexOf(sel.page);
    d.appendChild(el('div', {id: 'cell-owners', text: 'page ' + sel.page + ': ' + D.sides.map(x => {
      const c = D.grids[x][j]; return x + ': ' + (c ? c[r][1] : 'no state'); }).join('; ')})); }
  if (sel.step >= 0) {
    d.appendChild(el('h2', {text: 'What changed since the previous step'}));
    const ch = s.changes, sides = Object.keys(ch);
    const same = sides.length < 2 || JSON.stringify(ch[sides[0]]) === JSON.stringify(ch[sides[1]]);
    (same ? [sides[0]] : sides).forEach(x => { const lines = ch[x];
      const other = sides.filter(y => y !== x).map(y => ch[y] || []).flat();
      d.appendChild(el('div', {class: 'muted', text: sides.length < 2 ? x + ':' : same ? 'both sides alike:' : x + ' (lines only this side has are marked):'}));
      const pre = el('pre', {class: 'changes', 'data-side': x});
      if (lines === null || !lines.length) pre.textContent = lines === null ? '(no state)' : '(no change)';
      else lines.forEach(ln => pre.appendChild(el('div', {class: !same && !other.includes(ln) ? 'only' : '', text: ln})));
      d.appendChild(pre); });
  }
  d.appendChild(el('h2', {text: 'Full state after this step' + (s.table_sides.length > 1 ?
    ' (one value: both sides agree; * differs; ~ differs only in page/row ids)' : ' (' + s.table_sides.join('') + ')')}));
  const two = s.table_sides.length > 1;
  const t = el('table', {id: 'state-table'}, [el('tr', {}, [el('th', {text: ''}), el('th', {text: 'field'}),
    ...s.table_sides.map(x => el('th', {text: x}))])]);
  s.table.forEach(([m, label, a, b]) => {
    const tr = el('tr', {class: m === '*' ? 'm-star' : m === '~' ? 'm-tilde' : ''}, [el('td', {class: 'mark', text: m}),
      el('td', {text: label}), el('td', {text: a})]);
    if (two) { const c = el('td', {text: m ? b : '='}); tr.appendChild(c); }
    t.appendChild(tr); });
  d.appendChild(t);
}

function select(step, page){ sel = {step: step, page: page};
  history.replaceState(null, '', '#step=' + step + (page !== null ? '&page=' + page : '')); draw(); }
function fromHash(){ const h = new URLSearchParams(location.hash.slice(1));
  if (h.has('step')) { const st = parseInt(h.get('step'), 10); if (st >= -1 && st < D.labels.length - 1) sel.step = st; }
  if (h.has('page')) { const p = parseInt(h.get('page'), 10); if (D.pages.includes(p)) sel.page = p; }
  if (h.has('side') && D.sides.includes(h.get('side'))) side = h.get('side'); }
function draw(){ sideButtons(); grid(); ops(); detail(); }
fromHash(); header(); legend(); draw();
document.body.setAttribute('data-ready', '1');
})();
"""
