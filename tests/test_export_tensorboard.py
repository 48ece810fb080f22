"""`tightrope export RUN_DIR --tensorboard DIR`: what TensorBoard's own reader finds in the
files is what the journal and the microscope recorded (docs/exports.md)."""

from __future__ import annotations

import contextlib
import io
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from rich.console import Console

from harness.commands.main import main
from harness.exports.tensorboard_points import BUCKET_LIMITS, tensorboard_buckets
from harness.records.journal import JournalWriter, read_journal
from harness.records.microscope_file import (
    N_BINS,
    WHY_ANOMALY,
    WHY_PERIODIC,
    MicroscopeWriter,
    Record,
    histogram,
    read_microscope,
)

event_accumulator = pytest.importorskip(
    "tensorboard.backend.event_processing.event_accumulator",
    reason="the tensorboard package (the dev extra) reads the files back",
)

LAYERS = ["embed", "blocks.0", "blocks.1"]
STEPS = 12
FAULT_STEP = 6
#: Each TensorBoard bucket's lower edge (docs/exports.md): zeros, then the previous limit.
LOWER_EDGES = [0.0, 0.0, *BUCKET_LIMITS[1:-1]]


def tightrope(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def read_back(folder: Path) -> Any:
    """TensorBoard's own reader over one rank's folder, keeping every point."""
    guidance = dict.fromkeys(event_accumulator.DEFAULT_SIZE_GUIDANCE, 0)
    accumulator = event_accumulator.EventAccumulator(str(folder), size_guidance=guidance)
    accumulator.Reload()
    return accumulator


def f32(value: float) -> float:
    return float(np.float32(value))


def activations(rng: np.random.Generator, step: int) -> np.ndarray:
    """Values spread over the bins, with zeros, overflows and (at the fault) non-finites."""
    x = rng.standard_normal(500) * 10.0 ** rng.uniform(-9, 9, 500)
    x[:7] = 0.0
    x[7:9] = 3e9
    if step == FAULT_STEP:
        x[9:12] = [np.nan, np.inf, -np.inf]
    return x


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """Two ranks: steps with every field rank 0 has, a fault, a detection and a recovery,
    and a microscope record every other step (and at the fault)."""
    run = tmp_path / "run"
    rng = np.random.default_rng(0)
    for rank in (0, 1):
        with JournalWriter(run, rank=rank) as journal:
            for step in range(1, STEPS + 1):
                fields: dict[str, Any] = {"loss": 5.0 - 0.1 * step + 0.01 * rank}
                if rank == 0:
                    fields.update(
                        lr=3e-4 * step / STEPS,
                        grad_norm=None if step == 3 else 1.0 / step,
                        loss_scale=2.0**16,
                        tokens=4096,
                        step_time=0.0123 * step,
                    )
                if step == FAULT_STEP and rank == 0:
                    fields["loss"] = float("nan")
                    journal.emit("fault_injected", step, fault="nan_grad", target="blocks.1")
                    journal.emit("detected", step, detector="nonfinite_grad")
                    journal.emit("recovered", step, action="skip_step")
                journal.emit("step", step, **fields)
        writer = MicroscopeWriter(run, rank=rank, restart=0, layers=LAYERS, chunk_records=4)
        for step in range(1, STEPS + 1):
            if step % 2 and step != FAULT_STEP:
                continue
            grad = rng.uniform(0.01, 2.0, len(LAYERS)).astype(np.float32)
            if step == FAULT_STEP:
                grad[2] = np.inf
            hist = np.stack([histogram(activations(rng, step)) for _ in LAYERS])
            if step == 4:
                hist[0] = 0  # not taken for this layer at this record
            writer.add(
                Record(
                    step=step,
                    why=WHY_ANOMALY if step == FAULT_STEP else WHY_PERIODIC,
                    wall=1.7e9 + step + rank / 10,
                    grad_norm=grad,
                    weight_norm=rng.uniform(1, 10, len(LAYERS)).astype(np.float32),
                    update_ratio=np.array([1e-3, np.nan, 2e-3], dtype=np.float32),
                    act_hist=hist,
                    allreduce_ms=float(rng.uniform(1, 5)),
                )
            )
            if step == 8:
                writer.add_probe(step, peer=1 - rank, round_trip_us=42.5 + rank)
        writer.flush()
    return run


def export(run: Path, out: Path) -> str:
    code, stdout, stderr = tightrope("export", str(run), "--tensorboard", str(out))
    assert code == 0, stderr
    return stdout


def test_scalars_are_the_journals_at_its_steps_and_wall_times(run_dir: Path, tmp_path: Path):
    out = tmp_path / "tb"
    export(run_dir, out)
    journal = read_journal(run_dir)
    for rank in (0, 1):
        board = read_back(out / f"rank-{rank}")
        steps = journal.steps(rank)
        for name in ("loss", "lr", "grad_norm", "loss_scale", "tokens", "step_time"):
            want = [(s, e.wall, e.get(name)) for s, e in sorted(steps.items())]
            want = [(s, w, v) for s, w, v in want if v is not None]
            if not want:  # rank 1 journals the loss only
                assert f"train/{name}" not in board.Tags()["scalars"]
                continue
            got = [(p.step, p.wall_time, p.value) for p in board.Scalars(f"train/{name}")]
            assert [(s, w) for s, w, _ in got] == [(s, w) for s, w, _ in want]
            np.testing.assert_array_equal(
                [v for *_, v in got], [f32(v) for *_, v in want], err_msg=name
            )
        if rank == 0:  # the null grad norm of step 3 is no point; the NaN loss is one
            assert 3 not in [p.step for p in board.Scalars("train/grad_norm")]
            assert np.isnan([p.value for p in board.Scalars("train/loss")][FAULT_STEP - 1])


def test_per_layer_scalars_are_the_microscopes(run_dir: Path, tmp_path: Path):
    out = tmp_path / "tb"
    export(run_dir, out)
    microscope = read_microscope(run_dir)
    for rank, series in microscope.ranks.items():
        board = read_back(out / f"rank-{rank}")
        for name in ("grad_norm", "weight_norm", "update_ratio"):
            for i, layer in enumerate(microscope.layers):
                values = getattr(series, name)[:, i]
                measured = ~np.isnan(values)
                points = board.Scalars(f"{name}/{layer}") if measured.any() else []
                assert [p.step for p in points] == series.steps[measured].tolist()
                assert [p.wall_time for p in points] == series.wall[measured].tolist()
                np.testing.assert_array_equal([p.value for p in points], values[measured])
        # update_ratio of blocks.0 was never measured: no tag, not a line of zeros
        assert "update_ratio/blocks.0" not in board.Tags()["scalars"]
        allreduce = board.Scalars("comm/allreduce_ms")
        np.testing.assert_array_equal([p.value for p in allreduce], series.allreduce_ms)
        probe = board.Scalars(f"comm/p2p_us/rank-{1 - rank}")
        assert [(p.step, p.value) for p in probe] == [(8, 42.5 + rank)]
    # the overflowed gradient is kept as the finding it is
    grads = read_back(out / "rank-0").Scalars("grad_norm/blocks.1")
    assert [p.value for p in grads if p.step == FAULT_STEP] == [np.inf]


def test_histograms_keep_every_recorded_count(run_dir: Path, tmp_path: Path):
    out = tmp_path / "tb"
    export(run_dir, out)
    microscope = read_microscope(run_dir)
    for rank, series in microscope.ranks.items():
        board = read_back(out / f"rank-{rank}")
        for i, layer in enumerate(microscope.layers):
            taken = series.act_hist[:, i].sum(axis=1) > 0
            hists = board.Histograms(f"act_hist/{layer}")
            nonfinite = board.Scalars(f"act_nonfinite/{layer}")
            assert [h.step for h in hists] == series.steps[taken].tolist()
            assert [p.step for p in nonfinite] == series.steps[taken].tolist()
            for hist, extra, counts in zip(
                hists, nonfinite, series.act_hist[taken, i], strict=True
            ):
                value = hist.histogram_value
                drawn = dict(zip(value.bucket_limit, value.bucket, strict=True))
                recorded = dict(zip(BUCKET_LIMITS, counts[:-1].tolist(), strict=True))
                assert drawn.keys() <= recorded.keys()
                assert {k: v for k, v in recorded.items() if v} == {
                    k: v for k, v in drawn.items() if v
                }
                assert value.min == LOWER_EDGES[BUCKET_LIMITS.index(value.bucket_limit[0])]
                assert sum(value.bucket) + extra.value == counts.sum() == 500
                assert value.num == counts[:-1].sum()
    # embed was not taken at step 4: no histogram there, rather than an empty one
    assert 4 not in [h.step for h in read_back(out / "rank-0").Histograms("act_hist/embed")]
    at_fault = read_back(out / "rank-0").Scalars("act_nonfinite/blocks.0")
    assert {p.step: p.value for p in at_fault}[FAULT_STEP] == 3


def test_each_value_falls_in_the_bucket_tensorboard_draws_it_in():
    for v in (0.0, -0.0, 1e-12, 5e-8, -3e-5, 0.99, 1.0, 7e7, 9e7):
        hist, nonfinite = tensorboard_buckets(histogram(np.array([v])), "t", 0, None)
        assert hist is not None and nonfinite == 0
        assert hist.bucket_counts == (1,)  # one value: one bucket, the empty ones left out
        bucket = BUCKET_LIMITS.index(hist.bucket_limits[0])
        assert LOWER_EDGES[bucket] <= abs(v) <= BUCKET_LIMITS[bucket], (v, bucket)
        assert (hist.min, hist.max) == (LOWER_EDGES[bucket], BUCKET_LIMITS[bucket])
    for v in (1e8, -2e12):  # overflow: the one bucket above 1e8
        hist, _ = tensorboard_buckets(histogram(np.array([v])), "t", 0, None)
        assert hist is not None and hist.bucket_limits == (BUCKET_LIMITS[-1],)
        assert hist.bucket_counts == (1,) and hist.min == 1e8
    only_nan, count = tensorboard_buckets(histogram(np.array([np.nan, np.inf])), "t", 0, None)
    assert only_nan is None and count == 2
    with pytest.raises(ValueError, match="expected 35 bin counts"):
        tensorboard_buckets(np.zeros(N_BINS - 1), "t", 0, None)


def test_faults_detections_and_recoveries_are_text_at_their_step(run_dir: Path, tmp_path: Path):
    out = tmp_path / "tb"
    export(run_dir, out)
    board = read_back(out / "rank-0")

    def texts(tag: str) -> dict[int, str]:
        # torch's add_text files TAG's text as TAG/text_summary
        points = board.Tensors(f"{tag}/text_summary")
        return {t.step: t.tensor_proto.string_val[0].decode() for t in points}

    assert list(texts("events/faults")) == [FAULT_STEP]
    assert "nan_grad" in texts("events/faults")[FAULT_STEP]
    assert "blocks.1" in texts("events/faults")[FAULT_STEP]
    assert "nonfinite_grad" in texts("events/detections")[FAULT_STEP]
    assert "skip_step" in texts("events/recoveries")[FAULT_STEP]
    assert read_back(out / "rank-1").Tags()["tensors"] == []


def test_export_again_replaces_the_earlier_one(run_dir: Path, tmp_path: Path):
    out = tmp_path / "tb"
    first = export(run_dir, out)
    (out / "notes.txt").write_text("kept")
    second = export(run_dir, out)
    board = read_back(out / "rank-0")
    assert len(board.Scalars("train/loss")) == STEPS
    assert len(board.Histograms("act_hist/blocks.0")) == 6
    assert len(list((out / "rank-0").glob("events.out.tfevents.*"))) == 1
    assert (out / "notes.txt").read_text() == "kept"
    assert "replaced 2 earlier event files" in second
    assert first.splitlines()[1:] == second.splitlines()[1:]


def test_prints_what_it_wrote(run_dir: Path, tmp_path: Path):
    out = tmp_path / "tb"
    stdout = export(run_dir, out)
    written = {"scalars": 0, "histograms": 0, "texts": 0}
    for rank in (0, 1):
        board = read_back(out / f"rank-{rank}")
        tags = board.Tags()
        written["scalars"] += sum(len(board.Scalars(t)) for t in tags["scalars"])
        written["histograms"] += sum(len(board.Histograms(t)) for t in tags["histograms"])
        written["texts"] += sum(len(board.Tensors(t)) for t in tags["tensors"])
    lines = dict(line.split(None, 1) for line in stdout.splitlines()[1:])
    assert {k: int(lines[k]) for k in written} == written
    assert lines["ranks"] == "0, 1"
    assert written["texts"] == 3 and written["histograms"] == 2 * (6 * len(LAYERS) - 1)


def test_a_run_without_steps_or_fields_has_no_tags_for_them(tmp_path: Path):
    # negative control: the tags come from what the run journaled, not from a fixed list
    run = tmp_path / "run"
    with JournalWriter(run, rank=0) as journal:
        journal.emit("fault_injected", 0, fault="sigkill")
    with JournalWriter(run, rank=1) as journal:
        journal.emit("step", 1, loss=2.5)
    out = tmp_path / "tb"
    stdout = export(run, out)
    assert read_back(out / "rank-0").Tags()["scalars"] == []
    assert read_back(out / "rank-1").Tags()["scalars"] == ["train/loss"]
    assert read_back(out / "rank-1").Tags()["histograms"] == []
    assert "scalars     1" in stdout


def test_a_run_dir_without_journal_is_refused(tmp_path: Path):
    (tmp_path / "run").mkdir()
    code, stdout, stderr = tightrope(
        "export", str(tmp_path / "run"), "--tensorboard", str(tmp_path / "tb")
    )
    assert code == 2 and stdout == ""
    assert "no journal in" in stderr and "journal" in stderr
    assert not (tmp_path / "tb").exists()


def test_without_tensorboard_it_says_what_to_install(
    run_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import fails
    code, _, stderr = tightrope("export", str(run_dir), "--tensorboard", str(tmp_path / "tb"))
    assert code == 2
    assert "pip install 'tightrope[tensorboard]'" in stderr
    assert not (tmp_path / "tb").exists()


def test_an_output_that_is_a_file_is_refused(run_dir: Path, tmp_path: Path):
    (tmp_path / "tb").write_text("not a folder")
    code, _, stderr = tightrope("export", str(run_dir), "--tensorboard", str(tmp_path / "tb"))
    assert code == 2 and "is not a folder" in stderr


@pytest.mark.slow
def test_a_reference_run_reads_back_as_it_was_recorded(tmp_path: Path):
    from tests.conftest import run_module

    plan = tmp_path / "plan.yaml"
    plan.write_text("faults:\n  - {kind: nan_grad, at_step: 12}\n")
    run = tmp_path / "run"
    argv = ["-m", "reference_trainer", "--preset", "tiny", "--steps", "20"]
    argv += ["--precision", "fp16", "--fault-plan", str(plan), "--run-dir", str(run)]
    proc = run_module(*argv, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = tmp_path / "tb"
    export(run, out)
    board = read_back(out / "rank-0")
    steps = read_journal(run).steps(0)
    for name in ("loss", "lr", "loss_scale", "grad_norm"):
        points = board.Scalars(f"train/{name}")
        want = {s: e.get(name) for s, e in steps.items() if e.get(name) is not None}
        assert {p.step: p.value for p in points}.keys() == want.keys(), name
        np.testing.assert_array_equal(
            [p.value for p in points], [f32(want[p.step]) for p in points], err_msg=name
        )
    microscope = read_microscope(run)
    series = microscope.ranks[0]
    assert 12 in series.steps.tolist() and len(series) > 2  # periodic and around the fault
    for i, layer in enumerate(microscope.layers):
        taken = series.act_hist[:, i].sum(axis=1) > 0
        hists = board.Histograms(f"act_hist/{layer}")
        assert len(hists) == taken.sum() > 0
        extra = [p.value for p in board.Scalars(f"act_nonfinite/{layer}")]
        recorded = series.act_hist[taken, i].sum(axis=1).tolist()
        assert [sum(h.histogram_value.bucket) + x for h, x in zip(hists, extra, strict=True)] == (
            recorded
        )
        grads = {p.step: p.value for p in board.Scalars(f"grad_norm/{layer}")}
        assert grads[12] == np.inf  # every gradient was NaN at the fault
    faults = board.Tensors("events/faults/text_summary")
    assert [t.step for t in faults] == [12]
    assert "nan_grad" in faults[0].tensor_proto.string_val[0].decode()


def test_a_long_run_shows_progress_on_a_terminal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import harness.commands.export as command

    run = tmp_path / "run"
    with JournalWriter(run, rank=0) as journal:
        for step in range(1, 1201):
            journal.emit("step", step, loss=1.0 / step, lr=1e-3)
    screen = io.StringIO()
    terminal = Console(file=screen, force_terminal=True, width=100)
    monkeypatch.setattr(command, "command_console", lambda: terminal)
    stdout = export(run, tmp_path / "tb")
    assert "2400/2400" in screen.getvalue() and "exporting" in screen.getvalue()
    assert "scalars     2400" in stdout
    short = tmp_path / "short"
    with JournalWriter(short, rank=0) as journal:
        journal.emit("step", 1, loss=1.0)
    screen.truncate(0)
    export(short, tmp_path / "tb-short")
    assert "exporting" not in screen.getvalue()  # a short export draws no bar


def test_a_microscope_of_a_newer_format_is_refused(run_dir: Path, tmp_path: Path):
    chunk = next((run_dir / "microscope" / "rank-0").glob("*.npz"))
    with np.load(chunk, allow_pickle=False) as data:
        arrays = {name: data[name] for name in data.files}
    np.savez_compressed(chunk, **{**arrays, "format": np.array(99)})
    code, _, stderr = tightrope("export", str(run_dir), "--tensorboard", str(tmp_path / "tb"))
    assert code == 2 and "microscope format 99 is newer" in stderr
