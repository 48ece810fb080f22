"""Keep very frequent words whole: after the BPE is trained, every word of the tokenizer's
training documents seen at least ``keep_whole_min_count`` times becomes one token.

Words. A word is one piece of the tokenizer's own pre-tokenizer (digits one by one,
punctuation alone, byte-level pieces with their leading space), holding at least one letter:
exactly the units the BPE merges within, so " the" and "the" are two words.

Threshold. The design keeps words seen more than 1e6 times whole in a web-scale corpus of
~1e10 words, a relative frequency of 1e-4. Scaled to the corpus the tokenizer is trained on,
the default is ``max(50, 1e-4 * words counted)`` (`scaled_min_count`); 50 keeps a tiny
corpus from making every word that appears a few dozen times a token. A positive
``keep_whole_min_count`` sets the count itself; 0 switches the step off.

How. BPE merges are ranked, and a word ends as the pieces no merge joins. For each frequent
word still in several pieces, merges that join its pieces left to right are appended after
the trained ones (so they act only where no trained merge does), each adding at most one
token. The vocabulary holds at most ``vocab_size`` tokens: a new token takes a free id, or
one given back by a trained token used fewer than ``min_count`` times in the training
documents (rarer than any word kept whole, so no document grows longer), the least used
first, never a piece of a frequent word nor a token a remaining merge still joins (no
frequent word's pieces move); ids are renumbered without gaps (`<|endoftext|>` stays 0).
Joining one word can change another's pieces, so the words are checked again, for a few
passes. At most ``vocab_size // 8`` tokens are spent, most frequent words first; the words
left split are in `KeptWhole.left_split`.

Measured (tiny preset: 1000 documents, 230,400 words, vocab 2048; the threshold is 50):
the trained BPE already holds whole every word seen 75 times or more; the 148 words seen
50 to 74 times stay split, because every token it could give back is used at least 75
times: keeping them whole would lengthen the documents. The step then changes nothing,
and it guarantees the property wherever the vocabulary has room for it.
"""

from __future__ import annotations

import functools
import json
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from tokenizers import Tokenizer

#: The design's threshold (1e6 occurrences) over its corpus (1e10 words).
DESIGN_FREQUENCY = 1e6 / 1e10
#: The smallest scaled threshold.
MIN_COUNT_FLOOR = 50
#: The tokenizer's pre-tokenizer (bpe.py) in two regexes: each digit and each
#: punctuation mark alone, then the byte-level split of what lies between (letters with at
#: most one leading space, whitespace). tests/test_token_fallback.py checks it against the
#: real one on the corpus.
_ISOLATED = re.compile(r"(\d|[^\w\s]|_)")
_BYTE_LEVEL = re.compile(r" ?[^\W\d_]+|\s+(?!\S)|\s+")
_PASSES = 12  # giving tokens back and joining change other words' pieces; a few passes settle it


@dataclass(kw_only=True, slots=True)
class TokenizerConfig:
    """How the BPE tokenizer is built beyond its size."""

    keep_whole_min_count: int | None = None
    """Words seen at least this many times in the tokenizer's training documents become one
    token each. None: scaled to the corpus, ``max(50, 1e-4 * words)``; 0: off."""

    def __post_init__(self) -> None:
        value = self.keep_whole_min_count
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 0
        ):
            raise ValueError(
                "data.tokenizer.keep_whole_min_count must be null or an integer >= 0 "
                f"(got {value!r})"
            )


@dataclass(frozen=True, slots=True)
class KeptWhole:
    """What `keep_whole` did: the threshold, the words counted, the frequent words, those it
    joined, how many trained tokens it gave back and the frequent words left split."""

    min_count: int
    words_counted: int
    frequent: tuple[str, ...]
    joined: tuple[str, ...] = ()
    given_back: int = 0
    left_split: tuple[str, ...] = ()


def scaled_min_count(words: int) -> int:
    """The default threshold for a corpus of ``words`` words."""
    return max(MIN_COUNT_FLOOR, round(DESIGN_FREQUENCY * words))


def count_pieces(texts: Iterable[str]) -> Counter[str]:
    """How often each piece of the tokenizer's pre-tokenizer occurs in ``texts``, in
    byte-level characters (the pre-tokenizer's own call is ~10x slower)."""
    raw: Counter[str] = Counter()
    for text in texts:
        for i, part in enumerate(_ISOLATED.split(text)):
            if i % 2:
                raw[part] += 1
            elif part:
                raw.update(_BYTE_LEVEL.findall(part))
    encode = byte_encoder()
    return Counter({"".join(encode[b] for b in p.encode()): n for p, n in raw.items()})


def is_word(piece: str) -> bool:
    """A piece with a letter in it (in byte-level characters, as the BPE sees it)."""
    decode = byte_decoder()
    raw = bytes(decode[c] for c in piece if c in decode).decode("utf-8", errors="ignore")
    return any(c.isalpha() for c in raw)


@functools.cache
def byte_encoder() -> dict[int, str]:
    """Byte -> the byte-level alphabet character standing for it (GPT-2's mapping)."""
    return {b: c for c, b in byte_decoder().items()}


