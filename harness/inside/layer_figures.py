"""Per-layer figures the microscope records: which parameters and modules make a layer, their
gradient and weight norms, and the fixed-bin histogram of a layer's output.

A *layer* is what a user would name: the module path up to and including the first numbered
part (``blocks.3``, ``transformer.h.3``, ``net.0``), else the module that owns the parameter
(``transformer.wte``, ``fc1``, ``ln_f``). A trainer may name its layers itself
(`Agent.name_layers`): the reference trainer calls its token and position tables together
``embedding``, as its own diagnosis does.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from harness.records.microscope_file import LOG_EDGES, N_BINS

#: A layer's output of more values than this is binned on an evenly strided sample of about
#: this many (``log10`` is most of a histogram's cost): unless its largest magnitude is 1e8 or
#: more, or not finite, when every value is binned, so the overflow and nan/inf bins always
#: count exactly.
SAMPLE_VALUES = 4096

OVERFLOW = float(LOG_EDGES[-1])


def default_layer(param_name: str) -> str:
    """The layer of a parameter (or of a module, given ``path + ".x"``)."""
    parts = param_name.split(".")[:-1] or param_name.split(".")
    for i, part in enumerate(parts):
        if part.isdigit():
            return ".".join(parts[: i + 1])
    return ".".join(parts)


@dataclass(slots=True)
class Layers:
    """A model's layers: names in forward order, their parameters, and the top-most modules
    whose outputs are a layer's activations."""

    names: list[str]
    params: list[list[nn.Parameter]]
    modules: dict[str, list[nn.Module]]
    flat: list[nn.Parameter] = field(init=False)
    """Every layer's parameters in one list, in layer order (the norms take them at once)."""
    layer_index: np.ndarray = field(init=False)
    """The layer of each of `flat`."""

    def __post_init__(self) -> None:
        self.flat = [p for group in self.params for p in group]
        self.layer_index = np.repeat(np.arange(len(self.params)), [len(g) for g in self.params])

    @classmethod
    def of(cls, model: nn.Module, layer_of: Callable[[str], str]) -> Layers:
        """Group ``model``'s parameters (each counted once: tied weights too) by layer."""
        params: dict[str, list[nn.Parameter]] = {}
        for name, param in model.named_parameters():
            if param.requires_grad:
                params.setdefault(layer_of(name), []).append(param)
        modules: dict[str, list[nn.Module]] = {}
        covered: list[str] = []
        for path, module in model.named_modules():
            if not path:
                continue
            layer = layer_of(path + ".x")
            if layer not in params or any(path.startswith(c + ".") for c in covered):
                continue
            modules.setdefault(layer, []).append(module)
            covered.append(path)
        return cls(names=list(params), params=list(params.values()), modules=modules)


@dataclass(frozen=True, slots=True)
class ParamNorms:
    """The L2 norm of each of some parameters (or their gradients), as computed: reduced to
    one norm per layer only when asked (`per_layer`), so a step the microscope never writes
    costs one `torch._foreach_norm` and no more."""

    norms: torch.Tensor | None
    """float32, one per tensor; None when there were none."""
    layer_of: Sequence[int] | np.ndarray
    """The layer of each."""
    layers: int

    @property
    def finite(self) -> bool:
        """False when any norm is NaN or infinite."""
        return self.norms is None or math.isfinite(sum(self.norms.tolist()))

    def per_layer(self) -> np.ndarray:
        """float32 per layer: NaN for a layer with none, +inf for one with any value NaN or
        infinite."""
        out = np.full(self.layers, np.nan, dtype=np.float32)
        if self.norms is None:
            return out
        squares = np.square(self.norms.cpu().numpy().astype(np.float64))
        index = np.asarray(self.layer_of, dtype=np.int64)
        norm = np.sqrt(np.bincount(index, weights=squares, minlength=self.layers))
        norm[np.isnan(norm)] = np.inf
        present = np.bincount(index, minlength=self.layers) > 0
        out[present] = norm[present]
        return out


def grad_norms(layers: Layers) -> ParamNorms:
    """The norm of each parameter's gradient (a layer with none: NaN)."""
    grads = [p.grad for p in layers.flat]
    if all(g is not None for g in grads):
        return param_norms(grads, layers.layer_index, len(layers.names))  # type: ignore[arg-type]
    present = [
        (g, i) for g, i in zip(grads, layers.layer_index.tolist(), strict=True) if g is not None
    ]
    return param_norms([g for g, _ in present], [i for _, i in present], len(layers.names))


def weight_norms(layers: Layers) -> ParamNorms:
    """The norm of each parameter."""
    return param_norms(layers.flat, layers.layer_index, len(layers.names))


