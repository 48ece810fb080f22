"""Configuration of a reference-trainer run: the components' own configs (the model's, the
optimizer's, the data stream's, the stability mechanisms') composed, and the named presets."""

from __future__ import annotations

import dataclasses
import json
import os
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from harness.run_layout import RunLayout
from reference_trainer.errors import ConfigError
from reference_trainer.model.gpt import GPTConfig
from reference_trainer.model.optim import OptimConfig
from reference_trainer.model.stable_embedding import wants_stable_embedding
from reference_trainer.stability.mechanisms import StabilityConfig
from reference_trainer.stream.data import DataConfig

T = TypeVar("T")

PRECISIONS = ("fp32", "bf16", "fp16")


@dataclass(kw_only=True, slots=True)
class TrainConfig:
    """Everything that decides what a run computes."""

    preset: str
    model: GPTConfig
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    stability: StabilityConfig = field(default_factory=StabilityConfig)
    steps: int = 200
    """Train until this many optimizer steps are done."""
    batch_size: int = 8
    """Sequences per rank per micro-step."""
    grad_accum: int = 1
    """Micro-steps accumulated per optimizer step."""
    precision: str = "fp32"
    """fp32, bf16 (autocast) or fp16 (autocast plus dynamic loss scaling)."""
    seed: int = 0
    """Seed of model initialization and every random draw of training."""
    checkpoint_every: int = 20
    """Save a full checkpoint every this many steps (and at the last step)."""
    checkpoint_every_tokens: int = 0
    """When > 0, replaces `checkpoint_every`: save at the first step boundary at or after
    each multiple of this many trained tokens (all ranks; and at the last step)."""
    keep_checkpoints: int = 3
    """Complete checkpoints kept on disk; older ones are deleted after a save."""
    log_every: int = 10
    """Print a progress line every this many steps (rank 0 only)."""

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise ConfigError(
                f"precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}"
            )
        for name in ("steps", "batch_size", "grad_accum", "checkpoint_every", "log_every"):
            _positive(name, getattr(self, name))
        _positive("keep_checkpoints", self.keep_checkpoints)
        every_tokens = self.checkpoint_every_tokens
        if not (isinstance(every_tokens, int) and every_tokens >= 0):
            raise ConfigError(
                f"checkpoint_every_tokens must be an integer >= 0 (0: every checkpoint_every "
                f"steps), got {every_tokens!r}"
            )
        self.data.batching.check_fits(self.model.block_size)
        self._check_opt_ins()

    def enable(self, name: str) -> None:
        """Switch on one opt-in by its name (`harness.mechanisms.OPT_IN`): dynamic batching
        here, the stability mechanisms' own in `StabilityConfig.enable`."""
        if name == "dynamic_batching":
            self.data.batching.enabled = True
        else:
            self.stability.enable(name)
        self._check_opt_ins()

    def _check_opt_ins(self) -> None:
        # Quality sampling reads each token's source from the fixed-window stream; the packed
        # stream of dynamic batching does not carry it yet.
        if self.data.batching.enabled and self.stability.quality_sampling.enabled:
            raise ConfigError(
                "dynamic_batching and quality_sampling cannot be enabled together (quality "
                "sampling needs the fixed-window stream's per-token sources)"
            )
        if self.data.batching.enabled and self.stability.hard_samples.enabled:
            raise ConfigError(
                "dynamic_batching and hard_sample_weighting cannot be enabled together (hard-"
                "sample weighting weighs the fixed-window stream's samples)"
            )
        if self.data.batching.enabled and self.stability.adaptive_batch.enabled:
            raise ConfigError(
                "dynamic_batching and adaptive_batch cannot be enabled together (dynamic "
                "batching sets its own micro-batches under a token budget)"
            )

    def model_config(self) -> GPTConfig:
        """The model's shape with the optimizer-dependent defaults settled (a stable token
        embedding for adamw8bit unless ``model.stable_embedding`` says otherwise)."""
        stable = wants_stable_embedding(self.model.stable_embedding, self.optim.name)
        return dataclasses.replace(self.model, stable_embedding=stable)

    def global_batch(self, world_size: int) -> int:
        """Sequences per optimizer step over all ranks."""
        return self.batch_size * self.grad_accum * world_size

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready copy."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        """Rebuild from `to_dict` output; unknown or missing keys raise `ConfigError`."""
        dedup = data.get("stability", {}).get("dedup") if isinstance(data, dict) else None
        if isinstance(dedup, dict) and "backend" not in dedup:
            # Written before the filter had backends: its run hashed with numpy, and its
            # checkpoints hold numpy signatures, which only the numpy backend can continue.
            data = {
                **data,
                "stability": {**data["stability"], "dedup": {**dedup, "backend": "numpy"}},
            }
        return build_dataclass(cls, data, "config")

    def save(self, run_dir: Path) -> None:
        """Write the configuration to ``run_dir/config.json``: whole or not at all, even
        when the process is killed mid-write (a temporary file, fsynced, renamed)."""
        path = RunLayout(run_dir).config
        tmp = RunLayout.aside(path)
        with open(tmp, "w") as f:
            f.write(json.dumps(self.to_dict(), indent=2) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fd = os.open(run_dir, os.O_RDONLY)  # the rename itself is durable
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    @classmethod
    def load(cls, run_dir: Path) -> TrainConfig:
        """Read ``run_dir/config.json``."""
        path = RunLayout(run_dir).config
        try:
            return cls.from_dict(json.loads(path.read_text()))
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot read the run's configuration {path}: {exc}") from exc


def build_dataclass(cls: type[T], data: Any, where: str) -> T:
    """Build a (nested) config dataclass from plain data, naming the dotted path of any
    unknown key, missing field or bad value."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where} must be a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(f"{where} has unknown field(s): {', '.join(unknown)}")
    values = {}
    for name, value in data.items():
        hint = hints[name]
        if dataclasses.is_dataclass(hint):
            value = build_dataclass(hint, value, f"{where}.{name}")  # type: ignore[arg-type]
        elif typing.get_origin(hint) is tuple and isinstance(value, list):
            value = tuple(value)
        values[name] = value
    try:
        return cls(**values)
    except TypeError as exc:
        raise ConfigError(f"{where}: {exc}") from exc
    except ValueError as exc:  # validation in modules that know no ConfigError
        raise ConfigError(str(exc)) from exc


def _positive(name: str, value: int) -> None:
    if not (isinstance(value, int) and value > 0):
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")


def _tiny() -> TrainConfig:
    return TrainConfig(
        preset="tiny",
        model=GPTConfig(vocab_size=2048, block_size=64, n_layer=2, n_head=2, n_embd=64),
        data=DataConfig(tokenizer_docs=1000),
        optim=OptimConfig(base_lr=6e-3, reference_batch=8, warmup_steps=5),
        batch_size=8,
        checkpoint_every=20,
    )


def _small() -> TrainConfig:
    return TrainConfig(
        preset="small",
        model=GPTConfig(vocab_size=4096, block_size=256, n_layer=4, n_head=4, n_embd=256),
        data=DataConfig(tokenizer_docs=3000),
        optim=OptimConfig(base_lr=1e-3, reference_batch=8, warmup_steps=20),
        batch_size=8,
        checkpoint_every=100,
    )


PRESETS = {"tiny": _tiny, "small": _small}


def preset(name: str) -> TrainConfig:
    """A fresh configuration of the named preset."""
    try:
        return PRESETS[name]()
    except KeyError:
        raise ConfigError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}") from None
