"""The microscope recorder on trainers that know nothing of tightrope: what it records, when,
and that a fault shows in the layer it hit."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import harness
from faults import FaultPlan
from harness.inside.layer_figures import SAMPLE_VALUES, OutputSamples, histogram
from harness.inside.microscope import MicroscopeOptions, MicroscopeOptionsError
from harness.records.journal import read_journal
from harness.records.microscope_file import (
    BIN_LABELS,
    MICROSCOPE_ENV,
    WHY_AFTER,
    WHY_ANOMALY,
    WHY_BEFORE,
    WHY_PERIODIC,
    read_microscope,
)
from harness.run_layout import RunLayout
from harness.running import warm_start

from .plain_train import VOCAB, Net
from .test_attach import batches

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ["embed", "blocks.0", "blocks.1", "head"]


def train(run_dir: Path, steps: int, faults: list[dict[str, object]] | None = None) -> None:
    """A tutorial loop with the agent attached and a non-finite-gradient guard; the
    microscope as the environment says."""
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    plan = FaultPlan.from_dict({"faults": faults}) if faults else None
    with harness.attach(model, optimizer, run_dir=run_dir, plan=plan) as agent:
        for tokens in agent.wrap_batches(batches(steps)):
            logits = model(tokens[:, :-1])
            loss = torch.nn.functional.cross_entropy(
                logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1)
            )
            optimizer.zero_grad()
            loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            if torch.isfinite(norm):  # a guarded loop: a non-finite gradient skips the step
                optimizer.step()


@pytest.fixture
def recording(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MICROSCOPE_ENV, "every=5,window=2")


def test_an_attached_agent_records_nothing_unless_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(MICROSCOPE_ENV, raising=False)
    train(tmp_path, 6)
    assert not RunLayout(tmp_path).microscope.exists()
    assert len(read_journal(tmp_path).steps()) == 6


@pytest.mark.usefixtures("recording")
def test_every_nth_step_is_recorded_whole(tmp_path: Path) -> None:
    train(tmp_path, 12)
    scope = read_microscope(tmp_path)
    series = scope.ranks[0]
    assert scope.layers == LAYERS
    assert series.steps.tolist() == [5, 10] and set(series.why.tolist()) == {WHY_PERIODIC}
    assert np.all(np.isfinite(series.grad_norm)) and np.all(series.grad_norm > 0)
    assert np.all(series.update_ratio > 0) and np.all(series.update_ratio < 1)
    # Every value of every layer's output is binned: 8 sequences x 12 positions x width.
    assert series.act_hist[0].sum(axis=1).tolist() == [8 * 12 * 16] * 3 + [8 * 12 * VOCAB]
    assert np.isnan(series.allreduce_ms).all()  # one process: no all-reduce


@pytest.mark.usefixtures("recording")
def test_a_nan_gradient_shows_in_its_layer_with_the_steps_around_it(tmp_path: Path) -> None:
    train(tmp_path, 12, [{"kind": "nan_grad", "at_step": 7, "target": "blocks.0.*"}])
    series = read_microscope(tmp_path).ranks[0]
    why = dict(zip(series.steps.tolist(), series.why.tolist(), strict=True))
    assert why == {
        5: WHY_PERIODIC,
        6: WHY_BEFORE,  # the ring held it until the anomaly came
        7: WHY_ANOMALY,
        8: WHY_AFTER,
        9: WHY_AFTER,
        10: WHY_PERIODIC,
    }
    at = series.steps.tolist().index(7)
    norms = dict(zip(LAYERS, series.grad_norm[at].tolist(), strict=True))
    assert norms["blocks.0"] == math.inf  # not NaN: NaN would read "not measured"
    assert all(math.isfinite(norms[name]) for name in ("embed", "blocks.1", "head"))
    # Before the anomaly there was no copy of the weights to compare: not measured.
    assert np.isnan(series.update_ratio[series.steps.tolist().index(6)]).all()


@pytest.mark.usefixtures("recording")
def test_an_overflowing_activation_shows_in_the_histogram_of_its_layer(tmp_path: Path) -> None:
    faults = [{"kind": "activation_overflow", "at_step": 3, "target": "blocks.1", "factor": 1e12}]
    train(tmp_path, 6, faults)
    series = read_microscope(tmp_path).ranks[0]
    at = series.steps.tolist().index(3)
    overflow = BIN_LABELS.index(">=1e+8")
    high = series.act_hist[at, :, overflow:].sum(axis=1)
    assert high[LAYERS.index("blocks.1")] > 0 and high[LAYERS.index("blocks.0")] == 0
    before = series.steps.tolist().index(2)
    assert series.act_hist[before, :, overflow:].sum() == 0  # negative control: a normal step


@pytest.mark.usefixtures("recording")
def test_the_output_hooks_stay_put_between_steps_without_a_fault(tmp_path: Path) -> None:
    # A compiled model is traced again whenever a module's hooks change: the recorder's stay
    # from step to step, and go in again only after a fault's own hooks (to run after them).
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    plan = FaultPlan.from_dict(
        {"faults": [{"kind": "activation_overflow", "at_step": 3, "target": "blocks.1"}]}
    )
    seen: list[tuple[int, ...]] = []
    with harness.attach(model, optimizer, run_dir=tmp_path, plan=plan) as agent:
        for tokens in agent.wrap_batches(batches(5)):
            logits = model(tokens[:, :-1])
            seen.append(tuple(model.blocks[0]._forward_hooks))
            loss = torch.nn.functional.cross_entropy(
                logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1)
            )
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    assert seen[0] == seen[1] and seen[1] != seen[2] and seen[3] == seen[4]
    assert len(seen[0]) == 1 and not model.blocks[0]._forward_hooks  # and all gone at close


@pytest.mark.usefixtures("recording")
def test_a_failing_microscope_is_journaled_once_and_training_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(self: OutputSamples, index: int, output: torch.Tensor) -> None:
        raise RuntimeError("no histogram today")

    monkeypatch.setattr(OutputSamples, "add", broken)
    train(tmp_path, 6)
    journal = read_journal(tmp_path)
    [failed] = journal.of_kind("microscope_failed")
    assert failed.step == 1 and failed["error"] == "RuntimeError: no histogram today"
    assert sorted(journal.steps()) == [1, 2, 3, 4, 5, 6]
    assert journal.of_kind("run_end")[0]["status"] == "completed"


def test_a_large_output_is_sampled_but_its_overflow_and_nan_are_counted_exactly() -> None:
    output = torch.randn(8, 256, 256)
    sampled = histogram(output)
    assert 3000 < sampled.sum() <= 2 * SAMPLE_VALUES and sampled[-2:].sum() == 0
    output[0, 0, 5], output[1, 2, 3] = float("nan"), 1e9
    every = histogram(output)
    assert every.sum() == output.numel()  # a blow-up somewhere: every value is binned
    assert every[BIN_LABELS.index(">=1e+8")] == 1 and every[-1] == 1


def test_a_steps_outputs_binned_together_count_as_each_binned_alone() -> None:
    """The microscope bins a step's outputs only when it writes the step, all layers at
    once: the counts are those of each output binned on its own, added up per layer."""
    torch.manual_seed(0)
    blown = torch.randn(8, 64, 64)
    blown[0, 0, 0] = float("inf")
    outputs = [
        (0, torch.randn(100)),
        (1, torch.randn(50_000) * 3),
        (1, torch.randn(4097) * 1e-6),  # the same layer again: a second micro-batch
        (2, blown),  # binned at once, in full
        (2, torch.randn(8, 64, 64).half()),
        (3, torch.randint(0, 5, (10,))),  # not floating point: not counted
    ]
    samples = OutputSamples(4)
    for index, output in outputs:
        samples.add(index, output)
    alone = np.zeros((4, len(BIN_LABELS)), dtype=np.int64)
    for index, output in outputs:
        alone[index] += histogram(output)
    assert (samples.counts() == alone).all() and alone[2, -1] == 1 and alone[3].sum() == 0
    assert (samples.counts() == alone).all()  # asked again: counted once


def test_bad_settings_are_named() -> None:
    with pytest.raises(MicroscopeOptionsError, match=r"colour=red.* NAME one of every, window"):
        MicroscopeOptions.parse("every=10,colour=red")
    with pytest.raises(MicroscopeOptionsError, match="window must be a number"):
        MicroscopeOptions.parse("window=wide")
    with pytest.raises(MicroscopeOptionsError, match=r"microscope\.every must be >= 1"):
        MicroscopeOptions.parse("every=0")
    assert MicroscopeOptions.parse("off", MicroscopeOptions(enabled=True)).enabled is False
    assert MicroscopeOptions.parse("probe_every=0").probe_every == 0


def _exec(run_dir: Path, steps: int, nproc: int = 1, spec: str = "every=5") -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1", **{MICROSCOPE_ENV: spec})
    launcher = [sys.executable]
    if nproc > 1:
        launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                    "--nproc-per-node", str(nproc)]  # fmt: skip
    cmd = [sys.executable, "-m", "harness", "exec", "--run-dir", str(run_dir), "--",
           *launcher, "tests/plain_train.py", "--steps", str(steps)]  # fmt: skip
    cmd = warm_start.warm(cmd, env)  # forked warm when the test session is (tests/conftest.py)
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.slow
def test_the_zero_code_attach_records_a_plain_script(tmp_path: Path) -> None:
    _exec(tmp_path, 10)
    scope = read_microscope(tmp_path)
    assert scope.layers == LAYERS and scope.ranks[0].steps.tolist() == [5, 10]


@pytest.mark.distributed
def test_two_ranks_record_their_all_reduce_time_and_the_latency_between_them(
    tmp_path: Path,
) -> None:
    _exec(tmp_path, 10, nproc=2, spec="every=5,probe_every=5")
    scope = read_microscope(tmp_path)
    assert sorted(scope.ranks) == [0, 1]
    for series in scope.ranks.values():
        assert series.steps.tolist() == [5, 10]
        assert np.all(series.allreduce_ms > 0)  # DDP's bucket all-reduces, timed
    ranks, matrix = scope.latency_matrix()
    assert ranks == [0, 1] and matrix[0, 1] > 0 and matrix[1, 0] > 0
    assert [p[0] for p in scope.ranks[0].probes] == [1, 5, 10]  # the first step, then every 5th
