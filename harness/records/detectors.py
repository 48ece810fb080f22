"""Every detector name a verdict can rest on, with what it means: the one home of the
names that `detected` claims carry, that the harness gives what it observed itself, and
that scenario files (`detected.detector`) and the monitoring checklist
(`harness/checklist/items.yaml`) ask for.

A name not in this table is refused where it is written in a scenario file; a test holds
the checklist, the reference trainer's claims and docs/journal.md to it.
"""

from __future__ import annotations

from types import MappingProxyType

#: Detectors the reference trainer claims (`detected.detector`), with what each saw.
CLAIMED: MappingProxyType[str, str] = MappingProxyType(
    {
        "nonfinite_guard": "the loss or the global gradient norm was NaN or infinite",
        "fp16_overflow": "fp16 gradients overflowed under the loss scaler",
        "loss_scale_hysteresis": "an overflow the loss scale's hysteresis absorbed",
        "loss_scale_backoff": "an overflow that halved the loss scale",
        "activation_range": "a block's activations came near the fp16 limit",
        "robust_zscore": "a loss spike by the robust z-score of the loss change",
        "early_max": "a loss spike by Megatron-LM's early-steps maximum rule",
        "forecast": "a loss spike above the online forecaster's prediction",
        "layer_swing": "a layer's gradient norm swung far from its own history",
        "stalled_layer": "a layer's gradients or updates stopped",
        "grad_variance": "the adaptive warmup measured noisy gradient norms",
        "replica_divergence": "data-parallel replicas no longer held the same parameters",
        "recovery_failed": "a recovery action did not bring training back",
        "recovery_exhausted": "the recovery policy ran out of options",
        "hang_watchdog": "a step outlived the hang watchdog",
        "collective_watchdog": "a rank never entered the collective the others waited in "
        "(from each rank's count of all-reduces entered)",
        "straggler": "a rank's compute time stayed well above the fastest rank's",
        "preemption": "the process received SIGTERM",
        "rank_crash": "a rank died by an exception (its type and message) or a fatal signal "
        "(SIGSEGV, SIGABRT: faulthandler's report); the rank is blamed",
        "out_of_memory": "a rank met a failed allocation (torch.OutOfMemoryError, "
        "MemoryError): its step redone with smaller micro-batches, or the rank died; the rank "
        "is blamed",
        "wedged_rank": "a rank past the hang timeout was alive and busy (running, burning CPU: "
        "not stopped, not waiting), as when a thread holds the GIL; the rank is blamed",
        "dedup": "the dedup stage dropped exact duplicate documents",
        "semantic_dedup": "the semantic dedup stage dropped near-duplicate documents",
        "toxicity_filter": "the toxicity filter dropped documents",
        "tokenizer_fallback": "a batch held too many byte-fallback tokens",
    }
)

#: Detections the harness counts from what the agent observed itself, no trainer's word
#: in it (`harness.records.timeline.responses`).
OBSERVED: MappingProxyType[str, str] = MappingProxyType(
    {
        "skipped_step": "a step at or after the fault ended with no update",
        "gradient_repaired": "gradients non-finite after backward were finite at the update",
        "rollback": "rank 0 trained a step number again",
        "restart": "the launcher restarted the workers",
        "checkpoint_integrity": "a damaged checkpoint was refused or avoided "
        "(a `checkpoint_rejected` claim counts as this detector too)",
    }
)

#: Claims that are events of their own kind rather than `detected`: kind -> detector.
BY_KIND: MappingProxyType[str, str] = MappingProxyType(
    {"checkpoint_rejected": "checkpoint_integrity", "rank_lost": "rank_lost"}
)

#: Every known detector name, with what it means.
DETECTORS: MappingProxyType[str, str] = MappingProxyType(
    {**CLAIMED, **OBSERVED, "rank_lost": "a rank stopped answering or died (a `rank_lost` event)"}
)


def unknown_detectors(names: str | list[str]) -> list[str]:
    """The names among ``names`` that no detector has, in the order given."""
    return [n for n in ([names] if isinstance(names, str) else names) if n not in DETECTORS]


def check_detectors(names: str | list[str]) -> str | list[str]:
    """``names`` when every one is a known detector; else a ValueError naming the
    unknown ones and the known ones."""
    unknown = unknown_detectors(names)
    if unknown:
        raise ValueError(
            f"unknown detector {', '.join(repr(n) for n in unknown)}; "
            f"known detectors: {', '.join(sorted(DETECTORS))}"
        )
    return names
