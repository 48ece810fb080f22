"""How the built-in corpus's sources are written: word lists and sentence templates (one
string each, split on whitespace, commas or "|"), and `Slots`, which fills a template's
``{slots}`` with values drawn from the `random.Random` passed in."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence

# A slot is filled from a tuple (one item at random; an item holding `{slots}` is filled in
# turn, which is how compound values such as paths are built) or by a function.
Fill = tuple[str, ...] | Callable[[random.Random], str]


def words(text: str, sep: str | None = None) -> tuple[str, ...]:
    # Deduplicate so an accidental repeat in a list cannot skew the sampling odds.
    items = text.split() if sep is None else text.replace("\n", " ").split(sep)
    return tuple(dict.fromkeys(s.strip() for s in items if s.strip()))


def phrases(text: str) -> tuple[str, ...]:
    return words(text, ",")


def templates(text: str) -> tuple[str, ...]:
    # Templates are separated by "|" so that short ones can share a source line.
    return words(text, "|")


def pick(rng: random.Random, seq: Sequence[str]) -> str:
    # rng.random() is several times cheaper than rng.choice and just as reproducible.
    return seq[int(rng.random() * len(seq))]


def between(rng: random.Random, lo: int, hi: int) -> int:
    return lo + int(rng.random() * (hi - lo + 1))


def ints(lo: int, hi: int) -> Callable[[random.Random], str]:
    return lambda rng: str(between(rng, lo, hi))


def number(rng: random.Random) -> str:
    # A mix of small, power-of-two and large values, like real configs and logs.
    r = rng.random()
    if r < 0.5:
        return str(between(rng, 1, 99))
    return str(2 ** between(rng, 3, 14) if r < 0.75 else between(rng, 100, 20000))


def cap(text: str) -> str:
    return text[:1].upper() + text[1:]


class Slots:
    """Answers every `{key}` of a template with a fresh random value (or a per-document one)."""

    __slots__ = ("_fills", "_random", "_rng")

    def __init__(self, rng: random.Random, fills: Mapping[str, Fill]) -> None:
        self._rng, self._random = rng, rng.random  # the bound method saves a lookup per slot
        # A private copy, so per-document values can be pinned with `pin`.
        self._fills: dict[str, Fill | str] = dict(fills)

    def __getitem__(self, key: str) -> str:
        fill = self._fills[key]
        if isinstance(fill, tuple):
            value = fill[int(self._random() * len(fill))]
            return value.format_map(self) if "{" in value else value
        return fill if isinstance(fill, str) else fill(self._rng)

    def pin(self, key: str, value: str) -> str:
        self._fills[key] = value
        return value

    def fill(self, templates: Sequence[str]) -> str:
        return templates[int(self._random() * len(templates))].format_map(self)
