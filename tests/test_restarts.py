"""torchrun restarts, two in a row on 2 ranks (rank 1 lost, then rank 0 in the restarted
job): each one rejoins the process group at the first try, resumes from the latest
checkpoint, names the rank it lost, and the run ends exactly where an uninterrupted one
does."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from harness.records.journal import Journal, read_journal

from .conftest import torchrun

ARGS = ("--preset", "tiny", "--steps", "20", "--checkpoint-every", "5")
KILLS = [(8, 1), (16, 0)]  # (step, rank)


def journal(run_dir: Path) -> Journal:
    return read_journal(run_dir, warn=False)  # the killed ranks' torn last lines


@pytest.mark.slow
@pytest.mark.distributed
def test_two_kills_two_restarts_and_the_same_result(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    faults = [{"kind": "kill", "at_step": step, "ranks": [rank]} for step, rank in KILLS]
    plan.write_text(yaml.safe_dump({"faults": faults}))
    # Exactly as many restarts as kills: one flaky rejoin would end the job.
    killed = torchrun(2, *ARGS, "--run-dir", str(tmp_path / "k"), "--fault-plan", str(plan),
                      max_restarts=len(KILLS), timeout=600)  # fmt: skip
    assert killed.returncode == 0, killed.stderr[-3000:]
    clean = torchrun(2, *ARGS, "--run-dir", str(tmp_path / "c"), timeout=300)
    assert clean.returncode == 0, clean.stderr[-3000:]

    events = journal(tmp_path / "k")
    restarts = [e for e in events.of_kind("restart") if e.rank == 0]
    assert [e["count"] for e in restarts] == [1, 2]
    # Each restart loads the newest checkpoint that had become durable before its kill: at
    # least the newest journaled as saved by then, and none past the kill's step (a save
    # published in the background just before the kill may not have been journaled yet).
    loaded = [Path(e["path"]).name for e in events.of_kind("checkpoint_loaded") if e.rank == 0]
    kills = [e.wall for e in events.of_kind("fault_injected")]
    saved = [(e.wall, Path(e["path"]).name) for e in events.of_kind("checkpoint_saved")]
    durable = [max(name for wall, name in saved if wall < kill) for kill in kills]
    newest = [f"step-{step - step % 5:08d}" for step, _ in KILLS]
    assert len(loaded) == len(KILLS)
    assert all(d <= got <= n for d, got, n in zip(durable, loaded, newest, strict=True)), (
        durable,
        loaded,
    )
    assert [e["lost_rank"] for e in events.of_kind("rank_lost")] == [rank for _, rank in KILLS]
    assert not [e for e in events.of_kind("recovered") if e["action"] == "rejoin_retry"]
    assert "Connection refused" not in killed.stderr
    # Every step redone from a checkpoint replays exactly: the same final loss, bit for bit.
    assert events.losses()[-5:] == journal(tmp_path / "c").losses()[-5:]
