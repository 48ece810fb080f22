"""Semantic dedup: paraphrases that the hash filter lets through are dropped, clean documents
are never even compared by meaning, and a resumed stage decides as the one it continues;
the paraphrase fault makes copies the hash filter misses, deterministically."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from faults import parse_fault
from faults.errors import FaultSpecError
from faults.paraphrase import ParaphraseContaminationInjector, paraphrase
from harness.records.journal import Journal
from reference_trainer.config import TrainConfig
from reference_trainer.corpus.corpus import Corpus, generate_text
from reference_trainer.stability.mechanisms import StabilityConfig
from reference_trainer.stages import embeddings
from reference_trainer.stages.dedup import DuplicateFilter
from reference_trainer.stages.semantic_dedup import SemanticDedupConfig, SemanticDedupStage

from .stability_support import claims, config, run

needs_model = pytest.mark.skipif(not embeddings.available(), reason="the semantic extra is missing")
PROSE = ("technical_docs", "social_chatter", "product_reviews")


@dataclass(frozen=True)
class Doc:
    index: int
    source: str
    text: str


@pytest.fixture(scope="module")
def embedder() -> embeddings.SentenceEmbedder:
    """One model for the module (loading it takes seconds)."""
    return embeddings.SentenceEmbedder()


def originals(source: str, n: int, start: int = 0) -> list[Doc]:
    return [Doc(i, source, generate_text(source, 1234, i)) for i in range(start, start + n)]


def paraphrases(docs: list[Doc]) -> list[Doc]:
    return [
        Doc(-1 - i, d.source, paraphrase(d.text, 0.8, 0.5, random.Random(i)))
        for i, d in enumerate(docs)
    ]


def missed_by_hash_dedup(docs: list[Doc], copies: list[Doc]) -> list[Doc]:
    """The copies that the trainer's hash filter keeps after it has seen the originals."""
    hashes = DuplicateFilter(StabilityConfig().dedup)
    hashes.check_batch([(d.index, d.text) for d in docs])
    verdicts = hashes.check_batch([(c.index, c.text) for c in copies])
    return [c for c, v in zip(copies, verdicts, strict=True) if v.keep]


@pytest.mark.slow
@needs_model
def test_paraphrases_the_hash_filter_misses_are_dropped(
    embedder: embeddings.SentenceEmbedder,
) -> None:
    stage = SemanticDedupStage(SemanticDedupConfig(), embedder)
    missed: list[Doc] = []
    for source in PROSE:
        docs = originals(source, 8)
        assert all(v.keep for v in stage.check_batch(docs))
        missed += missed_by_hash_dedup(docs, paraphrases(docs))
    assert len(missed) >= 10  # the fault's copies really do get past the hash filter
    verdicts = stage.check_batch(missed)
    dropped = [v for v in verdicts if not v.keep]
    assert len(dropped) >= 0.9 * len(missed)
    assert {v.reason for v in dropped} == {"paraphrase"}


@needs_model
def test_a_threshold_of_one_keeps_every_paraphrase(embedder: embeddings.SentenceEmbedder) -> None:
    # The negative control: the same copies, compared by meaning, pass when no cosine counts.
    cfg = SemanticDedupConfig(thresholds={s: 1.0 for s in PROSE})
    stage = SemanticDedupStage(cfg, embedder)
    docs = originals("technical_docs", 6)
    stage.check_batch(docs)
    copies = missed_by_hash_dedup(docs, paraphrases(docs))
    assert copies and all(v.keep for v in stage.check_batch(copies))
    assert stage.candidates == len(copies)  # they were compared, and kept


def test_clean_documents_are_not_compared_by_meaning() -> None:
    corpus = Corpus(
        {"technical_docs": 1, "social_chatter": 1, "product_reviews": 1, "code": 1}, 1234
    )
    stage = SemanticDedupStage(SemanticDedupConfig())
    docs = [corpus.document(i) for i in range(400)]
    assert all(v.keep for v in stage.check_batch(docs))
    assert stage.candidates == 0 and not stage.embedder.loaded  # no model, no cost


