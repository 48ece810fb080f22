"""Progress of a suite run: one bar per running scenario (its step), one for the suite.

The step comes from the run's own journal, read incrementally from the rank-0 file, so
the display costs the trainer nothing. Without a terminal (CI logs), one line is
printed per finished scenario instead of bars.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from types import TracebackType

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from harness.run_layout import RunLayout


class StepFollower:
    """Reads new complete lines of one journal file and remembers the last step seen."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.step = 0
        self._offset = 0
        self._partial = b""

    def poll(self) -> int:
        """The last step a `step` event reported so far."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except OSError:
            return self.step
        self._offset += len(data)
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        for raw in lines:
            if b'"kind":"step"' not in raw and b'"kind": "step"' not in raw:
                continue
            try:
                self.step = int(json.loads(raw)["step"])
            except (ValueError, KeyError, TypeError):
                continue
        return self.step


class SuiteProgress:
    """The live display of a suite run; safe to call from the runner's worker threads."""

    def __init__(self, total: int, title: str, console: Console | None = None) -> None:
        self.console = console or Console(stderr=True)
        self.live = self.console.is_terminal
        self._lock = threading.Lock()
        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=self.console,
            transient=False,
            disable=not self.live,
        )
        self._suite = self._progress.add_task(f"[bold]{title}", total=total)
        self._followers: dict[TaskID, StepFollower] = {}

    def __enter__(self) -> SuiteProgress:
        self._progress.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._progress.stop()

    def retitle(self, title: str) -> None:
        """Change the overall bar's title (a sweep's cells done)."""
        with self._lock:
            self._progress.update(self._suite, description=f"[bold]{title}")

    def start(self, label: str, steps: int) -> TaskID:
        """A bar for one run (a scenario or its baseline)."""
        with self._lock:
            return self._progress.add_task(f"  {label}", total=steps)

    def poll(self, task: TaskID, run_dir: Path) -> None:
        """Move a run's bar to the last step its journal shows."""
        with self._lock:
            follower = self._followers.get(task)
            if follower is None or follower.path.parent.parent != run_dir:
                follower = self._followers[task] = StepFollower(RunLayout(run_dir).journal_file(0))
            self._progress.update(task, completed=follower.poll())

    def finish(self, task: TaskID, line: str, *, counts: bool = True) -> None:
        """A run is over: drop its bar, print its one-line result, and advance the overall
        bar when the run is one it counts (a scenario's, not its baseline's)."""
        with self._lock:
            self._progress.remove_task(task)
            self._followers.pop(task, None)
            if counts:
                self._progress.advance(self._suite)
            self._progress.console.print(line, highlight=False)
