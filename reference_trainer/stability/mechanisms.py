"""The configuration of every stability mechanism of the reference trainer, each
switchable on its own: `reference_trainer.stability.registry` switches them off by name
(``disable``), and its ``fragile()`` switches them all off, the negative control that shows
what each one is for; `StabilityConfig.enable` switches an opt-in on.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from reference_trainer.checkpoints.manager import CheckpointConfig
from reference_trainer.errors import ConfigError
from reference_trainer.processes.watchdog import WatchdogConfig
from reference_trainer.stability.adaptive_batch import AdaptiveBatchConfig
from reference_trainer.stability.adaptive_warmup import AdaptiveWarmupConfig
from reference_trainer.stability.clipping import ClipConfig
from reference_trainer.stability.hard_samples import HardSampleConfig
from reference_trainer.stability.layer_stats import LayerStatsConfig
from reference_trainer.stability.layer_watch import StallConfig
from reference_trainer.stability.loss_scale import LossScaleConfig
from reference_trainer.stability.loss_spikes import RobustZScoreConfig, SpikeConfig
from reference_trainer.stability.oom_retry import OomRetryConfig
from reference_trainer.stability.precision_switch import PrecisionSwitchConfig
from reference_trainer.stability.quality_weights import QualitySamplingConfig
from reference_trainer.stability.recovery import RecoveryConfig
from reference_trainer.stability.replicas import ReplicaCheckConfig
from reference_trainer.stability.rl_lr import RlLrConfig
from reference_trainer.stability.stragglers import StragglerConfig
from reference_trainer.stability.surgery import SurgeryConfig
from reference_trainer.stages.dedup import DedupConfig
from reference_trainer.stages.semantic_dedup import SemanticDedupConfig
from reference_trainer.stages.toxicity import ToxicityConfig
from reference_trainer.tokenizer.fallback import FallbackConfig


@dataclass(kw_only=True, slots=True)
class StabilityConfig:
    """The stability mechanisms (all on by default)."""

    nonfinite_guard: bool = True
    """Skip a step on every rank when any rank's loss or gradient norm is not finite."""
    loss_scale: LossScaleConfig = field(default_factory=LossScaleConfig)
    precision_switch: PrecisionSwitchConfig = field(default_factory=PrecisionSwitchConfig)
    clipping: ClipConfig = field(default_factory=ClipConfig)
    spikes: SpikeConfig = field(
        default_factory=lambda: SpikeConfig(robust=RobustZScoreConfig(z_threshold=8.0))
    )
    """The robust detector's threshold is raised from 6 to 8: a tiny model's per-batch loss
    is noisy enough to reach 6 on clean data now and then."""
    checkpoints: CheckpointConfig = field(default_factory=CheckpointConfig)
    recovery: RecoveryConfig = field(default_factory=RecoveryConfig)
    dedup: DedupConfig = field(
        default_factory=lambda: DedupConfig(shingle_size=3, threshold=0.5, max_docs=50_000)
    )
    """Word 3-grams and Jaccard 0.5 catch light edits of short documents too (at 5-grams
    and 0.8 most copies under 100 words slip through); 50,000 documents bound the index."""
    semantic_dedup: SemanticDedupConfig = field(default_factory=SemanticDedupConfig)
    """After the hash filter: paraphrases, found by sentence embeddings of word-similar
    candidates (docs/data.md)."""
    watchdog: WatchdogConfig = field(default_factory=WatchdogConfig)
    preemption: bool = True
    """On SIGTERM, save an emergency checkpoint at the next step boundary, then exit."""
    crash_report: bool = True
    """A rank that dies by an exception or a fatal signal (faulthandler's report in its
    crash file) is journaled with its cause and blamed; the restart names the cause."""
    layer_stats: LayerStatsConfig = field(default_factory=LayerStatsConfig)
    """Per-layer statistics, the swing detector and the diagnosis of the problem layer."""
    underflow: StallConfig = field(default_factory=StallConfig)
    """A layer whose parameters stopped updating while the rest train (fp16: the loss
    scale is raised until its gradients survive)."""
    surgery: SurgeryConfig = field(default_factory=SurgeryConfig)
    """Repair a layer's swung gradient (projection, structured dropout, safe mode) instead
    of skipping the step (needs `layer_stats`, which detects the swing)."""
    lr_floor: float = 0.1
    """The cosine decays to this fraction of the peak learning rate and the last 20% of the
    run trains there (0: it decays to zero and the tail trains nothing)."""
    adaptive_warmup: AdaptiveWarmupConfig = field(default_factory=AdaptiveWarmupConfig)
    tokenizer_fallback: FallbackConfig = field(default_factory=FallbackConfig)
    """Re-tokenize (or drop) documents whose byte-fallback rate is over the threshold."""
    quality_sampling: QualitySamplingConfig = field(default_factory=QualitySamplingConfig)
    """Opt-in: the corpus's sampling weights follow a per-source quality score."""
    hard_samples: HardSampleConfig = field(default_factory=HardSampleConfig)
    """Opt-in: each sample's loss weighted by its hardness, within bounds."""
    adaptive_batch: AdaptiveBatchConfig = field(default_factory=AdaptiveBatchConfig)
    """Opt-in: micro-batch and accumulation chosen from memory headroom and step time."""
    toxicity: ToxicityConfig = field(default_factory=ToxicityConfig)
    """The three-tier toxicity filter (docs/data.md): lexicon, classifier, review queue."""
    replica_check: ReplicaCheckConfig = field(default_factory=ReplicaCheckConfig)
    """Ranks compare a fingerprint of their parameters; a mismatch restores a checkpoint."""
    stragglers: StragglerConfig = field(default_factory=StragglerConfig)
    """Per-rank straggler scores from compute times; a slow rank is journaled and named."""
    oom_retry: OomRetryConfig = field(default_factory=OomRetryConfig)
    """A step that runs out of memory is redone with the micro-batch halved and the
    accumulation doubled (the global batch kept), journaled."""
    rl_lr: RlLrConfig = field(default_factory=RlLrConfig)
    """Opt-in: a bandit chooses the multiplier of the learning-rate schedule from the run's
    own signals (loss trend, gradient noise, instability)."""

    def __post_init__(self) -> None:
        if not 0 <= self.lr_floor < 1:
            raise ConfigError(f"stability.lr_floor must be in [0, 1), got {self.lr_floor}")

    def enable(self, name: str) -> None:
        """Switch on one opt-in mechanism by its name (`harness.mechanisms.OPT_IN`); one
        whose detector is off (under ``--fragile``) stays off."""
        if name == "forecast_acting":
            if "forecast" in self.spikes.enabled and "forecast" not in self.spikes.acting:
                self.spikes.acting = (*self.spikes.acting, "forecast")
        elif name == "quality_sampling":  # needs no detector: on under --fragile too
            self.quality_sampling.enabled = True
        elif name == "straggler_rebalance":
            if self.stragglers.enabled:
                self.stragglers.rebalance = True
        elif name == "rl_lr":  # reads the step's own figures: on under --fragile too
            self.rl_lr.enabled = True
        elif name == "hard_sample_weighting":  # needs no detector: on under --fragile too
            self.hard_samples.enabled = True
        elif name == "adaptive_batch":  # needs no detector: on under --fragile too
            self.adaptive_batch.enabled = True
        else:
            raise KeyError(name)
