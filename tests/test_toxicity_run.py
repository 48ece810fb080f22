"""The toxic-data scenario of the extended suite, trained in this process: with the
toxicity filter the injected posts are dropped or held (judged by the scenario's own
checks), without it they are trained on; a resumed run decides exactly as an unbroken one."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.oracles import judge
from harness.oracles.verdict import Evidence
from harness.records.journal import Journal
from harness.suites.scenario import Expect
from harness.suites.suite_loader import load_suite

from .stability_support import claims, config, run

pytestmark = pytest.mark.slow

SUITE = Path(__file__).resolve().parent.parent / "scenarios" / "extended.yaml"
STEPS = 20  # the suite trains 40; half of it injects ~12 posts, plenty to tell the two apart


def scenario_parts() -> tuple[list[dict[str, object]], Expect, int]:
    (scenario,) = [s for s in load_suite(SUITE).scenarios if s.name == "toxic-data"]
    faults = [
        f.model_dump(mode="json", exclude_defaults=True) | {"kind": f.kind} for f in scenario.faults
    ]
    return faults, scenario.expect, int(scenario.trainer.batch_size or 16)


def toxic_consumed(journal: Journal) -> int:
    return sum(e["contaminated_kinds"].get("toxic", 0) for e in journal.of_kind("step"))


def test_with_and_without_the_filter_and_across_a_resume(tmp_path: Path) -> None:
    faults, expect, batch = scenario_parts()
    cfg = config(steps=STEPS, batch_size=batch)
    _, journal = run(tmp_path / "on", cfg, faults)
    checks = judge(expect, Evidence(journal, tmp_path / "on", STEPS))
    assert all(c.passed for c in checks), [(c.name, c.detail) for c in checks]
    drops = claims(journal, "detected", "toxicity_filter")
    assert sum(c["details"]["contaminated_dropped"] for c in drops) >= 5

    off = config(steps=STEPS, batch_size=batch, disable=("toxicity_filter",))
    _, bare = run(tmp_path / "off", off, faults)
    assert toxic_consumed(bare) >= 5 and not claims(bare, "detected", "toxicity_filter")
    failed = {
        c.name for c in judge(expect, Evidence(bare, tmp_path / "off", STEPS)) if not c.passed
    }
    assert failed == {"max_toxic_consumed"}

    run(tmp_path / "resumed", cfg, faults, stop_after=STEPS // 2)
    _, resumed = run(tmp_path / "resumed", cfg, faults, resume=True)
    assert resumed.losses()[-STEPS // 2 :] == journal.losses()[-STEPS // 2 :]
    assert toxic_consumed(resumed) == toxic_consumed(journal)
