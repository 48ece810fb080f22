"""Docker nodes: containers that run the trainer, train together, and die for real.

These need a running Docker engine. Without one they are skipped, except in CI (the
``CI`` variable set), where `.ci/run` starts the engine and a skip would hide a failure.
"""

from __future__ import annotations

import os
import socket
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from harness.docker.errors import DockerError, DockerSdkMissing, DockerUnavailable
from harness.records.journal import read_journal
from harness.run_layout import RunLayout

try:
    from harness.docker.faults import node_fault
    from harness.docker.nodes import (
        RUN_LABEL,
        DockerCluster,
        NodeVanished,
        NoSuchNode,
        connect,
        torchrun_node_argv,
    )
except DockerSdkMissing as missing:
    if os.environ.get("CI"):
        raise
    pytest.skip(str(missing), allow_module_level=True)

if TYPE_CHECKING:
    from docker import DockerClient

pytestmark = pytest.mark.docker

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
# A node that counts while it runs (so a freeze shows) and leaves quietly on SIGTERM.
COUNTER = """
import os, pathlib, signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
out = pathlib.Path(sys.argv[1])
n = 0
while True:
    n += 1
    out.with_suffix(".tmp").write_text(str(n))
    os.replace(out.with_suffix(".tmp"), out)
    time.sleep(0.02)
"""


@pytest.fixture(scope="module")
def client() -> DockerClient:
    """The local Docker engine; skip (fail in CI) when it cannot be reached."""
    try:
        return connect()
    except DockerUnavailable as exc:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the docker tests: {exc}")
        pytest.skip(str(exc))


def _run_id() -> str:
    return f"test-{uuid.uuid4().hex[:10]}"


def _leftovers(client: DockerClient, run_id: str) -> list[str]:
    found = client.containers.list(all=True, filters={"label": f"{RUN_LABEL}={run_id}"})
    return [str(c.name) for c in found]


@pytest.fixture
def cluster(client: DockerClient) -> Iterator[DockerCluster]:
    """A run's node containers, removed afterwards; no container of the run may be left."""
    with DockerCluster(_run_id(), client=client, workdir=ROOT) as nodes:
        yield nodes
    assert _leftovers(client, nodes.run_id) == []


