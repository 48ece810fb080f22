"""``-k EXPR``: choose scenarios by words, as pytest's ``-k`` does.

``EXPR`` is words joined by ``and``, ``or``, ``not`` and parentheses; a word matches a
scenario when it is a case-insensitive substring of its name, its fault class or one of
its fault kinds.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable

from harness.errors import TightropeError

_TOKEN = re.compile(r"\(|\)|[^\s()]+")
_OPERATORS = {"and", "or", "not", "(", ")"}


class KeywordError(TightropeError):
    """A ``-k`` expression that cannot be read."""


def keyword_match(expr: str, words: Iterable[str]) -> bool:
    """True when ``expr`` holds for a scenario described by ``words``."""
    haystack = [w.lower() for w in words]
    tokens = _TOKEN.findall(expr)
    if not tokens:
        raise KeywordError(f"-k {expr!r}: empty expression")
    parts = []
    for token in tokens:
        if token in _OPERATORS:
            parts.append(token)
        else:
            parts.append(str(any(token.lower() in w for w in haystack)))
    for left, right in itertools.pairwise(tokens):
        # Two words, or a word and "(", side by side would read as a call or a syntax error.
        if left not in _OPERATORS - {")"} and right not in _OPERATORS - {"("}:
            raise KeywordError(f"-k {expr!r}: {left!r} and {right!r} need and/or between them")
    # Only True/False, and/or/not and parentheses reach eval: nothing a user typed runs.
    try:
        return bool(eval(" ".join(parts), {"__builtins__": {}}, {}))
    except SyntaxError:
        raise KeywordError(
            f"-k {expr!r} is not an expression of words, and, or, not and parentheses"
        ) from None
