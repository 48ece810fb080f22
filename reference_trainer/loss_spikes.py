"""Loss-spike detectors: three ways to tell a spike from the noise of a falling loss curve.

Each detector sees one loss per optimizer step through ``observe(step, loss)`` and returns
a `SpikeClaim` when it fires; a non-finite loss fires every detector at once (its claim says
``non_finite=1``). `SpikeMonitor` runs the enabled detectors and says whether an acting one
fired.

- ``robust_zscore``: a robust z-score of the step-to-step change ``loss - last accepted
  loss`` against the median and MAD (scaled by 1.4826) of those changes over a rolling window
  of accepted losses. It scores changes, not levels: on a falling curve the median of a
  50-step window sits above the current loss by more than a 2x spike adds. A loss over the
  threshold never enters the window, so a spike does not pollute the baseline; ``patience``
  consecutive exceedances are needed to fire.
- ``early_max``: Megatron-LM's rule: fire when the loss exceeds ``factor`` times the largest
  loss of the first ``early_steps`` observed steps. Blind to spikes below that factor.
- ``forecast``: a one-layer LSTM trained online, a few Adam steps per step, on the run's own
  recent losses predicts the next ``horizon`` losses from the last ``context`` ones. The
  forecasts made for step t (one from each of the last ``horizon`` steps) give a band
  ``mean ± sigma_k·σ``, σ combining their spread with the recent forecast error; it fires
  when the loss is above the band. A loss it fires on is replaced in its history by the
  forecast. It draws no global random numbers (its init uses no RNG at all).

Detectors forget everything on ``reset()``; a resumed run restores them with
``load_state_dict`` and continues exactly as the uninterrupted one would.
"""

from __future__ import annotations

import copy
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch
from torch import nn

NAMES = ("robust_zscore", "early_max", "forecast")
_PREFIX = "stability.spikes"


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
    """Robust z-score of step-to-step loss changes."""

    window: int = 50
    """Accepted losses kept; their successive differences give the median and MAD."""
    z_threshold: float = 6.0
    """A change scoring above this is an exceedance."""
    patience: int = 1
    """Consecutive exceedances needed to fire."""
    min_history: int = 16
    """Accepted losses needed before it may fire (fewer give an unreliable MAD)."""
    eps: float = 1e-8
    """Added to the scale ``1.4826·MAD``."""
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
        scale = max(1.4826 * mad, cfg.rel_floor * abs(baseline)) + cfg.eps
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
    """Fires when the loss exceeds ``factor`` times the early maximum (losses assumed > 0)."""

    name: str = "early_max"

    def __init__(self, config: EarlyMaxConfig | None = None) -> None:
        self.config = config or EarlyMaxConfig()
        self.seen = 0
        self.early_max = -math.inf

    def observe(self, step: int, loss: float) -> SpikeClaim | None:
        """Record the early maximum, then compare each loss with ``factor`` times it."""
        if not math.isfinite(loss):
            return _claim(self.name, step, loss, non_finite=1)
        if self.seen < self.config.early_steps:
            self.seen += 1
            self.early_max = max(self.early_max, loss)
            return None
        threshold = self.config.factor * self.early_max
        if loss <= threshold:
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
        self.seen, self.early_max = 0, -math.inf


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
        _check(self.sigma_k > 0, p + "sigma_k", "> 0", self.sigma_k)
        _check(self.sigma_floor >= 0, p + "sigma_floor", ">= 0", self.sigma_floor)
        low = self.context + self.horizon
        ok = self.min_history >= low
        _check(ok, p + "min_history", f">= context + horizon = {low}", self.min_history)
        _check(self.lr > 0, p + "lr", "> 0", self.lr)
        _check(0 < self.norm_decay < 1, p + "norm_decay", "in (0, 1)", self.norm_decay)


class _Forecaster(nn.Module):
    """LSTM over normalized losses; the head adds a change for each future step to the last."""

    def __init__(self, hidden: int, horizon: int, seed: int) -> None:
        super().__init__()
        # Built on the meta device (no RNG drawn), then initialized from a private generator.
        self.lstm = nn.LSTM(1, hidden, batch_first=True, device="meta", dtype=torch.float32)
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
        out: torch.Tensor = self.lstm(x.unsqueeze(-1))[0]
        forecast: torch.Tensor = x[:, -1:] + self.head(out[:, -1])
        return forecast


@dataclass(slots=True)
class _Band:
    mean: float
    sigma: float
    spread: float
    resid: float
    n: int
    ready: bool


