"""Process faults: signals that kill, freeze or preempt the processes of a training job.

``kill`` sends SIGKILL (node loss), ``hang`` SIGSTOP (a frozen rank; SIGCONT after
``resume_after`` seconds when given) and ``preempt`` SIGTERM (a scheduler's notice; SIGKILL
after ``grace_seconds`` when the process is still alive). The delayed signal comes from a
small helper process in its own session, started before the first signal, because a
process that stops or kills itself cannot send it; the helper checks the process start
time first, so it never signals a recycled pid, and gives up as soon as its target is gone
(a helper must not outlive the job). It says in its environment what started it
(`STARTED_BY_ENV`), so that one found left behind can be named.

Targets are ranks, mapped to pids through ``StepContext.pids`` (the calling rank falls
back to its own pid). Every pid is checked before any signal is sent. When the caller is
itself a target it is signalled last, and the records are first handed to
``before_signal`` (from ``end_step``: the step context's ``record_now``, where the agent
journals and flushes them), since a caller that is killed or stopped never sees ``apply``
return.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Annotated, Any, ClassVar, Literal, TypeVar

from pydantic import Field

from faults.bias import Bias
from faults.errors import InjectionError
from faults.injector import Injection, Injector, StepContext
from faults.proc_stat import START_TIME, stat_fields
from faults.spec import FaultClass, FaultSpec

#: The environment variable in which a helper process says what started it, so that one
#: found outliving its job can be named (the harness reads it there).
STARTED_BY_ENV = "TIGHTROPE_STARTED_BY"

# Sleeps, then sends a signal unless the process is gone, a zombie, or a different process
# under the same pid (start time differs). argv: pid, start time, seconds, signal, poll.
_HELPER = """
# tightrope delayed-signal helper (faults/process.py)
import os, sys, time
pid, start, delay, sig, poll = int(sys.argv[1]), sys.argv[2], float(sys.argv[3]), \\
    int(sys.argv[4]), sys.argv[5] == "1"
def same():
    if not os.path.isdir("/proc/self"):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except OSError:
            pass
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return False
    except OSError:
        return True
    return fields[0] != "Z" and start in ("", fields[19])
end = time.monotonic() + delay
while (left := end - time.monotonic()) > 0:
    time.sleep(min(0.05, left) if poll else left)
    if poll and not same():
        sys.exit(0)
