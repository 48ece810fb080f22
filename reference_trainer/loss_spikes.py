"""Loss-spike detectors: three ways to tell a spike from the noise of a falling loss curve.

Each sees one loss per optimizer step through ``observe(step, loss)`` and returns a
`SpikeClaim` when it fires; a non-finite loss fires all of them (``non_finite=1``).
`SpikeMonitor` runs the enabled ones and says whether an acting one fired.

- ``robust_zscore``: robust z-score of the change ``loss - last accepted loss`` against the
  median and 1.4826·MAD of the changes within a rolling window of accepted losses. Changes,
  not levels: on a falling curve a 50-step window's median sits above the current loss by
  more than a 2x spike adds. Losses over the threshold never enter the window; ``patience``
  consecutive exceedances are needed to fire.
- ``early_max``: Megatron-LM's spiky-loss rule: fire when |loss| exceeds ``factor`` times the
  largest |loss| of the first ``early_steps`` steps observed. Blind to anything smaller.
- ``forecast``: a one-layer LSTM, trained online (a few Adam steps per step) on the run's
  own recent losses, predicts the next ``horizon`` losses from the last ``context``. The
  forecasts made for step t give a band ``mean ± sigma_k·σ``, σ combining their spread with
  the recent forecast error; it fires above the band and learns from the forecast instead of
  the spike. It draws no global random numbers and leaves torch's threads as they are.

``reset()`` forgets everything; ``load_state_dict`` continues exactly where
``state_dict`` left off.
"""

from __future__ import annotations

import copy
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch
from torch import nn

NAMES = ("robust_zscore", "early_max", "forecast")
_PREFIX = "stability.spikes"
_SMALL_SAMPLE = 150.0  # robust_zscore: 3 false alarms in 570k simulated clean steps at z > 6


@dataclass(frozen=True, slots=True)
class SpikeClaim:
    """One detector firing at one step, with the figures that made it fire."""

    detector: str
    step: int
    loss: float
    details: dict[str, float]


@runtime_checkable
class LossSpikeDetector(Protocol):
    """What every detector offers."""

    name: str

    def observe(self, step: int, loss: float) -> SpikeClaim | None:
        """Take this step's loss; a claim when the detector fires at this step."""

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue exactly after `load_state_dict`."""

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a `state_dict`."""

    def reset(self) -> None:
        """Forget all history."""


def _check(ok: bool, name: str, rule: str, value: object) -> None:
    if not ok:
        raise ValueError(f"{_PREFIX}.{name} must be {rule}, got {value!r}")


def _claim(name: str, step: int, loss: float, **details: float) -> SpikeClaim:
    return SpikeClaim(name, step, float(loss), {k: float(v) for k, v in details.items()})


# -- robust z-score -----------------------------------------------------------------------


@dataclass(kw_only=True, slots=True)
class RobustZScoreConfig:
    """Robust z-score of the change Δ = loss - last accepted loss against the n changes
    within the window: ``z = (Δ - median) / (1.4826·MAD·(1 + 150/n²) + eps)``. The factor
    widens short windows, whose MAD too often understates the spread (x2.9 at n = 9)."""

    window: int = 50
    """Accepted losses kept; their successive differences give the median and MAD."""
    z_threshold: float = 6.0
    """A change scoring above this is an exceedance."""
    patience: int = 1
    """Consecutive exceedances needed to fire."""
    min_history: int = 10
    """Accepted losses needed before it may fire."""
    eps: float = 1e-8
    """Added to the scale."""
    rel_floor: float = 1e-3
    """Lower bound on the scale as a fraction of the last accepted loss (flat curves)."""

    def __post_init__(self) -> None:
        p = "robust."
        _check(self.window >= 8, p + "window", ">= 8", self.window)
        _check(self.z_threshold > 0, p + "z_threshold", "> 0", self.z_threshold)
        _check(self.patience >= 1, p + "patience", ">= 1", self.patience)
        ok = 3 <= self.min_history <= self.window
        _check(ok, p + "min_history", f"in [3, window={self.window}]", self.min_history)
        _check(self.eps >= 0, p + "eps", ">= 0", self.eps)
        _check(self.rel_floor >= 0, p + "rel_floor", ">= 0", self.rel_floor)


