"""The hang monitor: a small process beside each rank that kills the rank when it hangs.

Started by `reference_trainer.processes.watchdog.Heartbeat`; see that module for why. It reads the
rank's heartbeat every ``--poll`` seconds and exits quietly when the rank exits or removes
its heartbeat. When the heartbeat is older than the timeout the rank wrote into it, it
journals ``detected`` (``hang_watchdog``) and ``rank_lost`` for the rank(s) that fell
behind, as the rank itself; when the collective ledger's files show ranks that never
entered the collective the others wait in, it names them too (``rank_blamed`` by
``collective_watchdog``: a rank alive, beating, stuck before a collective); then it SIGKILLs
the rank: torchrun sees a failed worker, stops
the others and restarts the job.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from faults.proc_stat import state
from harness.run_layout import RunLayout
from reference_trainer.processes import collective_counts
from reference_trainer.processes.wedge import classify, culprits

if TYPE_CHECKING:
    from harness.records.journal import JournalWriter


def _read(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _alive(pid: int) -> bool:
    """The process exists and is not a zombie (a stopped one is alive)."""
    try:
        return state(pid) != "Z"
    except FileNotFoundError:
        return False
    except OSError:
        return True


def behind(beats: dict[int, dict[str, Any]], now: float) -> list[int]:
    """Ranks that fell behind: the lowest step among those that beat, or the stalest."""
    if not beats:
        return []
    low = min(b["step"] for b in beats.values())
    if any(b["step"] > low for b in beats.values()):
        return sorted(r for r, b in beats.items() if b["step"] == low)
    oldest = min(b["wall"] for b in beats.values())
    return sorted(r for r, b in beats.items() if b["wall"] == oldest and now - oldest > 0)


def blame(journal: JournalWriter, step: int, found: dict[int, dict[str, Any]]) -> None:
    """Name each stopped rank (``hang_watchdog``) and each busy one (``wedged_rank``:
    alive, running, silent), with ``rank_blamed``."""
    for r in culprits(found):
        f = found[r]
        if f["state"] == "busy":
            detector = "wedged_rank"
            why = (
                f"alive and running (a thread in state R in {f['running']:.0%} of looks, "
                f"{f['cpu_share']:.0%} of a core) but silent past the timeout"
            )
            journal.emit("detected", step, detector=detector, details={"rank": r, **f})
        else:
            detector, why = "hang_watchdog", "its process is stopped (state T)"
        journal.emit("rank_blamed", step, blamed_rank=r, detector=detector, reason=why)


def watch(run_dir: Path, rank: int, world_size: int, pid: int, poll: float) -> int:
    """Watch one rank until it exits (0) or hangs (killed; 1)."""
    own = RunLayout(run_dir).heartbeat_file(rank)
    while True:
        time.sleep(poll)
        beat = _read(own)
        if beat is None or not _alive(pid):
            return 0
        stalled = time.monotonic() - float(beat["mono"])  # (`Heartbeat._write`: why not wall)
        if stalled <= float(beat["timeout"]):
            continue
        now = time.time()
        beats = {
            r: b
            for r in range(world_size)
            if (b := _read(RunLayout(run_dir).heartbeat_file(r))) is not None
            and b.get("restart") == beat.get("restart")
        }
        # A stopped or busy process is the culprit the others wait for; else the laggard.
        found = classify(beats)
        lost = culprits(found) or behind(beats, now)
        # Imported here: the monitor of a rank that never hangs starts without the journal.
        from harness.records.journal import JournalWriter

        with JournalWriter(run_dir, rank, restart=int(beat.get("restart", 0))) as journal:
            journal.emit(
                "detected",
                int(beat["step"]),
                detector="hang_watchdog",
                details={
                    "stalled_seconds": round(stalled, 3),
                    "timeout": beat["timeout"],
                    "lost_ranks": lost,
                    "steps": {str(r): b["step"] for r, b in beats.items()},
                    "processes": {str(r): f for r, f in found.items()},
                },
            )
            blame(journal, int(beat["step"]), found)
            for r in lost:
                journal.emit(
                    "rank_lost",
                    int(beat["step"]),
                    lost_rank=r,
                    reason=f"no progress past step {beats[r]['step']} for over "
                    f"{beat['timeout']:.1f} s",
                )
            blame_collective(journal, run_dir, world_size, beat)
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)  # a stopped process heeds nothing else
        return 1


def blame_collective(
    journal: JournalWriter, run_dir: Path, world_size: int, beat: dict[str, Any]
) -> list[int]:
    """Name the ranks that never entered the collective the others are in (from the
    collective ledger's files of this attempt); the ranks named."""
    seqs = collective_counts.counts(run_dir, world_size, int(beat.get("restart", 0)))
    blamed = collective_counts.culprits(seqs, world_size)
    step = int(beat["step"])
    for r in blamed:
        details = {"collective_counts": {str(k): v for k, v in seqs.items()}, "rank": r}
        journal.emit("detected", step, detector="collective_watchdog", details=details)
        journal.emit(
            "rank_blamed",
            step,
            blamed_rank=r,
            detector="collective_watchdog",
            reason=f"entered {seqs[r]} all-reduces, the others {max(seqs.values())}: "
            "it never joined the collective they wait in",
        )
    return blamed


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m reference_trainer.processes.hang_monitor``."""
    p = argparse.ArgumentParser(prog="hang_monitor", description=__doc__.splitlines()[0])
    p.add_argument("--run-dir", type=Path, required=True)
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world-size", type=int, required=True)
    p.add_argument("--pid", type=int, required=True)
    p.add_argument("--poll", type=float, default=0.25)
    args = p.parse_args(argv)
    # The rank's own terminal signals (Ctrl-C) are not for the monitor.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    return watch(args.run_dir, args.rank, args.world_size, args.pid, args.poll)


if __name__ == "__main__":
    sys.exit(main())
