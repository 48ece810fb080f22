"""Node faults on Docker: kill, pause, unpause or stop one node container of a run.

The fault is applied by the harness from outside the node, as a failing machine would
be; the returned record is what the runner journals as the fault's evidence.
"""

from __future__ import annotations

import time
from typing import Any, Literal, get_args

from harness.docker.errors import DockerError
from harness.docker.nodes import DockerCluster

__all__ = ["NODE_ACTIONS", "NodeAction", "node_fault"]

NodeAction = Literal["kill", "pause", "unpause", "stop"]
NODE_ACTIONS: tuple[str, ...] = get_args(NodeAction)


def node_fault(
    cluster: DockerCluster, action: NodeAction, node: int, *, timeout: float = 10.0
) -> dict[str, Any]:
    """Apply one node fault; a record of it (action, node, container, seconds) to journal."""
    if action not in NODE_ACTIONS:
        raise DockerError(
            f"node fault {action!r} is unknown: expected one of {', '.join(NODE_ACTIONS)}"
        )
    container = cluster.container(node)
    began = time.monotonic()
    if action == "stop":
        cluster.stop(node, timeout)
    else:
        getattr(cluster, action)(node)
    return {
        "action": action,
        "node": node,
        "run": cluster.run_id,
        "container": str(container.id),
        "seconds": round(time.monotonic() - began, 4),
        "wall_time": time.time(),
    }
