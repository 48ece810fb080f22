"""``-k EXPR``: choose scenarios by words, as pytest's ``-k`` does.

``EXPR`` is words joined by ``and``, ``or``, ``not`` and parentheses; a word matches a
scenario when it is a case-insensitive substring of its name, its fault class or one of
its fault kinds.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterable
from typing import NoReturn

from harness.errors import TightropeError

_TOKEN = re.compile(r"\(|\)|[^\s()]+")
_OPERATORS = {"and", "or", "not", "(", ")"}


class KeywordError(TightropeError):
    """A ``-k`` expression that cannot be read."""


#: The longest ``-k`` expression read, and how deep its parentheses and ``not``s may nest.
MAX_LENGTH = 10_000
MAX_DEPTH = 100


def keyword_match(expr: str, words: Iterable[str]) -> bool:
    """True when ``expr`` holds for a scenario described by ``words``."""
    if len(expr) > MAX_LENGTH:
        raise KeywordError(f"-k expression of {len(expr)} characters; at most {MAX_LENGTH}")
    haystack = [w.lower() for w in words]
    tokens = _TOKEN.findall(expr)
    if not tokens:
        raise KeywordError(f"-k {expr!r}: empty expression")
    for left, right in itertools.pairwise(tokens):
        # Two words, or a word and "(", side by side read as neither and nor or.
        if left not in _OPERATORS - {")"} and right not in _OPERATORS - {"("}:
            raise KeywordError(f"-k {expr!r}: {left!r} and {right!r} need and/or between them")
    parser = _Parser(expr, tokens, lambda word: any(word.lower() in w for w in haystack))
    return parser.parse()


class _Parser:
    """Recursive descent over ``or`` > ``and`` > ``not`` > word or parentheses; nothing
    the user typed is evaluated as code, and nesting is bounded."""

    def __init__(self, expr: str, tokens: list[str], word: Callable[[str], bool]) -> None:
        self.expr, self.tokens, self.word, self.at = expr, tokens, word, 0

    def parse(self) -> bool:
        value = self._or(0)
        if self.at != len(self.tokens):
            self._fail(f"unexpected {self.tokens[self.at]!r}")
        return value

    def _fail(self, why: str) -> NoReturn:
        raise KeywordError(
            f"-k {self.expr[:80]!r}: {why}; expected words joined by and, or, not and parentheses"
        )

    def _peek(self) -> str | None:
        return self.tokens[self.at] if self.at < len(self.tokens) else None

    def _or(self, depth: int) -> bool:
        value = self._and(depth)
        while self._peek() == "or":
            self.at += 1
            value = self._and(depth) or value
        return value

    def _and(self, depth: int) -> bool:
        value = self._not(depth)
        while self._peek() == "and":
            self.at += 1
            value = self._not(depth) and value
        return value

    def _not(self, depth: int) -> bool:
        if depth > MAX_DEPTH:
            self._fail(f"nested more than {MAX_DEPTH} deep")
        token = self._peek()
        if token is None:
            self._fail("it ends too early")
        self.at += 1
        if token == "not":
            return not self._not(depth + 1)
        if token == "(":
            value = self._or(depth + 1)
            if self._peek() != ")":
                self._fail("a '(' is never closed")
            self.at += 1
            return value
        if token in _OPERATORS:
            self._fail(f"unexpected {token!r}")
        return self.word(token)
