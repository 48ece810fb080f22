"""Which checklist items a run directory emitted, judged from what is on disk.

An item is emitted when any of its evidence is found: a journal event of its kind (with
the field present and not null, or holding the value asked for), a run-dir file, or a
microscope array with at least one finite value (a histogram: one non-zero count). An item
with ``evidence: none`` is never emitted: this project cannot show it yet.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from harness.checklist.catalogue import ChecklistError, Evidence, Item, catalogue, file_paths
from harness.errors import JournalError
from harness.records.journal import Event, read_journal
from harness.records.microscope_file import Microscope, MicroscopeFileError, read_microscope
from harness.run_layout import RunLayout


@dataclass(frozen=True, slots=True)
class Found:
    """What one piece of evidence found in a run: how many, and a word on what."""

    evidence: str
    count: int
    detail: str

    def to_dict(self) -> dict[str, Any]:
        """Plain data for ``--json``."""
        return {"evidence": self.evidence, "count": self.count, "detail": self.detail}


@dataclass(frozen=True, slots=True)
class ItemResult:
    """One item of a run's checklist: emitted or not, and the evidence found."""

    item: Item
    found: tuple[Found, ...] = ()

    @property
    def emitted(self) -> bool:
        """Some evidence of the item was found."""
        return any(f.count > 0 for f in self.found)


@dataclass(slots=True)
class RunChecklist:
    """A run directory's checklist: every item, emitted or not."""

    run_dir: Path
    results: list[ItemResult]
    notes: list[str] = field(default_factory=list)

    @property
    def emitted(self) -> list[ItemResult]:
        """The items the run emitted, in catalogue order."""
        return [r for r in self.results if r.emitted]

    @property
    def missing(self) -> list[ItemResult]:
        """The items it did not emit, in catalogue order."""
        return [r for r in self.results if not r.emitted]


def is_run_dir(path: Path) -> bool:
    """A directory that holds a journal or a trainer configuration."""
    layout = RunLayout(path)
    return path.is_dir() and (layout.journal.is_dir() or layout.config.is_file())


def _value(value: Any, path: Sequence[str]) -> bool:
    """``value`` holds something not null at ``path`` (``*``: any key of an object)."""
    if not path:
        return value is not None
    if not isinstance(value, dict):
        return False
    head, rest = path[0], path[1:]
    if head == "*":
        return any(_value(v, rest) for v in value.values())
    return head in value and _value(value[head], rest)


def _journal_count(events: Iterable[Event], evidence: Evidence) -> int:
    count = 0
    for event in events:
        if event.kind != evidence.name:
            continue
        if evidence.match is not None and str(event.get(evidence.match[0])) != evidence.match[1]:
            continue
        if evidence.path and not _value(dict(event.fields), evidence.path):
            continue
        count += 1
    return count


def _microscope_count(scope: Microscope, name: str) -> int:
    """Records (or probes) of every rank where the array holds something measured."""
    count = 0
    for series in scope.ranks.values():
        if name == "probe_us":
            count += sum(1 for _s, _p, us in series.probes if np.isfinite(us))
        elif name == "act_hist":
            count += int((series.act_hist.sum(axis=(1, 2)) > 0).sum()) if len(series) else 0
        else:
            values = np.asarray(getattr(series, name), dtype=np.float64)
            if values.size:
                finite = np.isfinite(values)
                count += int(finite.reshape(len(series), -1).any(axis=1).sum())
    return count


class _Run:
    """What a run directory holds, read once and lazily."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.notes: list[str] = []
        self._events: list[Event] | None = None
        self._scope: Microscope | None = None

    @property
    def events(self) -> list[Event]:
        if self._events is None:
            try:
                journal = read_journal(self.run_dir, warn=False)
            except JournalError as exc:
                self.notes.append(str(exc))
                self._events = []
            else:
                self.notes.extend(journal.skipped)
                self._events = list(journal)
        return self._events

    @property
    def scope(self) -> Microscope:
        if self._scope is None:
            try:
                # An unreadable chunk is skipped with a warning (on stderr) and noted.
                self._scope = read_microscope(self.run_dir)
            except MicroscopeFileError as exc:
                self.notes.append(str(exc))
                self._scope = Microscope(layers=[], ranks={})
            self.notes.extend(f"skipped microscope chunk {s}" for s in self._scope.skipped)
        return self._scope

    def find(self, evidence: Evidence) -> Found:
        if evidence.source == "journal":
            n = _journal_count(self.events, evidence)
            return Found(evidence.text, n, f"{n} event{'s' if n != 1 else ''}")
        if evidence.source == "file":
            paths = file_paths(self.run_dir, evidence.name)
            shown = str(paths[0].relative_to(self.run_dir)) if paths else "none on disk"
            more = f" (+{len(paths) - 1} more)" if len(paths) > 1 else ""
            return Found(evidence.text, len(paths), shown + more)
        n = _microscope_count(self.scope, evidence.name)
        what = "probes" if evidence.name == "probe_us" else "records"
        return Found(evidence.text, n, f"{n} {what} with a value")


def check_run(run_dir: Path, items: Sequence[Item] | None = None) -> RunChecklist:
    """The checklist of one run directory; `ChecklistError` when it is not one."""
    run_dir = Path(run_dir)
    if not is_run_dir(run_dir):
        raise ChecklistError(
            f"{run_dir} is not a run directory (no journal/ nor config.json in it)"
        )
    run = _Run(run_dir)
    results = [
        ItemResult(item, tuple(run.find(e) for e in item.evidence))
        for item in (catalogue() if items is None else items)
    ]
    return RunChecklist(run_dir=run_dir, results=results, notes=run.notes)
