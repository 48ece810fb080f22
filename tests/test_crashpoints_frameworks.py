"""Crash points on the trainers of the frameworks people use (issue #30, item 4):
``tightrope crashpoints`` kills each framework's own save at its file events, resumes with the
framework's own resume, and its verdicts must follow what the framework did.

What the framework did is read from its own files, never from tightrope's judgement: the
resume's output (``resume.log`` in the point's folder: the framework's traceback, the
checkpoint it said it resumed from) and the final weights the trainer wrote
(``--final-weights``, safetensors) against those of an uninterrupted run made here, outside
tightrope. A resume that raised and wrote no weights is HARD_FAIL; one that ended with other
weights is SILENT_DIVERGENCE; one that ended with the same weights is PASS, or LOST_WORK when
it started from an older checkpoint than the newest the kill left whole.

Each run is as short as shows the outcome (one or two saves, a sample of the points); the
durations alone are in docs/crashpoints.md ("Findings on frameworks").
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from safetensors import SafetensorError

from harness.commands.main import main as tightrope
from harness.running import warm_start
from tests.conftest import require
from tests.frameworks.final_weights import same_weights

require("transformers", "lightning")

ROOT = Path(__file__).resolve().parent.parent
FRAMEWORKS = ROOT / "tests" / "frameworks"
FINAL = "final.safetensors"
SLOT = "{run_dir}"
#: The last line of a Python traceback: the exception the resume died of.
_RAISED = re.compile(r"^(\w+(?:\.\w+)*(?:Error|Exception|Exit))\b(.*)$", re.M)


def trainer(script: str, steps: int, save_every: int, ranks: int = 1) -> list[str]:
    """The command of a framework trainer of tests/frameworks, its folder ``{run_dir}``."""
    head = [sys.executable]
    if ranks > 1:
        head += ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks)]
    return [*head, str(FRAMEWORKS / script), "--steps", str(steps), "--save-every",
            str(save_every), "--out", SLOT, "--final-weights", f"{SLOT}/{FINAL}"]  # fmt: skip


def env() -> dict[str, str]:
    """This checkout first on the path; one thread per process (2 cores, several ranks)."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return dict(os.environ, PYTHONPATH=path, OMP_NUM_THREADS="1")


