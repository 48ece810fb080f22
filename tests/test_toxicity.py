"""The toxicity filter's cascade without the embedding model: tier 1 flags on word
boundaries, only flagged documents reach tier 2, scores split into drop / keep / review,
the review queue and its decisions, and a state that resumes the same verdicts."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from faults.data import StreamDocument
from harness.records.review import append_decision, document_id, read_queue
from harness.run_layout import RunLayout
from reference_trainer.stages.stage import StageVerdict
from reference_trainer.stages.toxicity import ToxicityConfig, ToxicityStage, hit_sentences
from reference_trainer.stages.toxicity_corpus import labelled_set
from reference_trainer.stages.toxicity_lexicon import PatternMatcher, RegexMatcher


class Scripted:
    """A stand-in tier 2: a score per marker word, 0.0 otherwise; counts what it saw."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def score(self, texts: Sequence[str]) -> list[float]:
        self.seen += texts
        marks = {"idiot": 0.95, "dumb": 0.5, "kill": 0.1}
        return [max((v for k, v in marks.items() if k in t), default=0.0) for t in texts]


def doc(index: int, text: str, source: str = "social_chatter") -> StreamDocument:
    return StreamDocument(index, source, text)


DOCS = [
    doc(0, "The build passed on the second try."),
    doc(1, "You are an idiot. The build passed anyway."),
    doc(2, "Connect a dumb terminal to the serial port."),
    doc(3, "Use kill -9 on the stuck process."),
    doc(4, "Skillful people kill bugs early.", "technical_docs"),
    doc(5, "Nothing to see here."),
]


def reasons(verdicts: list[StageVerdict]) -> list[str]:
    return [v.reason for v in verdicts]


def test_tier_one_matches_terms_on_word_boundaries_only() -> None:
    m = PatternMatcher()
    assert m.flags("you absolute IDIOT!") and m.flags("shut\n  up")
    assert not m.flags("skillful killjoys use dumbbells")  # kill, dumb inside words
    assert not m.flags("The release notes are fine.")
    (hit,) = m.hits("a dumb terminal")
    assert (hit.start, hit.end, hit.term) == (2, 6, "dumb")


def test_the_regex_baseline_gives_the_same_answers() -> None:
    auto, regex = PatternMatcher(), RegexMatcher()
    items = labelled_set("heldout", 5, 200)
    assert [auto.flags(i.text) for i in items] == [regex.flags(i.text) for i in items]
    flagged = {i.kind for i in items if auto.flags(i.text)}
    assert {"toxic", "hard_negative"} <= flagged and "hard_positive" not in flagged


def test_only_flagged_documents_are_scored_and_scores_decide() -> None:
    tier2 = Scripted()
    stage = ToxicityStage(ToxicityConfig(), classifier=tier2)
    assert reasons(stage.check_batch(DOCS)) == ["kept", "toxic", "held", "kept", "kept", "kept"]
    # Tier 2 read the sentence with the hit, never an unflagged document.
    assert tier2.seen == [
        "you are an idiot.",
        "connect a dumb terminal to the serial port.",
        "use kill -9 on the stuck process.",
        "skillful people kill bugs early.",
    ]
    assert (stage.stats["flagged"], stage.stats["toxic"], stage.stats["held"]) == (4, 1, 1)


def test_verdicts_do_not_depend_on_batching_and_survive_a_state_round_trip() -> None:
    whole = ToxicityStage(ToxicityConfig(), classifier=Scripted())
    expected = reasons(whole.check_batch(DOCS))
    cut = ToxicityStage(ToxicityConfig(), classifier=Scripted())
    first = reasons(cut.check_batch(DOCS[:2]))
    resumed = ToxicityStage(ToxicityConfig(), classifier=Scripted())
    resumed.load_state_dict(cut.state_dict())
    assert first + reasons(resumed.check_batch(DOCS[2:])) == expected
    assert resumed.stats == whole.stats


def test_switched_off_it_keeps_everything_unscored() -> None:
    tier2 = Scripted()
    stage = ToxicityStage(ToxicityConfig(enabled=False), classifier=tier2)
    assert all(v.keep for v in stage.check_batch(DOCS)) and tier2.seen == []


def test_ambiguous_documents_are_queued_once_by_rank_zero(tmp_path: Path) -> None:
    layout = RunLayout(tmp_path)
    stage = ToxicityStage(ToxicityConfig(), run_dir=tmp_path, classifier=Scripted())
    stage.check_batch(DOCS)
    stage.check_batch(DOCS)  # met again (a rollback): not queued twice
    (entry,) = read_queue(layout.review_queue)
    assert (entry.index, entry.source, entry.score) == (2, "social_chatter", 0.5)
    assert entry.id == document_id(2, DOCS[2].text) and "dumb terminal" in entry.excerpt
    other = ToxicityStage(
        ToxicityConfig(), run_dir=tmp_path / "r1", writes_queue=False, classifier=Scripted()
    )
    other.check_batch(DOCS)
    assert not RunLayout(tmp_path / "r1").review_queue.exists()


def test_ambiguous_documents_may_be_trained_on_while_queued(tmp_path: Path) -> None:
    stage = ToxicityStage(
        ToxicityConfig(hold_ambiguous=False), run_dir=tmp_path, classifier=Scripted()
    )
    assert reasons(stage.check_batch(DOCS))[2] == "kept"
    assert len(read_queue(RunLayout(tmp_path).review_queue)) == 1


def test_decisions_are_honoured_when_the_stage_is_rebuilt(tmp_path: Path) -> None:
    layout = RunLayout(tmp_path)
    ToxicityStage(ToxicityConfig(), run_dir=tmp_path, classifier=Scripted()).check_batch(DOCS)
    append_decision(layout.review_decisions, document_id(2, DOCS[2].text), "accept")
    append_decision(layout.review_decisions, document_id(1, DOCS[1].text), "accept")
    append_decision(layout.review_decisions, document_id(3, DOCS[3].text), "reject")
    tier2 = Scripted()
    resumed = ToxicityStage(ToxicityConfig(), run_dir=tmp_path, classifier=tier2)
    got = reasons(resumed.check_batch(DOCS))
    assert got == ["kept", "kept", "kept", "rejected", "kept", "kept"]
    assert tier2.seen == ["skillful people kill bugs early."]  # decided ones are not scored
    # A decision is for that very text: an edited document is scored afresh.
    edited = doc(2, DOCS[2].text + " Twice.")
    assert reasons(resumed.check_batch([edited])) == ["held"]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("backend", "roberta"),
        ("drop_above", 1.5),
        ("keep_below", 0.9),
        ("enabled", "yes"),
        ("max_sentence_words", 2),
    ],
)
def test_bad_settings_name_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=rf"stability\.toxicity\.{field}"):
        ToxicityConfig(**{field: value})  # type: ignore[arg-type]


def test_long_sentences_are_cut_around_the_hit() -> None:
    words = " ".join(f"w{i}" for i in range(200))
    text = f"{words} idiot {words}. Next one."
    (sentence,) = hit_sentences(text, PatternMatcher().hits(text), 20)
    assert len(sentence.split()) == 20 and "idiot" in sentence.split()
