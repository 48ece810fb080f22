"""Adaptive batch split (opt-in `adaptive_batch`): the micro-batch size and the number of
accumulated micro-batches chosen from this machine's memory headroom and measured step
time, the global batch kept: ``micro x accum x world`` is the run's configured
``batch_size x grad_accum x world``, so the windows a step trains on, the learning-rate
schedule and the loss's scale stay what they were (the loss of a step is the mean of its
micro-batches' mean losses, all of the same token count: the same mean, to float rounding).

The rule, as pure functions (`choose`): the candidates are the divisors of the per-rank
batch; one fits when its micro-batch's activations (measured per sequence) stay within the
memory limit: the headroom (the budget less what is in use: this process's resident memory
on a CPU, ``torch.cuda.mem_get_info`` on CUDA) less ``reserve``, and ``step_memory_mb``
when set. Of those that fit, the largest, unless measured step times show a smaller one
faster by more than ``time_margin``. When none fits, micro-batches of one sequence.
"""

from __future__ import annotations

import math
import os
import resource
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from reference_trainer.errors import ConfigError

PREFIX = "stability.adaptive_batch"
MB = 2**20


@dataclass(kw_only=True, slots=True)
class AdaptiveBatchConfig:
    """Micro-batch and accumulation chosen from memory headroom and step time."""

    enabled: bool = False
    """Off by default: on, it may split the step differently (same batch, float rounding)."""
    memory_budget_mb: float = 0.0
    """Memory this process may use, MiB (0: this machine's: on CUDA the device's free memory
    plus what torch holds, on a CPU the available memory shared by the ranks on the host
    plus this process's resident memory)."""
    step_memory_mb: float = 0.0
    """At most this many MiB for one micro-batch's activations (0: only the budget limits)."""
    reserve: float = 0.2
    """Share of the headroom kept free, in [0, 1)."""
    measure_time: bool = True
    """Time a step at each split that fits (on a model of the same shape, before training;
    off: the largest that fits)."""
    time_margin: float = 0.1
    """A smaller micro-batch is chosen only when its step is this much faster, in [0, 1)."""

    def __post_init__(self) -> None:
        for name in ("enabled", "measure_time"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(
                    f"{PREFIX}.{name} must be true or false, got {getattr(self, name)!r}"
                )
        for name in ("memory_budget_mb", "step_memory_mb"):
            _check(
                getattr(self, name),
                name,
                "a finite number >= 0 (0: none)",
                lambda v: 0 <= v < math.inf,
            )
        for name in ("reserve", "time_margin"):
            _check(getattr(self, name), name, "a number in [0, 1)", lambda v: 0 <= v < 1)


def _check(value: object, name: str, expected: str, ok: Any) -> None:
    good = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not (good and ok(float(value))):  # type: ignore[arg-type]
        raise ConfigError(f"{PREFIX}.{name} must be {expected}, got {value!r}")


@dataclass(frozen=True, slots=True)
class Split:
    """One way to train a rank's share of the batch: ``accum`` micro-batches of ``micro``."""

    micro: int
    accum: int


def splits(per_rank: int) -> list[Split]:
    """Every split of ``per_rank`` sequences, the smallest micro-batch first."""
    return [Split(m, per_rank // m) for m in range(1, per_rank + 1) if per_rank % m == 0]


def fitting(per_rank: int, sequence_mb: float, limit_mb: float) -> list[Split]:
    """The splits whose micro-batch's activations fit in ``limit_mb``."""
    return [s for s in splits(per_rank) if s.micro * sequence_mb <= limit_mb]


def choose(
    per_rank: int,
    sequence_mb: float,
    limit_mb: float,
    step_seconds: Mapping[int, float] | None = None,
    time_margin: float = 0.1,
) -> tuple[Split, str]:
    """The split to train with and why (``step_seconds``: micro -> measured step time)."""
    fit = fitting(per_rank, sequence_mb, limit_mb)
    if not fit:
        return Split(1, per_rank), "none fits the memory limit: one sequence per micro-batch"
    largest = fit[-1]
    timed = [s for s in fit if step_seconds and s.micro in step_seconds]
    if timed and step_seconds:
        fastest = min(timed, key=lambda s: step_seconds[s.micro])
        slowest_ok = step_seconds.get(largest.micro, math.inf) * (1 - time_margin)
        if fastest != largest and step_seconds[fastest.micro] < slowest_ok:
            return fastest, "fastest measured step among the splits that fit"
    return largest, "largest micro-batch that fits the memory limit"


@dataclass(frozen=True, slots=True)
class Memory:
    """This process's memory as the decision sees it, MiB."""

    budget: float
    used: float

    @property
    def headroom(self) -> float:
        """What is left of the budget."""
        return self.budget - self.used

    def limit(self, cfg: AdaptiveBatchConfig) -> float:
        """The memory a micro-batch's activations may take."""
        limit = max(self.headroom, 0.0) * (1 - cfg.reserve)
        return min(limit, cfg.step_memory_mb) if cfg.step_memory_mb > 0 else limit


def memory(cfg: AdaptiveBatchConfig, device: torch.device) -> Memory:
    """The budget (configured, or this machine's) and what this process uses of it."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        used = torch.cuda.memory_reserved(device) / MB
        budget = cfg.memory_budget_mb or free / MB + used
        return Memory(budget, used)
    used = resident_mb()
    if cfg.memory_budget_mb:
        return Memory(cfg.memory_budget_mb, used)
    ranks_here = max(int(os.environ.get("LOCAL_WORLD_SIZE", "1")), 1)
    return Memory(available_mb() / ranks_here + used, used)


def resident_mb() -> float:
    """This process's resident memory (Linux: /proc; elsewhere its peak so far)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / MB
    except (OSError, ValueError, IndexError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def available_mb() -> float:
    """Memory the machine can still give (MemAvailable; else its physical memory)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / MB
