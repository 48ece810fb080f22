"""`tightrope watch`: the incremental reader, one frame (`--once`) of a synthetic run, and
the live view under a pseudo-terminal following a job that a writer process drives."""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from harness.commands.main import main
from harness.live import heatmap
from harness.live.hot_layers import from_microscope, hottest
from harness.live.watch_reader import JournalTail, WatchReader
from harness.records.journal import JournalWriter
from harness.records.microscope_file import (
    WHY_PERIODIC,
    MicroscopeWriter,
    Record,
    histogram,
    read_microscope,
)
from harness.run_layout import RunLayout
from harness.running import warm_start
from harness.running.process_tree import MARK

LAYERS = ["embed", "blocks.0.attn", "blocks.0.mlp", "blocks.1.attn", "blocks.1.mlp", "head"]
ROOT = Path(__file__).resolve().parents[1]


def _start(w: JournalWriter, world: int = 2) -> None:
    w.emit("run_start", 0, world_size=world, pid=os.getpid(), host="here", target_steps=30)


def _steps(w: JournalWriter, first: int, last: int) -> None:
    for step in range(first, last + 1):
        w.emit(
            "step",
            step,
            loss=4.0 - 0.05 * step,
            lr=3e-4,
            loss_scale=65536.0,
            grad_norm=1.25,
            step_time=0.02,
        )


def _microscope(run_dir: Path, rank: int, hot: str | None) -> None:
    writer = MicroscopeWriter(run_dir, rank=rank, restart=0, layers=LAYERS, chunk_records=10)
    rng = np.random.default_rng(rank)
    for step in range(1, 31):
        grad = np.linspace(0.5, 1.5, len(LAYERS)).astype(np.float32) * (1 + 0.05 * rng.random())
        if hot is not None and step == 30:
            grad[LAYERS.index(hot)] *= 40.0  # the last record: 40x its usual norm
        writer.add(
            Record(
                step=step,
                why=WHY_PERIODIC,
                wall=time.time(),
                grad_norm=grad,
                weight_norm=np.ones(len(LAYERS), dtype=np.float32),
                update_ratio=np.full(len(LAYERS), 1e-3, dtype=np.float32),
                act_hist=np.stack([histogram(rng.normal(size=64)) for _ in LAYERS]),
            )
        )
    writer.flush()


def finished_run(run_dir: Path, *, hot: str | None) -> Path:
    """Two ranks to step 30, a fault armed by a command and fired at 20, microscope on."""
    for rank in (0, 1):
        with JournalWriter(run_dir, rank=rank) as w:
            _start(w)
            _steps(w, 1, 19)
            w.emit("command", 19, id="cmd-7", accepted=True, fault="nan_grad", effective_step=20)
            w.emit("command", 19, id="cmd-8", accepted=True, fault="slow_rank", effective_step=90)
            if rank == 1:
                w.emit("fault_injected", 20, fault="nan_grad", target="blocks.1.mlp.weight")
            _steps(w, 20, 30)
            w.emit("run_end", 30, status="completed")
        _microscope(run_dir, rank, hot if rank == 1 else None)
    heartbeat = RunLayout(run_dir).heartbeat_file(0)
    heartbeat.parent.mkdir(parents=True, exist_ok=True)
    heartbeat.write_text(json.dumps({"step": 30, "wall": time.time() - 5.0}))
    return run_dir


