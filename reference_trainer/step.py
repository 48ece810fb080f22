"""One optimizer step of the reference trainer, with every guard in its place:

batch (bad-data faults) -> forward under autocast (blocks may run in fp32)
-> scaled backward -> gradient faults -> unscale -> global gradient norm
-> one agreement of all ranks (losses, finiteness, each mechanism's slice)
-> the mechanisms judge (skip the update everywhere) and repair
-> adjusted gradients (clipping) -> optimizer step -> loss-scale update -> precision switches

The stability mechanisms act through their hooks (`reference_trainer.stability.mechanism`),
called in the registry's order (`reference_trainer.stability.registry`): the step names none.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from harness.inside.agent import Agent
from harness.records.events import Claim, DataWeightsObserved, StepObserved
from reference_trainer.agreement import agree
from reference_trainer.config import TrainConfig
from reference_trainer.hessian_step import HessianBatch, HessianEstimator
from reference_trainer.model.gpt import GPT
from reference_trainer.model.optim import lr_at
from reference_trainer.passes import forward_backward
from reference_trainer.processes.distributed import Topology
from reference_trainer.stability.layer_stats import StepStats
from reference_trainer.stability.loss_scale import DynamicLossScaler
from reference_trainer.stability.mechanism import Boundary, Mechanism, StepState
from reference_trainer.stability.oom_retry import MicroBatchSplit
from reference_trainer.stability.precision import Precision
from reference_trainer.stability.recovery import Failure
from reference_trainer.stability.registry import mechanism_states
from reference_trainer.stages.embeddings import SentenceEmbedder
from reference_trainer.step_claims import data_claims
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
    documents: DocumentPipeline
    stream: TokenStream | PackedStream
    loader: ShardedLoader | PackedLoader
    agent: Agent
    max_lr: float
    #: The stability mechanisms on in this run, in the registry's order.
    mechanisms: list[Mechanism] = field(default_factory=list)
    #: Multiplier on the schedule, lowered by level-2 recovery.
    lr_scale: float = 1.0
    #: Set by level-3 recovery: train in fp32 up to this step, whatever checkpoints say.
    fp32_until: int | None = None
    #: Whether this process received SIGTERM (shared with every rank at each step).
    preempt_requested: Callable[[], bool] = lambda: False
    #: The embedding model the data stages share (loaded on first use, if ever).
    embedder: SentenceEmbedder | None = None
    #: Counts the byte-fallback tokens of each batch (None: not counted).
    probe: FallbackProbe | None = None
    #: This rank's micro-batch split, halved after an out-of-memory error (None: off).
    micro_split: MicroBatchSplit | None = None
    #: Sophia's Hessian estimate every k steps (None: the optimizer takes none).
    hessian: HessianEstimator | None = field(init=False)

    def __post_init__(self) -> None:
        self.hessian = HessianEstimator.of(self)

    def mechanism(self, name: str) -> Mechanism | None:
        """The mechanism of that name, when it is on in this run."""
        return next((m for m in self.mechanisms if m.name == name), None)

    def lr(self, step: int) -> float:
        """Learning rate of 1-based ``step``."""
        lr = lr_at(
            step - 1,
            max_lr=self.max_lr,
            warmup_steps=self.cfg.optim.warmup_steps,
            total_steps=self.cfg.steps,
            min_lr_ratio=self.cfg.stability.lr_floor,
        )
        lr *= self.lr_scale
        for mechanism in self.mechanisms:
            lr *= mechanism.lr_factor(step)
        return lr

    def step(self, step: int) -> StepResult:
        """Train step ``step`` (1-based)."""
        t0 = time.perf_counter()
        self.agent.begin_step(step)
        s = StepState(step, self.lr(step))
        for group in self.optimizer.param_groups:
            group["lr"] = s.lr
        mechanisms = self.mechanisms
        for mechanism in mechanisms:
            mechanism.begin_step(s)
        passes = forward_backward(self)
        s.claims += passes.claims
        self.agent.after_backward()
        loss_scale = self.scaler.current()
        s.grad_norm = self._unscaled_norm()
        for mechanism in mechanisms:
            mechanism.after_backward(s)
        preempt = self.preempt_requested()
        preempted = agree(s, passes.local, preempt=preempt, mechanisms=mechanisms, topo=self.topo)
        for mechanism in mechanisms:
            mechanism.judge(s)
        for mechanism in mechanisms:
            mechanism.repair(s)
        self._update(s, passes.sample)
        for mechanism in mechanisms:
            mechanism.end_step(s)
        counters = self.documents.take_counters()
        s.claims += data_claims(counters)
        if self.stream.fallback is not None:
            s.claims += fallback_claims(self.stream.fallback.take_counters())
        observed = StepObserved(
            loss=s.loss,
            grad_norm=s.grad_norm,
            lr=s.lr,
            loss_scale=loss_scale,
            tokens=self.loader.tokens_per_step(),
            step_time=time.perf_counter() - t0,
            skipped=s.skip,
            docs=counters.docs,
            contaminated_docs=counters.contaminated_docs,
            contaminated_kinds=counters.contaminated_kinds,
            **passes.observed,
            **s.observed,
        )
        for mechanism in mechanisms:
            mechanism.finish(s)
        return StepResult(observed, s.claims, preempted, s.layers, s.data)

    def between_steps(self, step: int, *, save_due: bool) -> tuple[Failure | None, list[Claim]]:
        """The mechanisms' checks after step ``step`` (every rank calls this): the first
        failure they found, and their claims."""
        boundary = Boundary(step, save_due)
        failures = [mechanism.between_steps(boundary) for mechanism in self.mechanisms]
        return next((f for f in failures if f is not None), None), boundary.claims

    def _unscaled_norm(self) -> float:
        """Unscale the gradients; their global norm on this rank."""
        params = list(self.model.parameters())
        self.scaler.unscale_(params)
        grads = [p.grad for p in params if p.grad is not None]
        norms = torch.stack([torch.linalg.vector_norm(g, 2.0) for g in grads])
        return float(torch.linalg.vector_norm(norms, 2.0))

    def _update(self, s: StepState, sample: HessianBatch) -> None:
        """The optimizer step, between the mechanisms' hooks, or its skip."""
        if s.skip:
            self.optimizer.zero_grad(set_to_none=True)
            for mechanism in self.mechanisms:
                mechanism.after_update(s)
            return
        for mechanism in self.mechanisms:
            mechanism.adjust_gradients(s)
        self.agent.before_optimizer_step()
        for mechanism in self.mechanisms:
            mechanism.before_update(s)
        self.optimizer.step()
        for mechanism in self.mechanisms:
            mechanism.after_update(s)
        self.agent.after_optimizer_step()
        if self.hessian is not None:  # after the update, on its batch, as published
            s.claims += self.hessian.after_update(self, s.step, sample)
        self.optimizer.zero_grad(set_to_none=True)

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
        for mechanism in self.mechanisms:
            mechanism.precision_changed(name)

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
                **mechanism_states(self.mechanisms),
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
        for mechanism in self.mechanisms:
            mechanism.load_state_dict(extra)
        return int(state["step"])
