"""One optimizer step of the reference trainer, with every guard in its place:

batch (bad-data faults) -> forward under autocast (blocks may run in fp32)
-> scaled backward -> gradient faults -> unscale -> global gradient norm
-> non-finite guard, agreed by all ranks (skip the update everywhere; the agreed norm
   feeds the adaptive warmup of the next steps)
-> adaptive clipping -> optimizer step -> loss-scale update -> precision switches
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from harness.inside.agent import Agent
from harness.records.events import (
    OMIT,
    Claim,
    DataWeightsObserved,
    Detected,
    Recovered,
    StepObserved,
)
from reference_trainer.config import TrainConfig
from reference_trainer.hessian_step import HessianBatch, HessianEstimator
from reference_trainer.model.gpt import GPT, next_token_loss
from reference_trainer.model.optim import layer_of, lr_at
from reference_trainer.packed_step import packed_forward_backward
from reference_trainer.processes.distributed import Topology
from reference_trainer.stability.adaptive_warmup import AdaptiveWarmup
from reference_trainer.stability.clipping import clip_gradients
from reference_trainer.stability.layer_monitor import LayerMonitor
from reference_trainer.stability.layer_stats import StepStats
from reference_trainer.stability.loss_scale import DynamicLossScaler
from reference_trainer.stability.precision import Precision
from reference_trainer.stability.precision_switch import ActivationMonitor
from reference_trainer.stability.quality_sampling import QualitySampler
from reference_trainer.stability.surgery import GradientSurgeon
from reference_trainer.stages.embeddings import SentenceEmbedder
from reference_trainer.step_claims import data_claims, scale_claims, switch_claims
from reference_trainer.stream.batching import PackedLoader, PackedStream
from reference_trainer.stream.data import DocumentPipeline, ShardedLoader, TokenStream
from reference_trainer.tokenizer.fallback import FallbackProbe, fallback_claims


@dataclass(frozen=True, slots=True)
class StepResult:
    """What a step did: the `step` event's fields and the claims it gives rise to."""

    observed: StepObserved
    claims: list[Claim] = field(default_factory=list)
    #: Some rank received SIGTERM: every rank stops after this step (agreed by all).
    preempted: bool = False
    #: Per-layer statistics of the step (None when no mechanism needs them).
    layers: StepStats | None = None
    #: The corpus's sampling weights, when quality sampling journals them at this step.
    data: DataWeightsObserved | None = None

    @property
    def skipped(self) -> bool:
        """The update was skipped."""
        return self.observed.skipped is True


@dataclass(frozen=True, slots=True)
class Seen:
    """What the ranks together saw of the layers' gradients."""

    #: Some rank saw a layer's gradient swing up.
    swung: bool
    #: How many ranks saw a layer gradient surgery could repair.
    count: int


