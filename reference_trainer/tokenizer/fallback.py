"""Tokenizer fallback: a document whose tokens are too often byte fallback is tokenized
again after a stated repair, and dropped when even that does not help.

The measure. A byte-level BPE never says "unknown": what it cannot represent it spells
byte by byte. A *fallback token* is one whose bytes are not a whole UTF-8 character on their
own (a fragment of a character the vocabulary never learned: an unusual script, an emoji,
the three bytes of U+FFFD standing for broken input), or that holds a control character
(Unicode Cc other than tab, newline and carriage return) or U+FFFD; and a digit past the
``max_digit_run``-th of an unbroken run of digit tokens (digits are split one by one, so a
long run is one token per digit, the same token over and over). `FallbackProbe` finds them
from the vocabulary alone, so the same count serves the mechanism (per document) and the
step's observation (``fallback_tokens``: the token ids of the batch that reached the model).

The fallback. When a document's fallback rate (fallback tokens / tokens) is above
``threshold`` (default 0.05), its text is repaired, in this order, and encoded again:
lone surrogates (undecodable input bytes) and U+FFFD are removed; NFKC normalization (full
width and mathematical letters and digits, ligatures become plain ones); control and format
characters (Cc, Cf) are removed but tab, newline and carriage return; every run of more
than ``max_digit_run`` digits is cut to its first ``max_digit_run``. If the rate is still
above the threshold, the document is dropped: it is mostly characters the vocabulary lacks
(a script the tokenizer was not trained on) and would reach the model as byte noise.

Every document, with the mechanism on or off, first has its lone surrogates replaced by
U+FFFD (`encodable`): the tokenizer refuses a Python string that is not valid Unicode.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
from tokenizers import Tokenizer

from harness.records.events import Claim, Detected
from reference_trainer.tokenizer.keep_whole import byte_decoder

Encoder = Callable[[list[str]], list[list[int]]]
_SURROGATE = re.compile("[\ud800-\udfff]")
_KEEP_CONTROL = frozenset("\t\n\r")


@dataclass(kw_only=True, slots=True)
class FallbackConfig:
    """When a document is tokenized again with the fallback, and what counts as fallback."""

    enabled: bool = True
    threshold: float = 0.05
    """A document whose share of fallback tokens is above this is repaired and encoded
    again (and dropped when it is still above)."""
    max_digit_run: int = 32
    """Digits past this many in one unbroken run count as fallback; the repair cuts runs
    to this length."""

    def __post_init__(self) -> None:
        if not isinstance(self.enabled, bool):
            raise ValueError(
                f"stability.tokenizer_fallback.enabled must be a bool (got {self.enabled!r})"
            )
        if isinstance(self.threshold, bool) or not (
            isinstance(self.threshold, (int, float)) and 0 < self.threshold < 1
        ):
            raise ValueError(
                "stability.tokenizer_fallback.threshold must be a number in (0, 1) "
                f"(got {self.threshold!r})"
            )
        run = self.max_digit_run
        if isinstance(run, bool) or not isinstance(run, int) or run < 1:
            raise ValueError(
                f"stability.tokenizer_fallback.max_digit_run must be an int >= 1 (got {run!r})"
            )


def _is_fallback(raw: bytes) -> bool:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return True  # a fragment of a character the vocabulary does not hold whole
    return any(
        ch == "\ufffd" or (unicodedata.category(ch) == "Cc" and ch not in _KEEP_CONTROL)
        for ch in text
    )


class FallbackProbe:
    """Which token ids are byte fallback (and which are digits), from the vocabulary."""

    def __init__(self, vocab: dict[str, int], max_digit_run: int) -> None:
        decode = byte_decoder()
        size = max(vocab.values()) + 1
        self.fallback = np.zeros(size, dtype=bool)
        self.digit = np.zeros(size, dtype=bool)
        self.max_digit_run = max_digit_run
        for token, i in vocab.items():
            if not all(c in decode for c in token):
                continue  # a special token such as <|endoftext|>
            raw = bytes(decode[c] for c in token)
            self.fallback[i] = _is_fallback(raw)
            self.digit[i] = len(raw) == 1 and raw.isdigit()

    @classmethod
    def of(cls, tokenizer: Tokenizer, max_digit_run: int) -> FallbackProbe:
        """The probe of ``tokenizer``'s vocabulary."""
        return cls(tokenizer.get_vocab(with_added_tokens=True), max_digit_run)

    def mask(self, ids: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
        """Fallback tokens of ``ids`` (runs of digits are counted along the last axis)."""
        # An id outside the tokenizer's vocabulary (a bad-data fault's random ids) is no
        # byte of any text: counted as neither fallback nor digit, like <|endoftext|> (0).
        ids = np.where((ids >= 0) & (ids < len(self.fallback)), ids, 0)
        digit = self.digit[ids]
        ran = np.cumsum(digit, axis=-1)
        start = np.maximum.accumulate(np.where(digit, 0, ran), axis=-1)
        return self.fallback[ids] | (ran - start > self.max_digit_run)

    def count(self, ids: npt.NDArray[np.int64]) -> int:
        """How many of ``ids`` are fallback tokens."""
        return int(self.mask(ids).sum()) if ids.size else 0


def encodable(text: str) -> str:
    """``text`` with lone surrogates (undecodable input bytes) as U+FFFD."""
    return _SURROGATE.sub("\ufffd", text)


def repair(text: str, max_digit_run: int) -> str:
    """The fallback's repair of ``text`` (module docstring, in that order)."""
    text = _SURROGATE.sub("", text).replace("\ufffd", "")
    text = unicodedata.normalize("NFKC", text)
    text = "".join(
        ch for ch in text if ch in _KEEP_CONTROL or unicodedata.category(ch) not in ("Cc", "Cf")
    )
    return re.sub(rf"(\d{{{max_digit_run}}})\d+", r"\1", text)


@dataclass(slots=True)
class FallbackCounters:
    """What the fallback did since the last `take_counters`: per source, documents seen,
    over the threshold, re-tokenized and dropped; tokens and fallback tokens of the
    documents over the threshold before and after the repair."""

    by_source: dict[str, dict[str, int]] = field(default_factory=dict)
    tokens_before: int = 0
    fallback_before: int = 0
    tokens_after: int = 0
    fallback_after: int = 0
    #: Documents tagged by the tokenizer-stress fault, and how many of them were dropped.
    stress_docs: int = 0
    stress_dropped: int = 0

    def acted(self) -> bool:
        """Some document was over the threshold."""
        return any(c["over"] for c in self.by_source.values())


def _count(counters: FallbackCounters, source: str, name: str) -> None:
    by = counters.by_source.setdefault(
        source, {"docs": 0, "over": 0, "retokenized": 0, "dropped": 0}
    )
    by[name] += 1


class TokenFallback:
    """Encodes documents, repairing or dropping those whose fallback rate is too high."""

    def __init__(self, config: FallbackConfig, probe: FallbackProbe) -> None:
        self.config = config
        self.probe = probe
        self.counters = FallbackCounters()

    def _rate(self, ids: list[int]) -> tuple[int, int]:
        return self.probe.count(np.asarray(ids, dtype=np.int64)), len(ids)

    def encode(self, docs: Sequence[Any], encode: Encoder) -> list[list[int] | None]:
        """Token ids of each of ``docs`` (anything with .text and .source); None for a
        dropped one."""
        out: list[list[int] | None] = list(encode([doc.text for doc in docs]))
        c = self.counters
        over = []
        for i, (doc, ids) in enumerate(zip(docs, out, strict=True)):
            stress = getattr(doc, "contamination_kind", None) == "tokenizer_stress"
            c.stress_docs += stress
            _count(c, doc.source, "docs")
            bad, total = self._rate(ids or [])
            if total and bad / total > self.config.threshold:
                over.append(i)
                _count(c, doc.source, "over")
                c.fallback_before += bad
                c.tokens_before += total
        if not over:
            return out
        repaired = encode([repair(docs[i].text, self.config.max_digit_run) for i in over])
        for i, ids in zip(over, repaired, strict=True):
            doc = docs[i]
            bad, total = self._rate(ids)
            c.fallback_after += bad
            c.tokens_after += total
            _count(c, doc.source, "retokenized")
            if not total or bad / total > self.config.threshold:
                _count(c, doc.source, "dropped")
                c.stress_dropped += getattr(doc, "contamination_kind", None) == "tokenizer_stress"
                out[i] = None
            else:
                out[i] = ids
        return out

    def take_counters(self) -> FallbackCounters:
        """Counters since the last call, reset."""
        counters, self.counters = self.counters, FallbackCounters()
        return counters


def _share(part: int, whole: int) -> float:
    return part / whole if whole else 0.0


def fallback_claims(counters: FallbackCounters) -> list[Claim]:
    """The documents over the threshold this step, what the fallback did with them."""
    if not counters.acted():
        return []
    total = {k: sum(c[k] for c in counters.by_source.values()) for k in ("over", "dropped")}
    return [
        Detected(
            detector="tokenizer_fallback",
            details={
                "over": total["over"],
                "dropped": total["dropped"],
                "by_source": counters.by_source,
                "rate_before": _share(counters.fallback_before, counters.tokens_before),
                "rate_after": _share(counters.fallback_after, counters.tokens_after),
                "stress_docs": counters.stress_docs,
                "stress_dropped": counters.stress_dropped,
            },
        )
    ]
