"""Scenarios sharing a cached baseline copy it into the out dir at once: one whole copy."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from harness.run_layout import RunLayout
from harness.running.runner import keep_baseline

THREADS = 8


def cached_baseline(root: Path) -> Path:
    """A cache entry as `baseline_run` leaves it: two ranks' journals and the log."""
    cached = root / "cache" / "baselines" / "0123456789abcdef"
    (cached / "journal").mkdir(parents=True)
    for rank in (0, 1):
        lines = "".join(f'{{"rank": {rank}, "step": {s}}}\n' for s in range(2000))
        (cached / "journal" / f"rank-{rank}.jsonl").write_text(lines)
    RunLayout(cached).log.write_text("step 1 loss 4.0\n" * 1000)
    (cached / "baseline.json").write_text("{}")
    return cached


def files(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` by relative path, with its bytes."""
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_parallel_scenarios_share_one_whole_copy_of_their_baseline(tmp_path: Path) -> None:
    cached = cached_baseline(tmp_path)
    expected = {k: v for k, v in files(cached).items() if k != "baseline.json"}
    for attempt in range(5):  # a fresh out dir each round: every round races for the copy
        out = tmp_path / f"out-{attempt}"
        start = threading.Barrier(THREADS)

        def keep(_: int, out: Path = out, start: threading.Barrier = start) -> Path:
            start.wait()
            return keep_baseline(cached, out)

        with ThreadPoolExecutor(THREADS) as pool:
            kept = set(pool.map(keep, range(THREADS)))  # re-raises any thread's exception
        assert kept == {out / "baselines" / cached.name}
        assert files(kept.pop()) == expected
        assert [p.name for p in (out / "baselines").iterdir() if p.is_dir()] == [cached.name]


def test_a_half_copy_left_by_a_killed_run_is_replaced(tmp_path: Path) -> None:
    cached = cached_baseline(tmp_path)
    half = tmp_path / "out" / "baselines" / cached.name
    (half / "journal").mkdir(parents=True)
    (half / "journal" / "rank-0.jsonl").write_text('{"rank": 0, "st')
    kept = keep_baseline(cached, tmp_path / "out")
    assert files(kept) == {k: v for k, v in files(cached).items() if k != "baseline.json"}
