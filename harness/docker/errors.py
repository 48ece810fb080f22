"""Errors of the Docker node back end (`harness.docker.nodes`), all under `TightropeError`.

They live apart from the back end so that a missing `docker` SDK can itself be reported
as one of them, before anything of the SDK is imported.
"""

from __future__ import annotations

from collections.abc import Iterable

from harness.errors import TightropeError

__all__ = [
    "DockerError",
    "DockerSdkMissing",
    "DockerUnavailable",
    "NoSuchNode",
    "NodeTimeout",
    "NodeVanished",
]

START_HINT = "start it with `dockerd --bridge=none --iptables=false`"


class DockerError(TightropeError):
    """The Docker engine refused or failed an operation on a node of a run."""


class DockerSdkMissing(DockerError, ImportError):
    """The `docker` Python SDK is not installed (it is the `docker` extra of tightrope)."""

    def __init__(self) -> None:
        super().__init__(
            "the Docker node back end needs the `docker` Python SDK, which is not installed; "
            "install it with `pip install -e '.[docker]'`"
        )


class DockerUnavailable(DockerError):
    """The Docker engine cannot be reached at its address."""

    def __init__(self, url: str, reason: str) -> None:
        self.url = url
        super().__init__(f"cannot reach the Docker engine at {url}: {reason}; {START_HINT}")


class NoSuchNode(DockerError, LookupError):
    """A node number that the run never started (or that was removed with the run)."""

    def __init__(self, run_id: str, node: int, nodes: Iterable[int]) -> None:
        self.node = node
        known = ", ".join(str(n) for n in sorted(nodes))
        have = f"its nodes are {known}" if known else "it has no nodes"
        super().__init__(f"node {node} is not a node of run {run_id!r}: {have}")


class NodeVanished(DockerError):
    """A node's container was removed behind the harness's back."""

    def __init__(self, run_id: str, node: int, name: str) -> None:
        self.node = node
        super().__init__(
            f"node {node} of run {run_id!r} is gone: its container {name} was removed "
            "outside the harness"
        )


class NodeTimeout(DockerError, TimeoutError):
    """A node's container did not exit within the time it was given."""