class ForecastDetector:
    """Fires when the loss is above the band its own online forecasts put around it."""

    name: str = "forecast"

    def __init__(self, config: ForecastConfig | None = None) -> None:
        self.config = config or ForecastConfig()
        self.reset()

    def reset(self) -> None:
        """Forget all history and start again from the seeded initialization."""
        cfg = self.config
        self.net = _Forecaster(cfg.hidden, cfg.horizon, cfg.seed)
        self.opt = torch.optim.Adam(self.net.parameters(), lr=cfg.lr, fused=True)
        self.history: deque[float] = deque(maxlen=cfg.buffer + cfg.context + cfg.horizon - 1)
        self.residuals: deque[float] = deque(maxlen=cfg.resid_window)
        self.pending: dict[int, list[float]] = {}
        self.count, self.mean, self.var = 0, 0.0, 0.0
        self.last_step: int | None = None

    def observe(self, step: int, loss: float) -> SpikeClaim | None:
        """Compare the loss with the band, then learn from it and forecast the next steps."""
        if self.last_step is not None and step <= self.last_step:
            self.pending.clear()  # steps went back: these forecasts were for another future
        self.last_step = step
        band = self._band(self.pending.pop(step, []))
        self.pending = {s: p for s, p in self.pending.items() if s > step}
        figures: dict[str, float] = {}
        if band is not None:
            high = band.mean + self.config.sigma_k * band.sigma
            figures = {
                "forecast_mean": band.mean, "forecast_std": band.sigma, "spread": band.spread,
                "resid_std": band.resid, "n_forecasts": band.n, "band_high": high,
                "band_low": band.mean - self.config.sigma_k * band.sigma,
            }  # fmt: skip
        claim, value = None, loss
        if not math.isfinite(loss):
            claim = _claim(self.name, step, loss, non_finite=1, **figures)
            value = band.mean if band else (self.history[-1] if self.history else math.nan)
        elif band is not None and band.ready and loss > figures["band_high"]:
            claim = _claim(self.name, step, loss, non_finite=0, **figures)
            value = band.mean  # keep the spike out of what it learns from
        elif band is not None:
            self.residuals.append(loss - band.mean)
        if math.isfinite(value):
            self._learn_and_forecast(step, value)
        return claim

    def _band(self, forecasts: list[float]) -> _Band | None:
        if not forecasts:
            return None
        mean = sum(forecasts) / len(forecasts)
        spread = math.sqrt(sum((f - mean) ** 2 for f in forecasts) / len(forecasts))
        resid = math.sqrt(sum(r * r for r in self.residuals) / max(len(self.residuals), 1))
        sigma = max(math.hypot(spread, resid), self.config.sigma_floor * abs(mean))
        ready = self.count >= self.config.min_history and len(self.residuals) >= 8
        return _Band(mean, sigma, spread, resid, len(forecasts), ready)

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
        else:  # the last window rides along the final training batch: one pass less
            windows = series.unfold(0, cfg.context + cfg.horizon, 1)
            inputs = torch.cat([windows[:, : cfg.context], latest])
            targets, n = windows[:, cfg.context :], len(windows)
            with torch.enable_grad():
                for _ in range(cfg.train_steps):
                    self.opt.zero_grad(set_to_none=True)
                    out = self.net(inputs)
                    error = nn.functional.mse_loss(out[:n], targets)
                    torch.autograd.backward(error)
                    self.opt.step()
            forecast = out[n].detach()
        for ahead, predicted in enumerate((forecast * std + self.mean).tolist(), start=1):
            self.pending.setdefault(step + ahead, []).append(predicted)

    def state_dict(self) -> dict[str, Any]:
        """LSTM weights and Adam state (tensors), history, normalization, pending forecasts."""
        return {
            "detector": self.name,
            "model": {k: v.detach().clone() for k, v in self.net.state_dict().items()},
            "optimizer": copy.deepcopy(self.opt.state_dict()),
            "history": list(self.history),
            "residuals": list(self.residuals),
            "pending": [[s, list(p)] for s, p in sorted(self.pending.items())],
            "count": self.count,
            "mean": self.mean,
            "var": self.var,
            "last_step": self.last_step,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a `state_dict`."""
        _same_detector(self.name, state)
        self.reset()
        self.net.load_state_dict(state["model"])
        self.opt.load_state_dict(copy.deepcopy(state["optimizer"]))
        self.history.extend(float(x) for x in state["history"])
        self.residuals.extend(float(x) for x in state["residuals"])
        self.pending = {int(s): [float(x) for x in p] for s, p in state["pending"]}
        self.count, self.mean, self.var = int(state["count"]), state["mean"], state["var"]
        last = state["last_step"]
        self.last_step = None if last is None else int(last)


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
    detectors: list[LossSpikeDetector] = []
    for name in dict.fromkeys(config.enabled):
        if name == "robust_zscore":
            detectors.append(RobustZScoreDetector(config.robust))
        elif name == "early_max":
            detectors.append(EarlyMaxDetector(config.early_max))
        else:
            detectors.append(ForecastDetector(config.forecast))
    return detectors


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
