"""Node faults: a whole node (a container running torchrun's agent and its ranks) is killed,
paused or stopped, as a failed machine, a frozen VM or a drained host would be.

Unlike every other kind, these are not applied from inside the training process: their
``reach`` is ``node``, and the harness (``harness.running.docker_launch``) drives their
injector from outside, through a `faults.injector.NodeControl` over the node containers,
when the run reaches ``at_step`` (`FaultSpec.fires_at`) or after ``after_seconds``; the
only triggers they honour. Inside the trainer their injector does nothing.
``rejoin_after`` brings a killed or stopped node back (a fresh container) after that many
seconds; ``resume_after`` unpauses a paused one.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from faults.injector import Injection, Injector, NodeControl
from faults.spec import FaultClass, FaultSpec, Reach, Trigger

#: Seconds a node action may take when the kind sets no limit of its own.
DEFAULT_TIMEOUT = 10.0


class NodeFaultSpec(FaultSpec):
    """Fields every node kind shares."""

    fault_class: ClassVar[FaultClass] = "process"
    reach: ClassVar[Reach] = "node"
    # Applied once, from outside, at a step the harness sees in the journal or at a time.
    triggers: ClassVar[tuple[Trigger, ...]] = ("at_step", "after_seconds")
    #: The container action the harness takes.
    action: ClassVar[str] = ""

    node: int = Field(ge=0, description="The node (container) hit, 0-based.")

    def target_node(self) -> int:
        """The node hit."""
        return self.node

    def timeout(self) -> float:
        """Seconds the action may take."""
        return DEFAULT_TIMEOUT

    def restore_after(self) -> float | None:
        """Seconds after the action at which the node comes back; None: never."""
        return None


class LosingNodeSpec(NodeFaultSpec):
    """Fields of the kinds that take a node away (it may come back)."""

    rejoin_after: float | None = Field(
        default=None, gt=0, description="Start the node again after this many seconds."
    )

    def restore_after(self) -> float | None:
        """The node rejoins after ``rejoin_after`` seconds, when given."""
        return self.rejoin_after


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

    def timeout(self) -> float:
        """The grace before SIGKILL."""
        return self.grace_seconds


class NodePauseSpec(NodeFaultSpec):
    """Freeze every process of a node's container (a frozen machine)."""

    kind: Literal["node_pause"] = "node_pause"
    description: ClassVar[str] = "Pause a node's container (frozen machine); Docker launcher only."
    action: ClassVar[str] = "pause"
    resume_after: float | None = Field(
        default=None, gt=0, description="Unpause the node after this many seconds."
    )

    def restore_after(self) -> float | None:
        """The node is unpaused after ``resume_after`` seconds, when given."""
        return self.resume_after


class NodeInjector(Injector[NodeFaultSpec]):
    """Acts on the node from outside through the harness's `NodeControl`; inside the trainer
    it does nothing."""

    def on_node(self, nodes: NodeControl) -> list[Injection]:
        """Kill, stop or pause the node; the record the harness journals."""
        spec = self.spec
        record = nodes.fault(spec.action, spec.node, timeout=spec.timeout())
        return [Injection(fault=spec.kind, target=f"node {spec.node}", details=record)]

    def restore_after(self) -> float | None:
        """Seconds until the node comes back, if it does."""
        return self.spec.restore_after()

    def restore_node(self, nodes: NodeControl) -> None:
        """Unpause the node, or start it again."""
        nodes.restore(self.spec.action, self.spec.node)
