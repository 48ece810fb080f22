"""Launch a scenario on Docker nodes: one container per node, each running torchrun's agent.

The nodes meet through c10d rendezvous on a store hosted by a small process of the
harness, outside every node, so losing any node never takes the rendezvous with it.
With ``min_nodes`` below ``nodes`` the job is elastic (``--nnodes MIN:MAX``): after a node
is lost the others go on without it, and a node that comes back (``rejoin_after``) is
admitted at the next rendezvous. Faults whose reach is ``node`` (`faults.node`) are
applied here, from outside the containers, when a step the run reached fires them
(`FaultSpec.fires_at`) or their time has come:
their injector's `on_node` acts through `_Nodes` (a `faults.injector.NodeControl`) and
its records are journaled as ``fault_injected`` events. Each node's output goes into the
run's ``trainer.log``.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from faults import FaultSpec, Injector, build_injector
from harness.records.journal import JournalWriter
from harness.run_layout import RunLayout
from harness.running.launch import Launch, LaunchError, reference_command
from harness.running.progress import StepFollower
from harness.suites.scenario import Scenario

if TYPE_CHECKING:
    from harness.docker.nodes import DockerCluster

_STORE = (
    "import sys, time\n"
    "from torch.distributed import TCPStore\n"
    "store = TCPStore('127.0.0.1', int(sys.argv[1]), is_master=True, wait_for_workers=False)\n"
    "print('ready', flush=True)\n"
    "time.sleep(1e9)\n"
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(slots=True)
class _Pending:
    """A node fault not yet applied, or an undo (rejoin, unpause) not yet due."""

    spec: FaultSpec
    injector: Injector[Any]
    node: int
    fired_at: float | None = None
    undone: bool = False
    #: The furthest step already looked at for its trigger.
    seen: int = 0

    def due(self, step: int, elapsed: float) -> bool:
        """Whether a step up to ``step`` fires it (the run is followed from its journal, so
        steps may pass between two looks), or ``elapsed`` seconds reached its time."""
        spec, seen = self.spec, self.seen
        self.seen = max(seen, step)
        if spec.after_seconds is not None:
            return elapsed >= spec.after_seconds
        return any(spec.fires_at(s) for s in range(seen + 1, step + 1))


#: How often each node's torchrun agent says it is alive, and how many it may miss.
RENDEZVOUS_KEEP_ALIVE = "keep_alive_interval=2,keep_alive_max_attempt=3"


@dataclass(slots=True)
class _Cluster:
    """The nodes of one run and what is left to do to them."""

    scenario: Scenario
    run_dir: Path
    plan: Path | None
    run_id: str
    endpoint: str
    started: float = field(default_factory=time.monotonic)
    pending: list[_Pending] = field(default_factory=list)
    lost: set[int] = field(default_factory=set)
    incarnations: dict[int, int] = field(default_factory=dict)
    followers: list[StepFollower] = field(default_factory=list)

    def argv(self) -> list[str]:
        """Every node's command: its torchrun agent, then the reference trainer."""
        from harness.docker.image import torchrun_node_argv

        spec = self.scenario.trainer
        nnodes = f"{spec.min_nodes}:{spec.nodes}" if spec.min_nodes else str(spec.nodes)
        head = torchrun_node_argv(nnodes, spec.world_size // spec.nodes, self.endpoint, self.run_id)
        # A lost node is dropped from the next rendezvous once its agent has missed 3
        # keep-alives (torchrun's own count) at 2 s each, where torchrun's 5 s kept the
        # survivors waiting 15 s; the agents beat from a thread of their own, not the trainer's.
        head += ["--rdzv-conf", f"is_host=false,last_call_timeout=5,{RENDEZVOUS_KEEP_ALIVE}"]
        head += ["--max-restarts", str(spec.restarts)]
        return reference_command(spec, self.run_dir, self.plan, head=head)

    def step(self) -> int:
        """The furthest step any rank has reported."""
        return max((f.poll() for f in self.followers), default=0)


def run_on_docker(
    scenario: Scenario,
    run_dir: Path,
    plan: Path | None,
    log: Path,
    deadline: float,
    poll: Callable[[], None],
    *,
    owner_env: Mapping[str, str] | None = None,
) -> Launch:
    """Run the scenario's trainer on Docker nodes until every node is done or the deadline;
    ``env`` is added to every node's (the runner's claim on the run dir, to share)."""
    from harness.docker.nodes import DockerCluster

    spec = scenario.trainer
    port = _free_port()
    store = subprocess.Popen(
        [sys.executable, "-c", _STORE, str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    began = time.monotonic()
    state = _Cluster(scenario, run_dir, plan, f"{run_dir.name}-{port}", f"127.0.0.1:{port}")
    state.pending = [
        _Pending(f, build_injector(f), node)
        for f in scenario.faults
        if f.reach == "node" and (node := f.target_node()) is not None
    ]
    state.followers = [
        StepFollower(RunLayout(run_dir).journal_file(r)) for r in range(spec.world_size)
    ]
    exit_codes: dict[int, int | None] = {}
    timed_out = False
    try:
        assert store.stdout is not None
        if store.stdout.readline().strip() != b"ready":
            raise LaunchError(f"the rendezvous store on port {port} did not start")
        with DockerCluster(state.run_id, workdir=Path.cwd()) as cluster:
            argv = state.argv()
            # torchrun shares a TCP store hosted by the rank-0 agent and remembers its
            # address from the first round; an agent that joins a later round (a node
            # that came back) would wait forever for an address nobody writes again.
            # Without sharing, every round publishes it.
            env = {
                "OMP_NUM_THREADS": "1",
                "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
                **(owner_env or {}),
                **spec.env,
            }
            for node in range(spec.nodes):
                cluster.start(node, argv, env, run_dir)
            while True:
                poll()
                _drive_faults(state, cluster, argv, env)
                statuses = {n: cluster.status(n) for n in range(spec.nodes)}
                if all(s.state in ("exited", "dead") for s in statuses.values()) and not any(
                    p.fired_at is not None
                    and not p.undone
                    and p.injector.restore_after() is not None
                    for p in state.pending
                ):
                    exit_codes = {n: s.exit_code for n, s in statuses.items()}
                    break
                if time.monotonic() >= deadline:
                    timed_out = True
                    break
                time.sleep(0.25)
            with open(log, "a") as out:
                for node in range(spec.nodes):
                    out.write(f"==== node {node} ====\n{cluster.logs(node)}\n")
    finally:
        store.kill()
        store.wait()
    kept = [c for n, c in exit_codes.items() if n not in state.lost]
    code = None if timed_out else max((c if c is not None else 1 for c in kept), default=1)
    return Launch(code, timed_out, time.monotonic() - began)


class _Nodes:
    """The run's node containers as node faults act on them (a `faults.injector.NodeControl`)."""

    def __init__(
        self, state: _Cluster, cluster: DockerCluster, argv: list[str], env: dict[str, str]
    ) -> None:
        self.state, self.cluster, self.argv, self.env = state, cluster, argv, env

    def fault(self, action: str, node: int, *, timeout: float) -> dict[str, Any]:
        """Kill, stop or pause the node's container; a killed or stopped node is lost."""
        from harness.docker.faults import node_fault

        record = node_fault(self.cluster, action, node, timeout=timeout)  # type: ignore[arg-type]
        if action in ("kill", "stop"):
            self.state.lost.add(node)
        return record

    def restore(self, action: str, node: int) -> None:
        """Unpause a paused node; start a lost one again, which then rejoins."""
        state = self.state
        if action == "pause":
            self.cluster.unpause(node)
            return
        # torchrun tells nodes apart by address and pid, and pid 1 is the same in every
        # container: a node that comes back takes an address of its own, or the rendezvous
        # could take it for the one that died.
        state.incarnations[node] = state.incarnations.get(node, 0) + 1
        address = f"127.0.{state.incarnations[node]}.{node + 1}"
        self.cluster.start(node, self.argv, self.env | {"PET_LOCAL_ADDR": address}, state.run_dir)
        state.lost.discard(node)


def _drive_faults(
    state: _Cluster, cluster: DockerCluster, argv: list[str], env: dict[str, str]
) -> None:
    """Apply the node faults whose step or time has come; undo those whose time is up."""
    nodes = _Nodes(state, cluster, argv, env)
    step = state.step()
    now = time.monotonic()
    trainer = state.scenario.trainer
    for p in state.pending:
        if p.fired_at is None:
            if not p.due(step, now - state.started):
                continue
            records = p.injector.on_node(nodes)
            p.fired_at = now
            rank = p.node * (trainer.world_size // trainer.nodes)
            # Written as the node's first rank; the harness cannot know the attempt the
            # trainer is in, so it records attempt 0.
            with JournalWriter(state.run_dir, rank, restart=0) as journal:
                for record in records:
                    journal.emit("fault_injected", step, **record.event_fields())
        elif (
            not p.undone
            and (delay := p.injector.restore_after()) is not None
            and now - p.fired_at >= delay
        ):
            p.undone = True
            p.injector.restore_node(nodes)
