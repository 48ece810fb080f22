"""The duplicate filter: drops exact and lightly edited copies, keeps the natural corpus."""

from __future__ import annotations

import hashlib
import itertools
import os
import random
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from benchmarks.dedup_set import labelled_stream, score, true_jaccard
from reference_trainer.corpus.corpus import Corpus
from reference_trainer.stages.dedup import (
    BACKENDS,
    DedupConfig,
    DedupVerdict,
    DuplicateFilter,
)

ROOT = Path(__file__).resolve().parents[1]
WEIGHTS = {"technical_docs": 1, "social_chatter": 1, "product_reviews": 1, "code": 1}
N_NATURAL = 3000
COPY_ID = 1_000_000  # ids of injected copies, far from the corpus indices


@pytest.fixture(scope="module")
def natural() -> list[str]:
    """3,000 natural documents; their index in the list is their doc id."""
    corpus = Corpus(WEIGHTS, 0)
    return [corpus.document(i).text for i in range(N_NATURAL)]


@pytest.fixture(scope="module")
def indexed(natural: list[str]) -> tuple[dict[str, Any], list[DedupVerdict]]:
    """A default filter fed the natural documents: its state and its verdicts on them."""
    dedup = DuplicateFilter(DedupConfig())
    verdicts = dedup.check_batch(list(enumerate(natural)))
    return dedup.state_dict(), verdicts


@pytest.fixture(scope="module")
def indexed_state(indexed: tuple[dict[str, Any], list[DedupVerdict]]) -> dict[str, Any]:
    """State of a default filter after it has seen the natural documents."""
    return indexed[0]


def _restored(state: dict[str, Any], **overrides: Any) -> DuplicateFilter:
    dedup = DuplicateFilter(DedupConfig(**overrides))
    dedup.load_state_dict(state)
    return dedup


def _light_edit(text: str, rng: random.Random) -> str:
    """Change, insert or delete 1-3 words; never returns the same words as the input."""
    while True:
        words = text.split()
        for _ in range(rng.randint(1, 3)):
            op, i = rng.choice(("change", "insert", "delete")), rng.randrange(len(words))
            if op == "change":
                words[i] = f"edited{rng.randrange(10**6)}"
            elif op == "insert":
                words.insert(i, f"inserted{rng.randrange(10**6)}")
            else:
                del words[i]
        if words != text.split():
            return " ".join(words)


def _jaccard(a: str, b: str, k: int = 5) -> float:
    wa, wb = a.lower().split(), b.lower().split()
    sa = {tuple(wa[i : i + k]) for i in range(len(wa) - k + 1)}
    sb = {tuple(wb[i : i + k]) for i in range(len(wb) - k + 1)}
    return len(sa & sb) / len(sa | sb)


def _near_cases(natural: list[str], n: int = 200) -> list[tuple[int, str]]:
    """(source id, edited copy) for n documents of 150+ words."""
    rng = random.Random(7)
    long_ids = [i for i, t in enumerate(natural) if len(t.split()) >= 150]
    return [(i, _light_edit(natural[i], rng)) for i in rng.sample(long_ids, n)]


def test_exact_copies_are_dropped_even_with_other_whitespace_and_case() -> None:
    dedup = DuplicateFilter(DedupConfig())
    text = "The Quick brown fox\njumps over the lazy dog near the river bank today."
    assert dedup.check(7, text) == DedupVerdict(True, "unique", None, None)
    copies = [text, "  the quick BROWN fox jumps\tover the lazy dog near the river bank today.\n"]
    for offset, copy in enumerate(copies):
        assert dedup.check(100 + offset, copy) == DedupVerdict(False, "exact", 7, 1.0)
    # A real change of one word is not an exact copy.
    assert dedup.check(200, text.replace("lazy", "sleepy")).reason != "exact"


