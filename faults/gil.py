"""A wedged rank: a thread holds the GIL for seconds, so the process is alive and running
(state R, burning a core: not stopped, state T, as ``hang``'s SIGSTOP leaves it) and
answers nothing: no step ends, no heartbeat is written, no Python signal handler runs.

What really holds the GIL here: a pure-Python loop in a thread of tightrope's, under a
switch interval (``sys.setswitchinterval``) longer than the lock. CPython's GIL is
handed over only when a waiting thread has waited a whole switch interval and asks for
it (or the holder blocks, sleeps or calls C code that releases it); a loop of bytecode
and ``time.monotonic()`` calls never releases it, so every other thread, the training
loop first, waits for the loop to end. This is the wedge a C extension's long call that
keeps the GIL (a regex that backtracks, a ``ctypes.PyDLL`` call) makes, with a length
one can choose. The loop puts the switch interval back when it ends.

The thread starts before the step's forward pass; the record is journaled first, since a
watchdog may kill the rank before the hook returns.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Annotated, ClassVar, Literal

from pydantic import Field

from faults.bias import Bias
from faults.injector import Injection, Injector, StepContext
from faults.spec import FaultClass, FaultSpec

#: The name of the thread that holds the GIL.
HOLDER_THREAD = "tightrope-gil-holder"
#: Seconds the switch interval is set past the lock, so no waiter takes the GIL early.
MARGIN = 5.0


class GilLockSpec(FaultSpec):
    """Hold the GIL in a thread of the target ranks for ``seconds``."""

    fault_class: ClassVar[FaultClass] = "process"
    kind: Literal["gil_lock"] = "gil_lock"
    description: ClassVar[str] = "A thread holds a rank's GIL for seconds: alive, busy, silent."
    seconds: Annotated[float, Bias((0.5, 30.0), upto=60)] = Field(
        default=30.0, gt=0, le=3600, description="Seconds the thread holds the GIL."
    )


def hold_gil(seconds: float) -> threading.Thread:
    """Start a thread that holds the GIL for ``seconds``; the caller waits for it from
    its next bytecode on (returns once the GIL is back)."""
    before = sys.getswitchinterval()

    def spin() -> None:
        end = time.monotonic() + seconds
        try:
            while time.monotonic() < end:
                pass
        finally:
            sys.setswitchinterval(before)

    sys.setswitchinterval(seconds + MARGIN)
    holder = threading.Thread(target=spin, name=HOLDER_THREAD, daemon=True)
    holder.start()  # (start waits for the thread to run: the thread has the GIL from here)
    return holder


class GilLockInjector(Injector[GilLockSpec]):
    """Starts the holding thread before the forward pass."""

    def before_forward(self, ctx: StepContext) -> list[Injection]:
        if ctx.rank not in self.spec.target_ranks(ctx.world_size):
            return []
        record = Injection(
            fault=self.spec.kind,
            target=f"rank {ctx.rank}",
            details={
                "rank": ctx.rank,
                "pid": os.getpid(),
                "seconds": self.spec.seconds,
                "thread": HOLDER_THREAD,
            },
        )
        if ctx.record_now is None:
            hold_gil(self.spec.seconds).join()
            return [record]
        ctx.record_now([record])
        hold_gil(self.spec.seconds).join()
        return []