@needs_model
def test_a_restored_stage_decides_as_the_one_it_continues(
    embedder: embeddings.SentenceEmbedder,
) -> None:
    docs = originals("product_reviews", 10)
    stream = (
        docs
        + paraphrases(docs[:5])
        + originals("product_reviews", 5, start=10)
        + paraphrases(docs[5:])
    )
    whole = SemanticDedupStage(SemanticDedupConfig(), embedder)
    expected = whole.check_batch(stream)
    first = SemanticDedupStage(SemanticDedupConfig(), embedder)
    first.check_batch(stream[:12])
    second = SemanticDedupStage(SemanticDedupConfig(seed=99), embedder)  # seed comes from the state
    second.load_state_dict(first.state_dict())
    assert first.check_batch(stream[12:]) == second.check_batch(stream[12:]) == expected[12:]
    assert any(not v.keep for v in expected[12:])
    with pytest.raises(ValueError, match=r"semantic_dedup\.num_perm is 64 but the state has 128"):
        SemanticDedupStage(SemanticDedupConfig(num_perm=64)).load_state_dict(first.state_dict())


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        (
            "thresholds",
            {"social_chatter": 1.5},
            "semantic_dedup.thresholds.social_chatter must be in",
        ),
        ("default_threshold", 0, "semantic_dedup.default_threshold must be in"),
        ("candidate_jaccard", float("nan"), "semantic_dedup.candidate_jaccard must be in"),
        ("max_docs", 0, "semantic_dedup.max_docs must be an int >= 1"),
    ],
)
def test_bad_settings_name_the_field(field: str, value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SemanticDedupConfig(**{field: value})  # type: ignore[arg-type]


def paraphrase_fault(**fields: object) -> ParaphraseContaminationInjector:
    spec = parse_fault({"kind": "paraphrase_contamination", "at_step": 1, "rate": 0.05, **fields})
    injector = ParaphraseContaminationInjector(spec)  # type: ignore[arg-type]
    return injector


def test_the_fault_tags_paraphrases_and_repeats_itself_from_its_seed() -> None:
    corpus = Corpus({"product_reviews": 1}, 1234)

    def draw(seed: int) -> list[tuple[int, str, object]]:
        stream = paraphrase_fault(seed=seed, pool=4).wrap_documents(
            corpus.document(i) for i in range(10**6)
        )
        return [(d.index, d.text, d.contamination_of) for d in (next(stream) for _ in range(400))]

    first = draw(3)
    assert first == draw(3) and first != draw(4)
    copies = [d for d in first if d[2] is not None]
    assert 8 <= len(copies) <= 40  # about 5% of 400
    originals_ = {d[0]: d[1] for d in first if d[2] is None}
    assert all(text != originals_[of] for _, text, of in copies)  # other words, same source doc
    assert len({text for _, text, _ in copies}) > len(copies) // 2  # each copy draws its own words


def test_the_fault_resumes_where_it_stopped() -> None:
    corpus = Corpus({"social_chatter": 1}, 1234)
    whole = paraphrase_fault(seed=1, pool=3).wrap_documents(
        corpus.document(i) for i in range(10**6)
    )
    expected = [next(whole).text for _ in range(300)]
    part = paraphrase_fault(seed=1, pool=3).wrap_documents(corpus.document(i) for i in range(10**6))
    head = [next(part) for _ in range(150)]
    state = part.state_dict()
    last = max(d.index for d in head)
    resumed = paraphrase_fault(seed=1, pool=3).wrap_documents(
        corpus.document(i) for i in range(last + 1, 10**6)
    )
    resumed.load_state_dict(state)
    assert [d.text for d in head] + [next(resumed).text for _ in range(150)] == expected


@pytest.mark.parametrize(
    ("fields", "message"),
    [({"rate": 0.5}, "rate"), ({"swap": 0}, "swap"), ({"every": 3}, "every")],
)
def test_bad_fault_specs_are_refused(fields: dict[str, object], message: str) -> None:
    with pytest.raises(FaultSpecError, match=message):
        parse_fault({"kind": "paraphrase_contamination", "at_step": 1, "rate": 0.05, **fields})


PARAPHRASES = [{"kind": "paraphrase_contamination", "at_step": 1, "rate": 0.05, "pool": 8}]


def paraphrased(**fields: Any) -> TrainConfig:
    """24 steps of batch 16 under `PARAPHRASES`, a checkpoint at step 12."""
    return config(steps=24, batch_size=16, checkpoint_every=12, **fields)


@pytest.fixture(scope="module")
def straight(tmp_path_factory: pytest.TempPathFactory) -> Journal:
    """The uninterrupted run with semantic dedup on: the pair's "with" half and the run the
    resumed one must match."""
    return run(tmp_path_factory.mktemp("straight") / "run", paraphrased(), PARAPHRASES)[1]


@needs_model
@pytest.mark.slow
@pytest.mark.parametrize("semantic", [True, False], ids=["with", "without"])
def test_paraphrases_reach_the_model_only_without_semantic_dedup(
    tmp_path: Path, request: pytest.FixtureRequest, semantic: bool
) -> None:
    if semantic:
        journal = request.getfixturevalue("straight")
    else:
        _, journal = run(tmp_path, paraphrased(disable=("semantic_dedup",)), PARAPHRASES)
    steps = journal.of_kind("step")
    consumed = sum(e["contaminated_kinds"].get("paraphrase", 0) for e in steps)
    drops = claims(journal, "detected", "semantic_dedup")
    if semantic:
        assert consumed == 0
        assert sum(c["details"]["contaminated_dropped"] for c in drops) >= 2
    else:
        assert consumed >= 2 and not drops


@needs_model
@pytest.mark.slow
def test_a_run_resumed_with_paraphrases_in_its_stream_is_bit_exact(
    tmp_path: Path, straight: Journal
) -> None:
    run(tmp_path / "split", paraphrased(), PARAPHRASES, stop_after=12)
    _, split = run(tmp_path / "split", paraphrased(), PARAPHRASES, resume=True)
    assert straight.losses() == split.losses() and len(split.losses()) == 24

    def drops(journal: Journal) -> list[tuple[int, int]]:
        return [
            (e.step, e["details"]["dropped"]) for e in claims(journal, "detected", "semantic_dedup")
        ]

    # The resumed stage dropped the same paraphrases at the same steps, some after the resume.
    assert drops(straight) == drops(split) and any(step > 12 for step, _ in drops(split))


@needs_model
def test_text_with_undecodable_bytes_is_embedded(embedder: embeddings.SentenceEmbedder) -> None:
    # A lone surrogate (what broken UTF-8 decodes to with surrogateescape) must not crash
    # the stage: the tokenizer_stress fault sends such documents.
    vectors = embedder.encode(["price \udcff paid", "price ? paid"])
    assert vectors.shape == (2, embeddings.DIM) and float(vectors[0] @ vectors[1]) > 0.999
