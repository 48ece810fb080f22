"""The journal contract: what is written is read back, merged, and survives a killed writer."""

from __future__ import annotations

import json
import math
import re
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

from harness.errors import JournalError
from harness.records.events import CheckpointSaved, Detected, StepObserved
from harness.records.journal import JournalWriter, TornLineWarning, read_journal
from harness.records.journal_schema import (
    COMMON_FIELDS,
    EVENT_KINDS,
    SCHEMA_VERSION,
    kinds_markdown,
)
from harness.run_layout import RunLayout

from .conftest import ROOT


def _start(w: JournalWriter) -> None:
    w.emit("run_start", 0, world_size=2, pid=1, host="h")


def test_events_round_trip_with_common_fields(tmp_path: Path) -> None:
    with JournalWriter(tmp_path, rank=1, restart=2) as w:
        _start(w)
        w.emit("step", 1, loss=2.5, grad_norm=None, lr=1e-3, tokens=512)
    events = read_journal(tmp_path)
    assert [e.kind for e in events] == ["run_start", "step"]
    step = events[1]
    assert (step.rank, step.restart, step.step, step.v) == (1, 2, 1, SCHEMA_VERSION)
    assert step["loss"] == 2.5 and step["grad_norm"] is None and step["tokens"] == 512
    assert step.wall > 1e9 and step.mono > 0


def test_non_finite_floats_are_valid_json_and_read_back_as_floats(tmp_path: Path) -> None:
    with JournalWriter(tmp_path) as w:
        w.emit("step", 1, loss=math.nan, grad_norm=math.inf, lr=-math.inf)
    line = RunLayout(tmp_path).journal_file(0).read_text().strip()
    record = json.loads(line, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))
    assert record["loss"] == "nan"
    (event,) = read_journal(tmp_path)
    assert math.isnan(event["loss"]) and event["grad_norm"] == math.inf
    assert event["lr"] == -math.inf


@pytest.mark.parametrize(
    ("kind", "fields", "message"),
    [
        ("stepp", {"loss": 1.0}, "unknown journal event kind 'stepp'"),
        ("step", {"los": 1.0}, "step.los is not in the schema"),
        ("step", {"loss": "low"}, "step.loss must be float"),
        ("step", {}, "missing required field(s): loss"),
        ("checkpoint_rejected", {"path": "p"}, "missing required field(s): reason"),
    ],
)
def test_writer_refuses_events_outside_the_schema(
    tmp_path: Path, kind: str, fields: dict[str, object], message: str
) -> None:
    with JournalWriter(tmp_path) as w, pytest.raises(JournalError, match=re.escape(message)):
        w.emit(kind, 1, **fields)
    assert RunLayout(tmp_path).journal_file(0).read_bytes() == b""


def test_ranks_are_merged_in_time_and_each_keeps_its_order(tmp_path: Path) -> None:
    w0, w1 = JournalWriter(tmp_path, rank=0), JournalWriter(tmp_path, rank=1)
    for step in range(1, 4):
        w0.emit("step", step, loss=float(step))
        w1.emit("step", step, loss=float(step))
    w0.close()
    w1.close()
    events = read_journal(tmp_path)
    assert [(e.rank, e.step) for e in events] == [(0, 1), (1, 1), (0, 2), (1, 2), (0, 3), (1, 3)]
    assert events.ranks == [0, 1]


def test_a_step_redone_after_restart_keeps_the_last_attempt(tmp_path: Path) -> None:
    with JournalWriter(tmp_path, restart=0) as w:
        for step in (1, 2, 3):
            w.emit("step", step, loss=10.0 + step)
    with JournalWriter(tmp_path, restart=1) as w:  # resumed from step 1
        for step in (2, 3, 4):
            w.emit("step", step, loss=20.0 + step)
    journal = read_journal(tmp_path)
    assert journal.losses() == [11.0, 22.0, 23.0, 24.0]
    assert [e.restart for e in journal] == [0, 0, 0, 1, 1, 1]


def test_torn_last_line_is_skipped_with_a_warning(tmp_path: Path) -> None:
    with JournalWriter(tmp_path) as w:
        w.emit("step", 1, loss=1.0)
        w.emit("step", 2, loss=2.0)
    path = RunLayout(tmp_path).journal_file(0)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 9])  # cut the second line short
    with pytest.warns(TornLineWarning, match="torn last line"):
        events = read_journal(tmp_path)
    assert [e.step for e in events] == [1]
    # Where a torn tail is expected: the same events and a note, and no warning at all.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        quiet = read_journal(tmp_path, warn=False)
    assert [e.step for e in quiet] == [1]
    assert len(quiet.skipped) == 1 and "torn last line" in quiet.skipped[0]


