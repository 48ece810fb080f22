"""Verdicts on framework trainers, one process each (tests/frameworks/one_rank.yaml): the
Hugging Face Trainer's NaN scenarios, every Lightning and Accelerate scenario. The table
and how each expected verdict was established: tests/frameworks/expected.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.running.results import SuiteResult
from tests.conftest import require
from tests.frameworks.expected import ROOT, check_facts, check_verdicts, run_suite_of

require("transformers", "accelerate", "lightning")

SUITE = ROOT / "tests" / "frameworks" / "one_rank.yaml"
NAMES = {
    "hf-clean", "hf-nan", "hf-guard-nan",
    *(f"{f}-{s}" for f in ("lightning", "accelerate")
      for s in ("clean", "nan", "guard-nan", "kill", "bitflip", "truncate")),
}  # fmt: skip


@pytest.fixture(scope="module")
def out_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("frameworks")


@pytest.fixture(scope="module")
def verdicts(out_dir: Path) -> SuiteResult:
    return run_suite_of(SUITE, out_dir)


@pytest.mark.slow
def test_every_verdict_on_one_process_framework_trainers_follows_what_they_did(
    verdicts: SuiteResult, out_dir: Path
) -> None:
    check_verdicts(verdicts, out_dir, NAMES)


@pytest.mark.slow
def test_the_one_process_framework_trainers_did_what_the_table_says(
    verdicts: SuiteResult, out_dir: Path
) -> None:
    check_facts(verdicts, out_dir, NAMES)