@dataclass(slots=True)
class Trainer:
    """The pieces of a run; `step` advances them by one optimizer step."""

    cfg: TrainConfig
    topo: Topology
    model: GPT
    wrapped: torch.nn.Module
    optimizer: torch.optim.Optimizer
    precision: Precision
    scaler: DynamicLossScaler
    monitor: ActivationMonitor | None
    documents: DocumentPipeline
    stream: TokenStream | PackedStream
    loader: ShardedLoader | PackedLoader
    agent: Agent
    max_lr: float
    #: Multiplier on the schedule, lowered by level-2 recovery.
    lr_scale: float = 1.0
    #: Set by level-3 recovery: train in fp32 up to this step, whatever checkpoints say.
    fp32_until: int | None = None
    #: Whether this process received SIGTERM (shared with every rank at each step).
    preempt_requested: Callable[[], bool] = lambda: False
    layers: dict[str, list[torch.nn.Parameter]] = field(default_factory=dict)
    #: Per-layer statistics and what judges them (None when nothing needs them).
    layer_monitor: LayerMonitor | None = None
    #: The embedding model the data stages share (loaded on first use, if ever).
    embedder: SentenceEmbedder | None = None
    #: Repairs a swung gradient instead of skipping the step (None when off).
    surgeon: GradientSurgeon | None = None
    #: Counts the byte-fallback tokens of each batch (None: not counted).
    probe: FallbackProbe | None = None
    #: Quality-weighted sampling of the corpus's sources (None when off).
    quality: QualitySampler | None = None
    warmup: AdaptiveWarmup = field(init=False)
    #: Sophia's Hessian estimate every k steps (None: the optimizer takes none).
    hessian: HessianEstimator | None = field(init=False)

    def __post_init__(self) -> None:
        self.hessian = HessianEstimator.of(self)
        for name, param in self.model.named_parameters():
            self.layers.setdefault(layer_of(name), []).append(param)
        self.warmup = AdaptiveWarmup(
            self.cfg.stability.adaptive_warmup, self.cfg.optim.warmup_steps
        )

    def lr(self, step: int) -> float:
        """Learning rate of 1-based ``step``."""
        base = lr_at(
            step - 1,
            max_lr=self.max_lr,
            warmup_steps=self.cfg.optim.warmup_steps,
            total_steps=self.cfg.steps,
            min_lr_ratio=self.cfg.stability.lr_floor,
        )
        safe = self.surgeon.lr_factor if self.surgeon is not None else 1.0
        return base * self.lr_scale * safe * self.warmup.factor(step)

    def step(self, step: int) -> StepResult:
        """Train step ``step`` (1-based)."""
        t0 = time.perf_counter()
        agent, cfg, scaler = self.agent, self.cfg, self.scaler
        agent.begin_step(step)
        watch = self.layer_monitor
        if watch is not None:
            watch.begin(step)
        lr = self.lr(step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        packed = None
        quality = self.quality  # None with dynamic batching (refused together in the config)
        if isinstance(self.loader, PackedLoader):  # dynamic batching: docs/data.md
            step_batch = self.loader.next_step()
            # Counted on the ids of the step's rows, before any bad-data fault.
            fallback_tokens = (
                OMIT if self.probe is None else self.probe.count(step_batch.tokens.numpy())
            )
            batch_size_tokens = int(step_batch.lengths.sum())  # real tokens, not padding
            packed = packed_forward_backward(self, step_batch)
            local = packed.local
            sample = HessianBatch(packed.micro, step_batch.targets)
        else:
            batch = agent.batch(self.loader.next_step())
            # Counted on the ids that reach the model, after any bad-data fault.
            fallback_tokens = OMIT if self.probe is None else self.probe.count(batch.numpy())
            batch_size_tokens = int(batch.numel())
            batch = batch.to(self.topo.device)
            sample = HessianBatch.windows(batch, self.topo.world_size)
            sources = self.loader.last_sources
            if sources is not None:
                sources = sources.to(self.topo.device)
            accum = cfg.grad_accum
            local = torch.zeros((), device=self.topo.device)
            for micro in range(accum):
                x, y = batch[micro, :, :-1], batch[micro, :, 1:]
                sync = micro == accum - 1 or not isinstance(self.wrapped, DDP)
                with contextlib.nullcontext() if sync else self.wrapped.no_sync():  # type: ignore[operator]
                    with self.precision.autocast():
                        logits = self.wrapped(x)
                        loss = next_token_loss(logits, y)
                    if quality is not None and sources is not None:
                        quality.observe(logits, y, sources[micro, :, 1:])
                    del logits  # backward does not need them: free the (B, T, V) tensor now
                    scaler.scale_loss(loss / accum).backward()  # type: ignore[no-untyped-call]
                local += loss.detach() / accum
        agent.after_backward()
        params = list(self.model.parameters())
        loss_scale = scaler.current()
        scaler.unscale_(params)
        grads = [p.grad for p in params if p.grad is not None]
        grad_norm = float(
            torch.linalg.vector_norm(
                torch.stack([torch.linalg.vector_norm(g, 2.0) for g in grads]), 2.0
            )
        )
        verdict = watch.gradients() if watch is not None else None
        repairable = verdict.repairable if verdict is not None else []
        mean_loss, all_finite, preempted, mean_norm, repair_on, stalled, by_source = self._agree(
            local,
            grad_norm,
            swung=verdict is not None and verdict.skip,
            stalled=verdict is not None and verdict.stalled,
            repairable=bool(repairable),
            extra=quality.local_totals() if quality is not None else None,
        )
        swung = repair_on.swung  # on this rank or another
        claims: list[Claim] = []
        noisy = self.warmup.claim(step, lr)
        if noisy is not None:
            claims.append(noisy)
        grad_variance = self.warmup.grad_variance()
        # The factor is journaled while it can act: during warmup, with the mechanism on.
        in_warmup = cfg.stability.adaptive_warmup.enabled and step <= cfg.optim.warmup_steps
        factor = self.warmup.factor(step) if in_warmup else OMIT
        skip = not all_finite and (cfg.stability.nonfinite_guard or scaler.active)
        if skip:
            claims.append(
                Detected(
                    detector="nonfinite_guard" if not scaler.active else "fp16_overflow",
                    details={"loss": mean_loss, "grad_norm": grad_norm},
                )
            )
        elif swung:  # finite, but one layer's gradient is orders of magnitude off its norm
            skip = True
        # One or some layers' gradients went wrong, on every rank alike (the same gradients
        # after the all-reduce), and the forward pass was normal: repair, do not skip.
        # (In fp16 a non-finite gradient is an overflow: the loss scaler's, not surgery's.)
        everywhere = repair_on.count == self.topo.world_size
        if skip and everywhere and (all_finite or not scaler.active):
            repaired = self._operate(repairable, step, mean_loss)
            claims += repaired
            skip = not repaired
        if verdict is not None:
            claims += [Detected(detector="layer_swing", details=s.details) for s in verdict.swings]
            if swung and not verdict.skip:
                claims.append(Detected(detector="layer_swing", details={"other_rank": True}))
            claims += [Detected(detector="stalled_layer", details=s) for s in verdict.stalls]
        if self.surgeon is not None and not skip and not swung:
            self.surgeon.remember(mean_loss)
        if skip:
            self.optimizer.zero_grad(set_to_none=True)
            if watch is not None:
                watch.after_update(skipped=True)
        else:
            if self.surgeon is not None:
                self.surgeon.apply_dropout()
            if cfg.stability.clipping.enabled:
                threshold = cfg.stability.clipping.threshold(
                    cfg.global_batch(self.topo.world_size), cfg.optim.name
                )
                threshold *= self.surgeon.clip_factor if self.surgeon is not None else 1.0
                clip_gradients(self.layers, threshold, cfg.stability.clipping.layer_factors)
            agent.before_optimizer_step()
            if watch is not None:
                watch.before_update()
            self.optimizer.step()
            if watch is not None:
                watch.after_update(skipped=False)
            agent.after_optimizer_step()
            if self.hessian is not None:  # after the update, on its batch, as published
                claims += self.hessian.after_update(self, step, sample)
            self.optimizer.zero_grad(set_to_none=True)
            self.warmup.observe(mean_norm)
        change = scaler.update(overflow=not all_finite)
        if stalled and all_finite and change is None:  # gradients flushed to zero in fp16
            change = scaler.raise_scale(cfg.stability.underflow.max_scale)
        claims += scale_claims(change)
        if self.monitor is not None:
            claims += switch_claims(self.monitor.end_step(step))
        data = None
        if quality is not None and by_source is not None:
            data = quality.after_step(self.documents, by_source, step, skipped=skip)
        counters = self.documents.take_counters()
        claims += data_claims(counters)
        if self.stream.fallback is not None:
            claims += fallback_claims(self.stream.fallback.take_counters())
        observed = StepObserved(
            loss=mean_loss,
            local_loss=float(local) if packed is None else packed.local_loss,
            grad_norm=grad_norm,
            lr=lr,
            loss_scale=loss_scale,
            tokens=self.loader.tokens_per_step(),
            pad_tokens=OMIT if packed is None else packed.pad_tokens,
            step_time=time.perf_counter() - t0,
            skipped=skip,
            docs=counters.docs,
            contaminated_docs=counters.contaminated_docs,
            contaminated_kinds=counters.contaminated_kinds,
            fallback_tokens=fallback_tokens,
            batch_tokens=batch_size_tokens if self.probe is not None else OMIT,
            grad_variance=OMIT if grad_variance is None else grad_variance,
            warmup_factor=factor,
        )
        layers = None
        if watch is not None:
            layers, peaks = watch.finish()
            claims += [Detected(detector="layer_swing", details=s.details) for s in peaks]
            if self.surgeon is not None and self.surgeon.safe_layer is not None:
                name = self.surgeon.safe_layer
                lasted = self.surgeon.end_step(
                    step, layers.value(name, "grad_norm"), watch.history.median(name, "grad_norm")
                )
                if lasted is not None:
                    ended: dict[str, Any] = {"layer": name, "steps": lasted}
                    claims.append(Recovered(action="safe_mode_ended", details=ended))
        return StepResult(observed, claims, preempted, layers, data)

    def _operate(self, layers: list[str], step: int, loss: float) -> list[Claim]:
        """Gradient surgery on every layer whose gradient swung up or is not finite, when the
        forward pass was normal and each layer has a window to cut against; the claims of
        what was done, or none (the step is then skipped)."""
        surgeon, watch = self.surgeon, self.layer_monitor
        if surgeon is None or watch is None or not layers:
            return []
        ready = all(surgeon.can_operate(layer) for layer in layers)
        if not ready or not surgeon.forward_was_normal(loss):
            return []
        claims: list[Claim] = []
        for layer in layers:
            median = watch.history.median(layer, "grad_norm") or 0.0
            details = surgeon.operate(layer, median, step)
            claims.append(Recovered(action="gradient_surgery", details=details))
        return claims

    def _agree(
        self,
        local_loss: torch.Tensor,
        grad_norm: float,
        *,
        swung: bool,
        stalled: bool,
        repairable: bool,
        extra: torch.Tensor | None = None,
    ) -> tuple[float, bool, bool, float, Seen, bool, torch.Tensor | None]:
        """Mean loss over ranks, whether every rank's loss and gradients are finite,
        whether any rank was asked to stop (SIGTERM), the mean gradient norm over ranks
        (meaningful when all are finite), how many ranks saw a layer's gradient swing up or
        one surgery could repair, whether any saw a layer stall, and ``extra`` summed over
        ranks: one collective (the barrier every rank stops at), so all ranks take the
        same decisions."""
        device = local_loss.device
        finite = torch.isfinite(local_loss) & torch.tensor(math.isfinite(grad_norm), device=device)
        flags = torch.tensor(
            [
                float(self.preempt_requested()),
                grad_norm if math.isfinite(grad_norm) else 0.0,
                float(swung),
                float(stalled),
                float(repairable),
            ],
            device=device,
            dtype=local_loss.dtype,
        )
        packed = torch.cat(
            [
                torch.stack(
                    [
                        torch.nan_to_num(local_loss, nan=0.0, posinf=0.0, neginf=0.0),
                        (~finite).to(local_loss.dtype),
                        local_loss,
                    ]
                ),
                flags,
                *([extra.to(device, local_loss.dtype)] if extra is not None else []),
            ]
        )
        if self.topo.distributed:
            dist.all_reduce(packed, op=dist.ReduceOp.SUM)
        n = self.topo.world_size
        all_finite = bool(packed[1] == 0)
        # A non-finite loss anywhere makes the mean non-finite, as it should be.
        mean = float(packed[0] / n) if all_finite else float(packed[2] / n)
        seen = Seen(swung=bool(packed[5] > 0), count=round(float(packed[7])))
        return (
            mean,
            all_finite,
            bool(packed[3] > 0),
            float(packed[4] / n),
            seen,
            bool(packed[6] > 0),
            packed[8:] if extra is not None else None,
        )

    def force_fp32(self, until: int) -> None:
        """Train in fp32 up to step ``until`` (level-3 recovery): no autocast, no loss
        scaling; `end_fp32_retry` returns to the configured precision after it."""
        self.fp32_until = until
        self._set_precision("fp32")

    def end_fp32_retry(self, step: int) -> bool:
        """After step ``step``: back to the configured precision (a fresh loss scale) once
        the fp32 retry has redone the steps up to the failure; True when that changed the
        precision (an fp32 run has nothing to return to)."""
        if self.fp32_until is None or step < self.fp32_until:
            return False
        self.fp32_until = None
        self._set_precision(self.cfg.precision)
        self.scaler.reset()
        return self.cfg.precision != "fp32"

    def _set_precision(self, name: str) -> None:
        self.precision = Precision(name, self.topo.device.type)
        self.scaler.active = name == "fp16" and self.cfg.stability.loss_scale.enabled
        if name != "fp16":
            self.scaler.scale = 1.0
        if self.monitor is not None and name != "fp16":
            for block in self.monitor.blocks.values():
                block.fp32 = False

    # -- state -------------------------------------------------------------------------

    def state_dict(self, step: int) -> dict[str, Any]:
        """What a checkpoint keeps of the shared state (RNG states are saved per rank)."""
        return {
            "step": step,
            "world_size": self.topo.world_size,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict(),
            "data": self.stream.state_dict(),
            "trainer": {
                "lr_scale": self.lr_scale,
                "precision": self.precision.name,
                "fp32_until": self.fp32_until,
                "monitor": self.monitor.state_dict() if self.monitor else {},
                "layers": self.layer_monitor.state_dict() if self.layer_monitor else {},
                "surgery": self.surgeon.state_dict() if self.surgeon else {},
                "adaptive_warmup": self.warmup.state_dict(),
                "quality": self.quality.state_dict() if self.quality else {},
            },
        }

    def load_state_dict(self, state: dict[str, Any]) -> int:
        """Restore from a checkpoint's state; returns its step."""
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scaler.load_state_dict(state["scaler"])
        self.stream.load_state_dict(state["data"])
        extra = state.get("trainer", {})
        self.lr_scale = float(extra.get("lr_scale", 1.0))
        if extra.get("fp32_until") is not None and self.fp32_until is None:
            self.fp32_until = int(extra["fp32_until"])  # a retry the checkpoint was inside
        self._set_precision("fp32" if self.fp32_until is not None else self.cfg.precision)
        if self.monitor is not None and extra.get("monitor"):
            self.monitor.load_state_dict(extra["monitor"])
        if self.layer_monitor is not None and extra.get("layers"):
            self.layer_monitor.load_state_dict(extra["layers"])
        if self.surgeon is not None and extra.get("surgery"):
            self.surgeon.load_state_dict(extra["surgery"])
        if "adaptive_warmup" in extra:
            self.warmup.load_state_dict(extra["adaptive_warmup"])
        else:  # a checkpoint from before the mechanism existed: start the window afresh
            self.warmup.reset()
        if self.quality is not None and extra.get("quality"):
            self.quality.load_state_dict(extra["quality"])
            self.quality.apply(self.documents)
        return int(state["step"])