class RobustZScoreDetector:
    """Fires when a loss jumps far above the window's typical step-to-step change."""

    name: str = "robust_zscore"

    def __init__(self, config: RobustZScoreConfig | None = None) -> None:
        self.config = config or RobustZScoreConfig()
        self.window: deque[float] = deque(maxlen=self.config.window)
        self.count = 0

    def observe(self, step: int, loss: float) -> SpikeClaim | None:
        """Score the change from the last accepted loss; a claim after `patience` in a row."""
        cfg = self.config
        if not math.isfinite(loss):
            return _claim(self.name, step, loss, non_finite=1)
        if len(self.window) < cfg.min_history:
            self.window.append(loss)
            return None
        diffs = np.diff(np.fromiter(self.window, dtype=np.float64))
        median = float(np.median(diffs))
        mad = float(np.median(np.abs(diffs - median)))
        baseline = self.window[-1]
        widen = 1 + _SMALL_SAMPLE / len(diffs) ** 2
        scale = max(1.4826 * mad * widen, cfg.rel_floor * abs(baseline)) + cfg.eps
        z = (loss - baseline - median) / scale
        if z <= cfg.z_threshold:
            self.count = 0
            self.window.append(loss)
            return None
        self.count += 1
        if self.count < cfg.patience:
            return None
        return _claim(
            self.name, step, loss, non_finite=0, baseline=baseline, median=median, mad=mad,
            scale=scale, z=z, threshold=cfg.z_threshold, patience_count=self.count,
        )  # fmt: skip

    def state_dict(self) -> dict[str, Any]:
        """The window and the current run of exceedances."""
        return {"detector": self.name, "window": list(self.window), "count": self.count}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a `state_dict`."""
        _same_detector(self.name, state)
        self.window = deque((float(x) for x in state["window"]), maxlen=self.config.window)
        self.count = int(state["count"])

    def reset(self) -> None:
        """Forget all history."""
        self.window.clear()
        self.count = 0


# -- early max ----------------------------------------------------------------------------


@dataclass(kw_only=True, slots=True)
class EarlyMaxConfig:
    """Megatron-LM's spiky-loss rule."""

    early_steps: int = 10
    """Observed steps whose largest loss is the reference (it never fires during them)."""
    factor: float = 10.0
    """Fire when the loss exceeds this times the reference."""

    def __post_init__(self) -> None:
        _check(self.early_steps >= 1, "early_max.early_steps", ">= 1", self.early_steps)
        _check(self.factor > 1, "early_max.factor", "> 1", self.factor)


