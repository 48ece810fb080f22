"""Verdicts on framework trainers with two ranks under torchrun: the Hugging Face Trainer
killed and resumed, its newest checkpoint damaged (tests/frameworks/two_ranks.yaml), and a
loop saving with torch.distributed.checkpoint under DDP and FSDP2 (tests/frameworks/dcp.yaml),
run as one suite. The table and how each expected verdict was established:
tests/frameworks/expected.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.running.results import SuiteResult
from tests.conftest import require
from tests.frameworks.expected import ROOT, check_facts, check_verdicts, run_suite_of

require("transformers", "accelerate")

SUITES = [ROOT / "tests" / "frameworks" / name for name in ("two_ranks.yaml", "dcp.yaml")]
NAMES = {
    "hf-ddp-clean", "hf-kill", "hf-bitflip", "hf-truncate",
    "dcp-clean", "dcp-fsdp-clean", "dcp-nan", "dcp-guard-nan", "dcp-kill", "dcp-bitflip",
    "dcp-truncate", "dcp-fsdp-kill",
}  # fmt: skip


@pytest.fixture(scope="module")
def out_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("frameworks")


@pytest.fixture(scope="module")
def verdicts(out_dir: Path) -> SuiteResult:
    return run_suite_of(SUITES, out_dir)


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
