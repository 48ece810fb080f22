"""Every journal event kind as a typed dataclass: what a trainer claims, what the agent
observes, and the lifecycle of a run.

A trainer's claims (``detected``, ``recovered``, a checkpoint saved or refused, a restart,
a rank lost), a step's observations and the files the attached agent sees saved and
loaded are dataclasses, not dicts built where they are sent: a misspelt field fails
where it is written. Each class's docstring is its kind's meaning and each field's doc
its own; the journal schema (`harness.records.journal_schema`, the contract the oracles
read) and the kind table of docs/journal.md are written from `ALL`.

A field left at `OMIT` is not written (nothing was observed); ``None`` is written as null
where the schema allows it (observed: there is none).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from harness.records.event_base import OMIT, Reported, free_form, optional, required
from harness.records.file_events import FileLoaded, FileLoadFailed, FileSaved
from harness.records.step_events import (
    BatchSplit,
    DataWeightsObserved,
    LayerStatsObserved,
    StepObserved,
)

__all__ = [
    "ALL",
    "OMIT",
    "BatchSplit",
    "CheckpointLoaded",
    "CheckpointRejected",
    "CheckpointSaved",
    "Claim",
    "CommandAnswered",
    "DataWeightsObserved",
    "Detected",
    "Diagnosed",
    "FaultInjected",
    "FaultSkipped",
    "FileLoadFailed",
    "FileLoaded",
    "FileSaved",
    "LayerStatsObserved",
    "LrDecided",
    "MetricsFailed",
    "MicroscopeFailed",
    "RankBlamed",
    "RankLost",
    "Recovered",
    "Reported",
    "Restart",
    "RunEnd",
    "RunStart",
    "StepObserved",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class RunStart(Reported):
    """A process began training (a fresh run or a resume)."""

    kind: ClassVar[str] = "run_start"
    world_size: int = required("Number of ranks in the job.")
    pid: int = required("Process id of the writer.")
    host: str = required("Host name of the writer.")
    target_steps: int = optional("Step the run trains to.")
    preset: str = optional("Reference-trainer preset, when there is one.")
    seed: int = optional("Seed of the run.")
    precision: str = optional("fp32, bf16 or fp16.")
    device: str = optional("cpu or cuda.")
    resumed_from: str | None = optional("Checkpoint the run resumed from; null when fresh.")
    config: dict[str, Any] = optional("The full trainer configuration.")


@dataclass(frozen=True, slots=True, kw_only=True)
class FaultInjected(Reported):
    """A fault was injected."""

    kind: ClassVar[str] = "fault_injected"
    fault: str = required("Fault kind, as in the fault registry.")
    target: str = optional("What was hit: a module, parameter, file or rank.")
    details: dict[str, Any] = optional("The figures behind the event, by name (free-form).")


@dataclass(frozen=True, slots=True, kw_only=True)
class FaultSkipped(Reported):
    """A checkpoint fault of the plan found nothing to act on at its step (no checkpoint yet,
    none older, the file gone); it counts as fired, so a restarted job does not meet it
    again. A fault whose *plan* is wrong (a parameter that does not exist) still stops the
    run."""

    kind: ClassVar[str] = "fault_skipped"
    fault: str = required("Fault kind, as in the fault registry.")
    reason: str = required("What was missing.")
    details: dict[str, Any] = optional(
        "The figures behind the event, by name (free-form); `plan_index` of the fault."
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class Detected(Reported):
    """A detector claims it saw a problem."""

    kind: ClassVar[str] = "detected"
    detector: str = required("Name of the detector.")
    details: dict[str, Any] = free_form()


@dataclass(frozen=True, slots=True, kw_only=True)
class Recovered(Reported):
    """A recovery action claims it ran."""

    kind: ClassVar[str] = "recovered"
    action: str = required("Name of the recovery action.")
    details: dict[str, Any] = free_form()


@dataclass(frozen=True, slots=True, kw_only=True)
class Diagnosed(Reported):
    """The trainer's own diagnosis of which layer(s) a detection points at (the reference
    trainer's rules: docs/stability.md, `layer_stats`)."""

    kind: ClassVar[str] = "diagnosed"
    detectors: list[str] = required("Names of the detectors that fired at this step.")
    layers: list[str] = required(
        "The layer(s) named, the most likely first; empty when no layer stands out (a cause that "
        "reached every layer alike)."
    )
    rule: str = optional("Which rule of the diagnosis named them.")
    details: dict[str, Any] = free_form()


