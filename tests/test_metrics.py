"""The agent's metrics for dashboards: the OpenMetrics file and the Prometheus endpoint hold
what the journal holds, a failing write is journaled once and never raised."""

from __future__ import annotations

import math
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

import pytest
import torch
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_om
from prometheus_client.parser import text_string_to_metric_families as parse_prom

from faults import FaultPlan
from harness.inside.agent import Agent
from harness.inside.metrics import (
    ENV_FILE,
    ENV_INTERVAL,
    ENV_PORT,
    MetricsError,
    MetricsOptions,
)
from harness.records.events import Detected, Recovered, StepObserved
from harness.records.journal import Journal, read_journal
from harness.run_layout import RunLayout


def samples(
    text: str, *, openmetrics: bool = True
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of an exposition: (name, sorted labels) -> value."""
    parse = parse_om if openmetrics else parse_prom
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in parse(text)
        for s in family.samples
    }


def value(
    found: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str
) -> float | None:
    """One sample's value; None when absent."""
    return found.get((name, tuple(sorted(labels.items()))))


def expected(journal: Journal, rank: int = 0) -> dict[str, object]:
    """What the metrics must say, computed from the journal alone."""
    own = [e for e in journal if e.rank == rank]
    steps = [e for e in own if e.kind == "step"]
    last = steps[-1]
    return {
        "step": last.step,
        "loss": last.get("loss"),
        "loss_scale": last.get("loss_scale"),
        "wall": last.wall,
        "faults": Counter(e["fault"] for e in own if e.kind == "fault_injected"),
        "detections": Counter(e["detector"] for e in own if e.kind == "detected"),
        "recoveries": Counter(e["action"] for e in own if e.kind == "recovered"),
        "checkpoints": sum(e.kind == "checkpoint_saved" for e in own),
        "restarts": max(e.restart for e in own),
    }


def assert_matches(
    found: dict[tuple[str, tuple[tuple[str, str], ...]], float],
    want: dict[str, object],
    rank: int = 0,
) -> None:
    """The exposition holds the journal's figures for ``rank``."""
    r = str(rank)
    assert value(found, "tightrope_step", rank=r) == want["step"]
    loss = want["loss"]
    assert isinstance(loss, float) and math.isfinite(loss)
    assert value(found, "tightrope_loss", rank=r) == pytest.approx(loss)
    scale = want["loss_scale"]
    assert value(found, "tightrope_loss_scale", rank=r) == (
        None if scale is None else pytest.approx(scale)
    )
    assert value(found, "tightrope_last_step_timestamp_seconds", rank=r) == pytest.approx(
        want["wall"]
    )
    assert value(found, "tightrope_restarts", rank=r) == want["restarts"]
    assert value(found, "tightrope_checkpoints_saved_total", rank=r) == want["checkpoints"]
    for name, label, key in (
        ("tightrope_faults_injected_total", "fault", "faults"),
        ("tightrope_detections_total", "detector", "detections"),
        ("tightrope_recoveries_total", "action", "recoveries"),
    ):
        got = {dict(labels)[label]: v for (n, labels), v in found.items() if n == name}
        counts = want[key]
        assert isinstance(counts, Counter)
        assert got == dict(counts), name


def _train(agent: Agent, model: torch.nn.Linear, steps: range) -> None:
    """Steps of a small trainer with a guard: a non-finite gradient is claimed detected
    and its step skipped."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in steps:
        agent.begin_step(step)
        loss = model(torch.ones(2, 4)).pow(2).mean()
        loss.backward()
        agent.after_backward()
        agent.before_optimizer_step()
        if all(bool(p.grad.isfinite().all()) for p in model.parameters() if p.grad is not None):
            opt.step()
            agent.after_optimizer_step()
        else:
            agent.claim(Detected(detector="nonfinite_guard"))
        opt.zero_grad()
        agent.observe_step(StepObserved(loss=float(loss.detach()), loss_scale=1024.0 / step))
        agent.end_step()


def test_the_file_holds_the_journal_figures_after_a_run(tmp_path: Path) -> None:
    model = torch.nn.Linear(4, 2)
    plan = FaultPlan.from_dict({"faults": [{"kind": "nan_grad", "at_step": 3}]})
    options = MetricsOptions(file=tmp_path / "m" / "rank-0.prom", interval=0.0001)
    agent = Agent(tmp_path, plan=plan, model=model, control=False, metrics=options)
    agent.start(0)
    _train(agent, model, range(1, 4))
    agent.claim(Recovered(action="rollback"))
    _train(agent, model, range(4, 7))
    mid = samples(options.file.read_text())  # type: ignore[union-attr]
    assert value(mid, "tightrope_step", rank="0") == 6
    agent.close("completed")
    text = options.file.read_text()  # type: ignore[union-attr]
    assert text.endswith("# EOF\n")
    want = expected(read_journal(tmp_path))
    assert want["faults"] and want["detections"] and want["recoveries"]
    assert_matches(samples(text), want)
    assert_matches(samples(text, openmetrics=False), want)


def test_a_restarted_process_counts_the_whole_run(tmp_path: Path) -> None:
    plan = FaultPlan.from_dict({"faults": [{"kind": "nan_grad", "at_step": 2}]})
    path = tmp_path / "rank-0.prom"
    for restart, steps in ((0, range(1, 4)), (1, range(3, 6))):
        model = torch.nn.Linear(4, 2)
        options = MetricsOptions(file=path, interval=3600)
        agent = Agent(
            tmp_path, plan=plan, model=model, control=False, restart=restart, metrics=options
        )
        agent.start(steps[0] - 1)
        _train(agent, model, steps)
        agent.close("completed")
    want = expected(read_journal(tmp_path))
    assert want["restarts"] == 1 and sum(want["faults"].values()) == 1  # type: ignore[attr-defined]
    assert_matches(samples(path.read_text()), want)


def test_the_file_is_rewritten_at_most_every_interval(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.prom"
    model = torch.nn.Linear(4, 2)
    agent = Agent(
        tmp_path, model=model, control=False, metrics=MetricsOptions(file=path, interval=3600)
    )
    agent.start(0)
    _train(agent, model, range(1, 6))
    # Written once, at the first event; the next write is an hour away.
    assert value(samples(path.read_text()), "tightrope_step", rank="0") is None
    agent.close("completed")
    assert value(samples(path.read_text()), "tightrope_step", rank="0") == 5


def test_a_failing_write_is_journaled_once_and_training_goes_on(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the metrics folder should be")
    options = MetricsOptions(file=blocker / "rank-0.prom", interval=0.0001)
    model = torch.nn.Linear(4, 2)
    agent = Agent(tmp_path / "run", model=model, control=False, metrics=options)
    agent.start(0)
    _train(agent, model, range(1, 8))
    agent.close("completed")
    journal = read_journal(tmp_path / "run")
    failed = journal.of_kind("metrics_failed")
    assert len(failed) == 1
    assert failed[0]["path"] == str(options.file)
    assert "Error" in failed[0]["error"]
    assert [e.step for e in journal.of_kind("step")] == list(range(1, 8))


def _scrape(port: int, openmetrics: bool) -> str:
    accept = "application/openmetrics-text; version=1.0.0" if openmetrics else "text/plain"
    request = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers={"Accept": accept})
    with urllib.request.urlopen(request, timeout=10) as answer:
        return str(answer.read().decode())


def test_the_endpoint_serves_the_journal_figures_on_loopback(tmp_path: Path) -> None:
    model = torch.nn.Linear(4, 2)
    plan = FaultPlan.from_dict({"faults": [{"kind": "nan_grad", "at_step": 2}]})
    agent = Agent(tmp_path, plan=plan, model=model, control=False, metrics=MetricsOptions(port=0))
    assert agent.metrics is not None and agent.metrics.port
    port = agent.metrics.port
    agent.start(0)
    _train(agent, model, range(1, 5))
    want = expected(read_journal(tmp_path))
    assert_matches(samples(_scrape(port, openmetrics=True)), want)
    found = samples(_scrape(port, openmetrics=False), openmetrics=False)
    assert_matches(found, want)
    time.sleep(0.3)  # the heartbeat's age is reckoned at the scrape
    later = samples(_scrape(port, openmetrics=True))
    age = value(later, "tightrope_heartbeat_age_seconds", rank="0")
    assert age is not None and age >= 0.3
    agent.close("completed")
    with pytest.raises(urllib.error.URLError):
        _scrape(port, openmetrics=True)


def test_a_port_in_use_is_journaled_and_training_goes_on(tmp_path: Path) -> None:
    first = Agent(tmp_path / "a", control=False, metrics=MetricsOptions(port=0))
    assert first.metrics is not None and first.metrics.port
    model = torch.nn.Linear(4, 2)
    second = Agent(
        tmp_path / "b", model=model, control=False, metrics=MetricsOptions(port=first.metrics.port)
    )
    second.start(0)
    _train(second, model, range(1, 3))
    second.close("completed")
    first.close("completed")
    failed = read_journal(tmp_path / "b").of_kind("metrics_failed")
    assert len(failed) == 1 and failed[0]["port"] == first.metrics.port


def test_the_environment_switches_the_metrics_on(tmp_path: Path) -> None:
    env = {ENV_FILE: "1", ENV_PORT: "9400", ENV_INTERVAL: "2.5"}
    options = MetricsOptions.from_env(tmp_path, 3, env)
    assert options.file == RunLayout(tmp_path).metrics_file(3)
    assert (options.port, options.address, options.interval) == (9403, "127.0.0.1", 2.5)
    assert (
        MetricsOptions.from_env(tmp_path, 3, {ENV_FILE: str(tmp_path / "tf")}).file
        == tmp_path / "tf" / "rank-3.prom"
    )
    assert not MetricsOptions.from_env(tmp_path, 0, {}).enabled


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({ENV_INTERVAL: "soon"}, ENV_INTERVAL),
        ({ENV_INTERVAL: "0"}, ENV_INTERVAL),
        ({ENV_PORT: "http"}, ENV_PORT),
    ],
)
def test_bad_settings_name_the_variable(tmp_path: Path, env: dict[str, str], named: str) -> None:
    with pytest.raises(MetricsError, match=named):
        MetricsOptions.from_env(tmp_path, 0, {ENV_FILE: "1", **env})
