"""The checkpoint fuzzer against the reference trainer's resume, and against a loader that
verifies nothing (the negative control: the oracle must catch it)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from reference_trainer.checkpoints.manager import CheckpointConfig
from tests.checkpoint_fuzzer import FAILURES, Settings, fuzz
from tests.checkpoint_mutations import MUTATIONS
from tests.checkpoint_truth import (
    Pristine,
    Resume,
    build_pristine,
    checkpoint_manager,
    content_digest,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def pristine() -> Iterator[Pristine]:
    """The two trained runs every case is copied from (built once for the module)."""
    base = Path(tempfile.mkdtemp(prefix="tightrope-fuzz-pristine-"))
    try:
        yield build_pristine(base)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_resume_survives_100_random_damages(pristine: Pristine) -> None:
    # A hang is reported after 10 s rather than the fuzzer's default 30: no resume of this
    # run comes near that, and a regression should not cost minutes. 100 cases of seed 0
    # do each of the 14 kinds of damage 10 to 22 times and leave 5 runs with nothing valid
    # (the asserts below check that every kind and a refusal still come up); longer
    # campaigns are the fuzzer's CLI's (docs/checkpoint-fuzzer.md).
    report = fuzz(
        Settings(seed=0, cases=100, cli_every=25, timeout=10, cli_timeout=60), pristine=pristine
    )

    found = report.failures()
    assert all(found[kind] == 0 for kind in FAILURES), report.render(show=8)
    # The campaign could have failed: every kind of damage was done, both a load and a
    # refusal (no valid checkpoint left) were judged in process, and 4 cases went through
    # the CLI.
    assert set(report.mutations()) == set(MUTATIONS), report.mutations()
    outcomes = report.outcomes("load")
    assert outcomes["loaded"] > 0 and outcomes["refused"] > 0, outcomes
    assert sum(report.outcomes("cli").values()) == 4


def _trusting_resume(run_dir: Path) -> Resume:
    """Resume from ``latest`` (or the newest name) without verifying anything."""
    manager = checkpoint_manager(run_dir, CheckpointConfig(integrity=False))
    path, state = manager.load_valid()
    return Resume(str(path), str(path), content_digest(path, state))


def test_the_oracle_catches_a_loader_that_verifies_nothing(pristine: Pristine) -> None:
    report = fuzz(
        Settings(seed=0, cases=20, cli_every=0, timeout=10),
        load=_trusting_resume,
        pristine=pristine,
    )

    assert report.failures()["corrupt_load"] > 0, report.render()
