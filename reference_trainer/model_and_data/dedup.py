"""Streaming duplicate filter: exact hashes plus MinHash signatures with LSH banding.

Method. A document is normalized by lowercasing and ``str.split()`` (so whitespace and case
differences vanish). Exact duplicates are caught by a 16-byte blake2b digest of the words
joined by single spaces. Near duplicates are caught with MinHash: the document's word
``shingle_size``-grams are hashed to stable uint64 values (a Rabin-Karp polynomial over the
shingle's normalized UTF-8 bytes mod 2**64, computed for the whole batch from prefix sums,
then the splitmix64 mixer; never Python's salted ``hash()``), reduced mod the prime
``p = 2**32 - 5``, and pushed through ``num_perm``
universal hash functions ``(a*x + b) mod p`` with ``a`` in [1, p), ``b`` in [0, p) drawn
from ``np.random.default_rng(seed)``. Because x, a, b < 2**32, ``a*x + b < 2**64``: the
arithmetic is exact in numpy uint64 with no overflow, and a signature fits in uint32.
A signature entry is the minimum over the document's shingles; the fraction of equal
entries between two signatures estimates their Jaccard similarity (std ~0.035 at
s=0.8 with 128 entries). A document with fewer words than ``shingle_size`` is one shingle.

LSH. The signature is cut into ``bands`` bands of ``rows`` entries; each band is hashed to
a bucket key, and each band has its own dict from key to the index slots holding it. Two
documents of Jaccard s share at least one bucket (become candidates) with probability
``1 - (1 - s**rows)**bands``, an S-curve. With bands=32, rows=4: s=0.8 -> ~1.0 (miss rate
~5e-8), s=0.5 -> ~0.87, s=0.3 -> ~0.23. More rows steepen the curve and move it right
(fewer candidates, more misses near the threshold); more bands move it left. Candidates
are always verified, so a false positive needs an estimated Jaccard >= ``threshold``;
a loose curve only costs verification time, never wrong drops.

Streaming. ``check`` drops a document that duplicates an already-kept one and otherwise
adds it to the index. The index holds at most ``max_docs`` documents; beyond that the
oldest kept entry is evicted (FIFO), so a copy of a document older than the last
``max_docs`` kept ones is no longer caught. Verdicts depend only on the sequence of
(doc_id, text) pairs and the seed, so they are reproducible across processes. Memory at
the default 200k docs: ~100 MB of signatures plus ~0.7 GB of bucket dicts (32 per doc).
With ``enabled=False`` every document is kept and nothing is hashed or indexed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

U64 = npt.NDArray[np.uint64]
U32 = npt.NDArray[np.uint32]
I64 = npt.NDArray[np.int64]

_P = 2**32 - 5  # prime; keeps a*x + b below 2**64 so uint64 arithmetic is exact
_FNV_BASIS = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)
_M = np.uint64(0x9E3779B97F4A7C15)  # odd, so invertible mod 2**64
_M_INV = np.uint64(pow(int(_M), -1, 2**64))
_CHUNK = 2048  # shingles per hashing pass: the (num_perm, chunk) block stays in cache


@dataclass(kw_only=True, slots=True)
class DedupConfig:
    """Settings of the duplicate filter; ``enabled=False`` keeps every document unindexed."""

    enabled: bool = True
    shingle_size: int = 5  # words per shingle; words = text.lower().split()
    num_perm: int = 128  # = bands * rows
    bands: int = 32
    rows: int = 4
    seed: int = 0
    threshold: float = 0.8  # estimated Jaccard at/above which a candidate is a near duplicate
    max_docs: int = 200_000  # index capacity; the oldest kept entries are evicted FIFO

    def __post_init__(self) -> None:
        if not isinstance(self.enabled, bool):
            raise ValueError(f"dedup.enabled must be a bool (got {self.enabled!r})")
        for name in ("shingle_size", "num_perm", "bands", "rows", "max_docs", "seed"):
            value = getattr(self, name)
            low = 0 if name == "seed" else 1
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"dedup.{name} must be an int >= {low} (got {value!r})")
        if self.bands * self.rows != self.num_perm:
            raise ValueError(
                "dedup.bands * dedup.rows must equal dedup.num_perm "
                f"({self.bands} * {self.rows} != {self.num_perm})"
            )
        t = self.threshold
        if isinstance(t, bool) or not isinstance(t, int | float) or not 0.0 < t <= 1.0:
            raise ValueError(f"dedup.threshold must be in (0, 1] (got {t!r})")


@dataclass(frozen=True, slots=True)
class DedupVerdict:
    """What the filter decided about one document."""

    keep: bool
    reason: str  # "unique", "exact" or "near"
    duplicate_of: int | None  # caller's doc id of the kept document it matched
    similarity: float | None  # estimated Jaccard for near matches, 1.0 for exact


_UNIQUE = DedupVerdict(keep=True, reason="unique", duplicate_of=None, similarity=None)


def _mix64(z: U64) -> U64:
    """splitmix64 finalizer: every input bit affects every output bit."""
    z = z ^ (z >> np.uint64(30))
    z = z * np.uint64(0xBF58476D1CE4E5B9)
    z = z ^ (z >> np.uint64(27))
    z = z * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _fold(columns: Sequence[U64]) -> U64:
    """FNV-1a over 64-bit symbols (one array per position), then mixed."""
    h = np.full(columns[0].shape, _FNV_BASIS, dtype=np.uint64)
    for col in columns:
        h = (h ^ col) * _FNV_PRIME  # wraps mod 2**64, as FNV intends
    return _mix64(h)


class DuplicateFilter:
    """Drops exact and near-duplicate documents of a stream, remembering what it kept."""

    def __init__(self, config: DedupConfig) -> None:
        self.config = config
        rng = np.random.default_rng(config.seed)
        self._a: U64 = rng.integers(1, _P, size=config.num_perm, dtype=np.uint64)
        self._b: U64 = rng.integers(0, _P, size=config.num_perm, dtype=np.uint64)
        self._reset()

    def _reset(self, size: int = 0) -> None:
        n = max(size, min(self.config.max_docs, 1024))  # grown by doubling up to max_docs
        self._sigs: U32 = np.empty((n, self.config.num_perm), dtype=np.uint32)
        self._ids: npt.NDArray[np.int64] = np.empty(n, dtype=np.int64)
        self._digests: list[bytes] = [b""] * n
        self._count = 0
        self._oldest = 0  # slot of the oldest entry once the index is full
        self._exact: dict[bytes, int] = {}
        # Per band: bucket key -> slot, or a list of slots when several kept docs share the
        # key (rare: kept docs are mostly dissimilar). A plain int per bucket keeps the dicts
        # free of container objects, which at 200k docs x 32 bands would cost ~2x the
        # memory and make the garbage collector rescan millions of lists.
        self._buckets: list[dict[int, int | list[int]]] = [{} for _ in range(self.config.bands)]
        self._stats = dict.fromkeys(("seen", "kept", "dropped_exact", "dropped_near", "evicted"), 0)

    # ------------------------------------------------------------------ hashing
    def _shingle_hashes(self, norms: Sequence[bytes], n_words: I64) -> tuple[U64, I64]:
        """uint64 hash of every shingle of the batch, and the number of shingles per doc."""
        k = self.config.shingle_size
        counts = np.where(n_words >= k, n_words - k + 1, np.minimum(n_words, 1))
        # Every word, the last included, ends with a space; empty docs add no bytes.
        data = np.frombuffer(b" ".join(n for n in norms if n) + b" ", dtype=np.uint8)
        ends = np.flatnonzero(data == 32)  # one per word: split() left no other spaces
        word_start = np.concatenate(([0], ends[:-1] + 1))
        # Rabin-Karp over bytes mod 2**64 with prefix sums: the hash of the byte span
        # [lo, hi) is (S[hi] - S[lo]) * M**-lo, the same wherever the span sits.
        powers = np.full(len(data), _M, dtype=np.uint64)
        powers[0] = 1
        np.cumprod(powers, out=powers)
        inverse = np.full(len(data), _M_INV, dtype=np.uint64)
        inverse[0] = 1
        np.cumprod(inverse, out=inverse)
        prefix = np.zeros(len(data) + 1, dtype=np.uint64)
        # +1 so that a NUL byte still changes the hash.
        np.cumsum((data.astype(np.uint64) + np.uint64(1)) * powers, out=prefix[1:])
        # Shingle j of a doc spans its words j .. j+k-1; a doc shorter than k is one shingle.
        firsts = np.concatenate(([0], np.cumsum(counts)[:-1]))
        doc_word = np.concatenate(([0], np.cumsum(n_words)[:-1]))
        first_word = np.arange(int(counts.sum()), dtype=np.int64)
        first_word += np.repeat(doc_word - firsts, counts)
        last_word = first_word + np.repeat(np.minimum(n_words, k) - 1, counts)
        lo, hi = word_start[first_word], ends[last_word]
        return _mix64((prefix[hi] - prefix[lo]) * inverse[lo]), counts

    def _signatures(self, norms: Sequence[bytes], n_words: I64) -> U32:
        """MinHash signatures, one row per document, computed for the whole batch at once."""
        shingles, counts = self._shingle_hashes(norms, n_words)
        x = shingles % np.uint64(_P)
        num = len(norms)
        first = np.concatenate(([0], np.cumsum(counts)[:-1]))
        # Empty documents keep the sentinel p, which no real hash value (< p) can equal.
        sigs = np.full((num, self.config.num_perm), _P, dtype=np.uint32)
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

    def _band_keys(self, sigs: U32) -> U64:
        """One uint64 bucket key per (document, band); collisions are harmless (verified)."""
        c = self.config
        cube = sigs.reshape(len(sigs), c.bands, c.rows).astype(np.uint64)
        return _fold([cube[:, :, j] for j in range(c.rows)])

    # ------------------------------------------------------------------ index
    def _position(self, slot: int) -> int:
        """Age rank of a slot (0 = oldest), independent of how slots were assigned."""
        return (slot - self._oldest) % max(self._count, 1)

    def _insert(self, doc_id: int, digest: bytes, sig: U32, keys: list[int]) -> None:
        cap = self.config.max_docs
        if self._count < cap:
            slot = self._count
            if slot == len(self._ids):
                grow = min(2 * slot, cap)
                sigs = np.empty((grow, self.config.num_perm), dtype=np.uint32)
                ids = np.empty(grow, dtype=np.int64)
                sigs[:slot], ids[:slot] = self._sigs, self._ids
                self._sigs, self._ids = sigs, ids
                self._digests.extend([b""] * (grow - slot))
            self._count += 1
        else:
            slot = self._oldest
            self._evict(slot)
            self._oldest = (slot + 1) % cap
        self._sigs[slot], self._ids[slot], self._digests[slot] = sig, doc_id, digest
        self._exact[digest] = slot
        for band, key in zip(self._buckets, keys, strict=True):
            held = band.setdefault(key, slot)
            if isinstance(held, list):
                held.append(slot)
            elif held != slot:
                band[key] = [held, slot]

    def _evict(self, slot: int) -> None:
        if self._exact.get(self._digests[slot]) == slot:
            del self._exact[self._digests[slot]]
        keys = self._band_keys(self._sigs[slot : slot + 1])[0].tolist()
        for band, key in zip(self._buckets, keys, strict=True):
            held = band[key]
            if isinstance(held, int):
                del band[key]
                continue
            held.remove(slot)
            if len(held) == 1:
                band[key] = held[0]
        self._stats["evicted"] += 1

    def _decide(self, doc_id: int, digest: bytes, sig: U32, keys: list[int]) -> DedupVerdict:
        hit = self._exact.get(digest)
        if hit is not None:
            self._stats["dropped_exact"] += 1
            return DedupVerdict(False, "exact", int(self._ids[hit]), 1.0)
        cands: set[int] = set()
        for band, key in zip(self._buckets, keys, strict=True):
            held = band.get(key)
            if isinstance(held, int):
                cands.add(held)
            elif held is not None:
                cands.update(held)
        if cands:
            # Oldest first, so argmax breaks ties toward the oldest entry whatever the slot
            # numbers are: the choice then survives a state_dict round trip.
            slots = sorted(cands, key=self._position)
            equal = np.count_nonzero(self._sigs[slots] == sig, axis=1)
            best = int(np.argmax(equal))
            sim = float(equal[best]) / self.config.num_perm
            if sim >= self.config.threshold:
                self._stats["dropped_near"] += 1
                return DedupVerdict(False, "near", int(self._ids[slots[best]]), sim)
        self._insert(doc_id, digest, sig, keys)
        self._stats["kept"] += 1
        return _UNIQUE

    # ------------------------------------------------------------------ public API
    def check(self, doc_id: int, text: str) -> DedupVerdict:
        """Verdict for one document; a kept document is added to the index."""
        return self.check_batch([(doc_id, text)])[0]

    def check_batch(self, items: Sequence[tuple[int, str]]) -> list[DedupVerdict]:
        """Verdicts for documents in order, as if ``check`` were called on each in turn."""
        self._stats["seen"] += len(items)
        if not self.config.enabled:
            self._stats["kept"] += len(items)
            return [_UNIQUE] * len(items)
        if not items:
            return []
        # Normalization: lowercase, split on any whitespace, rejoin with single spaces.
        word_lists = [text.lower().split() for _, text in items]
        norms = [" ".join(words).encode("utf-8", "surrogatepass") for words in word_lists]
        n_words = np.fromiter(map(len, word_lists), dtype=np.int64, count=len(items))
        sigs = self._signatures(norms, n_words)
        keys = self._band_keys(sigs).tolist()
        out = []
        for (doc_id, _), norm, sig, key in zip(items, norms, sigs, keys, strict=True):
            digest = hashlib.blake2b(norm, digest_size=16).digest()
            out.append(self._decide(int(doc_id), digest, sig, key))
        return out

    def stats(self) -> dict[str, int]:
        """Counters: seen, kept, dropped_exact, dropped_near, evicted, and indexed (size now)."""
        return {**self._stats, "indexed": self._count}

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue identically: numpy arrays and plain Python values."""
        order = (self._oldest + np.arange(self._count)) % max(self._count, 1)
        digests = b"".join(self._digests[i] for i in order.tolist())
        return {
            "version": 1,
            "config": asdict(self.config),
            "perm_a": self._a.copy(),
            "perm_b": self._b.copy(),
            "signatures": self._sigs[order].copy(),  # oldest first, uint32
            "doc_ids": self._ids[order].copy(),
            "digests": np.frombuffer(digests, dtype=np.uint8).reshape(-1, 16).copy(),
            "stats": dict(self._stats),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from ``state_dict()``; the signature-shaping settings must match."""
        if state.get("version") != 1:
            raise ValueError(f"unsupported dedup state version {state.get('version')!r}")
        saved, c = state["config"], self.config
        for name in ("shingle_size", "num_perm", "bands", "rows"):
            if saved[name] != getattr(c, name):
                raise ValueError(
                    f"dedup.{name} is {getattr(c, name)} but the state has "
                    f"{saved[name]}; signatures would not be comparable"
                )
        # The stored permutations win over the seed, so a numpy upgrade cannot change them.
        self._a = np.asarray(state["perm_a"], dtype=np.uint64).copy()
        self._b = np.asarray(state["perm_b"], dtype=np.uint64).copy()
        keep = slice(-c.max_docs, None)  # a smaller capacity keeps the newest entries
        sigs = np.asarray(state["signatures"], dtype=np.uint32)[keep]
        n = len(sigs)
        self._reset(n)
        self._count, self._sigs[:n] = n, sigs  # oldest first, so slot i = position i
        self._ids[:n] = np.asarray(state["doc_ids"], dtype=np.int64)[keep]
        self._digests[:n] = [d.tobytes() for d in np.asarray(state["digests"], np.uint8)[keep]]
        self._exact = {d: i for i, d in enumerate(self._digests[:n])}
        # Bulk-build each band's dict in C, then turn the rare shared keys into lists;
        # one insert at a time would take ~20 s at 200k docs.
        slots = list(range(n))
        for band, col in zip(self._buckets, self._band_keys(sigs).T, strict=True):
            band.update(zip(col.tolist(), slots, strict=True))
            uniq, inverse, counts = np.unique(col, return_inverse=True, return_counts=True)
            for shared in np.flatnonzero(counts > 1).tolist():
                band[int(uniq[shared])] = np.flatnonzero(inverse == shared).tolist()
        self._stats.update({k: int(v) for k, v in state["stats"].items()})
