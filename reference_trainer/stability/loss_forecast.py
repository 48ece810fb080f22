"""The forecasting loss-spike detector: a small LSTM, trained online on the run's own loss
history, predicts the next losses; a loss outside the band around its forecasts, above it
or below it, is a claim that says which side. (See `reference_trainer.stability.loss_spikes`
for the other detectors and the monitor, docs/detectors.md for what each side means.)"""

from __future__ import annotations

import copy
import math
from collections import deque
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from reference_trainer.stability.spike_claims import Side, SpikeClaim
from reference_trainer.stability.spike_claims import check as _check
from reference_trainer.stability.spike_claims import claim as _claim
from reference_trainer.stability.spike_claims import same_detector as _same_detector

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
    """Band half-width in σ; fires outside ``[mean - sigma_k·σ, mean + sigma_k·σ]``."""
    sigma_floor: float = 0.005
    """Lower bound on σ as a fraction of the forecast mean."""
    min_history: int = 32
    """Losses observed before it may fire."""
    relearn_after: int = 10
    """Losses in a row outside the band after which it learns from them again: a level
    that lasts is the new normal, not a spike (else it would fire for ever after a shift)."""
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
        names = ("context", "horizon", "hidden", "train_steps", "buffer", "resid_window")
        for name in (*names, "relearn_after"):
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


def _outside(loss: float, band: dict[str, float]) -> Side | None:
    """Which side of the band the loss fell on, or None inside it."""
    if loss > band["band_high"]:
        return "above"
    if loss < band["band_low"]:
        return "below"
    return None


class ForecastDetector:
    """Fires when the loss is outside the band its own online forecasts put around it."""

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
        self.outside = 0  # losses in a row outside the band

    def observe(self, step: int, loss: float) -> SpikeClaim | None:
        """Compare the loss with the band, then learn from it and forecast the next steps."""
        if self.last_step is not None and step <= self.last_step:
            self.pending.clear()  # steps went back: these forecasts were for another future
        self.last_step = step
        band = self._band(self.pending.pop(step, []))
        self.pending = {s: p for s, p in self.pending.items() if s > step}
        claim, value = None, loss
        if not math.isfinite(loss):
            claim = _claim(self.name, step, loss, side=None, non_finite=1, **(band or {}))
            value = band["forecast_mean"] if band else (self.history[-1] if self.history else loss)
        elif band is not None:
            ready = self.count >= self.config.min_history and len(self.residuals) >= 8
            side = _outside(loss, band)
            if ready and side is not None:
                self.outside += 1
                figures = band | {"outside_run": self.outside}
                claim = _claim(self.name, step, loss, side=side, non_finite=0, **figures)
            else:
                self.outside = 0
            if claim is not None and self.outside <= self.config.relearn_after:
                # Keep the outlier out of what it learns from, on either side: a drop it
                # learned from would become the level it expects next.
                value = band["forecast_mean"]
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
            "outside": self.outside,
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
        self.outside = int(state.get("outside", 0))  # (absent from states saved before it)