@functools.cache
def byte_decoder() -> dict[str, int]:
    """Byte-level alphabet character -> the byte it stands for (GPT-2's mapping)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = list(printable)
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


def _model(tokenizer: Tokenizer) -> dict[str, Any]:
    model: dict[str, Any] = json.loads(tokenizer.to_str())["model"]
    model["merges"] = [
        tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in model["merges"]
    ]
    return model


def _rebuild(
    tokenizer: Tokenizer, vocab: dict[str, int], merges: list[tuple[str, str]]
) -> Tokenizer:
    data = json.loads(tokenizer.to_str())
    data["model"]["vocab"] = vocab
    data["model"]["merges"] = [list(m) for m in merges]
    return Tokenizer.from_str(json.dumps(data))


def _pieces(tokenizer: Tokenizer, word: str) -> list[str]:
    return [t.value for t in tokenizer.model.tokenize(word)]


def _joins(pieces: list[str]) -> list[tuple[str, str]]:
    """The merges that join ``pieces`` left to right: (p0, p1), (p0p1, p2), ..."""
    steps = []
    prefix = pieces[0]
    for piece in pieces[1:]:
        steps.append((prefix, piece))
        prefix += piece
    return steps


def _plan(
    tokenizer: Tokenizer, words: list[str], vocab: dict[str, int], limit: int
) -> tuple[list[tuple[str, str]], set[str], list[str]]:
    """The merges that join ``words`` (most frequent first) with at most ``limit`` new
    tokens: the merges, the new tokens, the words they join."""
    plan: list[tuple[str, str]] = []
    new: set[str] = set()
    chosen: list[str] = []
    for word in words:
        steps = _joins(_pieces(tokenizer, word))
        fresh = {a + b for a, b in steps if a + b not in vocab} - new
        if len(new) + len(fresh) > limit:
            continue  # the rest stay split
        plan += [s for s in steps if s not in plan]
        new |= fresh
        chosen.append(word)
    return plan, new, chosen


def _prune(
    vocab: dict[str, int],
    merges: list[tuple[str, str]],
    count: int,
    spare: set[str],
    usage: Counter[str],
    below: int,
) -> int:
    """Take back up to ``count`` trained tokens, the least used first, only those used fewer
    than ``below`` times, that no remaining merge joins and that are not in ``spare``;
    renumber the ids without gaps; how many went."""
    inputs = Counter(t for pair in merges for t in pair)
    made = Counter(a + b for a, b in merges)
    leaves = [
        (usage[a + b], i)
        for i, (a, b) in enumerate(merges)
        if a + b not in spare and not inputs[a + b] and made[a + b] == 1 and usage[a + b] < below
    ]
    gone = sorted(i for _, i in sorted(leaves)[:count])
    for i in reversed(gone):
        a, b = merges.pop(i)
        del vocab[a + b]
    for new_id, token in enumerate(sorted(vocab, key=vocab.__getitem__)):
        vocab[token] = new_id
    return len(gone)


def _usage(tokenizer: Tokenizer, counts: Counter[str]) -> Counter[str]:
    """How often each token occurs in the training documents (from their word counts)."""
    usage: Counter[str] = Counter()
    for word, n in counts.items():
        for piece in _pieces(tokenizer, word):
            usage[piece] += n
    return usage


def keep_whole(
    tokenizer: Tokenizer, texts: Iterable[str], vocab_size: int, config: TokenizerConfig
) -> tuple[Tokenizer, KeptWhole]:
    """``tokenizer`` with every frequent word of ``texts`` one token, at most ``vocab_size``."""
    counts = count_pieces(texts)
    words = sum(n for w, n in counts.items() if is_word(w))
    min_count = config.keep_whole_min_count
    if min_count is None:
        min_count = scaled_min_count(words)
    if min_count == 0:
        return tokenizer, KeptWhole(0, words, ())
    frequent = tuple(w for w, n in counts.most_common() if n >= min_count and is_word(w))
    if all(len(_pieces(tokenizer, w)) == 1 for w in frequent):
        return tokenizer, KeptWhole(min_count, words, frequent)
    model = _model(tokenizer)
    vocab: dict[str, int] = dict(model["vocab"])
    merges: list[tuple[str, str]] = list(model["merges"])
    budget = vocab_size // 8
    joined: list[str] = []
    spent = 0
    before = len(vocab)
    current = tokenizer
    for _ in range(_PASSES):
        split = [w for w in frequent if len(_pieces(current, w)) > 1]
        wanted = _plan(current, split, vocab, budget - spent)
        if not wanted[0]:
            break
        if len(wanted[1]) > vocab_size - len(vocab):
            # Room from the least useful trained tokens; the frequent words' pieces (and
            # the tokens the plan joins) stay, so their segmentation does not move.
            keep = {p for w in frequent for p in _pieces(current, w)}
            keep |= {t for a, b in wanted[0] for t in (a, b, a + b)}
            need = len(wanted[1]) - (vocab_size - len(vocab))
            if _prune(vocab, merges, need, keep, _usage(current, counts), min_count):
                current = _rebuild(tokenizer, vocab, merges)
        plan, new, chosen = _plan(
            current, split, vocab, min(budget - spent, vocab_size - len(vocab))
        )
        if not plan:
            break
        known = set(merges)
        for pair in plan:
            if pair not in known:
                merges.append(pair)
                known.add(pair)
            if pair[0] + pair[1] not in vocab:
                vocab[pair[0] + pair[1]] = len(vocab)
        spent += len(new)
        joined += chosen
        current = _rebuild(tokenizer, vocab, merges)
    left = tuple(w for w in frequent if len(_pieces(current, w)) > 1)
    done = tuple(dict.fromkeys(w for w in joined if w not in left))
    return current, KeptWhole(min_count, words, frequent, done, before + spent - len(vocab), left)