def param_norms(
    tensors: Sequence[torch.Tensor], layer_of: Sequence[int] | np.ndarray, layers: int
) -> ParamNorms:
    """`ParamNorms` of ``tensors`` (``layer_of[i]`` the layer of ``tensors[i]``): one
    `torch._foreach_norm` for all, as a step of a small model is short enough that a few
    torch calls per layer show in it."""
    if not tensors:
        return ParamNorms(None, layer_of, layers)
    with torch.no_grad():
        norms = torch._foreach_norm([t if t.dtype == torch.float32 else t.float() for t in tensors])
        try:
            stacked = torch.stack(norms)
        except RuntimeError:  # on several devices
            stacked = torch.stack([n.cpu() for n in norms])
    return ParamNorms(stacked, layer_of, layers)


def snapshot(layers: Layers) -> list[torch.Tensor]:
    """A copy of every layer's weights (for the update ratio), as `Layers.flat`."""
    with torch.no_grad():
        return [p.detach().clone() for p in layers.flat]


def update_ratios(layers: Layers, before: list[torch.Tensor]) -> np.ndarray:
    """``||w_after - w_before|| / ||w_before||`` per layer."""
    with torch.no_grad():
        diff = torch._foreach_sub([p.detach() for p in layers.flat], before)
    n, index = len(layers.names), layers.layer_index
    change = param_norms(diff, index, n).per_layer()
    base = param_norms(before, index, n).per_layer()
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio: np.ndarray = (change / base).astype(np.float32)
    ratio[~(np.isfinite(base) & (base > 0))] = np.inf
    return ratio


class OutputSamples:
    """A step's layer outputs, kept as what their histograms need and binned only when
    `counts` is asked for: the microscope asks only for the steps it writes (about one in
    ``every``), and binning all layers at once costs a few tensor operations rather than a
    dozen per layer and forward.

    An output of more than `SAMPLE_VALUES` values whose largest magnitude is finite and
    under 1e8 is kept as a float32 copy of an evenly strided sample of about that many
    values; any other output is binned at once, in full (so the overflow and nan/inf bins
    always count exactly, and no whole activation is held)."""

    def __init__(self, layers: int) -> None:
        self._counts = np.zeros((layers, N_BINS), dtype=np.int64)
        self._kept: list[tuple[int, torch.Tensor]] = []

    def add(self, index: int, output: torch.Tensor) -> None:
        """Layer ``index`` computed ``output`` (its forward may run more than once a step:
        the counts add up)."""
        x = output.detach()
        if not x.is_floating_point():
            return
        x = x.reshape(-1)
        if x.numel() > SAMPLE_VALUES:
            low, high = torch.aminmax(x)  # NaN when any value is NaN; one pass
            peak = max(-float(low), float(high))
            if not (math.isfinite(peak) and peak < OVERFLOW):
                self._counts[index] += _bin([x])[0]
                return
            # An odd stride, so a sample of a (batch, time, channels) tensor meets every
            # channel rather than the few a stride dividing the width would.
            x = x[:: max(1, x.numel() // SAMPLE_VALUES) | 1]
        self._kept.append((index, x.to(torch.float32, copy=True)))

    def counts(self) -> np.ndarray:
        """Counts of ``|output|`` per layer in the microscope's fixed bins
        (microscope_file.BIN_LABELS), int64 ``[layers, bins]``."""
        if self._kept:
            index = torch.tensor([i for i, _ in self._kept])
            sizes = torch.tensor([len(x) for _, x in self._kept])
            layers = torch.repeat_interleave(index, sizes)
            self._counts += _bin([x for _, x in self._kept], layers, len(self._counts))
            self._kept = []
        return self._counts


def _bin(
    values: list[torch.Tensor], layers: torch.Tensor | None = None, n_layers: int = 1
) -> np.ndarray:
    """Fixed-bin counts of ``|values|`` (concatenated), one row per layer of ``layers``
    (the layer index of each value; all in row 0 when None)."""
    x = torch.cat(values).float().abs() if len(values) > 1 else values[0].float().abs()
    index = torch.log10(x).mul_(2.0).add_(17.0).floor_().clamp_(1.0, 33.0)
    index = torch.where(x == 0, 0.0, index)
    index = torch.where(torch.isfinite(x), index, float(N_BINS - 1)).long()
    if layers is not None:
        index += layers.to(index.device) * N_BINS
    counts: np.ndarray = torch.bincount(index, minlength=n_layers * N_BINS).cpu().numpy()
    return counts.astype(np.int64).reshape(n_layers, N_BINS)


def histogram(output: torch.Tensor) -> np.ndarray:
    """Counts of ``|output|`` in the microscope's fixed bins (see `OutputSamples`)."""
    samples = OutputSamples(1)
    samples.add(0, output)
    counts: np.ndarray = samples.counts()[0]
    return counts