def _once(run_dir: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> str:
    os.environ["COLUMNS"] = "120"
    assert main(["watch", str(run_dir), "--once", *extra]) == 0
    return capsys.readouterr().out


def _section(out: str, title: str) -> list[str]:
    """The frame's lines under ``title`` up to the next blank line (inside the panel)."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if title in line) + 1
    rows = []
    for line in lines[start:]:
        if not line.strip("│ ╰─╯"):
            break
        rows.append(line)
    return rows


# -- the reader --------------------------------------------------------------------------


def test_tail_reads_appended_lines_once_and_waits_for_a_torn_last_line(tmp_path: Path) -> None:
    w = JournalWriter(tmp_path, rank=0)
    _start(w)
    _steps(w, 1, 3)
    tail = JournalTail(RunLayout(tmp_path).journal_file(0))
    assert [e.kind for e in tail.read_new()] == ["run_start", "step", "step", "step"]
    whole = tail.offset
    assert whole == tail.path.stat().st_size
    assert tail.read_new() == []  # nothing new: nothing read again
    _steps(w, 4, 5)
    with open(tail.path, "ab") as f:  # the next line, half written
        f.write(b'{"v":1,"kind":"step","wall":1.0,')
    assert [e.step for e in tail.read_new()] == [4, 5]
    assert tail.offset < tail.path.stat().st_size  # the torn line is not consumed yet
    with open(tail.path, "ab") as f:  # ... and now finished
        f.write(b'"mono":1.0,"rank":0,"restart":0,"step":6,"loss":3.5}\n')
    assert [(e.step, e["loss"]) for e in tail.read_new()] == [(6, 3.5)]
    assert tail.offset == tail.path.stat().st_size and tail.torn == 0
    with open(tail.path, "ab") as f:  # a writer killed mid-line, its line ended by the next
        f.write(b'{"v":1,"kind":"st\n')
    _steps(w, 7, 7)
    assert [e.step for e in tail.read_new()] == [7]
    assert tail.torn == 1
    w.close()
    tail.path.unlink()  # a new run in the same folder starts a new file
    with JournalWriter(tmp_path, rank=0) as again:
        _start(again)
    assert [e.kind for e in tail.read_new()] == ["run_start"]


def test_reader_keeps_only_a_bounded_window_and_finds_new_ranks(tmp_path: Path) -> None:
    w0 = JournalWriter(tmp_path, rank=0)
    _start(w0)
    _steps(w0, 1, 500)
    reader = WatchReader(tmp_path)
    snap = reader.refresh()
    assert snap.ranks[0].last_step is not None and snap.ranks[0].last_step.step == 500
    assert len(snap.ranks[0].losses) <= 60 and not snap.ended
    w1 = JournalWriter(tmp_path, rank=1)  # a rank that starts late is picked up
    _start(w1)
    _steps(w1, 1, 2)
    w0.emit("run_end", 500, status="completed")
    snap = reader.refresh()
    assert snap.ranks[1].last_step is not None and snap.ranks[1].last_step.step == 2
    assert not snap.ended  # rank 1 is still going
    w1.emit("run_end", 2, status="completed")
    assert reader.refresh().ended
    w0.close()
    w1.close()


# -- one frame ---------------------------------------------------------------------------


def test_once_shows_step_loss_hot_layer_fault_and_heartbeats(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = _once(finished_run(tmp_path, hot="blocks.0.attn"), capsys)
    assert "ended (completed)" in out
    assert "step 30" in out and "loss 2.5000" in out
    assert "6.55e+04" in out or "65536" in out  # the loss scale
    layer_rows = [line for line in out.splitlines() if any(n in line for n in LAYERS)]
    assert "blocks.0.attn" in layer_rows[0] and "HOT" in layer_rows[0]
    assert not any("HOT" in row for row in layer_rows[1:])
    assert "fired nan_grad at step 20 on rank 1 -> blocks.1.mlp.weight" in out
    assert "armed slow_rank at step 90 (cmd-8)" in out
    assert "cmd-7" not in out  # fired: no longer armed
    beats = _section(out, "heartbeat age per rank")[1:]  # below its header row
    assert [row.split()[1] for row in beats] == ["0", "1"]
    assert all(row.split()[-2] == "ended" for row in beats)  # ended ranks are not stale
    beat = re.search(r"([\d.]+) s \(step 30\)", beats[0])  # rank 0's heartbeat file
    assert beat is not None and 5.0 <= float(beat.group(1)) < 15.0  # written 5 s before
    # rank 0 alone: its layers are quiet, the hot one was rank 1's
    quiet = _section(_once(tmp_path, capsys, "--rank", "0"), "hottest layers")
    assert len(quiet) == 5 and not any("HOT" in row for row in quiet)  # header, 3 rows, note
    assert "no layer is at 3x" in quiet[-1]


def test_once_without_a_hot_layer_flags_none(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = _once(finished_run(tmp_path, hot=None), capsys)
    assert "HOT" not in out
    assert "no layer is at 3x its own median or above" in out


def test_once_falls_back_to_layer_stats_then_says_there_are_none(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with JournalWriter(tmp_path, rank=0) as w:
        _start(w, world=1)
        _steps(w, 1, 3)
        assert "no per-layer records" in _once(tmp_path, capsys)
        for step in range(1, 6):
            grads = {"embed": 1.0, "head": 1.0 if step < 5 else None}  # null: not finite
            w.emit("layer_stats", step, layers={k: {"grad_norm": v} for k, v in grads.items()})
    out = _once(tmp_path, capsys)
    assert "from the layer_stats" in out
    head = next(line for line in out.splitlines() if "head" in line)
    assert "non-finite" in head and "HOT" in head


def test_a_quiet_rank_is_stale_and_a_fresh_one_is_not(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for rank, age in ((0, 0.0), (1, 60.0)):
        with JournalWriter(tmp_path, rank=rank) as w:
            _start(w)
            _steps(w, 1, 5)
        path = RunLayout(tmp_path).journal_file(rank)
        lines = [json.loads(x) for x in path.read_text().splitlines()]
        for line in lines:
            line["wall"] = time.time() - age
        path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    out = _once(tmp_path, capsys)
    rows = [line for line in out.splitlines() if " s " in line and "STALE" in line]
    assert len(rows) == 1 and "60." in rows[0]


def test_bad_run_dirs_and_arguments_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["watch", str(tmp_path / "nope"), "--once"]) == 2
    assert "no such directory" in capsys.readouterr().err
    assert main(["watch", str(tmp_path), "--once"]) == 2
    assert "no journal" in capsys.readouterr().err
    RunLayout(tmp_path).journal.mkdir()
    assert main(["watch", str(tmp_path), "--once"]) == 2
    assert "holds no rank-<R>.jsonl" in capsys.readouterr().err
    for bad in (["--interval", "0"], ["--interval", "soon"], ["--rank", "-1"]):
        with pytest.raises(SystemExit) as exit_:
            main(["watch", str(tmp_path), *bad])
        assert exit_.value.code == 2
        assert bad[0] in capsys.readouterr().err


# -- live, under a pseudo-terminal -------------------------------------------------------

WRITER = textwrap.dedent(
    """
    import os, sys, time
    from harness.records.journal import JournalWriter
    w = JournalWriter(sys.argv[1], rank=0)
    w.emit("run_start", 0, world_size=1, pid=os.getpid(), host="here")
    for step in range(1, 31):
        w.emit("step", step, loss=3.0, lr=1e-3, step_time=0.05)
        time.sleep(0.1)
    w.emit("run_end", 30, status="completed")
    """
)


def _spawn_watch(run_dir: Path) -> tuple[subprocess.Popen[bytes], int]:
    master, slave = os.openpty()
    env = {**os.environ, "COLUMNS": "120", "LINES": "40", "TERM": "xterm-256color"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness.commands.main", "watch", str(run_dir), "--interval", "0.2"],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=env,
        cwd=ROOT,
        start_new_session=True,
    )
    os.close(slave)
    return proc, master


def _read_until(
    master: int, proc: subprocess.Popen[bytes], seconds: float, until: str | None = None
) -> str:
    """What the terminal showed (styling codes removed) until the watcher exits, ``until``
    appears on it, or ``seconds`` pass."""
    done, screen = time.monotonic() + seconds, b""
    while time.monotonic() < done:
        ready, _, _ = select.select([master], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the watcher closed the terminal
                break
            screen += chunk
            if until is not None and until in _plain(screen):
                break
        elif proc.poll() is not None:
            break
    return _plain(screen)


def _plain(screen: bytes) -> str:
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", screen.decode(errors="replace"))


@pytest.mark.slow
def test_live_view_follows_the_steps_and_exits_0_at_run_end(tmp_path: Path) -> None:
    with JournalWriter(tmp_path, rank=0):
        pass  # the journal folder exists before the job writes: the watcher waits for it
    proc, master = _spawn_watch(tmp_path)
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path)], cwd=ROOT)
    try:
        screen = _read_until(master, proc, 60)
        assert proc.wait(timeout=10) == 0
        assert writer.wait(timeout=10) == 0
    finally:
        for p in (proc, writer):
            if p.poll() is None:
                p.kill()
                p.wait()
        os.close(master)
    seen = sorted({int(s) for s in re.findall(r"step (\d+) ", screen)})
    assert len(seen) >= 3 and seen[-1] == 30, seen  # it advanced on screen, to the end
    assert "ended (completed)" in screen


def test_live_view_exits_0_quietly_on_ctrl_c(tmp_path: Path) -> None:
    with JournalWriter(tmp_path, rank=0) as w:
        _start(w, world=1)
        _steps(w, 1, 3)  # running, and never ending
    proc, master = _spawn_watch(tmp_path)
    try:
        first = _read_until(master, proc, 20, until="step 3 ")
        assert "step 3 " in first and "running" in first
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C reaches the terminal's process group
        rest = _read_until(master, proc, 10)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
    assert "Traceback" not in first + rest and "KeyboardInterrupt" not in rest


def test_a_background_job_ends_when_its_processes_are_gone_not_at_run_end(
    tmp_path: Path,
) -> None:
    mark = "watch-test-" + os.urandom(4).hex()
    job = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"], env={**os.environ, MARK: mark}
    )
    try:
        record = {"pid": job.pid, "mark": mark, "argv": ["x"], "log": "x", "started": 0.0}
        RunLayout(tmp_path).background.write_text(json.dumps(record))
        with JournalWriter(tmp_path, rank=0) as w:
            _start(w, world=1)
            w.emit("run_end", 0, status="failed")  # its launcher may restart it: watch on
        reader = WatchReader(tmp_path)
        deadline = time.monotonic() + 5  # until the child has exec'd with the mark
        while not (snap := reader.refresh()).background_alive and time.monotonic() < deadline:
            time.sleep(0.05)
        assert snap.background_alive and not snap.ended
    finally:
        job.kill()
        job.wait()
    snap = reader.refresh()
    assert snap.background_alive is False and snap.ended


@pytest.mark.slow
def test_live_view_of_a_real_tiny_training_run(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    argv = [sys.executable, "-m", "reference_trainer", "--preset", "tiny", "--steps", "40"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    trainer = subprocess.Popen(
        warm_start.warm([*argv, "--run-dir", str(run_dir)], env),  # as the suite's trainers
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    started: list[subprocess.Popen[bytes]] = [trainer]
    master = -1
    try:
        deadline = time.monotonic() + 120
        while not RunLayout(run_dir).journal.is_dir() and time.monotonic() < deadline:
            time.sleep(0.1)
        proc, master = _spawn_watch(run_dir)
        started.append(proc)
        screen = _read_until(master, proc, 180)
        assert proc.wait(timeout=10) == 0
        assert trainer.wait(timeout=60) == 0
    finally:
        for p in started:
            if p.poll() is None:
                p.kill()
                p.wait()
        if master >= 0:
            os.close(master)
    seen = sorted({int(s) for s in re.findall(r"step (\d+) ", screen)})
    assert len(seen) >= 3 and seen[-1] == 40, seen
    assert "hottest layers (from the microscope)" in screen
    assert "ended (completed)" in screen


def test_non_finite_gradients_rank_first_and_unmeasured_records_are_skipped(
    tmp_path: Path,
) -> None:
    writer = MicroscopeWriter(tmp_path, rank=0, restart=0, layers=["a", "b", "c", "d"])
    ones = np.ones(4, dtype=np.float32)
    hist = np.zeros((4, len(histogram(np.ones(1)))), dtype=np.int64)
    for step in range(1, 11):
        writer.add(Record(step, WHY_PERIODIC, 0.0, ones.copy(), ones, ones * 1e-3, hist))
    grad = np.array([np.nan, np.inf, 50.0, np.nan], dtype=np.float32)
    weight = np.array([1.0, 1.0, 1.0, np.nan], dtype=np.float32)  # d: not measured here
    writer.add(Record(11, WHY_PERIODIC, 0.0, grad, weight, ones * 1e-3, hist))
    writer.flush()
    rows = hottest(from_microscope(read_microscope(tmp_path)), top=4)
    assert [(h.layer, h.finite, h.hot) for h in rows[:3]] == [
        ("a", False, True),  # NaN where its weights were measured: a NaN gradient
        ("b", False, True),
        ("c", True, True),
    ]
    assert rows[2].ratio == pytest.approx(50.0)
    d = rows[3]  # its last measured record is step 10, at its median
    assert (d.layer, d.step, d.hot) == ("d", 10, False) and d.ratio == pytest.approx(1.0)


# -- the gradient heatmap -----------------------------------------------------------------


def _map_rows(out: str) -> dict[str, str]:
    """The heatmap's cells by layer (its rows lie between its title and its legend)."""
    rows = _section(out, "gradient heatmap")
    cells = {}
    for row in rows:
        parts = row.strip("│ ").split()
        if len(parts) == 2 and parts[0] in LAYERS:
            cells[parts[0]] = parts[1]
    return cells


def test_the_heatmap_shows_the_hot_layer_at_its_step_on_its_rank(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = _once(finished_run(tmp_path, hot="blocks.0.attn"), capsys)
    # rank 1's map, without --rank: the hot layer is rank 1's
    assert "rank 1, steps 1-30" in out.split("gradient heatmap", 1)[1].splitlines()[0]
    cells = _map_rows(out)
    assert set(cells) == set(LAYERS) and all(len(c) == 30 for c in cells.values())
    assert cells["blocks.0.attn"] == "▃" * 29 + "█"  # 40x its median at step 30 only
    assert all(set(c) == {"▃"} for name, c in cells.items() if name != "blocks.0.attn")
    # Negative control: rank 0's map has nothing hot.
    quiet = _map_rows(_once(tmp_path, capsys, "--rank", "0"))
    assert set(quiet) == set(LAYERS) and all(set(c) == {"▃"} for c in quiet.values())


def test_the_heatmap_marks_non_finite_and_unmeasured_cells(tmp_path: Path) -> None:
    writer = MicroscopeWriter(tmp_path, rank=0, restart=0, layers=["a", "b", "c", "d"])
    ones = np.ones(4, dtype=np.float32)
    hist = np.zeros((4, len(histogram(np.ones(1)))), dtype=np.int64)
    for step in range(1, 11):
        writer.add(Record(step, WHY_PERIODIC, 0.0, ones.copy(), ones, ones * 1e-3, hist))
    grad = np.array([np.nan, np.inf, 0.1, np.nan], dtype=np.float32)
    weight = np.array([1.0, 1.0, 1.0, np.nan], dtype=np.float32)  # d: not measured here
    writer.add(Record(11, WHY_PERIODIC, 0.0, grad, weight, ones * 1e-3, hist))
    writer.flush()
    found = heatmap.from_microscope(read_microscope(tmp_path), rank=0)
    assert found is not None and found.steps == list(range(1, 12))
    last = [found.cell(i, 10)[0] for i in range(4)]
    assert last == ["!", "!", "▁", "·"]  # NaN, inf, a vanishing gradient, not measured
    assert heatmap.from_microscope(read_microscope(tmp_path), rank=1) is None


def test_the_heatmap_falls_back_to_layer_stats(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with JournalWriter(tmp_path, rank=0) as w:
        _start(w, world=1)
        _steps(w, 1, 3)
        assert "gradient heatmap: no per-layer records" in _once(tmp_path, capsys)
        for step in range(1, 6):
            grads = {"embed": 1.0, "head": 1.0 if step < 5 else None}  # null: not finite
            w.emit("layer_stats", step, layers={k: {"grad_norm": v} for k, v in grads.items()})
    cells = _map_rows(_once(tmp_path, capsys))
    assert cells == {"embed": "▃▃▃▃▃", "head": "▃▃▃▃!"}