class EarlyMaxDetector:
    """Fires when |loss| exceeds ``factor`` times the largest |loss| of the first steps."""

    name: str = "early_max"

    def __init__(self, config: EarlyMaxConfig | None = None) -> None:
        self.config = config or EarlyMaxConfig()
        self.seen, self.early_max = 0, 0.0

    def observe(self, step: int, loss: float) -> SpikeClaim | None:
        """Record the early maximum, then compare each loss with ``factor`` times it."""
        if not math.isfinite(loss):
            return _claim(self.name, step, loss, non_finite=1)
        if self.seen < self.config.early_steps:
            self.seen += 1
            self.early_max = max(self.early_max, abs(loss))
            return None
        threshold = self.config.factor * self.early_max
        if abs(loss) <= threshold:
            return None
        return _claim(
            self.name, step, loss, non_finite=0, early_max=self.early_max,
            factor=self.config.factor, threshold=threshold,
        )  # fmt: skip

    def state_dict(self) -> dict[str, Any]:
        """The early maximum and how many early steps it covers."""
        return {"detector": self.name, "seen": self.seen, "early_max": self.early_max}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a `state_dict`."""
        _same_detector(self.name, state)
        self.seen, self.early_max = int(state["seen"]), float(state["early_max"])

    def reset(self) -> None:
        """Forget all history."""
        self.seen, self.early_max = 0, 0.0


# -- LSTM forecast ------------------------------------------------------------------------


@dataclass(kw_only=True, slots=True)
class ForecastConfig:
    """An online LSTM forecaster and the band around its forecasts."""

    context: int = 16
    """Past losses the forecaster reads."""
    horizon: int = 5
    """Future losses each forecast covers (so up to this many forecasts per step)."""
    hidden: int = 16
    """LSTM hidden size (one layer)."""
    patch: int = 4
    """Losses the LSTM reads per time step (``context / patch`` steps: fewer is cheaper)."""
    sigma_k: float = 3.0
    """Band half-width in σ; fires above ``mean + sigma_k·σ``."""
    sigma_floor: float = 0.005
    """Lower bound on σ as a fraction of the forecast mean."""
    min_history: int = 32
    """Losses observed before it may fire."""
    train_steps: int = 2
    """Adam steps per observed step."""
    buffer: int = 32
    """Most recent (context, horizon) windows trained on, all at once."""
    lr: float = 1e-2
    """Adam learning rate."""
    resid_window: int = 128
    """Recent forecast errors whose root mean square enters σ."""
    norm_decay: float = 0.98
    """Decay of the exponential running mean and variance that normalize the losses."""
    seed: int = 0
    """Seed of the LSTM's initialization (its own generator, never the global one)."""

    def __post_init__(self) -> None:
        p = "forecast."
        for name in ("context", "horizon", "hidden", "train_steps", "buffer", "resid_window"):
            _check(getattr(self, name) >= 1, p + name, ">= 1", getattr(self, name))
        ok = self.patch >= 1 and self.context % self.patch == 0
        _check(ok, p + "patch", f"a divisor of context={self.context}", self.patch)
        _check(self.sigma_k > 0, p + "sigma_k", "> 0", self.sigma_k)
        _check(self.sigma_floor >= 0, p + "sigma_floor", ">= 0", self.sigma_floor)
        low = self.context + self.horizon
        ok = self.min_history >= low
        _check(ok, p + "min_history", f">= context + horizon = {low}", self.min_history)
        _check(self.lr > 0, p + "lr", "> 0", self.lr)
        _check(0 < self.norm_decay < 1, p + "norm_decay", "in (0, 1)", self.norm_decay)


