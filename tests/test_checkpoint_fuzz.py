"""The checkpoint fuzzer against the reference trainer's resume, and against a loader that
verifies nothing (the negative control: the oracle must catch it)."""

from __future__ import annotations

import os
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


#: Where the cases are copied and damaged: memory when the machine has it (each case writes
#: and deletes an 18 MB copy of the run, which on a disk is waiting, not work).
SCRATCH = Path("/dev/shm") if os.access("/dev/shm", os.W_OK) else None


@pytest.fixture(scope="module")
def pristine() -> Iterator[Pristine]:
    """The two trained runs every case is copied from (built once for the module)."""
    base = Path(tempfile.mkdtemp(prefix="tightrope-fuzz-pristine-", dir=SCRATCH))
    try:
        yield build_pristine(base)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_resume_survives_50_random_damages(pristine: Pristine) -> None:
    # A hang is reported after 10 s rather than the fuzzer's default 30: no resume of this
    # run comes near that, and a regression should not cost minutes. 50 cases of seed 0
    # do each of the 14 kinds of damage 2 to 11 times and leave 3 runs with nothing valid
    # (the asserts below check that every kind and a refusal still come up); two of them
    # also resume through the CLI, each a fresh trainer process, the dearest part of a
    # case. Longer campaigns are the fuzzer's CLI's (docs/checkpoint-fuzzer.md).
    settings = Settings(seed=0, cases=50, cli_every=25, timeout=10, cli_timeout=60, scratch=SCRATCH)
    report = fuzz(settings, pristine=pristine)

    found = report.failures()
    assert all(found[kind] == 0 for kind in FAILURES), report.render(show=8)
    # The campaign could have failed: every kind of damage was done, both a load and a
    # refusal (no valid checkpoint left) were judged in process, and 2 cases went through
    # the CLI.
    assert set(report.mutations()) == set(MUTATIONS), report.mutations()
    outcomes = report.outcomes("load")
    assert outcomes["loaded"] > 0 and outcomes["refused"] > 0, outcomes
    assert sum(report.outcomes("cli").values()) == 2


def _trusting_resume(run_dir: Path) -> Resume:
    """Resume from ``latest`` (or the newest name) without verifying anything."""
    manager = checkpoint_manager(run_dir, CheckpointConfig(integrity=False))
    path, state = manager.load_valid()
    return Resume(str(path), str(path), content_digest(path, state))


def test_the_oracle_catches_a_loader_that_verifies_nothing(pristine: Pristine) -> None:
    report = fuzz(
        Settings(seed=0, cases=20, cli_every=0, timeout=10, scratch=SCRATCH),
        load=_trusting_resume,
        pristine=pristine,
    )

    assert report.failures()["corrupt_load"] > 0, report.render()
