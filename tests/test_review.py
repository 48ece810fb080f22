"""`tightrope review RUN_DIR`: lists the queue the trainer wrote, records decisions that the
trainer's filter then honours, and refuses bad input with a clear message."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from faults.data import StreamDocument
from harness.commands.main import main
from harness.records.review import QueueEntry, append_entry, read_decisions
from harness.run_layout import RunLayout
from reference_trainer.stages.toxicity import ToxicityConfig, ToxicityStage


def tightrope(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


class Middling:
    """Tier 2 that finds every flagged text ambiguous."""

    def score(self, texts: list[str]) -> list[float]:
        return [0.5] * len(texts)


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """A run directory whose filter queued two documents."""
    RunLayout(tmp_path).config.write_text("{}")
    docs = [
        StreamDocument(3, "social_chatter", "This thread is so dumb, honestly."),
        StreamDocument(8, "product_reviews", "The update is dumb, the app froze."),
        StreamDocument(9, "code", "def f(): return 1"),
    ]
    stage = ToxicityStage(ToxicityConfig(), run_dir=tmp_path, classifier=Middling())
    assert [v.reason for v in stage.check_batch(docs)] == ["held", "held", "kept"]
    return tmp_path


def queued_ids(run_dir: Path) -> list[str]:
    lines = RunLayout(run_dir).review_queue.read_text().splitlines()
    return [json.loads(line)["id"] for line in lines]


def test_lists_the_queue(run_dir: Path) -> None:
    code, out, _ = tightrope("review", str(run_dir))
    assert code == 0
    first, second = queued_ids(run_dir)
    assert first in out and "social_chatter" in out and "0.500" in out and "so dumb" in out
    assert second in out and out.strip().endswith("2 held, 2 undecided")


def test_decisions_are_recorded_and_honoured_on_resume(run_dir: Path) -> None:
    first, second = queued_ids(run_dir)
    assert tightrope("review", str(run_dir), "--accept", first, "--reject", second)[0] == 0
    assert read_decisions(RunLayout(run_dir).review_decisions) == {
        first: "accept",
        second: "reject",
    }
    code, out, _ = tightrope("review", str(run_dir))
    assert code == 0 and "accept" in out and "reject" in out and "0 undecided" in out
    # The trainer, resumed, meets both documents again: kept and dropped, unscored.
    resumed = ToxicityStage(ToxicityConfig(), run_dir=run_dir, classifier=Middling())
    docs = [
        StreamDocument(3, "social_chatter", "This thread is so dumb, honestly."),
        StreamDocument(8, "product_reviews", "The update is dumb, the app froze."),
    ]
    assert [v.reason for v in resumed.check_batch(docs)] == ["kept", "rejected"]


def test_an_unknown_id_is_refused_and_nothing_recorded(run_dir: Path) -> None:
    code, _, err = tightrope("review", str(run_dir), "--accept", "d99-0000000000")
    assert code == 2 and "not in the review queue" in err and "d99-0000000000" in err
    assert not RunLayout(run_dir).review_decisions.exists()


def test_not_a_run_dir_is_refused(tmp_path: Path) -> None:
    code, _, err = tightrope("review", str(tmp_path / "nowhere"))
    assert code == 2 and "is not a run directory" in err


def test_a_torn_line_is_an_error_naming_file_and_line(run_dir: Path) -> None:
    queue = RunLayout(run_dir).review_queue
    with queue.open("a") as f:
        f.write('{"id": "d1-')
    code, _, err = tightrope("review", str(run_dir))
    assert code == 2 and f"{queue}:3" in err and "torn" in err


def test_an_empty_queue_says_so(tmp_path: Path) -> None:
    RunLayout(tmp_path).config.write_text("{}")
    code, out, _ = tightrope("review", str(tmp_path))
    assert code == 0 and "no documents held for review" in out
    entry = QueueEntry("d1-abc", 1, "code", 0.4, "x")
    append_entry(RunLayout(tmp_path).review_queue, entry)
    assert tightrope("review", str(tmp_path), "--accept", "d1-abc", "--reject", "d1-abc")[0] == 2
