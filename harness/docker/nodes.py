"""Docker nodes: a launcher back end where each training node is a container.

A `DockerCluster` starts one container per node of a run (``tightrope-<run>-node<N>``,
labelled ``tightrope.run=<run>``) on the host network, from the near-empty node image of
`harness.docker.image` with the host's Python, libraries and project mounted read-only.
Node loss is then real: `kill` sends SIGKILL to every process of the node, `pause`
freezes them all (the cgroup freezer, the way a hung machine looks from outside), `stop`
is a preemption (SIGTERM, then SIGKILL after a grace period). `harness.docker.faults.node_fault`
applies one of these as a fault and returns its record for the journal.

Nodes share the host's network and hostname, and each torchrun agent is PID 1 of its
own container, so two nodes would offer torchrun's rendezvous the same node identity
(host, pid) and never meet. Every node therefore gets its own loopback address,
127.0.0.<N+1>, handed to torchrun as ``PET_LOCAL_ADDR`` (its ``--local-addr``).
"""

from __future__ import annotations

import contextlib
import os
import re
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from harness.docker.errors import (
    DockerError,
    DockerSdkMissing,
    DockerUnavailable,
    NodeTimeout,
    NodeVanished,
    NoSuchNode,
)

try:
    import docker
    import docker.errors
    from docker.models.containers import Container
except ImportError as exc:  # only without the `docker` extra
    raise DockerSdkMissing() from exc

from harness.docker.image import (
    DEFAULT_URL,
    IMAGE,
    connect,
    ensure_image,
    error_reason,
    node_address,
    node_mounts,
    torchrun_node_argv,
)

__all__ = [
    "NODE_LABEL",
    "RUN_LABEL",
    "DockerCluster",
    "DockerError",
    "DockerSdkMissing",
    "DockerUnavailable",
    "NoSuchNode",
    "NodeStatus",
    "NodeTimeout",
    "NodeVanished",
    "connect",
    "ensure_image",
    "node_address",
    "torchrun_node_argv",
]

RUN_LABEL = "tightrope.run"
NODE_LABEL = "tightrope.node"
_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_POLL_S = 0.1


@dataclass(frozen=True, slots=True)
class NodeStatus:
    """Where a node's container stands: Docker's state and, once exited, its exit code."""

    node: int
    container: str
    state: str  # created, running, paused, restarting, exited, dead
    exit_code: int | None

    def __str__(self) -> str:
        code = "" if self.exit_code is None else f" with code {self.exit_code}"
        return f"node {self.node} ({self.container[:12]}): {self.state}{code}"


