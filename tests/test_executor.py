"""Where runs execute, without a cluster: a run dir's files carried between machines (what
judging reads, not the checkpoints unless a check reads them, nothing outside the run dir),
the cluster flags refused without ``--executor ray``, an unreachable Ray address or a
missing Ray refused before anything runs, and a lost attempt shown by every scorecard."""

from __future__ import annotations

import builtins
import io
import json
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from harness.commands.main import main
from harness.running.ray_executor import ExecutorError, RayExecutor
from harness.running.results import SuiteResult
from harness.running.run_files import copy_run, pack, unpack
from harness.scorecard.render import write_scorecards
from harness.scorecard.render.terminal import print_results

from .conftest import ROOT
from .scorecard_support import make_suite


def _run_dir(root: Path) -> Path:
    (root / "journal").mkdir(parents=True)
    (root / "journal" / "rank-0.jsonl").write_text('{"kind": "run_start"}\n')
    (root / "checkpoints" / "step-00000010").mkdir(parents=True)
    (root / "checkpoints" / "step-00000010" / "model.pt").write_bytes(b"\0" * 4096)
    (root / "trainer.log").write_text("step 1\n")
    (root / ".lock").write_text("123 host\n")
    return root


def _files(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}


@pytest.mark.parametrize("checkpoints", [False, True])
def test_a_run_dir_travels_whole_but_its_lock_and_checkpoints_unless_asked(
    tmp_path: Path, checkpoints: bool
) -> None:
    source = _run_dir(tmp_path / "node")
    expected = {"journal/rank-0.jsonl", "trainer.log"}
    if checkpoints:
        expected.add("checkpoints/step-00000010/model.pt")
    unpack(pack(source, checkpoints=checkpoints), tmp_path / "shipped")
    copy_run(source, tmp_path / "copied", checkpoints=checkpoints)
    for landed in (tmp_path / "shipped", tmp_path / "copied"):
        assert _files(landed) == expected
        assert (landed / "journal" / "rank-0.jsonl").read_bytes() == (
            source / "journal" / "rank-0.jsonl"
        ).read_bytes()


def test_files_that_would_land_outside_the_run_dir_are_refused(tmp_path: Path) -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        data = b"owned"
        member = tarfile.TarInfo("../escaped.txt")
        member.size = len(data)
        tar.addfile(member, io.BytesIO(data))
    with pytest.raises(tarfile.OutsideDestinationError):
        unpack(buffer.getvalue(), tmp_path / "run")
    assert not (tmp_path / "escaped.txt").exists()


def test_cluster_flags_without_the_ray_executor_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    card = tmp_path / "card"
    suite = str(ROOT / "scenarios" / "smoke.yaml")
    assert main(["run", suite, "--ray-address", "auto", "--scorecard", str(card)]) == 2
    assert "--ray-address go with --executor ray" in capsys.readouterr().err
    assert not card.exists()


def test_an_unreachable_ray_address_is_refused_at_once_and_nothing_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("ray")
    card = tmp_path / "card"
    suite = str(ROOT / "scenarios" / "smoke.yaml")
    argv = ["run", suite, "--executor", "ray", "--ray-address", "127.0.0.1:9"]
    assert main([*argv, "--scorecard", str(card)]) == 2
    err = capsys.readouterr().err
    assert "cannot reach a Ray cluster at --ray-address 127.0.0.1:9" in err
    assert not card.exists()


def test_without_ray_installed_the_error_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = builtins.__import__

    def no_ray(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "ray" or name.startswith("ray."):
            raise ImportError(f"No module named {name!r}")
        return real(name, *args, **kwargs)

    monkeypatch.delitem(sys.modules, "ray", raising=False)
    monkeypatch.setattr(builtins, "__import__", no_ray)
    with pytest.raises(ExecutorError, match=r"pip install 'tightrope\[ray\]'"):
        RayExecutor("auto")


def test_a_lost_attempt_is_in_every_scorecard_and_read_back(tmp_path: Path) -> None:
    suite = make_suite(tmp_path)
    lost = "attempt 1 lost: NodeDiedError: Task failed because the node it was running on is dead"
    suite.scenarios[0].lost_attempts = [lost]
    suite.scenarios[0].ran_on = "c0ffee" * 8
    files = write_scorecards(suite, tmp_path)
    again = SuiteResult.from_dict(json.loads(files["json"].read_text()))
    assert again.scenarios[0].lost_attempts == [lost]
    assert again.scenarios[0].ran_on == "c0ffee" * 8
    assert again.scenarios[0].status == "passed"  # the cluster's loss is not the trainer's
    markdown = files["markdown"].read_text()
    assert "Run again after a lost cluster node" in markdown and "NodeDiedError" in markdown
    assert "run again after the cluster lost 1 attempt" in files["html"].read_text()
    assert '<property name="lost_attempts" value="1"' in files["junit"].read_text()
    console = Console(file=io.StringIO(), width=200)
    print_results(again, console)
    assert "RERUN nan-grad" in console.file.getvalue()  # type: ignore[attr-defined]
    # A local run's scorecard says nothing of clusters.
    plain = write_scorecards(make_suite(tmp_path / "plain"), tmp_path / "plain")
    assert "cluster" not in plain["markdown"].read_text()
