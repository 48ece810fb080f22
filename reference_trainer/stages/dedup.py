"""Streaming duplicate filter: exact hashes plus MinHash signatures with LSH banding.

Method. A document is normalized by lowercasing and ``str.split()`` (so whitespace and case
differences vanish). Exact duplicates are caught by a 16-byte blake2b digest of the words
joined by single spaces. Near duplicates are caught with MinHash: the document's word
``shingle_size``-grams are hashed to stable uint64 values (a Rabin-Karp polynomial over the
shingle's normalized UTF-8 bytes mod 2**64, computed for the whole batch from prefix sums,
then the splitmix64 mixer; never Python's salted ``hash()``), and each of ``num_perm``
permutations keeps the minimum over the document's shingles. A document with fewer words
than ``shingle_size`` is one shingle. The fraction of equal entries between two signatures
estimates their Jaccard similarity (std ~0.035 at s=0.8 with 128 entries).

Backends. Who permutes the shingle hashes is ``backend``:

- ``"rensa"`` (the default): rensa's R-MinHash in Rust (``minhash_rensa.py``) is handed the
  batch's shingle hashes as one flat uint64 buffer with row offsets, and returns uint32
  signatures; its permutations come from ``seed`` inside rensa. On the labelled stream of
  ``benchmarks/dedup.py`` the filter is 1.6-1.9x faster (CPU time) with it than with numpy at
  as good an F1 (figures in benchmarks/README.md).
- ``"numpy"``, the reference: ``(a*x + b) mod p`` with ``x`` the hash mod the prime
  ``p = 2**32 - 5`` and ``a`` in [1, p), ``b`` in [0, p) drawn from
  ``np.random.default_rng(seed)``. Because x, a, b < 2**32, ``a*x + b < 2**64``: the
  arithmetic is exact in numpy uint64 with no overflow, and a signature fits in uint32.

The two backends' signatures are not comparable, so a saved state names its backend and a
load into the other is refused (a version-1 state predates the setting and is numpy's). A
rensa state also keeps rensa's algorithm version and the signature of fixed probe hashes, so
a rensa that permutes differently is refused rather than silently mixed in.

LSH. The signature is cut into ``bands`` bands of ``rows`` entries; each band is hashed to
a bucket key (salted with the band number, so all bands share one dict from key to the
index slots holding it). Two documents of Jaccard s share at least one bucket (become
candidates) with probability ``1 - (1 - s**rows)**bands``, an S-curve. With bands=32,
rows=4: s=0.8 -> ~1.0 (miss rate ~5e-8), s=0.5 -> ~0.87, s=0.3 -> ~0.23. More rows steepen
the curve and move it right (fewer candidates, more misses near the threshold); more bands
move it left. Candidates are always verified, so a false positive needs an estimated
Jaccard >= ``threshold``; a loose curve only costs verification time, never wrong drops.

Streaming. ``check`` drops a document that duplicates an already-kept one and otherwise
adds it to the index. The index holds at most ``max_docs`` documents; beyond that the
oldest kept entry is evicted (FIFO), so a copy of a document older than the last
``max_docs`` kept ones is no longer caught. ``check_batch`` gives exactly the verdicts of
``check`` on each document in turn: it decides one by one only the documents that share a
bucket key with the index or with an earlier document of the batch, and puts the runs
between them (which cannot be duplicates) into the index in bulk. Verdicts depend only on
the sequence of (doc_id, text) pairs and the seed, so they are reproducible across
processes. Memory at the default 200k docs: ~100 MB of signatures plus ~0.7 GB for the
bucket dict (32 keys per doc). With ``enabled=False`` every document is kept and nothing
is hashed or indexed.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from reference_trainer.stages.minhash import (
    FNV_BASIS,
    FNV_PRIME,
    I64,
    U32,
    U64,
    NumpySigner,
    fold,
    shingle_hashes,
)
from reference_trainer.stages.minhash_rensa import RensaSigner
from reference_trainer.stages.stage import KEPT, StageVerdict

BACKENDS = ("rensa", "numpy")
_STATE_VERSION = 2  # 2 added the backend; a version-1 state is a numpy-backend state


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
    # Who computes the signatures: "rensa" (Rust, the fast default) or "numpy" (the
    # reference). Their signatures differ, so a state saved by one never loads into the other.
    backend: str = "rensa"

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
        if self.backend not in BACKENDS:
            raise ValueError(
                f"dedup.backend must be one of {', '.join(map(repr, BACKENDS))} "
                f"(got {self.backend!r})"
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


class DuplicateFilter:
    """Drops exact and near-duplicate documents of a stream, remembering what it kept."""

    def __init__(self, config: DedupConfig) -> None:
        self.config = config
        self._band_start: U64 = (FNV_BASIS ^ np.arange(config.bands, dtype=np.uint64)) * FNV_PRIME
        signer = RensaSigner if config.backend == "rensa" else NumpySigner
        self._signer: RensaSigner | NumpySigner = signer(config.num_perm, config.seed)
        self._reset()

    def _reset(self, size: int = 0) -> None:
        n = max(size, min(self.config.max_docs, 1024))  # grown by doubling up to max_docs
        self._sigs: U32 = np.empty((n, self.config.num_perm), dtype=np.uint32)
        self._ids: npt.NDArray[np.int64] = np.empty(n, dtype=np.int64)
        self._digests: list[bytes] = [b""] * n
        self._count = 0
        self._oldest = 0  # slot of the oldest entry once the index is full
        self._exact: dict[bytes, int] = {}
        # One dict for all bands (each band's keys are salted with its number): bucket key ->
        # slot, or a list of slots when several kept docs share the key (rare: kept docs are
        # mostly dissimilar). One dict lets a lookup of all 32 keys be one set operation in C;
        # a plain int per bucket keeps it free of container objects, which at 200k docs x 32
        # bands would cost ~2x the memory and make the garbage collector rescan millions of
        # lists.
        self._buckets: dict[int, int | list[int]] = {}
        self._stats = dict.fromkeys(("seen", "kept", "dropped_exact", "dropped_near", "evicted"), 0)

    # ------------------------------------------------------------------ hashing
    def _signatures(self, norms: Sequence[bytes], n_words: I64) -> U32:
        """MinHash signatures, one row per document, computed for the whole batch at once."""
        shingles, counts = shingle_hashes(norms, n_words, self.config.shingle_size)
        return self._signer.signatures(shingles, counts)

    def _band_keys(self, sigs: U32) -> U64:
        """One uint64 bucket key per (document, band); collisions are harmless (verified)."""
        c = self.config
        cube = sigs.reshape(len(sigs), c.bands, c.rows).astype(np.uint64)
        # The band number is the first symbol (folded in already, in _band_start), so equal
        # rows in two bands give two keys.
        return fold([cube[:, :, j] for j in range(c.rows)], self._band_start)

    # ------------------------------------------------------------------ index
    def _position(self, slot: int) -> int:
        """Age rank of a slot (0 = oldest), independent of how slots were assigned."""
        return (slot - self._oldest) % max(self._count, 1)

    def _take_slots(self, want: int) -> tuple[int, int]:
        """Up to ``want`` consecutive slots for new entries, as that many single inserts
        would take them: free ones while the index grows, then the oldest (evicted)."""
        cap = self.config.max_docs
        if self._count < cap:
            start = self._count
            got = min(want, cap - start)
            if start + got > len(self._ids):
                grow = min(max(2 * len(self._ids), start + got), cap)
                sigs = np.empty((grow, self.config.num_perm), dtype=np.uint32)
                ids = np.empty(grow, dtype=np.int64)
                sigs[:start], ids[:start] = self._sigs[:start], self._ids[:start]
                self._sigs, self._ids = sigs, ids
                self._digests.extend([b""] * (grow - len(self._digests)))
            self._count += got
            return start, got
        start = self._oldest
        got = min(want, cap - start)
        for slot in range(start, start + got):
            self._evict(slot)
        self._oldest = (start + got) % cap
        return start, got

    def _insert_run(self, ids: I64, digests: list[bytes], sigs: U32, keys: list[int]) -> None:
        """Adds documents known to share no key or digest with the index or each other
        (``keys``: theirs, flat, ``bands`` per document)."""
        done, total, bands = 0, len(ids), self.config.bands
        while done < total:
            start, got = self._take_slots(total - done)
            part, slots = slice(done, done + got), slice(start, start + got)
            self._sigs[slots], self._ids[slots] = sigs[part], ids[part]
            self._digests[slots] = digests[part]
            self._exact.update(zip(digests[part], range(start, start + got), strict=True))
            owners = itertools.chain.from_iterable(
                map(itertools.repeat, range(start, start + got), itertools.repeat(bands))
            )
            mine = keys[done * bands : (done + got) * bands]
            self._buckets.update(zip(mine, owners, strict=True))
            done += got
        self._stats["kept"] += total

    def _insert(self, doc_id: int, digest: bytes, sig: U32, keys: list[int]) -> None:
        slot, _ = self._take_slots(1)
        self._sigs[slot], self._ids[slot], self._digests[slot] = sig, doc_id, digest
        self._exact[digest] = slot
        buckets = self._buckets
        # Keys other kept docs hold already (looked up after the eviction above, which may
        # have freed some): they become lists; all the others are set in one C call.
        shared = {key: buckets[key] for key in buckets.keys() & keys}
        buckets.update(dict.fromkeys(keys, slot))
        for key, held in shared.items():
            if isinstance(held, list):
                held.append(slot)
                buckets[key] = held
            else:
                buckets[key] = [held, slot]

    def _evict(self, slot: int) -> None:
        if self._exact.get(self._digests[slot]) == slot:
            del self._exact[self._digests[slot]]
        buckets = self._buckets
        for key in set(self._band_keys(self._sigs[slot : slot + 1])[0].tolist()):
            held = buckets[key]
            if isinstance(held, int):
                del buckets[key]
                continue
            held.remove(slot)
            if len(held) == 1:
                buckets[key] = held[0]
        self._stats["evicted"] += 1

    def _decide(self, doc_id: int, digest: bytes, sig: U32, keys: list[int]) -> DedupVerdict:
        hit = self._exact.get(digest)
        if hit is not None:
            self._stats["dropped_exact"] += 1
            return DedupVerdict(False, "exact", int(self._ids[hit]), 1.0)
        buckets = self._buckets
        cands: set[int] = set()
        for key in buckets.keys() & keys:  # one C set operation; mostly empty
            held = buckets[key]
            if isinstance(held, int):
                cands.add(held)
            else:
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
        # Normalization: lowercase, split on any whitespace, rejoin with single spaces (so a
        # space byte is left only between words, which counts them).
        norms = [" ".join(t.lower().split()).encode("utf-8", "surrogatepass") for _, t in items]
        n = len(norms)
        n_words = np.fromiter((m.count(b" ") + 1 if m else 0 for m in norms), np.int64, n)
        ids = np.fromiter((int(doc_id) for doc_id, _ in items), np.int64, n)
        digests = [hashlib.blake2b(m, digest_size=16).digest() for m in norms]
        sigs = self._signatures(norms, n_words)
        keys = self._band_keys(sigs)
        flat, b = keys.ravel().tolist(), self.config.bands
        out: list[DedupVerdict] = []
        start = 0
        # Documents that may meet a candidate or an exact twin are decided one at a time; the
        # runs between them have none (so each would be kept) and go into the index in bulk.
        for i in [*np.flatnonzero(self._maybe_duplicate(keys, flat)).tolist(), n]:
            if i > start:
                part = slice(start, i)
                self._insert_run(ids[part], digests[part], sigs[part], flat[start * b : i * b])
                out += [_UNIQUE] * (i - start)
            if i < n:
                out.append(self._decide(int(ids[i]), digests[i], sigs[i], flat[i * b : i * b + b]))
            start = i + 1
        return out

    def _maybe_duplicate(self, keys: U64, flat: list[int]) -> npt.NDArray[np.bool_]:
        """Per document of a batch: could it have a candidate or an exact twin when its turn
        comes? False only if none of its keys is in the index or earlier in the batch;
        evictions on the way only remove entries, so False is then certain. An exact twin
        has the same signature, so its keys are found too: digests need no look of their
        own."""
        if len(keys) < 2:  # one document: nothing to gain, decide it
            return np.ones(len(keys), dtype=np.bool_)
        every = keys.ravel()
        ordered = np.sort(every)
        repeated = ordered[1:][ordered[1:] == ordered[:-1]]
        maybe = np.zeros(len(keys), dtype=np.bool_)
        if len(repeated):
            # Of the keys that occur more than once, every occurrence but the first.
            where = np.flatnonzero(np.isin(every, repeated))
            firsts = np.unique(every[where], return_index=True)[1]
            later = np.delete(where, firsts)
            maybe[later // keys.shape[1]] = True
        if self._count:
            held = self._buckets.keys() & flat
            if held:
                maybe |= np.isin(keys, np.fromiter(held, np.uint64, len(held))).any(axis=1)
        return maybe

    def stats(self) -> dict[str, int]:
        """Counters: seen, kept, dropped_exact, dropped_near, evicted, and indexed (size now)."""
        return {**self._stats, "indexed": self._count}

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue identically: numpy arrays and plain Python values."""
        order = (self._oldest + np.arange(self._count)) % max(self._count, 1)
        digests = b"".join(self._digests[i] for i in order.tolist())
        # numpy: the permutations themselves; rensa: what identifies the ones it derives.
        permutations = self._signer.state()
        return {
            "version": _STATE_VERSION,
            "backend": self.config.backend,
            "config": asdict(self.config),
            **permutations,
            "signatures": self._sigs[order].copy(),  # oldest first, uint32
            "doc_ids": self._ids[order].copy(),
            "digests": np.frombuffer(digests, dtype=np.uint8).reshape(-1, 16).copy(),
            "stats": dict(self._stats),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from ``state_dict()``; the backend and the signature-shaping settings must
        match."""
        version = state.get("version")
        if version not in (1, _STATE_VERSION):
            raise ValueError(f"unsupported dedup state version {version!r}")
        saved, c = state["config"], self.config
        saved_backend = state["backend"] if version == _STATE_VERSION else "numpy"
        if saved_backend != c.backend:
            why = (
                "the state is a version-1 state, which holds numpy-backend signatures"
                if version == 1
                else f"the state was saved with dedup.backend {saved_backend!r}"
            )
            raise ValueError(
                f"dedup.backend is {c.backend!r} but {why}; signatures of different backends "
                f"are not comparable (set dedup.backend to {saved_backend!r} to resume from it)"
            )
        for name in ("shingle_size", "num_perm", "bands", "rows"):
            if saved[name] != getattr(c, name):
                raise ValueError(
                    f"dedup.{name} is {getattr(c, name)} but the state has "
                    f"{saved[name]}; signatures would not be comparable"
                )
        # The state's permutations (numpy) or its seed (rensa, which refuses a state whose
        # permutations it would not reproduce) win over the configured seed.
        signer = RensaSigner if c.backend == "rensa" else NumpySigner
        self._signer = signer.restore(c.num_perm, int(saved["seed"]), state)
        keep = slice(-c.max_docs, None)  # a smaller capacity keeps the newest entries
        sigs = np.asarray(state["signatures"], dtype=np.uint32)[keep]
        n = len(sigs)
        self._reset(n)
        self._count, self._sigs[:n] = n, sigs  # oldest first, so slot i = position i
        self._ids[:n] = np.asarray(state["doc_ids"], dtype=np.int64)[keep]
        self._digests[:n] = [d.tobytes() for d in np.asarray(state["digests"], np.uint8)[keep]]
        self._exact = {d: i for i, d in enumerate(self._digests[:n])}
        # Bulk-build the bucket dict in C, then turn the rare shared keys into lists;
        # one insert at a time would take ~20 s at 200k docs.
        keys = self._band_keys(sigs).ravel()
        owners = np.repeat(np.arange(n, dtype=np.int64), c.bands)
        self._buckets.update(zip(keys.tolist(), owners.tolist(), strict=True))
        order = np.argsort(keys, kind="stable")
        runs = np.flatnonzero(np.diff(keys[order])) + 1  # where each run of equal keys starts
        for run in np.split(order, runs):
            if len(run) > 1:
                held = np.unique(owners[run]).tolist()
                self._buckets[int(keys[run[0]])] = held if len(held) > 1 else held[0]
        self._stats.update({k: int(v) for k, v in state["stats"].items()})


class DedupStage:
    """The streaming exact and near-duplicate filter (`DuplicateFilter`) as a stage."""

    name = "dedup"

    def __init__(self, dedup: DuplicateFilter) -> None:
        self.dedup = dedup

    def check_batch(self, documents: Sequence[Any]) -> list[StageVerdict]:
        """Exact or near duplicates of a kept document are dropped; the rest are indexed."""
        verdicts = self.dedup.check_batch([(doc.index, doc.text) for doc in documents])
        return [KEPT if v.keep else StageVerdict(False, v.reason) for v in verdicts]

    def state_dict(self) -> dict[str, Any]:
        """The filter's index (numpy arrays; the pipeline turns them into tensors)."""
        return self.dedup.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the filter's index."""
        self.dedup.load_state_dict(state)