if same():
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass
"""


def _start_time(pid: int) -> str:
    """The process start time from /proc (empty where /proc is not available)."""
    try:
        return stat_fields(pid)[START_TIME]
    except (OSError, IndexError):
        return ""


def signal_later(pid: int, sig: int, delay: float, *, poll: bool, started_by: str = "") -> int:
    """Start a detached helper that sends ``sig`` to ``pid`` after ``delay`` seconds.

    With ``poll`` the helper gives up as soon as the process has exited. ``started_by``
    (what asked for it) goes into its environment, as `STARTED_BY_ENV`. Returns its pid.
    """
    args = [str(pid), _start_time(pid), repr(delay), str(int(sig)), "1" if poll else "0"]
    what = f"{started_by}: " if started_by else ""
    what += f"{signal.Signals(sig).name} to pid {pid} after {delay:g} s"
    helper = subprocess.Popen(
        [sys.executable, "-c", _HELPER, *args],
        env={**os.environ, STARTED_BY_ENV: what},
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        close_fds=True,
    )
    return helper.pid


class ProcessFaultSpec(FaultSpec):
    """Fields every process kind shares (only the common ones)."""

    fault_class: ClassVar[FaultClass] = "process"


class KillSpec(ProcessFaultSpec):
    """SIGKILL the target ranks."""

    kind: Literal["kill"] = "kill"
    description: ClassVar[str] = "SIGKILL a rank's process (node loss)."


class HangSpec(ProcessFaultSpec):
    """SIGSTOP the target ranks, optionally resuming them later."""

    kind: Literal["hang"] = "hang"
    description: ClassVar[str] = "SIGSTOP a rank's process (a hung rank), optionally resumed."
    resume_after: Annotated[float | None, Bias((0.1, 1.0), upto=60)] = Field(
        default=None, gt=0, description="Send SIGCONT after this many seconds; never when unset."
    )


class PreemptSpec(ProcessFaultSpec):
    """SIGTERM the target ranks, then SIGKILL the ones still alive after the grace period."""

    kind: Literal["preempt"] = "preempt"
    description: ClassVar[str] = "SIGTERM a rank's process, SIGKILL after a grace period."
    grace_seconds: Annotated[float, Bias((0.1, 1.0), upto=60, apart=(0.0,), above=0)] = Field(
        default=30.0, ge=0, description="Seconds between SIGTERM and SIGKILL."
    )


P = TypeVar("P", bound=ProcessFaultSpec)


class SignalInjector(Injector[P]):
    """Base: check every target pid, then signal them, the calling process last."""

    sends: ClassVar[signal.Signals]

    def end_step(self, ctx: StepContext) -> list[Injection]:
        """Signal this rank's own process when it is a target.

        The agent runs this hook on every targeted rank, so each signals only itself;
        signalling other ranks' processes is the live-control channel's job (`apply`).
        """
        if ctx.rank not in self.spec.target_ranks(ctx.world_size):
            return []
        pids = dict(ctx.pids)
        pids.setdefault(ctx.rank, os.getpid())
        return self.apply(pids, [ctx.rank], before_signal=ctx.record_now)

    def apply(
        self,
        pids: Mapping[int, int],
        ranks: Iterable[int],
        *,
        before_signal: Callable[[list[Injection]], None] | None = None,
    ) -> list[Injection]:
        """Signal the processes of ``ranks``; nothing is sent unless every one exists.

        Returns the records; but when the caller is a target and ``before_signal`` is
        given, they go to ``before_signal`` just before the caller signals itself instead.
        """
        me = os.getpid()
        targets = sorted((pid == me, rank, pid) for rank, pid in self._pids(pids, ranks))
        records: list[Injection] = []
        handed = False
        for is_me, rank, pid in targets:
            details = {"rank": rank, "pid": pid, "signal": self.sends.name}
            details |= self._prepare(pid, f"{self.spec.kind} fault on rank {rank}")
            records.append(Injection(fault=self.spec.kind, target=f"rank {rank}", details=details))
            if is_me and before_signal is not None:
                before_signal(list(records))
                handed = True
            try:
                os.kill(pid, self.sends)
            except ProcessLookupError:  # exited since the check: nothing left to signal
                details["delivered"] = False
        return [] if handed else records

    def _pids(self, pids: Mapping[int, int], ranks: Iterable[int]) -> list[tuple[int, int]]:
        found = []
        for rank in sorted(set(ranks)):
            if rank not in pids:
                raise InjectionError(f"rank {rank}: no process id registered for it")
            pid = pids[rank]
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                raise InjectionError(
                    f"rank {rank}: process {pid} does not exist (is the job running?)"
                ) from None
            except PermissionError:
                raise InjectionError(
                    f"rank {rank}: no permission to signal process {pid}"
                ) from None
            found.append((rank, pid))
        return found

    def _prepare(self, pid: int, fault: str) -> dict[str, Any]:
        """Details of the record; start any helper here (before the signal). ``fault``
        names the fault and its target, for the helper to say what started it."""
        return {}


class KillInjector(SignalInjector[KillSpec]):
    """Sends SIGKILL."""

    sends = signal.SIGKILL


class HangInjector(SignalInjector[HangSpec]):
    """Sends SIGSTOP; a helper sends SIGCONT after ``resume_after`` seconds."""

    sends = signal.SIGSTOP

    def _prepare(self, pid: int, fault: str) -> dict[str, Any]:
        delay = self.spec.resume_after
        if delay is None:
            return {"resume_after": None}
        # It gives up once the hung process is gone (the hang watchdog kills it long before
        # a late resume_after): a helper sleeping on would outlive the job.
        helper = signal_later(pid, signal.SIGCONT, delay, poll=True, started_by=fault)
        return {"resume_after": delay, "helper_pid": helper}


class PreemptInjector(SignalInjector[PreemptSpec]):
    """Sends SIGTERM; a helper sends SIGKILL after ``grace_seconds`` if still alive."""

    sends = signal.SIGTERM

    def _prepare(self, pid: int, fault: str) -> dict[str, Any]:
        grace = self.spec.grace_seconds
        helper = signal_later(pid, signal.SIGKILL, grace, poll=True, started_by=fault)
        return {"grace_seconds": self.spec.grace_seconds, "helper_pid": helper}