def test_lightly_edited_copies_are_dropped_as_near(
    natural: list[str], indexed_state: dict[str, Any]
) -> None:
    dedup = _restored(indexed_state)
    cases = _near_cases(natural)
    verdicts = [dedup.check(COPY_ID + j, copy) for j, (_, copy) in enumerate(cases)]
    hits = [
        (v, _jaccard(natural[src], copy))
        for (src, copy), v in zip(cases, verdicts, strict=True)
        if v.reason == "near" and v.duplicate_of == src
    ]
    assert len(hits) / len(cases) >= 0.95, f"near-duplicate recall {len(hits) / len(cases):.3f}"
    assert all(not v.keep and v.similarity is not None for v, _ in hits)
    # The reported similarity estimates the true Jaccard of the 5-gram sets
    # (std ~0.035 with 128 permutations).
    errors = np.array([v.similarity - j for v, j in hits if v.similarity is not None])
    assert np.abs(errors).max() <= 0.15
    assert abs(errors.mean()) <= 0.02


def test_natural_corpus_is_not_dropped(
    indexed: tuple[dict[str, Any], list[DedupVerdict]],
) -> None:
    state, verdicts = indexed
    dropped = [i for i, v in enumerate(verdicts) if not v.keep]
    assert len(dropped) <= N_NATURAL // 1000, f"false positives: {dropped}"
    assert state["stats"]["kept"] == N_NATURAL - len(dropped) == len(state["doc_ids"])


def test_documents_sharing_most_text_but_below_threshold_are_kept(natural: list[str]) -> None:
    # 70% of a document followed by other text: Jaccard ~0.54, so LSH makes most of these
    # candidates (P ~0.94) and only the verification step keeps them.
    long_ids = [i for i, t in enumerate(natural) if len(t.split()) >= 150][:61]
    dedup = DuplicateFilter(DedupConfig())
    dedup.check_batch([(i, natural[i]) for i in long_ids])
    spliced = []
    for j, (i, other) in enumerate(itertools.pairwise(long_ids)):
        words, filler = natural[i].split(), natural[other].split()
        cut = int(0.7 * len(words))
        text = " ".join([*words[:cut], f"x{j}", *filler[: len(words) - cut]])
        assert 0.4 < _jaccard(natural[i], text) < 0.7
        spliced.append((COPY_ID + j, text))
    verdicts = dedup.check_batch(spliced)
    assert [v.reason for v in verdicts] == ["unique"] * len(spliced)


def test_disabled_filter_keeps_every_duplicate_and_indexes_nothing(natural: list[str]) -> None:
    # The same inputs the two tests above drop: with the filter off, all of them pass.
    dedup = DuplicateFilter(DedupConfig(enabled=False))
    originals = list(enumerate(natural[:300]))
    copies = [(COPY_ID + i, t) for i, t in originals[:100]]
    near = [(COPY_ID + 1000 + j, c) for j, (_, c) in enumerate(_near_cases(natural[:300], 50))]
    verdicts = dedup.check_batch(originals + copies + near)
    verdicts += [dedup.check(COPY_ID - 1, natural[0])]
    assert all(v == DedupVerdict(True, "unique", None, None) for v in verdicts)
    stats = dedup.stats()
    assert stats["seen"] == stats["kept"] == len(verdicts)
    assert stats["indexed"] == 0 and len(dedup.state_dict()["doc_ids"]) == 0


def _mixed_stream(natural: list[str]) -> list[tuple[int, str]]:
    """Originals, exact and near copies (some of a doc in the same batch), short and empty docs."""
    rng = random.Random(3)
    items = list(enumerate(natural[:40]))
    items += [(500, natural[3].upper()), (501, _light_edit(natural[5], rng))]
    items += [(502, "Short text."), (503, "short   TEXT."), (504, "short text!")]
    items += [(505, ""), (506, " \n\t"), (507, natural[60]), (508, natural[60])]
    items += [(509, _light_edit(natural[60], rng)), (510, natural[3]), (511, "one")]
    rng.shuffle(items)
    return items


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("max_docs", [200_000, 12])  # 12: batches evict what they insert
def test_check_batch_matches_sequential_check(
    natural: list[str], backend: str, max_docs: int
) -> None:
    items = _mixed_stream(natural)
    one_by_one = DuplicateFilter(DedupConfig(backend=backend, max_docs=max_docs))
    expected = [one_by_one.check(i, t) for i, t in items]
    assert {v.reason for v in expected} == {"unique", "exact", "near"}
    for batch in (len(items), 7):
        batched = DuplicateFilter(DedupConfig(backend=backend, max_docs=max_docs))
        got = []
        for start in range(0, len(items), batch):
            got += batched.check_batch(items[start : start + batch])
        assert got == expected
        assert batched.stats() == one_by_one.stats()
        a, b = batched.state_dict(), one_by_one.state_dict()
        assert np.array_equal(a["signatures"], b["signatures"])
        assert np.array_equal(a["doc_ids"], b["doc_ids"])
    assert (one_by_one.stats()["evicted"] > 0) == (max_docs < len(items))


