"""What an attached agent makes of the trainer's file saves and loads, as
`harness.inside.files` reports them: each journaled, a load matched against the run's
saves, and a process that has not trained yet numbered from the save it loaded."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from harness.inside.agent import Agent
from harness.inside.files import SaveMatch, read_saves, settle_memory_saves
from harness.inside.hooks import strip_hooks
from harness.records.events import FileLoaded, FileLoadFailed, FileSaved


class SaveAndLoadEvidence:
    """The file listener half of `harness.inside.attached_agent.AttachedAgent`, which
    holds the state read here and ends a step at a save (`_boundary`)."""

    agent: Agent
    _closed: bool  # the agent was closed: nothing more is journaled
    _began: bool  # a step began in this process
    _open: bool  # a step is open
    _resumed_from: int | None  # step of the save loaded before training

    def _boundary(self) -> None:
        """End the open step when its update happened or was given up."""
        raise NotImplementedError

    def before_save(self, obj: object) -> Callable[[], None]:
        """A save: a step whose update happened by hand ends first; the agent's own hooks
        leave the module while it is pickled, so nothing of the agent is in the file."""
        self._boundary()
        settle_memory_saves()
        return strip_hooks(obj)

    def saved(self, path: Path, sha256: str, size: int, api: str) -> None:
        """Journal the save; remember its hash and step."""
        if self._closed:
            return
        self.agent.observe_file(FileSaved(path=str(path), sha256=sha256, bytes=size, api=api))
        self.agent.file_saved(str(path))

    def loaded(self, path: Path, sha256: str, api: str) -> None:
        """Journal the load against the run's saves; a process that has not trained yet
        resumes counting from the step of the save whose bytes it loaded."""
        if self._closed:
            return
        match = self._match(path, sha256)
        self.agent.observe_file(
            FileLoaded(path=str(path), sha256=sha256, api=api, **match.fields())
        )
        # Damaged or not, the trainer resumes from what that save held.
        if match.step is not None and not self._began and not self._open:
            self.agent.step = self._resumed_from = match.step

    def load_failed(self, path: Path, sha256: str | None, error: BaseException, api: str) -> None:
        """Journal a load that raised."""
        if self._closed:
            return
        intact = self._match(path, sha256).intact if sha256 is not None else None
        error_text = f"{type(error).__name__}: {error}"[:500]
        self.agent.observe_file(
            FileLoadFailed(path=str(path), sha256=sha256, intact=intact, error=error_text, api=api)
        )

    def _match(self, path: Path, sha256: str) -> SaveMatch:
        """What the run's observed saves (every rank, every attempt) say of these bytes."""
        # This process's saves too: every journal line is flushed when written.
        return SaveMatch.of(read_saves(self.agent.run_dir), str(path), sha256)