class _Forecaster(nn.Module):
    """LSTM over normalized losses; the head adds a change for each future step to the last."""

    def __init__(self, patch: int, hidden: int, horizon: int, seed: int) -> None:
        super().__init__()
        self.patch = patch
        # Built on the meta device (no RNG drawn), then initialized from a private generator.
        self.lstm = nn.LSTM(patch, hidden, batch_first=True, device="meta", dtype=torch.float32)
        self.head = nn.Linear(hidden, horizon, device="meta", dtype=torch.float32)
        self.to_empty(device="cpu")
        gen, bound = torch.Generator().manual_seed(seed), 1 / math.sqrt(hidden)
        with torch.no_grad():
            for param in self.lstm.parameters():
                param.uniform_(-bound, bound, generator=gen)
            self.head.weight.zero_()  # untrained, it forecasts "same as the last loss"
            self.head.bias.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(batch, context) normalized losses -> (batch, horizon) forecasts."""
        out: torch.Tensor = self.lstm(x.reshape(len(x), -1, self.patch))[0]
        forecast: torch.Tensor = x[:, -1:] + self.head(out[:, -1])
        return forecast


class ForecastDetector:
    """Fires when the loss is above the band its own online forecasts put around it."""

    name: str = "forecast"

    def __init__(self, config: ForecastConfig | None = None) -> None:
        self.config = config or ForecastConfig()
        self.reset()

    def reset(self) -> None:
        """Forget all history and start again from the seeded initialization."""
        cfg = self.config
        self.net = _Forecaster(cfg.patch, cfg.hidden, cfg.horizon, cfg.seed)
        self.opt = torch.optim.Adam(self.net.parameters(), lr=cfg.lr, fused=True)
        self.history: deque[float] = deque(maxlen=cfg.buffer + cfg.context + cfg.horizon - 1)
        self.residuals: deque[float] = deque(maxlen=cfg.resid_window)
        self.pending: dict[int, list[float]] = {}  # step -> forecasts made for it
        self.count, self.mean, self.var = 0, 0.0, 0.0
        self.last_step: int | None = None

    def observe(self, step: int, loss: float) -> SpikeClaim | None:
        """Compare the loss with the band, then learn from it and forecast the next steps."""
        if self.last_step is not None and step <= self.last_step:
            self.pending.clear()  # steps went back: these forecasts were for another future
        self.last_step = step
        band = self._band(self.pending.pop(step, []))
        self.pending = {s: p for s, p in self.pending.items() if s > step}
        claim, value = None, loss
        if not math.isfinite(loss):
            claim = _claim(self.name, step, loss, non_finite=1, **(band or {}))
            value = band["forecast_mean"] if band else (self.history[-1] if self.history else loss)
        elif band is not None:
            ready = self.count >= self.config.min_history and len(self.residuals) >= 8
            if ready and loss > band["band_high"]:
                claim = _claim(self.name, step, loss, non_finite=0, **band)
                value = band["forecast_mean"]  # keep the spike out of what it learns from
            else:
                self.residuals.append(loss - band["forecast_mean"])
        if math.isfinite(value):
            with torch.inference_mode(False):
                self._learn_and_forecast(step, value)
        return claim

    def _band(self, forecasts: list[float]) -> dict[str, float] | None:
        if not forecasts:
            return None
        n, k = len(forecasts), self.config.sigma_k
        mean = sum(forecasts) / n
        spread = math.sqrt(sum((f - mean) ** 2 for f in forecasts) / n)
        resid = math.sqrt(sum(r * r for r in self.residuals) / max(len(self.residuals), 1))
        sigma = max(math.hypot(spread, resid), self.config.sigma_floor * abs(mean))
        return {
            "forecast_mean": mean, "forecast_std": sigma, "spread": spread, "resid_std": resid,
            "n_forecasts": n, "band_low": mean - k * sigma, "band_high": mean + k * sigma,
        }  # fmt: skip

    def _learn_and_forecast(self, step: int, value: float) -> None:
        cfg = self.config
        if self.count == 0:
            self.mean = value
        else:  # exponentially weighted mean and variance
            diff = value - self.mean
            self.mean += (1 - cfg.norm_decay) * diff
            self.var = cfg.norm_decay * (self.var + (1 - cfg.norm_decay) * diff * diff)
        self.count += 1
        self.history.append(value)
        if len(self.history) < cfg.context:
            return
        std = max(math.sqrt(self.var), 1e-3 * abs(self.mean), 1e-8)
        series = (torch.tensor(list(self.history), dtype=torch.float32) - self.mean) / std
        latest = series[None, -cfg.context :]
        if len(series) < cfg.context + cfg.horizon:
            with torch.no_grad():
                forecast = self.net(latest)[0]
        else:  # the latest window rides along the last training batch (one Adam step stale)
            windows = series.unfold(0, cfg.context + cfg.horizon, 1)
            inputs = torch.cat([windows[:, : cfg.context], latest])
            targets, n = windows[:, cfg.context :], len(windows)
            with torch.enable_grad():
                for _ in range(cfg.train_steps):
                    self.opt.zero_grad(set_to_none=True)
                    out = self.net(inputs)
                    torch.autograd.backward(nn.functional.mse_loss(out[:n], targets))
                    self.opt.step()
            forecast = out[n].detach()
        for ahead, predicted in enumerate((forecast * std + self.mean).tolist(), start=1):
            if math.isfinite(predicted):  # a diverged forecaster goes quiet, not NaN forever
                self.pending.setdefault(step + ahead, []).append(predicted)

    def state_dict(self) -> dict[str, Any]:
        """LSTM weights and Adam state (tensors), history, normalization, pending forecasts."""
        return {
            "detector": self.name,
            "model": {k: v.detach().clone() for k, v in self.net.state_dict().items()},
            "optimizer": copy.deepcopy(self.opt.state_dict()),
            "pending": [[s, list(p)] for s, p in sorted(self.pending.items())],
            "history": list(self.history), "residuals": list(self.residuals),
            "count": self.count, "mean": self.mean, "var": self.var, "last_step": self.last_step,
        }  # fmt: skip

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a `state_dict`."""
        _same_detector(self.name, state)
        self.reset()
        self.net.load_state_dict(state["model"])
        self.opt.load_state_dict(copy.deepcopy(state["optimizer"]))
        self.history.extend(float(x) for x in state["history"])
        self.residuals.extend(float(x) for x in state["residuals"])
        self.pending = {int(s): [float(x) for x in p] for s, p in state["pending"]}
        self.count, self.mean, self.var = state["count"], state["mean"], state["var"]
        self.last_step = state["last_step"]


