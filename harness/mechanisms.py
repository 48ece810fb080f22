"""The stability mechanisms a run may switch off, by name: the one list that the reference
trainer's ``--disable``, a suite's ``trainer.disable`` and docs/stability.md all read
(`tests/test_mechanisms.py` pins the three together)."""

from __future__ import annotations

#: Switched inside the reference trainer (``--disable NAME``), with what each one is.
TRAINER_MECHANISMS = {
    "nonfinite_guard": "skip steps whose loss or gradients are not finite (on all ranks)",
    "loss_scale": "dynamic fp16 loss scaling with hysteresis",
    "precision_switch": "move blocks near the fp16 limit to fp32",
    "clipping": "adaptive gradient clipping",
    "spikes": "loss-spike detectors",
    "integrity": "checkpoint manifests verified on load, fallback to older checkpoints",
    "delta": "delta checkpoints between full ones",
    "async": "background checkpoint persistence",
    "recovery": "the three-level recovery policy",
    "dedup": "the streaming duplicate filter",
    "semantic_dedup": "paraphrases of kept documents dropped (sentence embeddings of candidates)",
    "watchdog": "heartbeat hang monitor per rank, a bounded collective timeout, and the rank "
    "that never entered a collective named",
    "preemption": "SIGTERM saves an emergency checkpoint before a clean exit",
    "crash_report": "a rank dead by an exception or a fatal signal is journaled with its cause "
    "and blamed; the restart names it",
    "oom_retry": "a step that runs out of memory is redone with the micro-batch halved and "
    "the accumulation doubled (the global batch kept)",
    "lr_floor": "the last 20% trains at a small learning rate (10% of the peak), not at zero",
    "layer_stats": "per-layer statistics, the layer swing detector, diagnosis of the problem layer",
    "underflow": "a layer that stopped updating is detected; fp16 raises the loss scale",
    "surgery": "repair a layer's swung gradient instead of skipping the step",
    "adaptive_warmup": "a noisy start (erratic gradient norms) warms up at a lower learning rate",
    "tokenizer_fallback": "a document with over 5% byte-fallback tokens is repaired and "
    "tokenized again, or dropped",
    "toxicity_filter": "drop toxic documents (lexicon, classifier), hold unclear ones for review",
    "replica_check": "ranks compare a fingerprint of their parameters; a mismatch restores a "
    "checkpoint",
    "stragglers": "per-rank straggler scores from compute times; a rank slow for 5 steps is "
    "journaled, named and alerted",
}

#: Switched by how the runner launches the trainer, not inside it.
LAUNCHER_MECHANISMS = {
    "restarts": "torchrun restarts the workers after a failure (--max-restarts)",
}

#: Off by default, switched on one by one (``--enable NAME``, a suite's ``trainer.enable``):
#: choices a measurement found not worth their cost as defaults.
OPT_IN = {
    "forecast_acting": "the LSTM forecaster's claims above its band trigger recovery "
    "(it only journals by default: docs/detectors.md)",
    "dynamic_batching": "batches of whole documents grouped by length under a token budget, "
    "padding ignored by the loss (docs/data.md)",
    "quality_sampling": "the corpus's sampling weights follow a per-source quality score "
    "from per-source loss, within bounds (docs/data.md)",
    "straggler_rebalance": "a flagged straggler gets a smaller share of each micro-step's "
    "sequences, the other ranks the rest (the global batch kept) (docs/stability.md)",
    "rl_lr": "a bandit chooses the multiplier of the learning-rate schedule from the run's loss "
    "trend, gradient noise and instability, capped (docs/stability.md)",
    "hard_sample_weighting": "each sample's loss weighted by its loss against the run's recent "
    "loss, within bounds, mean weight 1 (docs/stability.md)",
    "adaptive_batch": "micro-batch size and accumulation chosen from memory headroom and "
    "measured step time, the global batch kept (docs/stability.md)",
}

#: Every name a suite's ``trainer.disable`` may hold.
MECHANISMS = {**TRAINER_MECHANISMS, **LAUNCHER_MECHANISMS}

#: Mechanisms the fragile preset leaves on: background checkpoint persistence protects
#: nothing (its files are the same), so the negative control keeps it.
KEPT_BY_FRAGILE = ("async",)
