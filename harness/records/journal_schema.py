"""The journal's event schema: every kind, its fields, their types and meaning.

This table is the contract between whatever writes a journal (the reference trainer,
the agent attached to someone else's trainer) and whatever judges it (the oracles).
`docs/journal.md` is written from the same words; a test keeps the two in step.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

#: Bumped when a field changes meaning or a required field is added. Readers refuse
#: journals written with a newer version than they know.
SCHEMA_VERSION = 1


@dataclass(frozen=True, slots=True)
class FieldSpec:
    """One field of an event: its JSON type, whether it must be present, what it means."""

    type: str  # "int", "float", "str", "bool", "object", "list"
    doc: str
    required: bool = False
    nullable: bool = False

    def accepts(self, value: Any) -> bool:
        """True when ``value`` has this field's type (``None`` only where nullable)."""
        if value is None:
            return self.nullable
        if self.type == "float":
            return isinstance(value, (int, float)) and not isinstance(value, bool)
        if self.type == "int":
            return isinstance(value, int) and not isinstance(value, bool)
        return isinstance(value, _PYTHON_TYPES[self.type])


_PYTHON_TYPES: dict[str, type | tuple[type, ...]] = {
    "str": str,
    "bool": bool,
    "object": dict,
    "list": list,
}

#: Fields every event carries, written by the journal writer itself.
COMMON_FIELDS: MappingProxyType[str, FieldSpec] = MappingProxyType(
    {
        "v": FieldSpec("int", "Schema version the line was written with.", required=True),
        "kind": FieldSpec("str", "Event kind, one of the kinds below.", required=True),
        "wall": FieldSpec("float", "Wall-clock time, seconds since the epoch.", required=True),
        "mono": FieldSpec(
            "float",
            "Monotonic clock, seconds; comparable between processes on one host only.",
            required=True,
        ),
        "rank": FieldSpec("int", "Global rank of the writing process.", required=True),
        "restart": FieldSpec(
            "int",
            "How many times the launcher had restarted the workers when this was written "
            "(torchrun's restart count; 0 for the first attempt).",
            required=True,
        ),
        "step": FieldSpec(
            "int",
            "Optimizer steps completed when the event happened. In a `step` event, the "
            "step it reports: the first training step is 1.",
            required=True,
        ),
    }
)


def _kind(**fields: FieldSpec) -> MappingProxyType[str, FieldSpec]:
    return MappingProxyType(fields)


_DETAILS = FieldSpec("object", "The figures behind the event, by name (free-form).")

