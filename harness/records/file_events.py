"""Typed journal events of the files the attached agent sees a trainer save and load (the
kinds `file_saved`, `file_loaded` and `file_load_failed`; `harness.records.events` holds
every kind)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from harness.records.event_base import Reported, optional, required


@dataclass(frozen=True, slots=True, kw_only=True)
class FileSaved(Reported):
    """Observed by the agent: the trainer saved a file (torch.save, safetensors)."""

    kind: ClassVar[str] = "file_saved"
    path: str = required("Absolute path of the file.")
    sha256: str = required("SHA-256 of its bytes just after the save.")
    bytes: int = optional("Its size.")
    api: str = optional("The call that saved it (torch.save, ...).")


@dataclass(frozen=True, slots=True, kw_only=True)
class FileLoaded(Reported):
    """Observed by the agent: the trainer loaded a file it or another rank saved, or one from
    elsewhere."""

    kind: ClassVar[str] = "file_loaded"
    path: str = required("Absolute path of the file.")
    sha256: str = required("SHA-256 of its bytes when loaded.")
    saved_sha256: str | None = optional(
        "SHA-256 of the matching save (or of this file's last save when none matches); null when "
        "the run never saved it."
    )
    saved_step: int | None = optional("Step of that save; null as above.")
    intact: bool | None = optional(
        "The bytes loaded are those of an observed save (of this file, or of one renamed since); "
        "false when the run saved this file but never these bytes; null when it never saved it."
    )
    api: str = optional("The call that loaded it (torch.load, ...).")


@dataclass(frozen=True, slots=True, kw_only=True)
class FileLoadFailed(Reported):
    """Observed by the agent: a load raised (the trainer refused or could not read it)."""

    kind: ClassVar[str] = "file_load_failed"
    path: str = required("Absolute path of the file.")
    error: str = required("The exception, as type: message.")
    sha256: str | None = optional("SHA-256 of its bytes.")
    intact: bool | None = optional("Its bytes are those of its last observed save.")
    api: str = optional("The call that failed.")
