"""Crashing ranks: a Python exception raised in one rank, or the interpreter killed by a
fatal signal (SIGSEGV, SIGABRT) the way a broken extension kills it.

``rank_exception`` raises at the start of the step's forward pass, in the main thread, or
in a worker thread (``thread: worker``, a data-loader or async-save thread of
tightrope's) whose exception the main thread then raises again, the way PyTorch's
``DataLoader`` hands a worker's exception to the loop ("Caught X in ..."), and the way an
async save's future raises at ``result()``.

``segfault`` and ``abort`` take the core-dump path, not a Python exception: ``segfault``
reads memory at address 8 through ``ctypes`` (a field of a null pointer, a real invalid
access: the kernel sends SIGSEGV), ``abort`` calls the C library's ``abort()``
(SIGABRT). No Python handler runs; ``faulthandler`` prints its report when the trainer
enabled it. Core dumps are switched
off in the rank first (``RLIMIT_CORE`` 0), so that no core file fills the disk. Both act
at the end of the step, as ``kill`` does, and hand their records to
``StepContext.record_now`` first, since the hook never returns.

Every record names the rank it acted on (``details.rank``), for the checks that ask which
rank a detector named.
"""

from __future__ import annotations

import ctypes
import os
import resource
import threading
import traceback
from typing import Annotated, ClassVar, Literal

from pydantic import Field

from faults.bias import Bias
from faults.errors import InjectionError
from faults.injector import Injection, Injector, StepContext
from faults.spec import FaultClass, FaultSpec

#: The exception types ``rank_exception`` may raise (each takes one message argument).
EXCEPTIONS: dict[str, type[Exception]] = {
    "RuntimeError": RuntimeError,
    "ValueError": ValueError,
    "OSError": OSError,
    "KeyError": KeyError,
}
ExceptionName = Literal["RuntimeError", "ValueError", "OSError", "KeyError"]

#: The address ``segfault`` reads: a field of a null pointer, in the page no process maps.
NULL_FIELD = 8

#: The name of the worker thread a ``thread: worker`` exception is raised in.
WORKER_THREAD = "tightrope-data-worker"


class CrashSpec(FaultSpec):
    """Fields every crash kind shares (only the common ones)."""

    fault_class: ClassVar[FaultClass] = "process"


class RankExceptionSpec(CrashSpec):
    """Raise a Python exception in the target ranks, in the main thread or a worker's."""

    kind: Literal["rank_exception"] = "rank_exception"
    description: ClassVar[str] = (
        "Raise a Python exception in a rank at a step (main thread or a worker thread)."
    )
    thread: Annotated[Literal["main", "worker"], Bias(("main", "worker"), only=True)] = Field(
        default="main",
        description="main: raised in the training loop; worker: in a worker thread, "
        "raised again in the loop as a data loader does.",
    )
    exception: Annotated[ExceptionName, Bias(("RuntimeError", "OSError"))] = Field(
        default="RuntimeError", description="The exception type raised."
    )
    message: str = Field(
        default="injected by tightrope",
        max_length=1000,
        description="The exception's message.",
    )


class SegfaultSpec(CrashSpec):
    """Kill the target ranks' interpreter by a real invalid memory access (SIGSEGV)."""

    kind: Literal["segfault"] = "segfault"
    description: ClassVar[str] = "Crash a rank's interpreter with SIGSEGV (a null read)."


class AbortSpec(CrashSpec):
    """Kill the target ranks' interpreter through the C library's ``abort()`` (SIGABRT)."""

    kind: Literal["abort"] = "abort"
    description: ClassVar[str] = "Crash a rank's interpreter with SIGABRT (C abort())."


def _record(spec: FaultSpec, ctx: StepContext, **details: object) -> Injection:
    return Injection(
        fault=spec.kind,
        target=f"rank {ctx.rank}",
        details={"rank": ctx.rank, "pid": os.getpid(), **details},
    )


class RankExceptionInjector(Injector[RankExceptionSpec]):
    """Raises before the forward pass; the record is journaled first."""

    def before_forward(self, ctx: StepContext) -> list[Injection]:
        spec = self.spec
        if ctx.rank not in spec.target_ranks(ctx.world_size):
            return []
        record = _record(spec, ctx, thread=spec.thread, exception=spec.exception)
        record.details["message"] = spec.message
        if ctx.record_now is None:
            raise self._error()  # nothing to journal it with: the exception still comes
        ctx.record_now([record])
        raise self._error()

    def _error(self) -> Exception:
        """The exception to raise, made in the thread the spec names."""
        if self.spec.thread == "main":
            return EXCEPTIONS[self.spec.exception](self.spec.message)
        return raised_in_worker(EXCEPTIONS[self.spec.exception], self.spec.message)


def raised_in_worker(kind: type[Exception], message: str) -> Exception:
    """Raise ``kind(message)`` in a worker thread and return what the main thread raises
    for it: the same type, its message saying the thread and the worker's traceback (as
    ``torch.utils.data``'s ``ExceptionWrapper.reraise`` does), the original as its cause."""
    caught: list[BaseException] = []

    def work() -> None:
        try:
            raise kind(message)
        except BaseException as exc:  # handed to the main thread, as a data loader does
            caught.append(exc)

    worker = threading.Thread(target=work, name=WORKER_THREAD, daemon=True)
    worker.start()
    worker.join()
    original = caught[0]
    trace = "".join(traceback.format_exception(original))
    error = kind(f"Caught {kind.__name__} in thread {WORKER_THREAD}.\nOriginal {trace}")
    error.__cause__ = original
    return error


class FatalSignalInjector(Injector[CrashSpec]):
    """Base: journal the record, switch core dumps off, then die by the kind's own path."""

    signal_name: ClassVar[str]

    def end_step(self, ctx: StepContext) -> list[Injection]:
        if ctx.rank not in self.spec.target_ranks(ctx.world_size):
            return []
        record = _record(self.spec, ctx, signal=self.signal_name)
        if ctx.record_now is not None:
            ctx.record_now([record])
        no_core_dumps()
        self.die()
        raise InjectionError(f"{self.spec.kind}: the process survived its {self.signal_name}")

    def die(self) -> None:
        """End this process by the kind's signal."""
        raise NotImplementedError


class SegfaultInjector(FatalSignalInjector):
    """Reads address 0: the kernel's SIGSEGV, no Python exception."""

    signal_name = "SIGSEGV"

    def die(self) -> None:
        # (Not address 0: ctypes reads ``string_at(0, n)`` as "n fresh bytes".)
        ctypes.string_at(NULL_FIELD, 1)


class AbortInjector(FatalSignalInjector):
    """Calls ``abort()``: SIGABRT, as a failed C assertion sends it."""

    signal_name = "SIGABRT"

    def die(self) -> None:
        os.abort()


def no_core_dumps() -> None:
    """No core file from this process (the soft limit only; where it cannot be lowered,
    the crash still comes)."""
    try:
        _, hard = resource.getrlimit(resource.RLIMIT_CORE)
        resource.setrlimit(resource.RLIMIT_CORE, (0, hard))
    except (OSError, ValueError):
        pass