#: Kind -> its own fields (beyond the common ones), with a one-line meaning of the kind.
EVENT_KINDS: MappingProxyType[str, tuple[str, MappingProxyType[str, FieldSpec]]] = MappingProxyType(
    {
        "run_start": (
            "A process began training (a fresh run or a resume).",
            _kind(
                world_size=FieldSpec("int", "Number of ranks in the job.", required=True),
                pid=FieldSpec("int", "Process id of the writer.", required=True),
                host=FieldSpec("str", "Host name of the writer.", required=True),
                target_steps=FieldSpec("int", "Step the run trains to."),
                preset=FieldSpec("str", "Reference-trainer preset, when there is one."),
                seed=FieldSpec("int", "Seed of the run."),
                precision=FieldSpec("str", "fp32, bf16 or fp16."),
                device=FieldSpec("str", "cpu or cuda."),
                resumed_from=FieldSpec(
                    "str", "Checkpoint the run resumed from; null when fresh.", nullable=True
                ),
                config=FieldSpec("object", "The full trainer configuration."),
            ),
        ),
        "step": (
            "An optimizer step finished: what was observed about it.",
            _kind(
                loss=FieldSpec(
                    "float",
                    "Training loss of the step, averaged over all ranks (may be NaN/inf).",
                    required=True,
                ),
                local_loss=FieldSpec("float", "Loss of this rank's share of the batch."),
                grad_norm=FieldSpec(
                    "float", "Global L2 norm of the gradients before clipping.", nullable=True
                ),
                lr=FieldSpec("float", "Learning rate applied at this step."),
                loss_scale=FieldSpec(
                    "float",
                    "fp16 loss scale used for the step; null when unscaled.",
                    nullable=True,
                ),
                tokens=FieldSpec("int", "Tokens the step trained on, summed over ranks."),
                step_time=FieldSpec("float", "Seconds the step took on this rank."),
                params_finite=FieldSpec(
                    "bool", "Every parameter finite after the step (when checked)."
                ),
                skipped=FieldSpec(
                    "bool",
                    "Observed by the agent: the step ended with no update (no optimizer step; "
                    "an optimizer step with no gradient at all; after a fault, an optimizer "
                    "step that changed no parameter; for a trainer that updates by hand, "
                    "parameters unchanged).",
                ),
                batch_fingerprint=FieldSpec(
                    "str",
                    "Observed by the attached agent: 16 hex digits hashing the dtype, shape "
                    "and first 4,096 elements of the first tensor the step's forward received "
                    "(its batch); a process that resumed from a save is numbered by the "
                    "earlier step that trained on the same batch.",
                ),
                numbered_by=FieldSpec(
                    "str",
                    "First step of a process that loaded a save before training: `batch` "
                    "(numbered after the earlier step that trained on its batch) or `save` "
                    "(after the step at which the loaded file was saved).",
                ),
                step_conflict=FieldSpec(
                    "object",
                    "First step of a resumed process whose evidence disagrees: "
                    "`{batch_step, saved_step}`, the step its batch was first trained at and "
                    "the step of the save it loaded. `completed` and `max_lost_steps` are "
                    "then not judged.",
                ),
                params_fingerprint=FieldSpec(
                    "str",
                    "Observed by the agent with several ranks, on its periodic check steps: a "
                    "64-bit digest (16 hex digits) of every parameter's bits after the step; "
                    "replicas of a data-parallel job must agree (`replicas_consistent`).",
                ),
                grads_repaired=FieldSpec(
                    "bool",
                    "Observed by the agent: a fault left gradients non-finite after backward, "
                    "and they were finite when the optimizer stepped (the trainer repaired "
                    "them instead of skipping the step).",
                ),
                docs=FieldSpec("int", "Documents that entered the training stream this step."),
                contaminated_docs=FieldSpec(
                    "int", "Of those, injected documents (tagged by a contamination fault)."
                ),
                contaminated_kinds=FieldSpec(
                    "object",
                    "The injected documents trained on, by contamination kind (`exact`, "
                    "`near`, `paraphrase`, ...): kind -> count.",
                ),
                fallback_tokens=FieldSpec(
                    "int",
                    "Reference trainer: byte-fallback tokens among the token ids this rank's "
                    "batch brought to the model (docs/stability.md, tokenizer_fallback).",
                ),
                batch_tokens=FieldSpec(
                    "int", "Token ids in this rank's batch, which `fallback_tokens` counts over."
                ),
                grad_variance=FieldSpec(
                    "float",
                    "Reference trainer: half the variance of the log-ratios of successive "
                    "gradient norms over the last good steps, which set this step's warmup "
                    "factor (docs/stability.md, adaptive_warmup).",
                ),
                warmup_factor=FieldSpec(
                    "float",
                    "Reference trainer, during warmup: the multiplier "
                    "1 / (1 + 10 * grad_variance) already applied to `lr`.",
                ),
                pad_tokens=FieldSpec(
                    "int",
                    "Reference trainer, with dynamic batching: padded positions of the step "
                    "(ignored by the loss), summed over ranks; `tokens` counts the real ones.",
                ),
            ),
        ),
        "fault_injected": (
            "A fault was injected.",
            _kind(
                fault=FieldSpec("str", "Fault kind, as in the fault registry.", required=True),
                target=FieldSpec("str", "What was hit: a module, parameter, file or rank."),
                details=_DETAILS,
            ),
        ),
        "fault_skipped": (
            "A checkpoint fault of the plan found nothing to act on at its step (no "
            "checkpoint yet, none older, the file gone); it counts as fired.",
            _kind(
                fault=FieldSpec("str", "Fault kind, as in the fault registry.", required=True),
                reason=FieldSpec("str", "What was missing.", required=True),
                details=_DETAILS,
            ),
        ),
        "detected": (
            "A detector claims it saw a problem.",
            _kind(
                detector=FieldSpec("str", "Name of the detector.", required=True),
                details=_DETAILS,
            ),
        ),
        "recovered": (
            "A recovery action claims it ran.",
            _kind(
                action=FieldSpec("str", "Name of the recovery action.", required=True),
                details=_DETAILS,
            ),
        ),
        "diagnosed": (
            "The trainer's own diagnosis of which layer(s) a detection points at.",
            _kind(
                detectors=FieldSpec(
                    "list", "Names of the detectors that fired at this step.", required=True
                ),
                layers=FieldSpec(
                    "list",
                    "The layer(s) named, the most likely first; empty when no layer stands "
                    "out (a cause that reached every layer alike).",
                    required=True,
                ),
                rule=FieldSpec("str", "Which rule of the diagnosis named them."),
                details=_DETAILS,
            ),
        ),
        "layer_stats": (
            "Per-layer statistics of a step, as the trainer measured them (every few steps "
            "and at every detection).",
            _kind(
                layers=FieldSpec(
                    "object",
                    "Layer name -> signal -> value (grad_norm, nonzero, weight_norm, "
                    "update_ratio, act_max, act_rms); null where not finite.",
                    required=True,
                ),
                anomaly=FieldSpec("bool", "Journaled because a detector fired at this step."),
            ),
        ),
        "data_weights": (
            "Quality-weighted sampling (reference trainer, opt-in `quality_sampling`): the "
            "corpus's sampling weights after a step and what moved them (every few steps and "
            "at the last).",
            _kind(
                weights=FieldSpec(
                    "object",
                    "Source -> share of the next documents drawn from it (they sum to 1).",
                    required=True,
                ),
                quality=FieldSpec(
                    "object",
                    "Source -> quality score: moving average over good steps of the step's "
                    "mean loss divided by the source's own (1: average; docs/data.md).",
                    required=True,
                ),
                losses=FieldSpec(
                    "object",
                    "Source -> the step's mean loss on its tokens, over all ranks; null when "
                    "it had too few tokens or the step was skipped.",
                ),
                tokens=FieldSpec(
                    "object", "Source -> target tokens of the step's batch, over all ranks."
                ),
            ),
        ),
        "checkpoint_saved": (
            "A checkpoint became durable (its `latest` pointer written).",
            _kind(
                path=FieldSpec("str", "Checkpoint directory.", required=True),
                bytes=FieldSpec("int", "Bytes on disk."),
                type=FieldSpec("str", "full or delta."),
                seconds=FieldSpec("float", "Seconds the save took to persist."),
                stall_seconds=FieldSpec(
                    "float", "Seconds the training loop waited for the save (copy to memory)."
                ),
                manifest_sha256=FieldSpec(
                    "str", "SHA-256 of the checkpoint's manifest.json as saved (which weights)."
                ),
            ),
        ),
        "checkpoint_loaded": (
            "A checkpoint was loaded and its state restored.",
            _kind(
                path=FieldSpec("str", "Checkpoint directory.", required=True),
                verified=FieldSpec(
                    "str",
                    "The agent's own check of the folder against its manifest when it was "
                    "loaded: intact, corrupt or missing.",
                ),
                verified_reason=FieldSpec("str", "Why it was not intact."),
            ),
        ),
        "checkpoint_rejected": (
            "A checkpoint was refused on load.",
            _kind(
                path=FieldSpec("str", "Checkpoint directory or file.", required=True),
                reason=FieldSpec("str", "Why it was refused.", required=True),
            ),
        ),
        "file_saved": (
            "Observed by the agent: the trainer saved a file (torch.save, safetensors).",
            _kind(
                path=FieldSpec("str", "Absolute path of the file.", required=True),
                sha256=FieldSpec("str", "SHA-256 of its bytes just after the save.", required=True),
                bytes=FieldSpec("int", "Its size."),
                api=FieldSpec("str", "The call that saved it (torch.save, ...)."),
            ),
        ),
        "file_loaded": (
            "Observed by the agent: the trainer loaded a file it or another rank saved, or "
            "one from elsewhere.",
            _kind(
                path=FieldSpec("str", "Absolute path of the file.", required=True),
                sha256=FieldSpec("str", "SHA-256 of its bytes when loaded.", required=True),
                saved_sha256=FieldSpec(
                    "str",
                    "SHA-256 of the matching save (or of this file's last save when none "
                    "matches); null when the run never saved it.",
                    nullable=True,
                ),
                saved_step=FieldSpec("int", "Step of that save; null as above.", nullable=True),
                intact=FieldSpec(
                    "bool",
                    "The bytes loaded are those of an observed save (of this file, or of one "
                    "renamed since); false when the run saved this file but never these "
                    "bytes; null when it never saved it.",
                    nullable=True,
                ),
                api=FieldSpec("str", "The call that loaded it (torch.load, ...)."),
            ),
        ),
        "file_load_failed": (
            "Observed by the agent: a load raised (the trainer refused or could not read it).",
            _kind(
                path=FieldSpec("str", "Absolute path of the file.", required=True),
                sha256=FieldSpec("str", "SHA-256 of its bytes.", nullable=True),
                intact=FieldSpec(
                    "bool", "Its bytes are those of its last observed save.", nullable=True
                ),
                error=FieldSpec("str", "The exception, as type: message.", required=True),
                api=FieldSpec("str", "The call that failed."),
            ),
        ),
        "command": (
            "A live-control command reached the job (accepted or rejected), or something "
            "under `control/` was refused (docs/live-control.md).",
            _kind(
                id=FieldSpec(
                    "str",
                    "Command id, as `tightrope inject` printed it; `armed/<file>` for an armed "
                    "entry refused before its id could be trusted; `control` when reading the "
                    "channel itself failed (journaled once per failure).",
                    required=True,
                ),
                accepted=FieldSpec("bool", "Whether the job armed it.", required=True),
                fault=FieldSpec("str", "Fault kind the command asked for."),
                effective_step=FieldSpec(
                    "int", "Step at which the fault takes effect, the same on every rank."
                ),
                reason=FieldSpec("str", "Why it was rejected."),
            ),
        ),
        "rank_lost": (
            "A rank stopped answering or died.",
            _kind(
                lost_rank=FieldSpec("int", "The rank that was lost.", required=True),
                reason=FieldSpec("str", "How the loss was noticed."),
            ),
        ),
        "restart": (
            "Workers came back after a failure.",
            _kind(
                count=FieldSpec("int", "Restart count after this restart.", required=True),
                reason=FieldSpec("str", "Why the restart happened, when known."),
            ),
        ),
        "metrics_failed": (
            "Observed by the agent: its metrics for dashboards (docs/metrics.md) could not be "
            "written or served; journaled once per process, training goes on without them.",
            _kind(
                error=FieldSpec("str", "What failed, as type: message.", required=True),
                path=FieldSpec("str", "The metrics file, when writing it failed."),
                port=FieldSpec("int", "The endpoint's port, when serving failed."),
            ),
        ),
        "microscope_failed": (
            "Observed by the agent: its microscope (docs/journal.md, The microscope) failed; "
            "journaled once per process, training goes on without it.",
            _kind(error=FieldSpec("str", "What failed, as type: message.", required=True)),
        ),
        "run_end": (
            "A process stopped training.",
            _kind(
                status=FieldSpec("str", "completed, failed or stopped.", required=True),
                reason=FieldSpec("str", "Why, when not completed."),
                seconds=FieldSpec("float", "Seconds since this process's run_start."),
                params_finite=FieldSpec(
                    "bool", "Observed by an attached agent: every parameter finite at the end."
                ),
                no_steps=FieldSpec(
                    "str", "An attached agent that found no training step: why not."
                ),
                gave_up=FieldSpec(
                    "bool",
                    "The trainer stopped on purpose: its recovery ran out of options (a judged "
                    "failure with a diagnosis, not a crash).",
                ),
            ),
        ),
    }
)


def field_spec(kind: str, name: str) -> FieldSpec | None:
    """The spec of field ``name`` in events of ``kind``; None when there is no such field."""
    if name in COMMON_FIELDS:
        return COMMON_FIELDS[name]
    entry = EVENT_KINDS.get(kind)
    return entry[1].get(name) if entry else None
