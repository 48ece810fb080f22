"""Tier 1 of the toxicity filter: a multi-pattern scan for toxic words and phrases.

An Aho-Corasick automaton (pyahocorasick) over a lexicon of lowercase terms finds every
occurrence in one pass over the lowercased text; a hit counts only when it stands on word
boundaries (the characters either side are not letters, digits or ``_``) of the text
lowercased with its whitespace runs as single spaces (so a phrase split by a line break
still matches), so "skill" does
not hit "kill" and "idiots" does not hit "idiot" (plurals and forms are in the lexicon).
Tier 1 only flags: a flagged text goes to the classifier (tier 2), an unflagged one is
kept without it. The lexicon is deliberately broad (it holds words with benign uses, such
as "kill" or "dumb"): its misses are lost for good, its false hits only cost a classifier
call. "useless" alone is not in it, only in phrases aimed at a person: product reviews call
things useless all the time, and with the bare word tier 1 flagged 7% of clean corpus
documents, so nearly every run loaded the embedding model for nothing (docs/data.md).

`RegexMatcher` is the plain-Python baseline the benchmark compares against: one compiled
alternation of the same terms between ``\\b`` anchors, with the same answers.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

#: Terms of the default lexicon, lowercase; multi-word phrases match with single spaces.
LEXICON: tuple[str, ...] = (
    # insults
    "idiot", "idiots", "idiotic", "moron", "morons", "stupid", "dumb", "dumbest",
    "worthless", "pathetic", "loser", "losers", "clown", "fool", "fools", "imbecile",
    "you are useless", "you're useless", "you useless", "brainless", "disgusting",
    "garbage", "trash", "scum", "waste of space", "failure", "ugly", "freak", "creep",
    "jerk", "stupidest",
    # harassment
    "shut up", "get lost", "nobody wants you", "nobody likes you", "nobody cares",
    "go away", "hate you", "hate", "hates you", "everyone hates", "get out of here",
    "never come back", "kill yourself", "go die", "die",
    # threats
    "hurt you", "kill", "killing", "kill you", "watch your back", "ruin your life",
    "make you regret", "regret this", "beat you", "destroy you", "find you",
    "where you live", "coming for you", "you will pay", "smash", "punch",
)  # fmt: skip


def normalize_text(text: str) -> str:
    """Lowercase with every run of whitespace as one space: what tier 1 scans."""
    return " ".join(text.lower().split())


def _is_word_char(ch: str) -> bool:
    return ch.isalnum() or ch == "_"


@dataclass(frozen=True, slots=True)
class Hit:
    """One lexicon term found in a text: character span [start, end) and the term."""

    start: int
    end: int
    term: str


def _normalize(terms: Iterable[str]) -> list[str]:
    out = sorted({" ".join(t.lower().split()) for t in terms})
    if not out or any(not t for t in out):
        raise ValueError("toxicity.lexicon must hold at least one non-empty term")
    return out


class PatternMatcher:
    """pyahocorasick automaton over the lexicon, with word-boundary checks."""

    def __init__(self, terms: Sequence[str] = LEXICON) -> None:
        import ahocorasick  # the `pyahocorasick` package (a core dependency)

        self.terms = _normalize(terms)
        automaton = ahocorasick.Automaton()
        for term in self.terms:
            automaton.add_word(term, term)
        automaton.make_automaton()
        self._automaton = automaton

    def hits(self, text: str) -> list[Hit]:
        """Every lexicon term on word boundaries in ``text``, in order of where it ends;
        spans index `normalize_text(text)`."""
        low = normalize_text(text)
        out = []
        for end, term in self._automaton.iter(low):
            start = end - len(term) + 1
            if start > 0 and _is_word_char(low[start - 1]):
                continue
            if end + 1 < len(low) and _is_word_char(low[end + 1]):
                continue
            out.append(Hit(start, end + 1, term))
        return out

    def flags(self, text: str) -> bool:
        """Whether ``text`` holds any lexicon term on word boundaries."""
        return bool(self.hits(text))


class RegexMatcher:
    """The baseline: one ``re`` alternation of the lexicon between word boundaries."""

    def __init__(self, terms: Sequence[str] = LEXICON) -> None:
        self.terms = _normalize(terms)
        # Longest first, so a phrase wins over a word it starts with.
        alternation = "|".join(re.escape(t) for t in sorted(self.terms, key=len, reverse=True))
        self._pattern = re.compile(rf"\b(?:{alternation})\b")

    def flags(self, text: str) -> bool:
        """Whether ``text`` holds any lexicon term on word boundaries."""
        return self._pattern.search(normalize_text(text)) is not None