class DockerCluster:
    """The node containers of one run; `close` (or leaving the `with`) removes them all."""

    def __init__(
        self,
        run_id: str,
        *,
        client: docker.DockerClient | None = None,
        workdir: Path | None = None,
        image: str = IMAGE,
        extra_mounts: Sequence[Path] = (),
    ) -> None:
        if not _RUN_ID.fullmatch(run_id):
            raise DockerError(
                f"run id {run_id!r} cannot name a container: expected 1-64 letters, digits, "
                "'_', '.' or '-', starting with a letter or digit"
            )
        self.run_id = run_id
        self.client = client or connect()
        self.workdir = (workdir or Path.cwd()).absolute()
        self.image = image
        self.extra_mounts = tuple(extra_mounts)
        self._started: dict[int, str] = {}  # node -> container name, for "vanished"

    def __enter__(self) -> DockerCluster:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            self.close()
            return
        # The error that ended the block matters more than a failed clean-up after it.
        try:
            self.close()
        except DockerError as cleanup:
            warnings.warn(f"run {self.run_id}: {cleanup}", RuntimeWarning, stacklevel=2)

    def name(self, node: int) -> str:
        """The container name of node ``node``."""
        return f"tightrope-{self.run_id}-node{node}"

    def nodes(self) -> list[int]:
        """The run's nodes that have a container, in order."""
        with self._engine("list the nodes"):
            found = self.client.containers.list(all=True, filters={"label": self._label()})
        return sorted(int(c.labels[NODE_LABEL]) for c in found if NODE_LABEL in c.labels)

    def start(
        self, node: int, argv: Sequence[str], env: Mapping[str, str], run_dir: Path
    ) -> Container:
        """Start node ``node`` running ``argv``; an exited container of it is replaced."""
        if node < 0 or node > 65533:
            raise DockerError(f"node {node} of run {self.run_id!r}: expected 0..65533")
        if not argv:
            raise DockerError(f"node {node} of run {self.run_id!r}: the command is empty")
        run_dir.mkdir(parents=True, exist_ok=True)
        mounts = node_mounts(self.workdir, run_dir, self.extra_mounts)
        with self._engine(f"start node {node}"):
            ensure_image(self.client, self.image)
            old = self._find(node)
            if old is not None:
                if old.status in ("running", "paused", "restarting"):
                    raise DockerError(
                        f"node {node} of run {self.run_id!r} is already {old.status} "
                        f"(container {old.name}); kill or stop it first"
                    )
                old.remove(force=True)
            container = self.client.containers.create(
                self.image,
                list(argv),
                name=self.name(node),
                labels={RUN_LABEL: self.run_id, NODE_LABEL: str(node)},
                environment=self._environment(node, env),
                mounts=[m.to_docker() for m in mounts],
                network_mode="host",
                working_dir=str(self.workdir),
                user=f"{os.getuid()}:{os.getgid()}",
                detach=True,
            )
            self._started[node] = self.name(node)
            try:
                container.start()
            except docker.errors.DockerException:
                # A container that never ran is no node; leave nothing of it behind.
                with contextlib.suppress(docker.errors.DockerException):
                    container.remove(force=True)
                raise
        return container

    def container(self, node: int) -> Container:
        """The container of node ``node``; `NoSuchNode` or `NodeVanished` when there is none."""
        with self._engine(f"find node {node}"):
            found = self._find(node)
        if found is not None:
            return found
        if node in self._started:
            raise NodeVanished(self.run_id, node, self._started[node])
        raise NoSuchNode(self.run_id, node, self.nodes())

    def kill(self, node: int, signal: str = "SIGKILL") -> None:
        """Send ``signal`` (default SIGKILL: node loss) to every process of the node."""
        container = self.container(node)
        with self._engine(f"kill node {node}", container):
            container.kill(signal)

    def pause(self, node: int) -> None:
        """Freeze every process of the node (a hung machine)."""
        container = self.container(node)
        with self._engine(f"pause node {node}", container):
            container.pause()

    def unpause(self, node: int) -> None:
        """Let a paused node run on."""
        container = self.container(node)
        with self._engine(f"unpause node {node}", container):
            container.unpause()

    def stop(self, node: int, timeout: float = 10.0) -> None:
        """Preempt the node: SIGTERM, then SIGKILL after ``timeout`` seconds."""
        container = self.container(node)
        with self._engine(f"stop node {node}", container):
            container.stop(timeout=max(0, round(timeout)))

    def wait(self, node: int, timeout: float) -> int:
        """Wait until the node's container exits; its exit code (137 after SIGKILL)."""
        deadline = time.monotonic() + timeout
        while True:
            status = self.status(node)
            if status.exit_code is not None:
                return status.exit_code
            if time.monotonic() >= deadline:
                raise NodeTimeout(
                    f"node {node} of run {self.run_id!r} is still {status.state} "
                    f"after {timeout:g} s"
                )
            time.sleep(_POLL_S)

    def logs(self, node: int) -> str:
        """Everything the node wrote to stdout and stderr so far."""
        container = self.container(node)
        with self._engine(f"read the logs of node {node}", container):
            raw = container.logs(stdout=True, stderr=True)
        return raw.decode("utf-8", errors="replace")

    def status(self, node: int) -> NodeStatus:
        """The node's current state and, once it has exited, its exit code."""
        container = self.container(node)
        state: dict[str, Any] = container.attrs.get("State") or {}
        name = str(state.get("Status", container.status))
        exited = name in ("exited", "dead")
        code = int(state.get("ExitCode", 0)) if exited else None
        return NodeStatus(node, str(container.id), name, code)

    def close(self) -> None:
        """Remove every container of the run, running, paused or exited."""
        with self._engine("remove the run's containers"):
            found = self.client.containers.list(all=True, filters={"label": self._label()})
            for container in found:
                # Removed meanwhile (by a concurrent close, say) is as good as removed here.
                with contextlib.suppress(docker.errors.NotFound):
                    container.remove(force=True)

    def _label(self) -> str:
        return f"{RUN_LABEL}={self.run_id}"

    def _find(self, node: int) -> Container | None:
        filters: dict[str, str | list[str] | bool] = {
            "label": [self._label(), f"{NODE_LABEL}={node}"]
        }
        found = self.client.containers.list(all=True, filters=filters)
        return found[0] if found else None

    def _environment(self, node: int, env: Mapping[str, str]) -> dict[str, str]:
        """Defaults a node needs, then the caller's ``env``, which wins."""
        pythonpath = os.pathsep.join(dict.fromkeys([str(self.workdir), _harness_root()]))
        base = {
            "HOME": "/tmp",
            "USER": os.environ.get("USER", "tightrope"),
            "PYTHONPATH": pythonpath,
            "PYTHONUNBUFFERED": "1",
            "PET_LOCAL_ADDR": node_address(node),
            "TIGHTROPE_NODE": str(node),
        }
        if "OMP_NUM_THREADS" in os.environ:
            base["OMP_NUM_THREADS"] = os.environ["OMP_NUM_THREADS"]
        return {**base, **env}

    @contextlib.contextmanager
    def _engine(self, what: str, container: Container | None = None) -> Iterator[None]:
        """Turn the SDK's errors into tightrope's, naming the run and what was being done."""
        try:
            yield
        except docker.errors.NotFound as exc:
            if container is None:
                raise DockerError(f"cannot {what} of run {self.run_id!r}: {_explain(exc)}") from exc
            node = int(container.labels.get(NODE_LABEL, -1))
            raise NodeVanished(self.run_id, node, str(container.name)) from exc
        except docker.errors.APIError as exc:
            raise DockerError(f"cannot {what} of run {self.run_id!r}: {_explain(exc)}") from exc
        except (docker.errors.DockerException, OSError) as exc:
            raise DockerUnavailable(_engine_url(self.client), error_reason(exc)) from exc


def _explain(exc: docker.errors.APIError) -> str:
    return str(exc.explanation or exc)


def _engine_url(client: docker.DockerClient) -> str:
    url = str(client.api.base_url)
    # The SDK names every local socket http+docker://localhost; the user knows it by path.
    if url.startswith("http+docker://"):
        return os.environ.get("DOCKER_HOST") or DEFAULT_URL
    return url


def _harness_root() -> str:
    return str(Path(__file__).resolve().parents[2])  # the project
