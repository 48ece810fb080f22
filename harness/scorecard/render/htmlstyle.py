"""The HTML scorecard's stylesheet, inlined into the page so the file stands alone."""

from __future__ import annotations

CSS = """
:root { --ink: #1d232b; --muted: #5d6874; --line: #dde2e8; --bg: #f6f8fa;
  --passed: #1a7f37; --failed: #cf222e; --error: #8250df; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto,
  "DejaVu Sans", sans-serif; color: var(--ink); background: #fff; }
.page { max-width: 1120px; margin: 0 auto; padding: 24px 28px 48px; }
h1 { font-size: 22px; margin: 0 0 4px; }
h2 { font-size: 18px; margin: 0 0 8px; display: flex; gap: 10px; align-items: center; }
h3 { font-size: 15px; margin: 18px 0 8px; }
.meta, .note, .muted { color: var(--muted); }
header.summary { display: grid; grid-template-columns: 1fr auto; gap: 12px 32px;
  padding: 20px 24px; background: var(--bg); border: 1px solid var(--line);
  border-radius: 8px; }
.score-box { text-align: right; }
.score-value { font-size: 44px; font-weight: 700; line-height: 1; }
.score-of { font-size: 18px; color: var(--muted); margin-left: 4px; }
.score-box .badge { display: block; margin: 10px 0 0 auto; }
.counts { display: flex; gap: 16px; list-style: none; padding: 0; margin: 8px 0 0; }
.counts li { font-weight: 600; }
.counts .passed { color: var(--passed); } .counts .failed { color: var(--failed); }
.counts .error { color: var(--error); } .counts .not-judged { color: #9a6700; }
.verdict { font-weight: 600; }
.verdict.passed { color: var(--passed); } .verdict.failed { color: var(--failed); }
.classes { grid-column: 1 / -1; }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: left; padding: 5px 8px; border-bottom: 1px solid var(--line);
  vertical-align: top; }
th { font-size: 12px; text-transform: uppercase; letter-spacing: .03em; color: var(--muted); }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
.bar { position: relative; width: 180px; height: 10px; background: #e9ecef;
  border-radius: 5px; overflow: hidden; display: inline-block; vertical-align: middle; }
.bar span { position: absolute; inset: 0 auto 0 0; background: var(--passed); }
.bar.mid span { background: #bf8700; } .bar.low span { background: var(--failed); }
.pill { display: inline-block; padding: 1px 9px; border-radius: 10px; font-size: 12px;
  font-weight: 600; color: #fff; text-transform: uppercase; letter-spacing: .03em; }
.pill.passed { background: var(--passed); } .pill.failed { background: var(--failed); }
.pill.error { background: var(--error); }
nav.index { margin: 24px 0 8px; }
nav.index a { color: inherit; }
section.scenario { margin: 28px 0; padding: 18px 22px; border: 1px solid var(--line);
  border-left: 5px solid var(--passed); border-radius: 6px; }
section.scenario.failed { border-left-color: var(--failed); }
section.scenario.error { border-left-color: var(--error); }
.facts { display: flex; flex-wrap: wrap; gap: 4px 22px; margin: 6px 0 12px; padding: 0;
  color: var(--muted); }
.facts div { display: flex; gap: 6px; } .facts dt { font-weight: 600; } .facts dd { margin: 0; }
tr.check-failed td { background: #fff5f5; }
tr.check-not-judged td { background: #fff8e6; }
.check-status { font-weight: 700; white-space: nowrap; }
tr.check-failed .check-status { color: var(--failed); }
tr.check-not-judged .check-status { color: #9a6700; }
tr.check-passed .check-status { color: var(--passed); }
.extra { color: var(--muted); font-size: 12px; }
.error-box { background: #f7f2ff; border: 1px solid #d8c8f5; border-radius: 6px;
  padding: 10px 14px; margin: 8px 0 12px; white-space: pre-wrap; font-weight: 600; }
.plots { display: grid; grid-template-columns: 1fr 1fr; gap: 12px; margin-top: 14px; }
figure.plot { margin: 0; border: 1px solid var(--line); border-radius: 6px; padding: 4px;
  background: #fff; }
figure.plot.wide { grid-column: 1 / -1; }
figure.plot svg { display: block; width: 100%; height: auto; }
pre { background: #0f1720; color: #dde3ea; padding: 12px 14px; border-radius: 6px;
  overflow-x: auto; font: 12px/1.4 ui-monospace, "DejaVu Sans Mono", monospace; }
details summary { cursor: pointer; color: var(--muted); margin-top: 10px; }
code { font: 12px ui-monospace, "DejaVu Sans Mono", monospace; }
footer { margin-top: 32px; color: var(--muted); font-size: 12px; }
"""
