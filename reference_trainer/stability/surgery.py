"""Gradient surgery: when one layer's gradient swings orders of magnitude off its norm while
the forward pass was normal, repair the gradient instead of losing the step.

The swing is agreed by every rank in the step's one collective (the barrier where all
ranks stop); gradients are the same on every rank after the all-reduce, so each rank
makes the same cut:

1. **Projection.** The layer's last ``window`` good gradients ``G`` (rows) span the
   directions it normally moves in; ``Q`` from the QR decomposition of ``Gᵀ`` is an
   orthonormal basis of them. The anomalous direction is the part of the current gradient
   outside that span, ``g⊥ = g - Q Qᵀ g``.
2. **Structured dropout.** In each matrix of the layer, the rows (output units) carrying
   the largest share of ``g⊥`` (``dropout_share``, 10%) are cut from the gradient and
   receive none for ``dropout_steps`` (3) steps. The anomalous direction of what is left
   is projected out (``g ← Q Qᵀ g``), and the result scaled down to the layer's median
   norm when it is still above it.
3. **Safe mode.** The learning rate is multiplied by ``safe_lr`` (0.5) and the clipping
   threshold by ``safe_clip`` (0.5) until the layer's gradient norm has stayed within
   ``calm_factor`` (3x) of its median for ``calm_steps`` (10) steps in a row; then both
   climb back linearly over ``ramp_steps`` (5) calm steps.

When the loss of the step is already ``loss_rise`` (1.2x) above its recent median, the
weights or the data are already bad and a repaired gradient would only carry on from them:
the step is skipped and left to rollback, as without surgery.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import torch

from reference_trainer.errors import ConfigError


@dataclass(kw_only=True, slots=True)
class SurgeryConfig:
    """Gradient surgery on a layer's swung gradient (an alternative to skipping it)."""

    enabled: bool = True
    window: int = 6
    """Recent good gradients per layer that span its normal directions."""
    remember_every: int = 4
    """Keep one good step's gradients in this many (the window spans 24 steps; a copy of
    every gradient at every step would cost about 10% of a `small` step)."""
    dropout_share: float = 0.1
    """Share of each matrix's rows frozen after surgery."""
    dropout_steps: int = 3
    """Steps the frozen rows receive no gradient."""
    safe_lr: float = 0.5
    """Learning-rate multiplier in safe mode."""
    safe_clip: float = 0.5
    """Clipping-threshold multiplier in safe mode."""
    calm_factor: float = 3.0
    """A gradient norm within this factor of the layer's median is calm."""
    calm_steps: int = 10
    """Calm steps in a row after which safe mode winds down."""
    ramp_steps: int = 5
    """Steps over which the learning rate and threshold climb back (a jump back to the
    full rate blew one layer's gradient up 40x in a tiny run)."""
    loss_rise: float = 1.2
    """A loss this many times its recent median means the forward pass was not normal."""

    def __post_init__(self) -> None:
        p = "stability.surgery."
        for name in ("window", "remember_every", "dropout_steps", "calm_steps", "ramp_steps"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{p}{name} must be >= 1, got {getattr(self, name)}")
        for name in ("dropout_share", "safe_lr", "safe_clip"):
            if not 0 < getattr(self, name) <= 1:
                raise ConfigError(f"{p}{name} must be in (0, 1], got {getattr(self, name)}")
        for name in ("calm_factor", "loss_rise"):
            if not getattr(self, name) > 1:
                raise ConfigError(f"{p}{name} must be > 1, got {getattr(self, name)}")


@dataclass(slots=True)
class _Safe:
    layer: str
    started: int
    dropout_left: int
    calm: int = 0
    ramp: int = 0  # steps into the way back to the full rate
    rows: dict[int, list[int]] = field(default_factory=dict)  # param index -> frozen rows


class GradientSurgeon:
    """Keeps each layer's recent gradients and operates on a swung one."""

    def __init__(self, config: SurgeryConfig, layers: dict[str, list[torch.nn.Parameter]]):
        self.config = config
        self.layers = layers
        self.window: dict[str, deque[torch.Tensor]] = {
            name: deque(maxlen=config.window) for name in layers
        }
        self.losses: deque[float] = deque(maxlen=20)
        self.safe: _Safe | None = None
        self._good = 0  # good steps seen, to keep one in ``remember_every``

    # -- what it remembers -------------------------------------------------------------

    def remember(self, loss: float) -> None:
        """A good step: keep its loss, and one in ``remember_every`` its gradients (after
        unscaling, before clipping)."""
        self.losses.append(loss)
        self._good += 1
        if self._good % self.config.remember_every and not self._filling:
            return
        for name, params in self.layers.items():
            flat = _flat(params)  # a new tensor: the gradients themselves stay untouched
            if flat is not None:
                self.window[name].append(flat.detach())

    @property
    def _filling(self) -> bool:
        """Fewer than 2 gradients kept: every good step counts until there are."""
        return any(len(w) < 2 for w in self.window.values())

    def forward_was_normal(self, loss: float) -> bool:
        """The step's loss is not above ``loss_rise`` times its recent median."""
        if len(self.losses) < 3:
            return False
        return loss <= self.config.loss_rise * statistics.median(self.losses)

    def can_operate(self, layer: str) -> bool:
        """Enough recent gradients of ``layer`` to tell its normal directions (2)."""
        return len(self.window.get(layer, ())) >= 2

    # -- the operation -----------------------------------------------------------------

    def operate(self, layer: str, median_norm: float, step: int) -> dict[str, Any]:
        """Project the anomalous direction out of ``layer``'s gradient, freeze the rows that
        carried it, enter safe mode; returns the figures for the claim."""
        params = [p for p in self.layers[layer] if p.grad is not None]
        g = _flat(params)
        assert g is not None
        basis, _ = torch.linalg.qr(torch.stack(list(self.window[layer])).T)  # (n, k)
        broken = self._rows_not_finite(params)
        masked = g.clone()
        self._cut(params, masked, broken)
        masked = torch.nan_to_num(masked, nan=0.0, posinf=0.0, neginf=0.0)  # 1-D leftovers
        anomalous = masked - basis @ (basis.T @ masked)
        # Non-finite rows are the anomaly; otherwise the rows carrying most of it.
        rows = broken or self._rows_to_freeze(params, anomalous)
        self._cut(params, masked, rows)
        kept = basis @ (basis.T @ masked)
        before, after = float(g.norm()), float(kept.norm())  # before: may be inf or NaN
        if after > median_norm > 0:
            kept *= median_norm / after
        offset = 0
        for p in params:
            assert p.grad is not None
            n = p.grad.numel()
            p.grad.copy_(kept[offset : offset + n].view_as(p.grad))
            offset += n
        index = {id(p): i for i, p in enumerate(self.layers[layer])}
        frozen = {index[id(p)]: r for p, r in rows.items()}
        self.safe = _Safe(layer, step, self.config.dropout_steps, rows=frozen)
        self.apply_dropout()
        return {
            "layer": layer,
            "grad_norm": before,
            "anomalous_share": (
                float(anomalous.norm()) / float(masked.norm()) if float(masked.norm()) > 0 else 0.0
            ),
            "non_finite_rows": sum(len(r) for r in broken.values()),
            "kept_norm": float(kept.norm()),
            "median_norm": median_norm,
            "window": len(self.window[layer]),
            "rows_frozen": sum(len(r) for r in frozen.values()),
        }

    def _rows_to_freeze(
        self, params: list[torch.nn.Parameter], anomalous: torch.Tensor
    ) -> dict[torch.nn.Parameter, list[int]]:
        rows: dict[torch.nn.Parameter, list[int]] = {}
        offset = 0
        for p in params:
            n = p.numel()
            part = anomalous[offset : offset + n]
            offset += n
            if p.dim() < 2:
                continue
            energy = part.view(p.shape[0], -1).norm(dim=1)
            k = max(1, int(self.config.dropout_share * p.shape[0]))
            rows[p] = sorted(torch.topk(energy, k).indices.tolist())
        return rows

    @staticmethod
    def _rows_not_finite(params: list[torch.nn.Parameter]) -> dict[torch.nn.Parameter, list[int]]:
        rows: dict[torch.nn.Parameter, list[int]] = {}
        for p in params:
            assert p.grad is not None
            if p.dim() >= 2:
                bad = (~torch.isfinite(p.grad.view(p.shape[0], -1))).any(dim=1)
                if bool(bad.any()):
                    rows[p] = bad.nonzero().flatten().tolist()
        return rows

    @staticmethod
    def _cut(
        params: list[torch.nn.Parameter],
        flat: torch.Tensor,
        rows: dict[torch.nn.Parameter, list[int]],
    ) -> None:
        offset = 0
        for p in params:
            n = p.numel()
            if p in rows:
                flat[offset : offset + n].view(p.shape[0], -1)[rows[p]] = 0
            offset += n

    def apply_dropout(self) -> None:
        """Zero the frozen rows' gradients (while the dropout lasts)."""
        safe = self.safe
        if safe is None or safe.dropout_left <= 0:
            return
        params = self.layers[safe.layer]
        for i, rows in safe.rows.items():
            grad = params[i].grad
            if grad is not None and rows:
                grad[rows] = 0

    # -- safe mode ---------------------------------------------------------------------

    @property
    def lr_factor(self) -> float:
        """Learning-rate multiplier (safe mode lowers it, then climbs back)."""
        return self._factor(self.config.safe_lr)

    @property
    def clip_factor(self) -> float:
        """Clipping-threshold multiplier (safe mode tightens it, then eases back)."""
        return self._factor(self.config.safe_clip)

    def _factor(self, low: float) -> float:
        if self.safe is None:
            return 1.0
        climbed = self.safe.ramp / (self.config.ramp_steps + 1)
        return low + (1.0 - low) * climbed

    def end_step(self, step: int, norm: float | None, median: float | None) -> int | None:
        """Count down the dropout and the calm streak after a step; returns the steps safe
        mode lasted when it ends now, else None."""
        safe = self.safe
        if safe is None or step == safe.started:
            return None
        safe.dropout_left -= 1
        factor = self.config.calm_factor
        calm = False
        if norm is not None and median is not None:
            calm = median / factor <= norm <= median * factor
        safe.calm = safe.calm + 1 if calm else 0
        if safe.dropout_left <= 0 and (safe.ramp or safe.calm >= self.config.calm_steps):
            if not calm:  # restless again on the way back: start the calm count over
                safe.ramp = 0
            elif safe.ramp >= self.config.ramp_steps:
                self.safe = None
                return step - safe.started
            else:
                safe.ramp += 1
        return None

    @property
    def safe_layer(self) -> str | None:
        """The layer safe mode watches, when it is on."""
        return self.safe.layer if self.safe is not None else None

    def state_dict(self) -> dict[str, Any]:
        """Safe mode, for checkpoints (the gradient window is not kept: it refills)."""
        safe = self.safe
        if safe is None:
            return {"safe": None}
        return {
            "safe": {
                "layer": safe.layer,
                "started": safe.started,
                "dropout_left": safe.dropout_left,
                "calm": safe.calm,
                "ramp": safe.ramp,
                "rows": [[i, r] for i, r in safe.rows.items()],
            }
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` saved (an empty window: surgery waits until it refills)."""
        for window in self.window.values():
            window.clear()
        self.losses.clear()
        self._good = 0
        saved = state.get("safe")
        if saved is None:
            self.safe = None
            return
        self.safe = _Safe(
            str(saved["layer"]),
            int(saved["started"]),
            int(saved["dropout_left"]),
            int(saved["calm"]),
            int(saved.get("ramp", 0)),
            {int(i): [int(x) for x in r] for i, r in saved["rows"]},
        )


def _flat(params: list[torch.nn.Parameter]) -> torch.Tensor | None:
    grads = [p.grad.reshape(-1).float() for p in params if p.grad is not None]
    return torch.cat(grads) if grads else None
