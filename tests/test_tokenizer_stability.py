"""The tokenizer fallback in a tiny run, with and without it, against the tokenizer-stress
fault: judged from the byte-fallback tokens of the batches that reached the model."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.records.journal import Journal

from .stability_support import claims, config, run

pytestmark = pytest.mark.slow

STRESS = [{"kind": "tokenizer_stress", "at_step": 1, "rate": 0.3, "kinds": ["scripts", "control"]}]


def _share(journal: Journal) -> float:
    steps = journal.of_kind("step")
    tokens = sum(e["batch_tokens"] for e in steps)
    assert tokens == 20 * 8 * 65  # every step reports what it counted over
    return sum(e["fallback_tokens"] for e in steps) / tokens


@pytest.fixture(scope="module")
def straight(tmp_path_factory: pytest.TempPathFactory) -> Journal:
    """A 20-step run under the fault, with the fallback."""
    _, journal = run(tmp_path_factory.mktemp("straight") / "run", config(steps=20), STRESS)
    return journal


def test_the_fallback_keeps_byte_noise_from_the_model(straight: Journal) -> None:
    assert _share(straight) == 0
    acted = claims(straight, "detected", "tokenizer_fallback")
    assert acted
    details = [c["details"] for c in acted]
    assert sum(d["dropped"] for d in details) >= 1  # a script the vocabulary lacks
    assert sum(d["over"] - d["dropped"] for d in details) >= 1  # repaired and kept
    assert all(d["rate_before"] > 0.05 for d in details)
    assert all(
        set(c) == {"docs", "over", "retokenized", "dropped"}
        for d in details
        for c in d["by_source"].values()
    )


def test_without_the_fallback_the_stress_reaches_the_model(tmp_path: Path) -> None:
    cfg = config(steps=20, disable=("tokenizer_fallback",))
    _, journal = run(tmp_path, cfg, STRESS)
    assert _share(journal) > 0.03
    assert not claims(journal, "detected", "tokenizer_fallback")


def test_a_resume_under_the_fault_is_bit_exact(tmp_path: Path, straight: Journal) -> None:
    cfg = config(steps=20)
    run(tmp_path, cfg, STRESS, stop_after=10)
    _, split = run(tmp_path, cfg, STRESS, resume=True)
    assert split.losses() == straight.losses()  # exact, not approximate
    fallback = [e["fallback_tokens"] for e in split.of_kind("step")]
    assert fallback == [e["fallback_tokens"] for e in straight.of_kind("step")]
