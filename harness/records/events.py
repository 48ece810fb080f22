"""Typed journal events that a trainer reports and the agent observes.

A trainer's claims (``detected``, ``recovered``, a checkpoint saved or refused, a restart,
a rank lost), a step's observations and the files the attached agent sees saved and
loaded are dataclasses here, not dicts built where they are sent: a misspelt field fails
where it is written, and `tests/test_events.py` holds each one to the journal schema
(`harness.records.journal_schema`), the contract the oracles read.

A field left at `OMIT` is not written (nothing was observed); ``None`` is written as null
where the schema allows it (observed: there is none).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar


class _Omit:
    def __repr__(self) -> str:
        return "OMIT"


#: The default of an optional field: not written at all.
OMIT: Any = _Omit()


@dataclass(frozen=True, slots=True, kw_only=True)
class Reported:
    """One journal event's own fields; ``kind`` names the event."""

    kind: ClassVar[str]

    def fields(self) -> dict[str, Any]:
        """The fields to journal (those left at `OMIT` are not written)."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return {name: value for name, value in values.items() if value is not OMIT}


# -- claims: what a trainer says about itself -------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Detected(Reported):
    """A detector saw a problem."""

    kind: ClassVar[str] = "detected"
    detector: str
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class Recovered(Reported):
    """A recovery action ran."""

    kind: ClassVar[str] = "recovered"
    action: str
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointSaved(Reported):
    """A checkpoint became durable."""

    kind: ClassVar[str] = "checkpoint_saved"
    path: str
    bytes: int = OMIT
    type: str = OMIT
    seconds: float = OMIT
    stall_seconds: float = OMIT
    manifest_sha256: str = OMIT


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointRejected(Reported):
    """A checkpoint was refused on load."""

    kind: ClassVar[str] = "checkpoint_rejected"
    path: str
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Restart(Reported):
    """The workers came back after a failure."""

    kind: ClassVar[str] = "restart"
    count: int
    reason: str = OMIT


@dataclass(frozen=True, slots=True, kw_only=True)
class RankLost(Reported):
    """A rank stopped answering or died."""

    kind: ClassVar[str] = "rank_lost"
    lost_rank: int
    reason: str = OMIT


@dataclass(frozen=True, slots=True, kw_only=True)
class Diagnosed(Reported):
    """The layer(s) a trainer's own diagnosis names behind a detection."""

    kind: ClassVar[str] = "diagnosed"
    detectors: list[str]
    layers: list[str]
    rule: str = OMIT
    details: dict[str, Any] = field(default_factory=dict)


#: Everything a trainer may claim.
Claim = Detected | Recovered | CheckpointSaved | CheckpointRejected | Restart | RankLost | Diagnosed


# -- observations ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class StepObserved(Reported):
    """What was observed about one optimizer step (the agent adds ``skipped`` and
    ``params_finite`` from its own evidence)."""

    kind: ClassVar[str] = "step"
    loss: float
    local_loss: float = OMIT
    grad_norm: float | None = OMIT
    lr: float = OMIT
    loss_scale: float | None = OMIT
    tokens: int = OMIT
    step_time: float = OMIT
    skipped: bool = OMIT
    batch_fingerprint: str = OMIT
    numbered_by: str = OMIT
    step_conflict: dict[str, int] = OMIT
    docs: int = OMIT
    contaminated_docs: int = OMIT
    contaminated_kinds: dict[str, int] = OMIT
    fallback_tokens: int = OMIT
    batch_tokens: int = OMIT
    grad_variance: float = OMIT
    warmup_factor: float = OMIT
    pad_tokens: int = OMIT


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerStatsObserved(Reported):
    """Per-layer statistics of one step, as the trainer measured them."""

    kind: ClassVar[str] = "layer_stats"
    layers: dict[str, dict[str, float | None]]
    anomaly: bool = OMIT


@dataclass(frozen=True, slots=True, kw_only=True)
class DataWeightsObserved(Reported):
    """The corpus's sampling weights and what moved them (quality-weighted sampling)."""

    kind: ClassVar[str] = "data_weights"
    weights: dict[str, float]
    quality: dict[str, float]
    losses: dict[str, float | None] = OMIT
    tokens: dict[str, int] = OMIT


@dataclass(frozen=True, slots=True, kw_only=True)
class FileSaved(Reported):
    """The attached agent saw the trainer save a file."""

    kind: ClassVar[str] = "file_saved"
    path: str
    sha256: str
    bytes: int = OMIT
    api: str = OMIT


@dataclass(frozen=True, slots=True, kw_only=True)
class FileLoaded(Reported):
    """The attached agent saw the trainer load a file, matched against the run's saves."""

    kind: ClassVar[str] = "file_loaded"
    path: str
    sha256: str
    saved_sha256: str | None = OMIT
    saved_step: int | None = OMIT
    intact: bool | None = OMIT
    api: str = OMIT


@dataclass(frozen=True, slots=True, kw_only=True)
class FileLoadFailed(Reported):
    """The attached agent saw a load raise."""

    kind: ClassVar[str] = "file_load_failed"
    path: str
    error: str
    sha256: str | None = OMIT
    intact: bool | None = OMIT
    api: str = OMIT


#: Every typed event, for the test that holds them to the schema.
ALL: tuple[type[Reported], ...] = (
    Detected,
    Recovered,
    CheckpointSaved,
    CheckpointRejected,
    Restart,
    RankLost,
    StepObserved,
    DataWeightsObserved,
    FileSaved,
    FileLoaded,
    FileLoadFailed,
)