@pytest.mark.parametrize("backend", BACKENDS)
def test_restored_filter_continues_like_an_uninterrupted_one(
    natural: list[str], backend: str
) -> None:
    # A small index, so FIFO eviction happens both before and after the restart.
    config: dict[str, Any] = {"max_docs": 50, "seed": 5, "backend": backend}
    rng = random.Random(11)
    first = [(i, natural[i]) for i in range(80)]
    first += [(COPY_ID + i, _light_edit(natural[i], rng)) for i in range(60, 80)]
    later = [(i, natural[i]) for i in range(80, 120)]
    later += [(COPY_ID + 100 + i, natural[i]) for i in range(40, 120, 3)]  # some evicted
    later += [(COPY_ID + 200 + i, _light_edit(natural[i], rng)) for i in range(90, 120)]
    rng.shuffle(later)

    uninterrupted = DuplicateFilter(DedupConfig(**config))
    uninterrupted.check_batch(first)
    state = uninterrupted.state_dict()
    assert state["signatures"].dtype == np.uint32 and state["signatures"].shape == (50, 128)
    restored = _restored(state, **config)
    expected = [uninterrupted.check(i, t) for i, t in later]
    assert [restored.check(i, t) for i, t in later] == expected
    assert restored.stats() == uninterrupted.stats()
    assert {v.reason for v in expected} == {"unique", "exact", "near"}
    assert uninterrupted.stats()["evicted"] > 0


_SIGNATURE_SCRIPT = """
import hashlib, sys
from reference_trainer.corpus.corpus import Corpus
from reference_trainer.stages.dedup import DedupConfig, DuplicateFilter
corpus = Corpus({"technical_docs": 1, "social_chatter": 1, "product_reviews": 1, "code": 1}, 0)
dedup = DuplicateFilter(DedupConfig(seed=int(sys.argv[1]), backend=sys.argv[2]))
dedup.check_batch([(i, corpus.document(i).text) for i in range(50)])
print(hashlib.sha256(dedup.state_dict()["signatures"].tobytes()).hexdigest())
"""


def _signature_digest(natural: list[str], seed: int, backend: str) -> str:
    dedup = DuplicateFilter(DedupConfig(seed=seed, backend=backend))
    dedup.check_batch(list(enumerate(natural[:50])))
    return hashlib.sha256(dedup.state_dict()["signatures"].tobytes()).hexdigest()