def test_writer_reopened_after_a_torn_line_starts_a_fresh_line(tmp_path: Path) -> None:
    with JournalWriter(tmp_path) as w:
        w.emit("step", 1, loss=1.0)
    path = RunLayout(tmp_path).journal_file(0)
    path.write_bytes(path.read_bytes() + b'{"v":1,"kind":"st')  # killed mid-line
    with JournalWriter(tmp_path, restart=1) as w:
        w.emit("step", 2, loss=2.0)
    with pytest.warns(TornLineWarning, match="line 2"):
        events = read_journal(tmp_path)
    assert [(e.step, e.restart) for e in events] == [(1, 0), (2, 1)]


_KILLED_WRITER = """
import sys
from harness.records.journal import JournalWriter
w = JournalWriter(sys.argv[1])
print("ready", flush=True)
step = 0
while True:
    step += 1
    w.emit("detected", step, detector="d", details={"pad": "x" * 2000})
"""


def test_reader_survives_a_writer_killed_mid_stream(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", _KILLED_WRITER, str(tmp_path)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        events = read_journal(tmp_path)
    # A torn tail may or may not exist; if it does, it is a warning, never an error.
    assert all(w.category is TornLineWarning for w in caught)
    assert len(events) > 10
    assert [e.step for e in events] == list(range(1, len(events) + 1))


def test_journal_from_a_newer_schema_is_refused(tmp_path: Path) -> None:
    path = RunLayout(tmp_path).journal_file(0)
    path.parent.mkdir(parents=True)
    record = {k: 0 for k in COMMON_FIELDS} | {"v": SCHEMA_VERSION + 1, "kind": "step"}
    path.write_text(json.dumps(record) + "\n")
    with pytest.raises(JournalError, match=f"schema v{SCHEMA_VERSION + 1}"):
        read_journal(tmp_path)


def test_missing_journal_names_the_folder(tmp_path: Path) -> None:
    with pytest.raises(JournalError, match="journal does not exist"):
        read_journal(tmp_path)


def test_docs_describe_every_kind_and_field() -> None:
    doc = (ROOT / "docs" / "journal.md").read_text()
    for name in COMMON_FIELDS:
        assert f"`{name}`" in doc, f"docs/journal.md does not describe common field {name}"
    for kind, (_, fields) in EVENT_KINDS.items():
        section = doc.split(f"### `{kind}`", 1)
        assert len(section) == 2, f"docs/journal.md has no section for {kind}"
        body = section[1].split("### ", 1)[0]
        for name in fields:
            assert f"`{name}`" in body, f"docs/journal.md: {kind} does not describe {name}"


def test_docs_kind_sections_are_written_from_the_events() -> None:
    doc = (ROOT / "docs" / "journal.md").read_text()
    assert kinds_markdown() in doc, "docs/journal.md: paste kinds_markdown() over its kinds"


def test_events_read_back_typed(tmp_path: Path) -> None:
    with JournalWriter(tmp_path, rank=0) as w:
        w.emit("step", 1, loss=2.5, lr=0.1, skipped=False)
        w.emit("detected", 1, detector="nonfinite_guard")
        w.emit("checkpoint_saved", 1, path="ckpt/step-1", bytes=7)
    journal = read_journal(tmp_path)
    step, detected, saved = journal
    assert step.is_(StepObserved) and not step.is_(Detected)
    assert detected.is_(StepObserved, Detected)
    assert journal.of_kind(CheckpointSaved) == journal.of_kind("checkpoint_saved") == [saved]
    typed = step.as_(StepObserved)
    assert typed == StepObserved(loss=2.5, lr=0.1, skipped=False) and typed.loss == 2.5
    assert detected.as_(Detected) == Detected(detector="nonfinite_guard")
    assert step.as_(Detected) is None  # another kind


def test_odd_evidence_is_not_typed_but_stays_readable(tmp_path: Path) -> None:
    path = RunLayout(tmp_path).journal_file(0)
    path.parent.mkdir(parents=True)
    common = {"v": SCHEMA_VERSION, "wall": 1.0, "mono": 1.0, "rank": 0, "restart": 0, "step": 3}
    lines = [
        common | {"kind": "step", "loss": "high"},  # a wrong type
        common | {"kind": "step", "loss": 1.0, "mood": "ok"},  # a field no schema has
        common | {"kind": "checkpoint_saved", "bytes": 3},  # a required field missing
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    wrong, unknown, missing = read_journal(tmp_path)
    assert wrong.as_(StepObserved) is None and wrong.get("loss") == "high"
    assert unknown.as_(StepObserved) is None and unknown.get("mood") == "ok"
    assert missing.as_(CheckpointSaved) is None and missing.get("bytes") == 3
