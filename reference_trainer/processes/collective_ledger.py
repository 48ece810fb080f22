"""The collective ledger: how many all-reduces each rank has entered, on disk, and how long
this rank spent in them.

Installed by the run on every rank of a distributed job, it wraps
``torch.distributed.all_reduce`` (the step's agreement, the start-up's agreements, and
DDP's bucket all-reduces, which the microscope's communication hook sends through it).
Just before a call goes to the backend the ledger counts it and, with the collective
watchdog on, rewrites ``collectives/rank-R.json`` with the count (its sequence number).
A rank that never enters a collective (stuck in Python, in a fault that wraps the call
above the ledger) never counts it; the ranks waiting inside it have
(`reference_trainer.processes.collective_counts` names the culprits from the files).

It also times the calls, for the straggler scores: a synchronous call from its start to
its return, an asynchronous one (DDP's buckets) from launch to completion.
"""

from __future__ import annotations

import functools
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import torch.distributed as dist

from harness.run_layout import RunLayout

_ACTIVE: CollectiveLedger | None = None


def active() -> CollectiveLedger | None:
    """The ledger installed in this process, if any."""
    return _ACTIVE


class CollectiveLedger:
    """One rank's count of the all-reduces it entered, and the seconds spent in them."""

    def __init__(self, run_dir: Path | None, rank: int, restart: int) -> None:
        #: Where the count goes (None: counted, not written: the watchdog is off).
        self.path = RunLayout(run_dir).collective_file(rank) if run_dir is not None else None
        self.rank, self.restart = rank, restart
        self.seq = 0
        self._seconds = 0.0
        self._lock = threading.Lock()
        self._original: Any = None
        self._wrapper: Any = None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def install(self) -> CollectiveLedger:
        """Wrap ``all_reduce``; this ledger becomes `active`."""
        global _ACTIVE
        original = self._original = dist.all_reduce

        @functools.wraps(original)
        def all_reduce(*args: Any, **kwargs: Any) -> Any:
            self._enter()
            started = time.perf_counter()
            work = original(*args, **kwargs)
            if kwargs.get("async_op") and work is not None:
                work.get_future().add_done_callback(lambda _: self._add(started))
            else:
                self._add(started)
            return work

        self._wrapper = all_reduce
        dist.all_reduce = all_reduce
        _ACTIVE = self
        return self

    def uninstall(self) -> None:
        """Put the previous ``all_reduce`` back (when nothing wrapped it since)."""
        global _ACTIVE
        if self._wrapper is not None and dist.all_reduce is self._wrapper:
            dist.all_reduce = self._original
        self._wrapper = None
        if _ACTIVE is self:
            _ACTIVE = None

    def take_seconds(self) -> float:
        """Seconds spent in all-reduces since the last call."""
        with self._lock:
            seconds, self._seconds = self._seconds, 0.0
        return seconds

    def _add(self, started: float) -> None:
        with self._lock:
            self._seconds += time.perf_counter() - started

    def _enter(self) -> None:
        with self._lock:
            self.seq += 1
            seq = self.seq
        if self.path is None:
            return
        record = {"seq": seq, "restart": self.restart, "wall": time.time(), "pid": os.getpid()}
        tmp = self.path.with_name(f"{self.path.name}.{threading.get_ident()}.tmp")
        tmp.write_text(json.dumps(record))
        os.replace(tmp, self.path)  # never half a record