def uninterrupted(command: list[str], where: Path) -> Path:
    """Run the trainer once, plainly (no tightrope), and return its final weights (forked
    warm, as the suite's trainer processes are, when the session is: tests/conftest.py)."""
    where.mkdir(parents=True)
    plain = env()
    cmd = warm_start.warm([part.replace(SLOT, str(where)) for part in command], plain)
    proc = subprocess.run(cmd, cwd=ROOT, env=plain, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return where / FINAL


@dataclass(slots=True)
class Exploration:
    """One ``tightrope crashpoints`` run: its exit code, crashpoints.json and folder."""

    exit: int
    doc: dict[str, Any]
    out: Path
    output: str

    def folder(self, point: dict[str, Any]) -> Path:
        """The folder of one point (its run dir, crash.log and resume.log)."""
        (found,) = (self.out / "points").glob(f"{point['index']:04d}-*")
        return found

    def verdicts(self) -> list[str]:
        return [p["verdict"] for p in self.doc["points"]]


def explore(out: Path, command: list[str], *options: str) -> Exploration:
    """``tightrope crashpoints --out OUT --cores 2 OPTIONS -- COMMAND``, in this process (its
    jobs run attached, each afresh as a user's; this checkout is the working folder)."""
    args = ["crashpoints", "--out", str(out), "--cores", "2", *options, "--", *command]
    printed, said = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(said):
        code = tightrope(args)
    report = out / "crashpoints.json"
    assert report.exists(), (printed.getvalue() + said.getvalue())[-3000:]
    return Exploration(code, json.loads(report.read_text()), out, printed.getvalue())


@dataclass(frozen=True, slots=True)
class WhatHappened:
    """What the resume of one point did, from the trainer's own output and files."""

    finished: bool
    """The resume wrote its final weights (readable)."""
    same: bool
    """Those weights are bit-identical to the uninterrupted run's."""
    raised: str | None
    """The exception the resume died of (its traceback's last line), if any."""
    log: str


def what_happened(folder: Path, reference: Path) -> WhatHappened:
    """Read one point's resume: its output and the final weights in its run dir."""
    log = (folder / "resume.log").read_text(errors="replace")
    raised = [m.group(1) for m in _RAISED.finditer(log)]
    try:  # a torn final file the kill left, never rewritten, is no end either
        same = same_weights(folder / "run" / FINAL, reference)
    except (OSError, SafetensorError):
        return WhatHappened(False, False, raised[-1] if raised else None, log)
    return WhatHappened(True, same, raised[-1] if raised else None, log)


def expected(w: WhatHappened) -> set[str]:
    """The verdicts the framework's own outcome allows (PASS and LOST_WORK look alike in
    the weights; which one is checked apart)."""
    if not w.finished:
        return {"HARD_FAIL"}
    if not w.same:
        return {"SILENT_DIVERGENCE"}
    return {"PASS", "LOST_WORK"}


def check_each_point(run: Exploration, reference: Path) -> dict[int, WhatHappened]:
    """Every point's verdict is one its framework's outcome allows; what happened, by index."""
    assert run.doc["deterministic"] is True, run.output[-2000:]
    seen = {}
    for point in run.doc["points"]:
        w = what_happened(run.folder(point), reference)
        assert point["verdict"] in expected(w), (point, w.raised, w.log[-1500:])
        seen[point["index"]] = w
    return seen


# -- Hugging Face Trainer, one process -----------------------------------------------------


@pytest.mark.slow
def test_hf_trainer_resumes_into_its_incomplete_newest_folder_and_dies(tmp_path: Path) -> None:
    """The class of #35525: auto-resume takes the highest ``checkpoint-N`` without checking it
    is whole (``trainer_state.json`` is written last), so a kill inside the save leaves a job
    that cannot restart. One save (step 2), an even sample of two of its points: the kill
    before the run's first file (a fresh start, PASS: the negative control) and one in the
    middle of the save (after ``checkpoint-2/`` was made, before ``trainer_state.json``),
    where the class shows (each point is a killed run and a resume, each importing the
    Trainer: seconds of CPU; docs/crashpoints.md has a larger sample)."""
    command = trainer("hf_trainer.py", steps=2, save_every=2)
    reference = uninterrupted(command, tmp_path / "plain")
    run = explore(tmp_path / "cp", command, "--max-points", "2")
    seen = check_each_point(run, reference)
    # Its points were forked from the warm interpreter: the forked fault-free run saw the
    # Trainer's model.safetensors save, which it binds when transformers is imported.
    assert run.doc["notes"] == [], run.doc["notes"]

    hard = [p for p in run.doc["points"] if p["verdict"] == "HARD_FAIL"]
    assert hard, run.output[-2000:]
    assert len(hard) < len(seen)  # the kill before the save resumed whole: not every point fails
    for point in hard:  # the framework's own words: it resumed into checkpoint-2 and raised
        w = seen[point["index"]]
        assert re.search(r"resuming training at \S*checkpoint-2\b", w.log), w.log[-1500:]
        assert w.raised is not None, w.log[-1500:]
    assert run.doc["summary"]["HARD_FAIL"] == sum(not w.finished for w in seen.values())
    assert run.exit == 1  # HARD_FAIL fails the command by default


# -- Lightning -----------------------------------------------------------------------------


@dataclass(slots=True)
class Explored:
    """An exploration and what the framework did at each of its points."""

    run: Exploration
    seen: dict[int, WhatHappened]


@pytest.fixture(scope="module")
def lightning(tmp_path_factory: pytest.TempPathFactory) -> Explored:
    """Every point of one Lightning save (step 2 of 2), checked point by point."""
    tmp = tmp_path_factory.mktemp("lightning")
    command = trainer("lightning_trainer.py", steps=2, save_every=2)
    reference = uninterrupted(command, tmp / "plain")
    run = explore(tmp / "cp", command)
    return Explored(run, check_each_point(run, reference))


@pytest.mark.slow
def test_lightning_resumes_whole_from_every_kill_of_its_save(lightning: Explored) -> None:
    """Lightning writes each checkpoint to a temporary file and renames it into place
    (``_atomic_save``: an fsspec transaction), so a kill never leaves a torn checkpoint under
    a name it reads: no point fails or diverges, every resume ends with the uninterrupted
    run's weights."""
    assert all(w.finished and w.same for w in lightning.seen.values())
    assert not {"HARD_FAIL", "SILENT_DIVERGENCE"} & set(lightning.run.verdicts())
    assert lightning.run.exit == 0


@pytest.mark.slow
def test_lightning_loses_work_killed_between_its_checkpoint_and_last_ckpt(
    lightning: Explored,
) -> None:
    """A kill after Lightning renamed ``epoch=0-step=2.ckpt`` into place but before it wrote
    ``last.ckpt`` leaves ``ckpt_path="last"`` nothing to load: the job starts over though a
    whole checkpoint of step 2 lies beside it. Work lost, never wrong weights."""
    points = lightning.run.doc["points"]
    # After the rename of the step's checkpoint (the fault-free run's event order) and yet,
    # by Lightning's own log, not resumed there.
    installed = min(
        p["event"]["n"]
        for p in points
        if p["event"]["op"] == "rename" and "epoch=" in p["event"]["path"]
    )
    lost = {
        p["index"]
        for p in points
        if p["event"]["n"] > installed
        and "resuming at step 2" not in lightning.seen[p["index"]].log
    }
    assert lost  # the class shows
    assert {p["index"] for p in points if p["verdict"] == "LOST_WORK"} == lost


# -- torch.distributed.checkpoint, two ranks ------------------------------------------------


@pytest.mark.slow
@pytest.mark.distributed
def test_dcp_never_loads_a_folder_without_its_metadata(tmp_path: Path) -> None:
    """DCP writes each rank's ``__R_0.distcp`` in place and the coordinator's ``.metadata``
    last, through ``.metadata.tmp`` and a rename; the trainer loads only a folder that holds
    ``.metadata`` (the recipe's check). A kill anywhere in the save, on either rank, leaves the
    folder without it, so the resume falls back to the previous save (here: a fresh start)
    and ends bit-identical. Two ranks under torchrun, and one point (a torchrun start costs
    two ranks' imports, and no zygote serves it; docs/crashpoints.md gives a larger sample):
    ``--only 4``, a kill on rank 0 inside the save before ``.metadata`` is in place. Which
    rank makes the shared folder first is a race, so rank 0 records 6 to 9 events (its own
    ``mkdir`` of ``ckpt/step-2`` and ``ckpt``, or none); in each case its fifth point (each
    event gives one, a file being written one more, torn) lies between its first step into
    ``ckpt/step-2/`` and the rename of ``.metadata``: the kill this test is about."""
    command = trainer("dcp_trainer.py", steps=2, save_every=2, ranks=2)
    reference = uninterrupted(command, tmp_path / "plain")
    run = explore(tmp_path / "cp", command, "--ranks", "2", "--only", "4")
    seen = check_each_point(run, reference)

    assert all(w.finished and w.same for w in seen.values())
    assert set(run.verdicts()) == {"PASS"}, run.output[-2000:]
    [point] = run.doc["points"]
    event = point["event"]
    assert (point["rank"], event["save_step"]) == (0, 2), point
    assert event["path"].startswith("ckpt/step-2") and event["op"] != "rename", point
    assert run.exit == 0
