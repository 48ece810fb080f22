"""The training microscope: per-layer figures every few steps and around every anomaly, per
rank all-reduce time and a periodic point-to-point latency probe, written beside the journal
(format: harness/records/microscope_file.py; docs/journal.md, "The microscope").

The agent drives it from its own step calls, so it sees the same steps in the reference
trainer, an attached trainer and ``tightrope exec``:

- every step, into a ring of the last ``window`` steps: each layer's gradient norm (as
  backward left the gradients, divided by the step's loss scale when the step reports one),
  weight norm after the step, and the histogram of its output;
- every ``every`` steps, and for ``window`` steps after an anomaly, also the update ratio
  (a copy of the weights is taken before the optimizer step);
- an *anomaly* is what the agent saw, or was told, at a step: a fault it injected, a
  ``detected`` claim, a non-finite loss, gradient norm or parameter, a skipped step, or a
  loss above ``spike_factor`` times the median of the last 20. The ring is written then, so
  the window before the anomaly is on disk too.

Off unless asked for (the reference trainer asks; docs/journal.md says how for the rest):
``TIGHTROPE_MICROSCOPE=on``, ``off``, or ``every=10,window=5,probe_every=100,max_mb=64``.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from harness.errors import TightropeError
from harness.inside.comm_timing import CommTimer
from harness.inside.hooks import OutputHook
from harness.inside.latency_probe import probe
from harness.inside.layer_figures import (
    Layers,
    OutputSamples,
    ParamNorms,
    default_layer,
    grad_norms,
    snapshot,
    update_ratios,
    weight_norms,
)
from harness.records.microscope_file import (
    MICROSCOPE_ENV,
    N_BINS,
    WHY_AFTER,
    WHY_ANOMALY,
    WHY_BEFORE,
    WHY_PERIODIC,
    MicroscopeWriter,
    Record,
)

ENV = MICROSCOPE_ENV


class MicroscopeOptionsError(TightropeError, ValueError):
    """A bad ``TIGHTROPE_MICROSCOPE`` value."""


@dataclass(frozen=True, kw_only=True, slots=True)
class MicroscopeOptions:
    """What the microscope records, and how much of it."""

    enabled: bool = False
    every: int = 10
    """Record every this many steps (besides the anomaly windows)."""
    window: int = 5
    """Steps recorded before and after each anomaly."""
    probe_every: int = 100
    """Steps between point-to-point latency probes (several ranks; 0: never), besides one at
    each process's first step."""
    max_mb: float = 64.0
    """Stop recording once a rank's chunks take this many megabytes."""
    spike_factor: float = 3.0
    """A loss this many times the median of the last 20 is an anomaly."""

    def __post_init__(self) -> None:
        for name in ("every", "window"):
            if getattr(self, name) < 1:
                raise MicroscopeOptionsError(f"microscope.{name} must be >= 1")
        if self.probe_every < 0:
            raise MicroscopeOptionsError("microscope.probe_every must be >= 0")
        if not self.max_mb > 0 or not self.spike_factor > 1:
            raise MicroscopeOptionsError("microscope.max_mb must be > 0, spike_factor > 1")

    @classmethod
    def parse(cls, text: str, default: MicroscopeOptions | None = None) -> MicroscopeOptions:
        """Options from ``on``, ``off`` or ``name=value,...`` (which turns it on)."""
        base = default or cls()
        text = text.strip().lower()
        if text in ("", "0", "off", "false", "no"):
            return replace(base, enabled=False)
        if text in ("1", "on", "true", "yes"):
            return replace(base, enabled=True)
        known = {f.name: f.type for f in fields(cls) if f.name != "enabled"}
        values: dict[str, Any] = {}
        for item in text.split(","):
            name, sep, value = item.partition("=")
            name = name.strip()
            if not sep or name not in known:
                raise MicroscopeOptionsError(
                    f"{ENV}: {item.strip()!r} is not on, off or NAME=VALUE with NAME one of "
                    + ", ".join(known)
                )
            try:
                values[name] = float(value) if known[name] == "float" else int(value)
            except ValueError:
                raise MicroscopeOptionsError(
                    f"{ENV}: {name} must be a number, got {value.strip()!r}"
                ) from None
        return replace(base, enabled=True, **values)

    @classmethod
    def from_env(cls, default: MicroscopeOptions | None = None) -> MicroscopeOptions:
        """``TIGHTROPE_MICROSCOPE`` over ``default`` (off when neither says)."""
        text = os.environ.get(ENV)
        return (default or cls()) if text is None else cls.parse(text, default)