def _count(path: Path, timeout: float = 30.0) -> int:
    """The counter a COUNTER node last wrote, waiting for its first value."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} was never written"
        time.sleep(0.05)
    return int(path.read_text())


def _start_counter(cluster: DockerCluster, node: int, run_dir: Path) -> Path:
    out = run_dir / f"count-{node}"
    cluster.start(node, [PYTHON, "-c", COUNTER, str(out)], {}, run_dir)
    return out


def test_a_node_runs_the_hosts_python_with_torch_and_writes_the_run_dir(
    cluster: DockerCluster, tmp_path: Path
) -> None:
    script = (
        "import pathlib, sys, torch\n"
        "try:\n"
        "    open(sys.argv[2] + '/not-here', 'w')\n"
        "    ro = 'writable'\n"
        "except OSError:\n"
        "    ro = 'read-only'\n"
        "pathlib.Path(sys.argv[1], 'out.txt').write_text(torch.__version__ + ' ' + ro)\n"
    )
    cluster.start(0, [PYTHON, "-c", script, str(tmp_path), str(ROOT)], {}, tmp_path)
    assert cluster.wait(0, timeout=60) == 0, cluster.logs(0)
    import torch

    assert (tmp_path / "out.txt").read_text() == f"{torch.__version__} read-only"
    assert not (ROOT / "not-here").exists()
    assert cluster.status(0).exit_code == 0


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_two_node_containers_train_together_through_torchrun(
    cluster: DockerCluster, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    head = torchrun_node_argv(2, 1, f"127.0.0.1:{_free_port()}", cluster.run_id)
    trainer = ["-m", "reference_trainer", "--preset", "tiny", "--steps", "6"]
    argv = [*head, *trainer, "--run-dir", str(run_dir), "--checkpoint-every", "3"]
    for node in (0, 1):
        cluster.start(node, argv, {"OMP_NUM_THREADS": "1"}, run_dir)
    for node in (0, 1):
        assert cluster.wait(node, timeout=180) == 0, cluster.logs(node)
    assert (
        RunLayout(run_dir).journal_file(0).exists() and RunLayout(run_dir).journal_file(1).exists()
    )
    journal = read_journal(run_dir)
    for rank in (0, 1):
        assert sorted(journal.steps(rank)) == [1, 2, 3, 4, 5, 6]
    assert {e["world_size"] for e in journal.of_kind("run_start")} == {2}


def test_kill_pause_unpause_and_stop_act_on_one_node_only(
    cluster: DockerCluster, tmp_path: Path
) -> None:
    counters = {node: _start_counter(cluster, node, tmp_path) for node in (0, 1)}
    _count(counters[1])

    cluster.pause(1)
    assert cluster.status(1).state == "paused"
    frozen = _count(counters[1])
    time.sleep(0.5)
    assert _count(counters[1]) == frozen, "a paused node went on running"

    cluster.unpause(1)
    assert cluster.status(1).state == "running"
    deadline = time.monotonic() + 10
    while _count(counters[1]) == frozen:
        assert time.monotonic() < deadline, "an unpaused node did not resume"
        time.sleep(0.05)

    record = node_fault(cluster, "kill", 1)
    assert record["action"] == "kill" and record["node"] == 1
    assert record["container"] == cluster.container(1).id and record["seconds"] >= 0
    assert cluster.wait(1, timeout=30) == 137
    status = cluster.status(1)
    assert (status.state, status.exit_code) == ("exited", 137)
    assert "exited with code 137" in str(status)

    before = _count(counters[0])
    time.sleep(0.2)
    assert cluster.status(0).state == "running" and _count(counters[0]) > before

    # Preemption: SIGTERM first, which this node answers by leaving with 143.
    record = node_fault(cluster, "stop", 0, timeout=20)
    assert cluster.wait(0, timeout=5) == 143
    assert record["seconds"] < 20


def test_a_node_that_is_not_there_is_named(cluster: DockerCluster, tmp_path: Path) -> None:
    with pytest.raises(NoSuchNode, match=r"node 0 is not a node of run .*: it has no nodes"):
        cluster.kill(0)
    cluster.start(0, [PYTHON, "-c", "pass"], {}, tmp_path)
    with pytest.raises(NoSuchNode, match=r"node 3 is not a node of run .*: its nodes are 0"):
        node_fault(cluster, "pause", 3)
    with pytest.raises(DockerError, match="node fault 'explode' is unknown: expected one of kill"):
        node_fault(cluster, "explode", 0)
    assert cluster.wait(0, timeout=60) == 0
    with pytest.raises(DockerError, match=r"cannot pause node 0 of run .*not running"):
        cluster.pause(0)

    cluster.client.containers.get(cluster.name(0)).remove(force=True)
    with pytest.raises(NodeVanished, match=rf"node 0 .* gone: its container {cluster.name(0)}"):
        cluster.status(0)
    with pytest.raises(DockerError, match=r"run id 'no spaces' cannot name a container"):
        DockerCluster("no spaces", client=cluster.client)


def test_an_unreachable_engine_is_named_with_the_way_to_start_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent.sock")
    with pytest.raises(DockerUnavailable) as caught:
        connect()
    message = str(caught.value)
    assert "cannot reach the Docker engine at unix:///nonexistent.sock" in message
    assert "dockerd --bridge=none --iptables=false" in message


def test_close_removes_every_container_of_the_run_and_no_other(
    client: DockerClient, tmp_path: Path
) -> None:
    other = DockerCluster(_run_id(), client=client, workdir=ROOT)
    try:
        _start_counter(other, 0, tmp_path / "other")
        with pytest.raises(RuntimeError, match="boom"):  # noqa: SIM117 - the with is the test
            with DockerCluster(_run_id(), client=client, workdir=ROOT) as run:
                _start_counter(run, 0, tmp_path)
                _start_counter(run, 1, tmp_path)
                run.start(2, [PYTHON, "-c", "pass"], {}, tmp_path)
                run.pause(1)
                assert run.wait(2, timeout=60) == 0
                assert run.nodes() == [0, 1, 2]
                raise RuntimeError("boom")
        assert _leftovers(client, run.run_id) == []
        assert other.status(0).state == "running"
    finally:
        other.close()
    assert _leftovers(client, other.run_id) == []
