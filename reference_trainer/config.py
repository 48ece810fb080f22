"""Configuration of a reference-trainer run: nested dataclasses and the named presets."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from harness.optimizers import OPTIMIZERS
from harness.run_layout import RunLayout
from reference_trainer.errors import ConfigError
from reference_trainer.model_and_data.batching_config import BatchingConfig
from reference_trainer.model_and_data.corpus import SOURCE_NAMES
from reference_trainer.model_and_data.keep_whole import TokenizerConfig
from reference_trainer.model_and_data.mixes import mix_weights
from reference_trainer.model_and_data.model import GPTConfig
from reference_trainer.model_and_data.sophia import SophiaConfig
from reference_trainer.model_and_data.stable_embedding import wants_stable_embedding
from reference_trainer.stability.mechanisms import StabilityConfig

T = TypeVar("T")

PRECISIONS = ("fp32", "bf16", "fp16")


@dataclass(kw_only=True, slots=True)
class DataConfig:
    """The built-in corpus, its tokenizer and the special-token layout of each document."""

    seed: int = 1234
    """Seed of the generated corpus (independent of the training seed)."""
    source_weights: dict[str, float] = field(default_factory=lambda: mix_weights("default"))
    """Share of documents drawn from each source; normalized, sources not named get 0
    (``--data-mix NAME`` sets a named mix: `reference_trainer.model_and_data.mixes`)."""
    tokenizer_docs: int = 1000
    """Documents from the start of the corpus used to train the BPE tokenizer."""
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    """How the tokenizer is built beyond its size (frequent words kept whole)."""
    eot_at_start: int = 1
    """`<|endoftext|>` tokens placed before each document."""
    eot_every: int = 1024
    """Inside a document, one `<|endoftext|>` after every this many tokens (0: never)."""
    eot_at_end: int = 2
    """`<|endoftext|>` tokens placed after each document."""
    batching: BatchingConfig = field(default_factory=BatchingConfig)
    """Dynamic batching of whole documents under a token budget (off: fixed windows)."""

    def __post_init__(self) -> None:
        for name, weight in self.source_weights.items():
            if name not in SOURCE_NAMES:
                raise ConfigError(
                    f"data.source_weights has unknown source {name!r}; "
                    f"expected some of {', '.join(SOURCE_NAMES)}"
                )
            if not (math.isfinite(weight) and weight >= 0):
                raise ConfigError(f"data.source_weights.{name} must be >= 0, got {weight}")
        if not any(w > 0 for w in self.source_weights.values()):
            raise ConfigError("data.source_weights must give at least one source a weight > 0")
        _positive("data.tokenizer_docs", self.tokenizer_docs)
        for name in ("eot_at_start", "eot_every", "eot_at_end"):
            if getattr(self, name) < 0:
                raise ConfigError(f"data.{name} must be >= 0, got {getattr(self, name)}")


@dataclass(kw_only=True, slots=True)
class OptimConfig:
    """AdamW with layered epsilon, warmup then cosine decay held flat for the last 20%."""

    name: str = "adamw"
    """Which optimizer: one of `harness.optimizers.OPTIMIZERS`."""
    base_lr: float = 3e-3
    """Peak learning rate at the reference batch size."""
    reference_batch: int = 8
    """Global batch (sequences) at which the peak learning rate is `base_lr`; other batch
    sizes scale it by sqrt(global_batch / reference_batch)."""
    warmup_steps: int = 10
    """Steps of linear warmup from 0 to the peak."""
    weight_decay: float = 0.1
    """Decoupled weight decay on matrices; never on norms, biases or embeddings."""
    beta1: float = 0.9
    beta2: float = 0.95
    eps_embedding: float = 1e-6
    eps_attention: float = 1e-5
    eps_feed_forward: float = 1e-4
    sophia: SophiaConfig = field(default_factory=SophiaConfig)
    """Sophia's own settings, read when `name` is ``sophia`` (docs/stability.md)."""

    def __post_init__(self) -> None:
        if self.name not in OPTIMIZERS:
            raise ConfigError(
                f"optim.name must be one of {', '.join(OPTIMIZERS)}, got {self.name!r}"
            )
        for name in ("base_lr", "eps_embedding", "eps_attention", "eps_feed_forward"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"optim.{name} must be > 0, got {getattr(self, name)}")
        _positive("optim.reference_batch", self.reference_batch)
        for name in ("warmup_steps", "weight_decay"):
            if getattr(self, name) < 0:
                raise ConfigError(f"optim.{name} must be >= 0, got {getattr(self, name)}")
        for name in ("beta1", "beta2"):
            if not 0 <= getattr(self, name) < 1:
                raise ConfigError(f"optim.{name} must be in [0, 1), got {getattr(self, name)}")


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
        tmp = path.with_name(f".{path.name}.tmp")
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
