"""Stable shingle hashes, the band-key fold, and the numpy MinHash backend (the reference).

Shingles: a document's word ``k``-grams are hashed to stable uint64 values, a Rabin-Karp
polynomial over the shingle's normalized UTF-8 bytes mod 2**64 (computed for the whole batch
from prefix sums), then the splitmix64 mixer; never Python's salted ``hash()``. Both
backends take these hashes. The numpy backend reduces them mod the prime ``p = 2**32 - 5``
and pushes them through ``num_perm`` universal hash functions ``(a*x + b) mod p`` with
``a`` in [1, p), ``b`` in [0, p) drawn from ``np.random.default_rng(seed)``; because
x, a, b < 2**32, ``a*x + b < 2**64``, so the arithmetic is exact in numpy uint64.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

U64 = npt.NDArray[np.uint64]
U32 = npt.NDArray[np.uint32]
I64 = npt.NDArray[np.int64]

_P = 2**32 - 5  # prime; keeps a*x + b below 2**64 so uint64 arithmetic is exact
FNV_BASIS = np.uint64(0xCBF29CE484222325)
FNV_PRIME = np.uint64(0x100000001B3)
_M = np.uint64(0x9E3779B97F4A7C15)  # odd, so invertible mod 2**64
_M_INV = np.uint64(pow(int(_M), -1, 2**64))
_CHUNK = 2048  # shingles per hashing pass: the (num_perm, chunk) block stays in cache


def mix64(z: U64) -> U64:
    """splitmix64 finalizer: every input bit affects every output bit."""
    z = z ^ (z >> np.uint64(30))
    z = z * np.uint64(0xBF58476D1CE4E5B9)
    z = z ^ (z >> np.uint64(27))
    z = z * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


class _Powers:
    """M**i, M**-i and sum(M**j for j < i) mod 2**64: constants, computed once per process
    and grown by doubling (a new filter would otherwise pay for them on its first batch)."""

    powers: U64 = np.ones(0, dtype=np.uint64)
    inverse: U64 = np.ones(0, dtype=np.uint64)
    sums: U64 = np.zeros(1, dtype=np.uint64)  # one longer: sums[i] sums the first i powers

    @classmethod
    def at_least(cls, n: int) -> type[_Powers]:
        """The class itself, its arrays now at least ``n`` long."""
        if len(cls.powers) < n:
            size = max(n, 2 * len(cls.powers), 1 << 16)
            powers = np.full(size, _M, dtype=np.uint64)
            powers[0] = 1
            np.cumprod(powers, out=powers)
            inverse = np.full(size, _M_INV, dtype=np.uint64)
            inverse[0] = 1
            np.cumprod(inverse, out=inverse)
            sums = np.zeros(size + 1, dtype=np.uint64)
            np.cumsum(powers, out=sums[1:])
            cls.powers, cls.inverse, cls.sums = powers, inverse, sums
        return cls


def fold(columns: Sequence[U64], start: U64) -> U64:
    """FNV-1a over 64-bit symbols (one array per position) from ``start``, then mixed."""
    h = start
    for col in columns:
        h = (h ^ col) * FNV_PRIME  # wraps mod 2**64, as FNV intends
    return mix64(h)


def shingle_hashes(norms: Sequence[bytes], n_words: I64, k: int) -> tuple[U64, I64]:
    """uint64 hash of every ``k``-word shingle of the batch (``norms``: normalized documents,
    words joined by single spaces; ``n_words``: their word counts), and the number of
    shingles per document."""
    counts = np.where(n_words >= k, n_words - k + 1, np.minimum(n_words, 1))
    # Every word, the last included, ends with a space; empty docs add no bytes.
    data = np.frombuffer(b" ".join(n for n in norms if n) + b" ", dtype=np.uint8)
    ends = np.flatnonzero(data == 32)  # one per word: split() left no other spaces
    word_start = np.concatenate(([0], ends[:-1] + 1))
    # Rabin-Karp over bytes mod 2**64 with prefix sums: the hash of the byte span
    # [lo, hi) is (S[hi] - S[lo]) * M**-lo, the same wherever the span sits.
    rk = _Powers.at_least(len(data))
    # S[i] = sum((byte_j + 1) * M**j for j < i), the +1 so that a NUL byte still changes
    # the hash; kept as the byte part C here plus the cached sums of powers, added below
    # only where a shingle starts or ends.
    prefix = np.zeros(len(data) + 1, dtype=np.uint64)
    np.multiply(data, rk.powers[: len(data)], out=prefix[1:])
    np.cumsum(prefix[1:], out=prefix[1:])
    # Shingle j of a doc spans its words j .. j+k-1; a doc shorter than k is one shingle.
    firsts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    doc_word = np.concatenate(([0], np.cumsum(n_words)[:-1]))
    first_word = np.arange(int(counts.sum()), dtype=np.int64)
    first_word += np.repeat(doc_word - firsts, counts)
    last_word = first_word + np.repeat(np.minimum(n_words, k) - 1, counts)
    lo, hi = word_start[first_word], ends[last_word]
    span = (prefix[hi] - prefix[lo]) + (rk.sums[hi] - rk.sums[lo])
    return mix64(span * rk.inverse[lo]), counts


class NumpySigner:
    """MinHash signatures by universal hashing mod p in numpy uint64."""

    def __init__(self, num_perm: int, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.num_perm = num_perm
        self._a: U64 = rng.integers(1, _P, size=num_perm, dtype=np.uint64)
        self._b: U64 = rng.integers(0, _P, size=num_perm, dtype=np.uint64)

    def signatures(self, shingles: U64, counts: I64) -> U32:
        """One uint32 row per document; a document without shingles is all p."""
        x = shingles % np.uint64(_P)
        num = len(counts)
        first = np.concatenate(([0], np.cumsum(counts)[:-1]))
        # Empty documents keep the sentinel p, which no real hash value (< p) can equal.
        sigs = np.full((num, self.num_perm), _P, dtype=np.uint32)
        d = 0
        while d < num:
            # Group whole documents into ~_CHUNK shingles so reduceat needs no stitching.
            end = int(np.searchsorted(first, first[d] + _CHUNK, side="right"))
            end = max(end, d + 1)
            lo, hi = int(first[d]), int(first[end - 1] + counts[end - 1])
            if hi > lo:
                # Permutations along rows: reduceat then runs over contiguous memory (~10x
                # faster than reducing along axis 0 of the transposed layout).
                y = np.multiply.outer(self._a, x[lo:hi])
                y += self._b[:, None]
                # y - (y // p) * p: numpy divides by a scalar with libdivide (multiply and
                # shift), which beats the hardware division behind np.remainder.
                q = y // np.uint64(_P)
                q *= np.uint64(_P)
                y -= q
                nz = np.flatnonzero(counts[d:end] > 0)  # reduceat mishandles empty segments
                mins = np.minimum.reduceat(y, first[d:end][nz] - lo, axis=1)
                sigs[d + nz] = mins.T.astype(np.uint32)
            d = end
        return sigs

    def state(self) -> dict[str, Any]:
        """The permutations themselves, for a saved filter state."""
        return {"perm_a": self._a.copy(), "perm_b": self._b.copy()}

    @classmethod
    def restore(cls, num_perm: int, seed: int, state: dict[str, Any]) -> NumpySigner:
        """A signer with a saved state's permutations (they win over the seed, so a numpy
        upgrade cannot change them)."""
        signer = cls(num_perm, seed)
        signer._a = np.asarray(state["perm_a"], dtype=np.uint64).copy()
        signer._b = np.asarray(state["perm_b"], dtype=np.uint64).copy()
        return signer
