"""Typed journal events of what a step did: the observations of one optimizer step, the
trainer's per-layer statistics and its data-sampling weights (the kinds `step`,
`layer_stats` and `data_weights`; `harness.records.events` holds every kind)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from harness.records.event_base import Reported, optional, required


@dataclass(frozen=True, slots=True, kw_only=True)
class StepObserved(Reported):
    """An optimizer step finished: what was observed about it."""

    kind: ClassVar[str] = "step"
    loss: float = required("Training loss of the step, averaged over all ranks (may be NaN/inf).")
    local_loss: float = optional("Loss of this rank's share of the batch.")
    grad_norm: float | None = optional("Global L2 norm of the gradients before clipping.")
    lr: float = optional("Learning rate applied at this step.")
    loss_scale: float | None = optional("fp16 loss scale used for the step; null when unscaled.")
    tokens: int = optional("Tokens the step trained on, summed over ranks.")
    step_time: float = optional("Seconds the step took on this rank.")
    params_finite: bool = optional("Every parameter finite after the step (when checked).")
    skipped: bool = optional(
        "Observed by the agent: the step ended with no update (no optimizer step; an optimizer "
        "step with no gradient at all; after a fault, an optimizer step that changed no "
        "parameter; for a trainer that updates by hand, parameters unchanged)."
    )
    batch_fingerprint: str = optional(
        "Observed by the attached agent: 16 hex digits hashing the dtype, shape and first 4,096 "
        "elements of the first tensor the step's forward received (its batch); a process that "
        "resumed from a save is numbered by the earlier step that trained on the same batch."
    )
    numbered_by: str = optional(
        "First step of a process that loaded a save before training: `batch` (numbered after the "
        "earlier step that trained on its batch) or `save` (after the step at which the loaded "
        "file was saved)."
    )
    step_conflict: dict[str, int] = optional(
        "First step of a resumed process whose evidence disagrees: `{batch_step, saved_step}`, "
        "the step its batch was first trained at and the step of the save it loaded. `completed` "
        "and `max_lost_steps` are then not judged."
    )
    params_fingerprint: str = optional(
        "Observed by the agent with several ranks, on its periodic check steps (at every step "
        "under `tightrope crashpoints`): a 64-bit digest (16 hex digits) of every parameter's "
        "bits after the step; replicas of a data-parallel job must agree "
        "(`replicas_consistent`)."
    )
    grads_repaired: bool = optional(
        "Observed by the agent: a fault left gradients non-finite after backward, and they were "
        "finite when the optimizer stepped (the trainer repaired them instead of skipping the "
        "step)."
    )
    docs: int = optional("Documents that entered the training stream this step.")
    contaminated_docs: int = optional(
        "Of those, injected documents (tagged by a contamination fault)."
    )
    contaminated_kinds: dict[str, int] = optional(
        "The injected documents trained on, by contamination kind (`exact`, `near`, `paraphrase`, "
        "...): kind -> count."
    )
    fallback_tokens: int = optional(
        "Reference trainer: byte-fallback tokens among the token ids this rank's batch brought to "
        "the model (docs/stability.md, tokenizer_fallback)."
    )
    batch_tokens: int = optional(
        "Token ids in this rank's batch, which `fallback_tokens` counts over."
    )
    grad_variance: float = optional(
        "Reference trainer: half the variance of the log-ratios of successive gradient norms over "
        "the last good steps, which set this step's warmup factor (docs/stability.md, "
        "adaptive_warmup)."
    )
    warmup_factor: float = optional(
        "Reference trainer, during warmup: the multiplier 1 / (1 + 10 * grad_variance) already "
        "applied to `lr`."
    )
    sample_weight_max: float = optional(
        "Reference trainer, opt-in `hard_sample_weighting`: the largest weight a sample's loss got "
        "in this rank's micro-batches (mean weight 1; docs/stability.md)."
    )
    samples_excluded: int = optional(
        "Reference trainer, opt-in `hard_sample_weighting`: samples of this rank given the least "
        "weight as outliers (loss above `outlier_factor` x the recent loss)."
    )
    pad_tokens: int = optional(
        "Reference trainer, with dynamic batching: padded positions of the step (ignored by the "
        "loss), summed over ranks; `tokens` counts the real ones."
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerStatsObserved(Reported):
    """Per-layer statistics of a step, as the trainer measured them (every few steps and at
    every detection)."""

    kind: ClassVar[str] = "layer_stats"
    layers: dict[str, dict[str, float | None]] = required(
        "Layer name -> signal -> value (grad_norm, nonzero, weight_norm, update_ratio, act_max, "
        "act_rms); null where not finite."
    )
    anomaly: bool = optional("Journaled because a detector fired at this step.")


@dataclass(frozen=True, slots=True, kw_only=True)
class DataWeightsObserved(Reported):
    """Quality-weighted sampling (reference trainer, opt-in `quality_sampling`): the corpus's
    sampling weights after a step and what moved them (every few steps and at the last)."""

    kind: ClassVar[str] = "data_weights"
    weights: dict[str, float] = required(
        "Source -> share of the next documents drawn from it (they sum to 1)."
    )
    quality: dict[str, float] = required(
        "Source -> quality score: moving average over good steps of the step's mean loss divided "
        "by the source's own (1: average; docs/data.md)."
    )
    losses: dict[str, float | None] = optional(
        "Source -> the step's mean loss on its tokens, over all ranks; null when it had too few "
        "tokens or the step was skipped."
    )
    tokens: dict[str, int] = optional(
        "Source -> target tokens of the step's batch, over all ranks."
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchSplit(Reported):
    """Reference trainer, opt-in `adaptive_batch`: how this process splits its share of each
    step's batch, decided from its machine's memory headroom and measured step times when it
    started (again after every restart); the global batch is the configured one."""

    kind: ClassVar[str] = "batch_split"
    micro_batch: int = required("Sequences per micro-batch on this rank.")
    grad_accum: int = required("Micro-batches accumulated per optimizer step on this rank.")
    world_size: int = required("Ranks in the job.")
    global_batch: int = required(
        "micro_batch x grad_accum x world_size: sequences per optimizer step (the configured one)."
    )
    candidates: list[int] = optional("The micro-batch sizes that split the rank's share evenly.")
    memory_budget_mb: float = optional(
        "Memory this process may use, MiB (configured, or the machine's: CUDA free memory plus "
        "what torch holds; on a CPU available memory per local rank plus resident memory)."
    )
    memory_used_mb: float = optional(
        "What it used when deciding, MiB: resident memory (CPU) or torch's reserved memory (CUDA)."
    )
    limit_mb: float = optional("Memory one micro-batch's activations could take, MiB.")
    sequence_mb: float = optional(
        "Measured activation memory of one more sequence in a micro-batch, MiB."
    )
    step_seconds: dict[str, float] = optional(
        "Micro-batch size -> measured seconds of one step's forward and backward passes at that "
        "split (the splits that fit; empty when not timed)."
    )
    threads: int = optional("torch's intra-op threads in this process.")
    cpus: int = optional("CPU cores of the machine.")
    device: str = optional("The device trained on.")
    reason: str = optional("Why this split.")
