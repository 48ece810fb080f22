"""Node faults: a whole node (a container running torchrun's agent and its ranks) is killed,
paused or stopped, as a failed machine, a frozen VM or a drained host would be.

Unlike every other kind, these are not applied from inside the training process: the
harness applies them to the node's container from outside (``harness.docker_nodes``),
when the run reaches ``at_step`` or after ``after_seconds``. Inside the trainer their
injector does nothing. ``rejoin_after`` brings a killed or stopped node back (a fresh
container) after that many seconds; ``resume_after`` unpauses a paused one.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from faults.injector import Injector
from faults.registry import register
from faults.spec import FaultSpec


class NodeFaultSpec(FaultSpec):
    """Fields every node kind shares."""

    fault_class: ClassVar[str] = "process"
    #: The container action the harness takes.
    action: ClassVar[str] = ""

    node: int = Field(ge=0, description="The node (container) hit, 0-based.")


class LosingNodeSpec(NodeFaultSpec):
    """Fields of the kinds that take a node away (it may come back)."""

    rejoin_after: float | None = Field(
        default=None, gt=0, description="Start the node again after this many seconds."
    )


class NodeKillSpec(LosingNodeSpec):
    """SIGKILL a node's container (machine lost)."""

    kind: Literal["node_kill"] = "node_kill"
    description: ClassVar[str] = "Kill a node's container (machine lost); Docker launcher only."
    action: ClassVar[str] = "kill"


class NodeStopSpec(LosingNodeSpec):
    """Stop a node's container: SIGTERM, then SIGKILL after ``grace_seconds`` (drained host)."""

    kind: Literal["node_stop"] = "node_stop"
    description: ClassVar[str] = "Stop a node's container (SIGTERM, then SIGKILL); Docker only."
    action: ClassVar[str] = "stop"
    grace_seconds: float = Field(default=10.0, ge=0, description="Seconds before SIGKILL.")


class NodePauseSpec(NodeFaultSpec):
    """Freeze every process of a node's container (a frozen machine)."""

    kind: Literal["node_pause"] = "node_pause"
    description: ClassVar[str] = "Pause a node's container (frozen machine); Docker launcher only."
    action: ClassVar[str] = "pause"
    resume_after: float | None = Field(
        default=None, gt=0, description="Unpause the node after this many seconds."
    )


class NodeInjector(Injector[NodeFaultSpec]):
    """Inside the trainer a node fault does nothing: the harness applies it from outside."""


for _spec in (NodeKillSpec, NodeStopSpec, NodePauseSpec):
    register(_spec, NodeInjector)
