"""Verdicts on the Hugging Face Trainer with two ranks under torchrun (tests/frameworks/
two_ranks.yaml): killed and resumed, its newest checkpoint damaged. The table and how each
expected verdict was established: tests/frameworks/expected.py. (The DCP loop's suite,
tests/frameworks/dcp.yaml, is not run here: see docs/frameworks.md.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.running.results import SuiteResult

pytest.importorskip("transformers")
pytest.importorskip("accelerate")  # the Trainer's own dependency

from tests.frameworks.expected import ROOT, check_facts, check_verdicts, run_suite_of

SUITE = ROOT / "tests" / "frameworks" / "two_ranks.yaml"
NAMES = {"hf-ddp-clean", "hf-kill", "hf-bitflip", "hf-truncate"}


@pytest.fixture(scope="module")
def out_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("frameworks")


@pytest.fixture(scope="module")
def verdicts(out_dir: Path) -> SuiteResult:
    return run_suite_of(SUITE, out_dir)


@pytest.mark.slow
@pytest.mark.distributed
def test_every_verdict_on_two_rank_framework_trainers_follows_what_they_did(
    verdicts: SuiteResult, out_dir: Path
) -> None:
    check_verdicts(verdicts, out_dir, NAMES)


@pytest.mark.slow
@pytest.mark.distributed
def test_the_two_rank_framework_trainers_did_what_the_table_says(
    verdicts: SuiteResult, out_dir: Path
) -> None:
    check_facts(verdicts, out_dir, NAMES)
