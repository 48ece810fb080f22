"""MinHash signatures from rensa's R-MinHash (Rust), fed this project's own shingle hashes.

The duplicate filter hashes shingles itself (stable uint64 values, see dedup.py) and hands
rensa one flat buffer of them with row offsets, so rensa only does the hot part: ``num_perm``
permutations of every hash and the minimum per document. rensa derives its permutations from
``seed`` inside the library; a rensa release could change them, which would make saved
signatures incomparable with new ones. A filter state therefore records rensa's algorithm
version and a fingerprint (the signature of fixed probe hashes), and a load compares both
against the rensa installed now.
"""

from __future__ import annotations

import array
import importlib
import itertools
from typing import Any

import numpy as np

from reference_trainer.stages.minhash import I64, U32, U64

# Fixed, arbitrary probe values: their signature pins down the permutations of a seed.
_PROBE = (np.arange(1, 65, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)).astype(np.uint64)
_U64_MAX = 2**64 - 1


def load_rensa() -> Any:
    """The rensa module, or an ImportError that says which setting needs it."""
    try:
        return importlib.import_module("rensa")
    except ImportError as exc:
        raise ImportError(
            "dedup.backend is 'rensa' but the rensa package is not installed "
            "(pip install 'rensa>=0.5,<0.6'), or set dedup.backend to 'numpy'"
        ) from exc


class RensaSigner:
    """Computes MinHash signatures of batches of shingle hashes with rensa's R-MinHash."""

    def __init__(self, num_perm: int, seed: int) -> None:
        if not 0 <= seed <= _U64_MAX:
            raise ValueError(f"dedup.seed must be in [0, 2**64) for the rensa backend (got {seed})")
        self._rensa = load_rensa()
        self.num_perm = num_perm
        self.seed = seed
        self.algorithm_version = int(self._rensa.RMinHash.ALGORITHM_VERSION)

    def signatures(self, shingles: U64, counts: I64) -> U32:
        """One uint32 row per document; a document without shingles is all 2**32 - 1."""
        offsets = np.zeros(len(counts) + 1, dtype=np.uint64)
        np.cumsum(counts, out=offsets[1:])
        matrix = self._rensa.RMinHash.digest_matrix_from_flat_token_hashes(
            np.ascontiguousarray(shingles, dtype=np.uint64), offsets, self.num_perm, self.seed
        )
        # rensa 0.5 exposes no buffer of the matrix, only lists: array("I") takes their
        # ints in one C loop, a little faster than numpy's conversion of nested lists.
        flat = array.array("I", itertools.chain.from_iterable(matrix.to_rows()))
        sigs = np.frombuffer(flat, dtype=np.uint32) if flat.itemsize == 4 else np.array(flat)
        return sigs.astype(np.uint32, copy=False).reshape(len(counts), self.num_perm)

    def fingerprint(self) -> U32:
        """The signature of fixed probe hashes: equal only if the permutations are equal."""
        probe: U32 = self.signatures(_PROBE, np.array([len(_PROBE)], dtype=np.int64))[0]
        return probe

    def state(self) -> dict[str, Any]:
        """What identifies these permutations in a saved filter state."""
        return {
            "rensa_algorithm": self.algorithm_version,
            "rensa_fingerprint": self.fingerprint(),
        }

    @classmethod
    def restore(cls, num_perm: int, seed: int, state: dict[str, Any]) -> RensaSigner:
        """A signer for a saved state; refuses a rensa whose permutations differ from its."""
        signer = cls(num_perm, seed)
        saved_version = int(state["rensa_algorithm"])
        saved_print = np.asarray(state["rensa_fingerprint"], dtype=np.uint32)
        if saved_version != signer.algorithm_version or not np.array_equal(
            saved_print, signer.fingerprint()
        ):
            raise ValueError(
                "the dedup state's signatures came from rensa's R-MinHash algorithm version "
                f"{saved_version}, but the installed rensa (algorithm version "
                f"{signer.algorithm_version}) permutes differently for seed {seed}; its "
                "signatures would not be comparable: install the rensa that saved the state, "
                "or start the filter empty"
            )
        return signer
