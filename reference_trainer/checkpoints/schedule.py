"""When a run saves a checkpoint: every N steps, or every N trained tokens (at the first
step boundary at or after each multiple of N, counted over all ranks); always at the last
step. The token count is saved with every checkpoint, so a resumed run keeps its place."""

from __future__ import annotations

import argparse
import re

_SUFFIXES = {"": 1, "k": 1_000, "m": 1_000_000, "g": 1_000_000_000}


def token_count(text: str) -> int:
    """A positive token count from the command line: digits with an optional k, M or G."""
    match = re.fullmatch(r"\s*(\d+)\s*([kKmMgG]?)\s*", text)
    value = int(match.group(1)) * _SUFFIXES[match.group(2).lower()] if match else 0
    if value <= 0:
        raise argparse.ArgumentTypeError(
            f"expected a positive token count such as 2000000, 500k or 2M, got {text!r}"
        )
    return value


class SaveSchedule:
    """Which steps save: ``every_tokens`` > 0 counts tokens, otherwise ``every_steps``."""

    def __init__(self, every_steps: int, every_tokens: int, tokens: int = 0) -> None:
        self.every_steps = every_steps
        self.every_tokens = every_tokens
        #: Tokens trained by the steps done so far, over all ranks.
        self.tokens = tokens

    def due(self, step: int, tokens: int) -> bool:
        """Whether the step that trained ``tokens`` is one to save at (nothing is counted)."""
        if self.every_tokens:
            return (self.tokens + tokens) // self.every_tokens > self.tokens // self.every_tokens
        return step % self.every_steps == 0

    def after_step(self, step: int, tokens: int) -> bool:
        """Count a finished step's ``tokens``; whether the step is one to save at."""
        saved = self.due(step, tokens)
        self.tokens += tokens
        return saved