# -- configuration and monitor -----------------------------------------------------------


def _same_detector(name: str, state: dict[str, Any]) -> None:
    if state.get("detector") != name:
        raise ValueError(f"state of detector {state.get('detector')!r} given to {name!r}")


@dataclass(kw_only=True, slots=True)
class SpikeConfig:
    """Which loss-spike detectors run, which of them trigger recovery, and their settings."""

    robust: RobustZScoreConfig = field(default_factory=RobustZScoreConfig)
    early_max: EarlyMaxConfig = field(default_factory=EarlyMaxConfig)
    forecast: ForecastConfig = field(default_factory=ForecastConfig)
    enabled: tuple[str, ...] = NAMES
    """Detectors that run and journal their claims."""
    acting: tuple[str, ...] = ("robust_zscore", "early_max")
    """Detectors whose claims trigger recovery (a subset of ``enabled``)."""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Check the detector names (called again by `SpikeMonitor`: fields may be reassigned)."""
        for key in ("enabled", "acting"):
            for name in getattr(self, key):
                if name not in NAMES:
                    raise ValueError(
                        f"{_PREFIX}.{key} has unknown detector {name!r}; "
                        f"expected some of {', '.join(NAMES)}"
                    )
        extra = [name for name in self.acting if name not in self.enabled]
        if extra:
            raise ValueError(
                f"{_PREFIX}.acting must be a subset of {_PREFIX}.enabled; "
                f"{', '.join(extra)} acting but not enabled"
            )


def build_detectors(config: SpikeConfig) -> list[LossSpikeDetector]:
    """The enabled detectors, in the order ``config.enabled`` names them."""
    config.validate()
    makers: dict[str, Callable[[], LossSpikeDetector]] = {
        "robust_zscore": lambda: RobustZScoreDetector(config.robust),
        "early_max": lambda: EarlyMaxDetector(config.early_max),
        "forecast": lambda: ForecastDetector(config.forecast),
    }
    return [makers[name]() for name in dict.fromkeys(config.enabled)]


class SpikeMonitor:
    """Runs the enabled detectors on every step and tells whether an acting one fired."""

    def __init__(self, config: SpikeConfig | None = None) -> None:
        self.config = config or SpikeConfig()
        self.detectors = build_detectors(self.config)

    def observe(self, step: int, loss: float) -> list[SpikeClaim]:
        """Every claim made at this step (empty when none fired)."""
        claims = [detector.observe(step, loss) for detector in self.detectors]
        return [claim for claim in claims if claim is not None]

    def acting(self, claims: list[SpikeClaim]) -> bool:
        """Whether any claim comes from a detector that triggers recovery."""
        return any(claim.detector in self.config.acting for claim in claims)

    def state_dict(self) -> dict[str, Any]:
        """Each enabled detector's state, by name."""
        return {detector.name: detector.state_dict() for detector in self.detectors}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore each enabled detector; one without saved state starts afresh."""
        for detector in self.detectors:
            if detector.name in state:
                detector.load_state_dict(state[detector.name])
            else:
                detector.reset()

    def reset(self) -> None:
        """Forget every detector's history."""
        for detector in self.detectors:
            detector.reset()