@pytest.mark.parametrize("backend", BACKENDS)
def test_signatures_are_identical_in_another_process(natural: list[str], backend: str) -> None:
    # A different PYTHONHASHSEED would change anything built on Python's salted hash().
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONHASHSEED="12345")
    result = subprocess.run(
        [sys.executable, "-c", _SIGNATURE_SCRIPT, "3", backend],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == _signature_digest(natural, 3, backend)
    assert _signature_digest(natural, 4, backend) != _signature_digest(natural, 3, backend)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"num_perm": 100}, "dedup.bands * dedup.rows must equal dedup.num_perm (32 * 4 != 100)"),
        ({"bands": 16}, "dedup.bands * dedup.rows must equal dedup.num_perm (16 * 4 != 128)"),
        ({"shingle_size": 0}, "dedup.shingle_size"),
        ({"rows": 0}, "dedup.rows"),
        ({"threshold": 0.0}, "dedup.threshold"),
        ({"threshold": 1.5}, "dedup.threshold"),
        ({"max_docs": 0}, "dedup.max_docs"),
        ({"seed": -1}, "dedup.seed"),
        ({"enabled": "yes"}, "dedup.enabled"),
        ({"backend": "rust"}, "dedup.backend must be one of 'rensa', 'numpy' (got 'rust')"),
    ],
)
def test_bad_config_is_rejected_naming_the_field(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        DedupConfig(**overrides)


def test_state_from_an_incompatible_config_is_rejected(indexed_state: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=re.escape("dedup.shingle_size")):
        _restored(indexed_state, shingle_size=4)


def test_stats_count_each_kind_of_drop(natural: list[str]) -> None:
    dedup = DuplicateFilter(DedupConfig())
    rng = random.Random(5)
    dedup.check_batch([(0, natural[0]), (1, natural[1]), (2, natural[2])])
    dedup.check_batch([(3, natural[0]), (4, natural[1].upper())])
    long_doc = max(range(3, 50), key=lambda i: len(natural[i]))
    dedup.check(long_doc, natural[long_doc])
    assert dedup.check(5, _light_edit(natural[long_doc], rng)).reason == "near"
    assert dedup.stats() == {
        "seen": 7,
        "kept": 4,
        "dropped_exact": 2,
        "dropped_near": 1,
        "evicted": 0,
        "indexed": 4,
    }


def test_oldest_entries_are_evicted_first(natural: list[str]) -> None:
    dedup = DuplicateFilter(DedupConfig(max_docs=2))
    for i in range(3):
        assert dedup.check(i, natural[i]).keep
    # Doc 0 was evicted, so its copy is new again (and pushes out doc 1); doc 2 is remembered.
    assert dedup.check(10, natural[0]).keep
    assert dedup.check(11, natural[2]) == DedupVerdict(False, "exact", 2, 1.0)
    assert dedup.stats()["evicted"] == 2 and dedup.stats()["indexed"] == 2


# ---------------------------------------------------------------- backends (numpy, rensa)
TRAINER = {"shingle_size": 3, "threshold": 0.5, "max_docs": 50_000}  # the trainer's settings


@pytest.fixture(scope="module")
def labelled() -> list[Any]:
    """1,500 originals of 88 words and 300 copies: 30% exact, the rest 1-12 word edits."""
    return labelled_stream(1500, 300, max_edits=12, seed=1)


def _calls(stream: list[Any], **config: Any) -> list[DedupVerdict]:
    dedup = DuplicateFilter(DedupConfig(**config))
    return dedup.check_batch([(doc.doc_id, doc.text) for doc in stream])


def test_rensa_backend_catches_the_copies_numpy_catches(labelled: list[Any]) -> None:
    copies = [doc.doc_id for doc in labelled if doc.source is not None]
    jaccard = dict(zip(copies, true_jaccard(labelled), strict=True))
    clear = [i for i in copies if jaccard[i] >= 0.6]
    caught: dict[str, set[int]] = {}
    for backend in BACKENDS:
        verdicts = _calls(labelled, backend=backend, **TRAINER)
        scores = score(labelled, [not v.keep for v in verdicts])
        assert scores.precision >= 0.99, (backend, scores)
        assert scores.recall >= 0.93, (backend, scores)
        by_id = {doc.doc_id: (doc, v) for doc, v in zip(labelled, verdicts, strict=True)}
        # Every copy well above the threshold is caught, as a copy of its own source.
        hits = [by_id[i] for i in clear if by_id[i][1].duplicate_of == by_id[i][0].source]
        assert len(hits) >= 0.99 * len(clear), (backend, len(hits), len(clear))
        assert all(v.reason == "exact" for doc, v in by_id.values() if doc.source and not doc.edits)
        caught[backend] = {i for i, (doc, v) in by_id.items() if doc.source and not v.keep}
    # The two backends differ only near the threshold (0.5), where each estimate has its own
    # noise (std ~0.044 there with 128 permutations).
    differ = sorted(jaccard[i] for i in caught["rensa"] ^ caught["numpy"])
    assert len(differ) <= 0.06 * len(copies) and all(0.4 <= j < 0.7 for j in differ), differ


def test_threshold_one_catches_no_near_copy(labelled: list[Any]) -> None:
    # Negative control of the test above: the same stream and scoring, a filter that can only
    # match identical signatures. Exact copies are still caught; near ones no longer are.
    verdicts = _calls(labelled, backend="rensa", **{**TRAINER, "threshold": 1.0})
    near = [not v.keep for doc, v in zip(labelled, verdicts, strict=True) if doc.edits]
    exact = [not v.keep for doc, v in zip(labelled, verdicts, strict=True)
             if doc.source is not None and not doc.edits]  # fmt: skip
    assert sum(near) <= 0.05 * len(near)
    assert all(exact) and exact
    assert score(labelled, [not v.keep for v in verdicts]).recall < 0.5


def test_rensa_state_resumes_through_a_checkpoint_without_pickle(
    natural: list[str], tmp_path: Path
) -> None:
    # The trainer's route: state -> tensors -> torch.save -> torch.load(weights_only) -> numpy.
    import torch

    from reference_trainer.stream.data import to_numpy, to_tensors

    rng = random.Random(2)
    first = [(i, natural[i]) for i in range(300)]
    later = [(COPY_ID + i, _light_edit(natural[i], rng)) for i in range(0, 300, 4)]
    later += [(i, natural[i]) for i in range(300, 400)] + [(COPY_ID - 1, natural[7])]
    straight = DuplicateFilter(DedupConfig())
    straight.check_batch(first)
    torch.save(to_tensors(straight.state_dict()), tmp_path / "dedup.pt")
    restored = DuplicateFilter(DedupConfig())
    restored.load_state_dict(to_numpy(torch.load(tmp_path / "dedup.pt", weights_only=True)))
    expected = straight.check_batch(later)
    assert restored.check_batch(later) == expected
    assert {v.reason for v in expected} == {"unique", "exact", "near"}
    assert restored.stats() == straight.stats()


@pytest.mark.parametrize(("saved", "loading"), [("numpy", "rensa"), ("rensa", "numpy")])
def test_state_of_the_other_backend_is_refused(
    natural: list[str], saved: str, loading: str
) -> None:
    dedup = DuplicateFilter(DedupConfig(backend=saved))
    dedup.check_batch(list(enumerate(natural[:20])))
    message = (
        f"dedup.backend is '{loading}' but the state was saved with dedup.backend '{saved}'; "
        f"signatures of different backends are not comparable (set dedup.backend to "
        f"'{saved}' to resume from it)"
    )
    with pytest.raises(ValueError, match=re.escape(message)):
        _restored(dedup.state_dict(), backend=loading)


def _version_1(state: dict[str, Any]) -> dict[str, Any]:
    """A numpy-backend state as version 1 wrote it: no backend anywhere."""
    old = {k: v for k, v in state.items() if k != "backend"}
    old["config"] = {k: v for k, v in state["config"].items() if k != "backend"}
    return {**old, "version": 1}


def test_version_1_state_loads_as_numpy_and_is_refused_by_rensa(natural: list[str]) -> None:
    dedup = DuplicateFilter(DedupConfig(backend="numpy"))
    dedup.check_batch(list(enumerate(natural[:60])))
    old = _version_1(dedup.state_dict())
    restored = _restored(old, backend="numpy")
    later = [(COPY_ID + i, natural[i].upper()) for i in range(50, 70)]
    later += [(COPY_ID + 100 + i, _light_edit(natural[i], random.Random(i))) for i in range(60)]
    assert restored.check_batch(later) == dedup.check_batch(later)
    with pytest.raises(ValueError, match=re.escape("is a version-1 state, which holds numpy")):
        _restored(old, backend="rensa")


@pytest.mark.parametrize("damage", ["rensa_algorithm", "rensa_fingerprint", "seed"])
def test_state_from_a_rensa_that_permutes_otherwise_is_refused(
    natural: list[str], damage: str
) -> None:
    dedup = DuplicateFilter(DedupConfig())
    dedup.check_batch(list(enumerate(natural[:20])))
    state = dedup.state_dict()
    if damage == "rensa_algorithm":
        state[damage] += 1
    elif damage == "rensa_fingerprint":
        state[damage] = state[damage] ^ np.uint32(1)
    else:  # the seed of the state decides the permutations, so a fingerprint must follow it
        state["config"] = {**state["config"], "seed": 9}
    with pytest.raises(ValueError, match="permutes differently"):
        _restored(state)
    _restored(dedup.state_dict())  # the undamaged state loads


def test_missing_rensa_is_a_clear_error_and_numpy_still_works(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "rensa", None)  # import rensa now raises ImportError
    with pytest.raises(ImportError, match=re.escape("dedup.backend is 'rensa' but the rensa")):
        DuplicateFilter(DedupConfig())
    dedup = DuplicateFilter(DedupConfig(backend="numpy"))
    assert dedup.check(1, "some words here").keep and not dedup.check(2, "Some words HERE").keep
