"""docs/checklist.md, written from the catalogue (``python -m harness.checklist.docs``);
`tests/test_checklist.py` keeps the checked-in page equal to what this writes."""

from __future__ import annotations

import sys

from harness.checklist.catalogue import FILE_EVIDENCE, GROUPS, MICROSCOPE_ARRAYS, Item, catalogue

_INTRO = """\
# The monitoring checklist

What a training team should watch, item by item: what is measured, why it matters, which
fault kinds exercise it, and how a run shows it emitted it. The catalogue is data,
`harness/checklist/items.yaml` (validated by `harness/checklist/catalogue.py`); this page is
written from it (`python -m harness.checklist.docs > docs/checklist.md`) and a test keeps
the two equal.

```
tightrope checklist RUN_DIR [--json]      # which items this run emitted, with the evidence
tightrope checklist SUITE.yaml [--json]   # which items the suite's fault kinds exercise
```

For a run directory each item is **emitted** when any of its evidence is found on disk:

{evidence}

A detector's or a recovery's item is emitted only when it fired: a clean run shows the
signals it records all the time (loss, gradient norms, checkpoints, the microscope), and a
faulted one the claims its fault gave rise to. A tiny reference-trainer run of 30 clean
steps on one rank emitted 27 of the 86 items (`python -m reference_trainer --run-dir R
--steps 30`, then `tightrope checklist R`; 2026-12-01). An item a fault kind exercises is not
always emitted when it is injected: of the 17 items `inf_grad` exercises, core's
`inf-grad-persistent` (fp32, one rank) emitted 9, since the loss-scale items need fp16 and
`gave-up` a recovery that ran out; of the 11 `bitflip` exercises, `weight-bitflip` emitted 8
(the replica items need two ranks)
(`tightrope run scenarios/core.yaml -k "inf-grad-persistent or weight-bitflip"`, then
`tightrope checklist` on each run directory).

For a suite file an item is **exercised** when some scenario injects one of its fault
kinds; the items no scenario exercises are what the suite's monitoring misses. An item with
no fault kind (`faults: -` below) is one no fault of this project exercises: every suite
misses it, and the checklist says so rather than count it. Exercised is not emitted: a
scenario under the `fragile` preset injects the fault with the detectors off, and
`tightrope checklist` on its run directory shows what was actually emitted.

The scorecard shows the same counts (items exercised by the suite, items emitted by its
runs) beside its table of fault kinds x mechanisms (docs/scorecard.md).

{counts}
"""


#: How each form of evidence is found, for the page's table.
_EVIDENCE_ROWS = (
    ("KIND", "the journal holds an event of that kind (docs/journal.md)"),
    (
        "KIND.FIELD",
        "... an event of that kind with `FIELD` present and not null (`KIND.FIELD.*.SUB`: "
        "`SUB` of any entry of the object `FIELD`)",
    ),
    (
        "KIND[FIELD=VALUE]",
        "... an event of that kind whose `FIELD` is `VALUE` (a detector's or an action's name)",
    ),
    ("file:NAME", "the run directory holds that file: {files}"),
    (
        "microscope.ARRAY",
        "a microscope array ({arrays}) has a finite value at some record (`act_hist`: a "
        "non-zero count; `probe_us`: a finite probe)",
    ),
    ("none", "never: this project cannot show the item yet"),
)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _row(item: Item) -> str:
    faults = ", ".join(f"`{k}`" for k in item.faults) or "-"
    evidence = " or ".join(f"`{e}`" for e in item.evidence) if item.evidence else "none"
    return (
        f"| `{item.name}` | {_cell(item.title)} | {_cell(item.signal)} | {_cell(item.why)} | "
        f"{faults} | {evidence} |"
    )


def render() -> str:
    """The whole page."""
    items = catalogue()
    shown = sum(i.showable for i in items)
    no_fault = sum(not i.faults for i in items)
    counts = (
        f"{len(items)} items in {len(GROUPS)} groups: {shown} this project can show today, "
        f"{len(items) - shown} it cannot yet (`evidence: none`); {len(items) - no_fault} "
        f"exercised by some fault kind, {no_fault} by none."
    )
    files = ", ".join(f"`{n}`" for n in FILE_EVIDENCE)
    arrays = ", ".join(f"`{n}`" for n in MICROSCOPE_ARRAYS)
    table = "\n".join(
        ["| evidence | found when |", "|---|---|"]
        + [
            f"| `{form}` | {how.format(files=files, arrays=arrays)} |"
            for form, how in _EVIDENCE_ROWS
        ]
    )
    lines = [_INTRO.format(evidence=table, counts=counts).rstrip("\n")]
    for group, title in GROUPS.items():
        members = [i for i in items if i.group == group]
        if not members:
            continue
        lines += [
            "",
            f"## {title}",
            "",
            "| item | title | signal | why it matters | faults | evidence |",
            "|---|---|---|---|---|---|",
            *(_row(i) for i in members),
        ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
