"""A real reference-trainer run with the agent's metrics on: scraped on loopback while it
trains, and its OpenMetrics file after, both agree with the journal."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.error
from pathlib import Path

import pytest

from harness.records.journal import read_journal
from harness.run_layout import RunLayout
from harness.running import warm_start

from .test_metrics import _scrape, assert_matches, expected, samples, value

ROOT = Path(__file__).resolve().parents[1]
STEPS = 10


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_a_reference_run_exposes_what_it_journals(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text("faults:\n  - {kind: nan_grad, at_step: 5}\n")
    run_dir = tmp_path / "run"
    port = _free_port()
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "TIGHTROPE_METRICS_FILE": "1",
        "TIGHTROPE_METRICS_PORT": str(port),
        "TIGHTROPE_METRICS_INTERVAL": "0.2",
    }
    argv = [sys.executable, "-m", "reference_trainer", "--preset", "tiny", "--steps", str(STEPS)]
    argv += ["--precision", "fp16", "--checkpoint-every", "5", "--fault-plan", str(plan)]
    argv = warm_start.warm([*argv, "--run-dir", str(run_dir)], env)  # as the suite's trainers
    proc = subprocess.Popen(
        argv, cwd=ROOT, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    scraped: list[tuple[float, float]] = []  # (step, loss) as the endpoint said mid-run
    try:
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                found = samples(_scrape(port, openmetrics=True))
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.05)
                continue
            step, loss = (value(found, n, rank="0") for n in ("tightrope_step", "tightrope_loss"))
            if step is not None and loss is not None and step < STEPS:
                scraped.append((step, loss))
            time.sleep(0.05)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, out
    journal = read_journal(run_dir)
    want = expected(journal)
    assert want["step"] == STEPS and want["loss_scale"] is not None
    assert want["faults"] == {"nan_grad": 1} and want["detections"] and want["checkpoints"]
    text = RunLayout(run_dir).metrics_file(0).read_text()
    assert_matches(samples(text), want)
    assert_matches(samples(text, openmetrics=False), want)
    # Each figure scraped mid-run is the one the journal holds for that step.
    # ...and it followed the run: more than one step seen while it trained.
    assert len({step for step, _ in scraped}) >= 2, f"scraped {scraped}:\n{out}"
    journaled = {(e.step, e["loss"]) for e in journal.of_kind("step") if e.rank == 0}
    for step, loss in scraped:
        assert any(s == step and got == pytest.approx(loss) for s, got in journaled), (step, loss)
    assert not read_journal(run_dir).of_kind("metrics_failed")