@dataclass(slots=True)
class _Step:
    """A step as measured, kept in the ring until written or dropped: its norms reduced to
    layers and its outputs binned only when written (`record`)."""

    step: int
    why: int
    wall: float
    grads: ParamNorms | None
    weights: ParamNorms
    scale: float | None
    """The step's loss scale (gradient norms are divided by it)."""
    ratios: np.ndarray | None
    outputs: OutputSamples | None
    allreduce_ms: float

    def record(self) -> Record:
        """The record the writer takes."""
        n = self.weights.layers
        grads = self.grads.per_layer() if self.grads is not None else np.full(n, np.nan, np.float32)
        if self.scale is not None:
            grads = grads / np.float32(self.scale)
        hist = (
            self.outputs.counts() if self.outputs is not None else np.zeros((n, N_BINS), np.int64)
        )
        return Record(
            step=self.step,
            why=self.why,
            wall=self.wall,
            grad_norm=grads,
            weight_norm=self.weights.per_layer(),
            update_ratio=self.ratios if self.ratios is not None else np.full(n, np.nan),
            act_hist=hist,
            allreduce_ms=self.allreduce_ms,
        )


class Microscope:
    """One process's recorder (see the module docstring)."""

    def __init__(
        self,
        options: MicroscopeOptions,
        run_dir: str | os.PathLike[str],
        *,
        rank: int,
        world_size: int,
        restart: int,
    ) -> None:
        self.options = options
        self.run_dir = Path(run_dir)
        self.rank, self.world_size, self.restart = rank, world_size, restart
        self.layer_of: Callable[[str], str] = default_layer
        self.comm = CommTimer()
        self.writer: MicroscopeWriter | None = None
        self._model: nn.Module | None = None
        self._layers: Layers | None = None
        self._hooks: list[RemovableHandle] = []
        self._outputs: OutputSamples | None = None
        self._grads: ParamNorms | None = None
        self._before: list[torch.Tensor] | None = None
        self._ratios: np.ndarray | None = None
        self._ring: deque[_Step] = deque(maxlen=options.window)
        self._pending: _Step | None = None  # the last step, until claims about it are in
        self._after = 0  # steps still to record after the last anomaly
        self._losses: deque[float] = deque(maxlen=20)
        self._step = 0
        self._ddp_seen = False
        self._probed = False
        self._failed: Exception | None = None  # what an output hook met, raised at end_step

    # -- set-up ----------------------------------------------------------------------

    def watch_data_parallel(self, wrapper: nn.Module) -> str | None:
        """Time the bucket all-reduces of a DDP ``wrapper``; the reason when it cannot."""
        self._ddp_seen = True
        self.comm.unwrap()
        return self.comm.hook_ddp(wrapper)

    def _setup(self, model: nn.Module) -> Layers:
        if self._layers is None or model is not self._model:
            self._remove_hooks()  # they were on the model before this one
            self._model = model
            self._layers = Layers.of(model, self.layer_of)
            if self.writer is not None:
                self.writer.flush()
            self.writer = MicroscopeWriter(
                self.run_dir,
                rank=self.rank,
                restart=self.restart,
                layers=self._layers.names,
                max_bytes=int(self.options.max_mb * (1 << 20)),
            )
            if self.world_size > 1 and not self._ddp_seen:
                self.comm.wrap_all_reduce()  # a trainer that averages gradients by hand
        return self._layers

    # -- the step --------------------------------------------------------------------

    def begin_step(self, model: nn.Module | None, step: int, *, faults_hooked: bool) -> None:
        """A step begins: the last one is final; probes run when due. The output hooks stay
        in from step to step (a compiled model would be traced again at every change);
        they go in again, last, when the step's faults hooked the model, so they see what
        the faults did. They copy and pickle as hooks that do nothing, and leave the
        modules while an attached agent's watched save runs (`harness.inside.hooks.strip_hooks`)."""
        self._finish_pending()
        self._step = step
        self._grads = self._before = self._ratios = None
        if model is None:
            self._remove_hooks()
            return
        layers = self._setup(model)
        every = self.options.probe_every
        # At this process's first step (the same step on every rank, a restart's too), so a
        # short run has its latency map, then every `probe_every` steps.
        due = every and (not self._probed or step % every == 0)
        if self.world_size > 1 and due and self.writer is not None:
            for peer, micros in probe(self.rank, self.world_size).items():
                self.writer.add_probe(step, peer, micros)
            self._probed = True
        self.comm.take()  # what came before this step is not this step's
        self._outputs = OutputSamples(len(layers.names))
        if faults_hooked or not self._hooks:
            self._remove_hooks()
            for i, name in enumerate(layers.names):
                for module in layers.modules.get(name, []):
                    self._hooks.append(module.register_forward_hook(OutputHook(self._see, i)))

    def _see(self, index: int, output: Any) -> None:
        """Layer ``index`` computed ``output`` (its output hook calls this)."""
        if self._outputs is not None and isinstance(output, torch.Tensor):
            try:
                self._outputs.add(index, output)
            except Exception as exc:  # raised again at end_step, out of the forward
                self._outputs, self._failed = None, exc

    def after_backward(self) -> None:
        """Gradients exist: each layer's norm (the last backward of the step counts)."""
        if self._layers is not None:
            self._grads = grad_norms(self._layers)

    def before_update(self) -> None:
        """Just before the optimizer step: a copy of the weights, when the step is recorded
        whole (periodic, or after an anomaly)."""
        if self._layers is not None and self._whole(self._step):
            self._before = snapshot(self._layers)

    def after_update(self) -> None:
        """Just after the optimizer step: the update ratios."""
        if self._layers is not None and self._before is not None:
            self._ratios = update_ratios(self._layers, self._before)
            self._before = None

    def end_step(self, observed: Mapping[str, Any], anomaly: bool) -> None:
        """The step's `step` event was written (``observed`` are its fields)."""
        if self._failed is not None:
            raise self._failed
        if self._layers is None:
            return
        scale = observed.get("loss_scale")
        if not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
            scale = None
        loss = observed.get("loss")
        if isinstance(loss, (int, float)):
            anomaly = anomaly or self._spike(float(loss))
        self._pending = _Step(
            step=self._step,
            why=0,
            wall=time.time(),
            grads=self._grads,
            weights=weight_norms(self._layers),
            scale=scale,
            ratios=self._ratios,
            outputs=self._outputs,
            allreduce_ms=self.comm.take(),
        )
        self._outputs = None
        if anomaly or (self._grads is not None and not self._grads.finite):
            self.mark_anomaly()

    def mark_anomaly(self) -> None:
        """Something went wrong at the step just finished (a claim, after its event)."""
        if self._pending is not None:
            self._pending.why |= WHY_ANOMALY

    def fault_injected(self) -> None:
        """A fault acted. After the step's event (a file or process fault, in ``end_step``),
        the step is an anomaly and goes to disk now: the fault may end this process."""
        if self._pending is not None and self._pending.step == self._step:
            self._pending.why |= WHY_ANOMALY
            self._finish_pending()

    def close(self) -> None:
        """Write what is left."""
        self._finish_pending()
        self._remove_hooks()
        self.comm.unwrap()
        if self.writer is not None:
            self.writer.flush()

    # -- internals -------------------------------------------------------------------

    def _whole(self, step: int) -> bool:
        return step % self.options.every == 0 or self._after > 0

    def _spike(self, loss: float) -> bool:
        if not math.isfinite(loss):
            return True
        spiked = len(self._losses) >= 5 and loss > self.options.spike_factor * statistics.median(
            self._losses
        )
        self._losses.append(loss)
        return spiked

    def _finish_pending(self) -> None:
        step, self._pending = self._pending, None
        if step is None or self.writer is None:
            return
        if step.why & WHY_ANOMALY:
            for earlier in self._ring:
                if earlier.step >= step.step - self.options.window:
                    earlier.why |= WHY_BEFORE
                    self.writer.add(earlier.record())
            self._ring.clear()
            self._after = self.options.window
            self.writer.add(step.record())
            self.writer.flush()  # an anomaly may be the last thing this process does
            return
        if step.step % self.options.every == 0:
            step.why |= WHY_PERIODIC
        if self._after > 0:
            step.why |= WHY_AFTER
            self._after -= 1
        if step.why:
            self.writer.add(step.record())
        else:
            self._ring.append(step)

    def _remove_hooks(self) -> None:
        for handle in self._hooks:
            handle.remove()
        self._hooks = []