@dataclass(frozen=True, slots=True, kw_only=True)
class LrDecided(Reported):
    """The learning-rate controller (reference trainer, opt-in `rl_lr`) chose the multiplier
    of the schedule for the next steps, from the state the run is in and the reward the
    multiplier in force earned (docs/stability.md)."""

    kind: ClassVar[str] = "lr_decided"
    multiplier: float = required("The multiplier chosen.")
    applied: float = required(
        "The multiplier at its first step after the cap (the learning rate never exceeds "
        "`max_lr_ratio` of the schedule's peak)."
    )
    from_step: int = required("The first step it applies to.")
    state: dict[str, Any] = required(
        "The state it was chosen in: `trend` (falling, flat, rising), `noisy`, `unstable`."
    )
    reward: float = required(
        "The reward the previous multiplier earned: progress less the instability penalty "
        "(a rollback: minus the whole penalty)."
    )
    details: dict[str, Any] = free_form()


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointSaved(Reported):
    """A checkpoint became durable (its `latest` pointer written)."""

    kind: ClassVar[str] = "checkpoint_saved"
    path: str = required("Checkpoint directory.")
    bytes: int = optional("Bytes on disk.")
    type: str = optional("full or delta.")
    seconds: float = optional("Seconds the save took to persist.")
    stall_seconds: float = optional(
        "Seconds the training loop waited for the save (copy to memory)."
    )
    manifest_sha256: str = optional(
        "SHA-256 of the checkpoint's manifest.json as saved (which weights)."
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointLoaded(Reported):
    """A checkpoint was loaded and its state restored."""

    kind: ClassVar[str] = "checkpoint_loaded"
    path: str = required("Checkpoint directory.")
    verified: str = optional(
        "The agent's own check of the folder against its manifest when it was loaded: intact, "
        "corrupt or missing."
    )
    verified_reason: str = optional("Why it was not intact.")


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointRejected(Reported):
    """A checkpoint was refused on load."""

    kind: ClassVar[str] = "checkpoint_rejected"
    path: str = required("Checkpoint directory or file.")
    reason: str = required("Why it was refused.")


@dataclass(frozen=True, slots=True, kw_only=True)
class CommandAnswered(Reported):
    """A live-control command reached the job (accepted or rejected), or something under
    `control/` was refused (docs/live-control.md)."""

    kind: ClassVar[str] = "command"
    id: str = required(
        "Command id, as `tightrope inject` printed it; `armed/<file>` for an armed entry refused "
        "before its id could be trusted; `control` when reading the channel itself failed "
        "(journaled once per failure)."
    )
    accepted: bool = required("Whether the job armed it.")
    fault: str = optional("Fault kind the command asked for.")
    effective_step: int = optional("Step at which the fault takes effect, the same on every rank.")
    reason: str = optional("Why it was rejected.")


@dataclass(frozen=True, slots=True, kw_only=True)
class RankLost(Reported):
    """A rank stopped answering or died."""

    kind: ClassVar[str] = "rank_lost"
    lost_rank: int = required("The rank that was lost.")
    reason: str = optional("How the loss was noticed.")


@dataclass(frozen=True, slots=True, kw_only=True)
class RankBlamed(Reported):
    """A rank was named as the culprit of a failure or a slowdown: a straggler, the rank a
    collective waited for, the rank that raised or crashed."""

    kind: ClassVar[str] = "rank_blamed"
    blamed_rank: int = required("The rank named as the culprit.")
    detector: str = required("What named it: a detector name (docs/journal.md, Detectors).")
    reason: str = optional("Why, in words: the score, the collective, the exception.")


@dataclass(frozen=True, slots=True, kw_only=True)
class Restart(Reported):
    """Workers came back after a failure."""

    kind: ClassVar[str] = "restart"
    count: int = required("Restart count after this restart.")
    reason: str = optional("Why the restart happened, when known.")


@dataclass(frozen=True, slots=True, kw_only=True)
class MetricsFailed(Reported):
    """Observed by the agent: its metrics for dashboards (docs/metrics.md) could not be written
    or served; journaled once per process, training goes on without them."""

    kind: ClassVar[str] = "metrics_failed"
    error: str = required("What failed, as type: message.")
    path: str = optional("The metrics file, when writing it failed.")
    port: int = optional("The endpoint's port, when serving failed.")


@dataclass(frozen=True, slots=True, kw_only=True)
class MicroscopeFailed(Reported):
    """Observed by the agent: its microscope (docs/journal.md, The microscope) failed;
    journaled once per process, training goes on without it."""

    kind: ClassVar[str] = "microscope_failed"
    error: str = required("What failed, as type: message.")


@dataclass(frozen=True, slots=True, kw_only=True)
class RunEnd(Reported):
    """A process stopped training."""

    kind: ClassVar[str] = "run_end"
    status: str = required("completed, failed or stopped.")
    reason: str = optional("Why, when not completed.")
    seconds: float = optional("Seconds since this process's run_start.")
    params_finite: bool = optional(
        "Observed by an attached agent: every parameter finite at the end."
    )
    no_steps: str = optional("An attached agent that found no training step: why not.")
    gave_up: bool = optional(
        "The trainer stopped on purpose: its recovery ran out of options (a judged failure with a "
        "diagnosis, not a crash)."
    )


#: Everything a trainer may claim.
Claim = (
    Detected
    | Recovered
    | CheckpointSaved
    | CheckpointRejected
    | Restart
    | RankLost
    | RankBlamed
    | Diagnosed
    | LrDecided
    | BatchSplit
)

#: Every event kind, in the order the schema and docs/journal.md list them.
ALL: tuple[type[Reported], ...] = (
    RunStart,
    StepObserved,
    FaultInjected,
    FaultSkipped,
    Detected,
    Recovered,
    Diagnosed,
    LayerStatsObserved,
    DataWeightsObserved,
    LrDecided,
    BatchSplit,
    CheckpointSaved,
    CheckpointLoaded,
    CheckpointRejected,
    FileSaved,
    FileLoaded,
    FileLoadFailed,
    CommandAnswered,
    RankLost,
    RankBlamed,
    Restart,
    MetricsFailed,
    MicroscopeFailed,
    RunEnd,
)
