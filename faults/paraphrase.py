"""Data fault: contaminate the training stream with paraphrases of its own documents,
copies that say the same thing in other words, so that hash dedup (exact digests, MinHash of
word n-grams) lets them through.

A paraphrase of a document: each word that has an entry in a small synonym table (below,
both directions, case kept) is replaced with probability ``swap``, and adjacent sentences
trade places with probability ``reorder``; every copy draws its own choices. Names, numbers
and prices stay, as they do in a real paraphrase. On the corpus's prose that breaks enough
word 3-grams for the hash filter to miss most copies, while a sentence-embedding model still
sees the same text (docs/data.md has the measured figures).

Like `duplicate_contamination` (faults/data.py, whose stream this reuses), copies are of the
first ``pool`` originals seen (from ``source`` only, when given), interleaved at ``rate``;
copy number k has index ``-k``, ``contamination_of`` = the original's index and
``contamination_kind`` = "paraphrase". The kind's reach is ``documents`` and its only trigger
``at_step`` (give ``at_step: 1``).
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Iterable
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field

from faults.bias import Bias
from faults.data import ContaminatedStream
from faults.injector import Injector
from faults.spec import FaultClass, FaultSpec, Reach, Trigger

KIND = "paraphrase_contamination"

# Pairs of words that mean the same in the corpus's prose; each maps to the other.
_PAIRS = (
    ("before", "prior to"),
    ("each", "every single"),
    ("restart", "reboot"),
    ("nodes", "machines"),
    ("large", "big"),
    ("reports", "shows"),
    ("may", "might"),
    ("read", "consult"),
    ("must", "has to"),
    ("between", "among"),
    ("after", "following"),
    ("limit", "cap"),
    ("errors", "failures"),
    ("delay", "lag"),
    ("size", "magnitude"),
    ("idle", "inactive"),
    ("capacity", "room"),
    ("more", "additional"),
    ("wait", "pause"),
    ("check", "verify"),
    ("without", "lacking"),
    ("requests", "calls"),
    ("maximum", "most"),
    ("spend", "use up"),
    ("server", "host"),
    ("job", "task"),
    ("long", "lengthy"),
    ("explains", "describes"),
    ("coordinates", "manages"),
    ("options", "settings"),
    ("matter", "count"),
    ("clusters", "fleets"),
    ("enable", "switch on"),
    ("how", "the way"),
    ("still", "even now"),
    ("new", "fresh"),
    ("again", "once more"),
    ("spent", "passed"),
    ("honestly", "truthfully"),
    ("said", "claimed"),
    ("actually", "in fact"),
    ("thoughts", "opinions"),
    ("ignores", "disregards"),
    ("right", "correct"),
    ("keeps", "continues"),
    ("missed", "skipped"),
    ("thanks", "cheers"),
    ("talk", "chat"),
    ("awful", "terrible"),
    ("hilarious", "very funny"),
    ("exhausting", "tiring"),
    ("rough", "hard"),
    ("wild", "crazy"),
    ("perfect", "flawless"),
    ("amazing", "incredible"),
    ("took", "needed"),
    ("setup", "installation"),
    ("support", "help desk"),
    ("price", "cost"),
    ("paid", "spent"),
    ("people", "folks"),
    ("found", "considered"),
    ("helpful", "useful"),
    ("less", "fewer"),
    ("expected", "anticipated"),
    ("better", "superior"),
    ("manual", "instructions"),
    ("returned", "sent back"),
    ("because", "since"),
    ("became", "turned"),
    ("clunky", "awkward to use"),
    ("noisy", "loud"),
    ("stopped", "ceased"),
    ("working", "functioning"),
    ("bought", "purchased"),
    ("impressive", "remarkable"),
    ("wobbly", "unsteady"),
    ("fragile", "delicate"),
    ("daily", "everyday"),
    ("sleek", "stylish"),
    ("arrived", "came"),
    ("flimsy", "weak"),
    ("disappointing", "underwhelming"),
    ("mediocre", "average"),
    ("sluggish", "slow"),
    ("generous", "ample"),
    ("smooth", "seamless"),
    ("fantastic", "superb"),
    ("comfortable", "pleasant"),
    ("overpriced", "too expensive"),
    ("cheap", "inexpensive"),
    ("quiet", "silent"),
    ("excellent", "outstanding"),
    ("annoying", "irritating"),
    ("great", "terrific"),
    ("worth", "deserving of"),
    ("reliable", "dependable"),
    ("fine", "okay"),
    ("useless", "worthless"),
    ("sturdy", "robust"),
    ("dented", "damaged"),
)
SYNONYMS: dict[str, str] = {a: b for a, b in _PAIRS} | {b: a for a, b in _PAIRS if " " not in b}
_WORD = re.compile(r"[A-Za-z]+")
_SENTENCE = re.compile(r"(?<=[.!?])\s+")


def _swapper(swap: float, rng: random.Random) -> Callable[[re.Match[str]], str]:
    def swap_word(match: re.Match[str]) -> str:
        word = match.group(0)
        other = SYNONYMS.get(word.lower())
        if other is None or rng.random() >= swap:
            return word
        return other[0].upper() + other[1:] if word[0].isupper() else other

    return swap_word


def paraphrase(text: str, swap: float, reorder: float, rng: random.Random) -> str:
    """``text`` in other words: each word with a synonym swapped at ``swap``, adjacent
    sentences traded at ``reorder``."""
    swap_word = _swapper(swap, rng)
    out = []
    for line in text.split("\n"):
        sentences = _SENTENCE.split(line)
        i = 0
        while i + 1 < len(sentences):
            if rng.random() < reorder:
                sentences[i], sentences[i + 1] = sentences[i + 1], sentences[i]
                i += 2
            else:
                i += 1
        out.append(" ".join(_WORD.sub(swap_word, s) for s in sentences))
    return "\n".join(out)


class ParaphraseContaminationSpec(FaultSpec):
    """Mix paraphrases of training documents into the stream (semantic duplicates)."""

    kind: Literal["paraphrase_contamination"] = "paraphrase_contamination"
    description: ClassVar[str] = (
        "Inject paraphrased copies of training documents (semantic duplicates hash dedup misses)."
    )
    fault_class: ClassVar[FaultClass] = "data"
    reach: ClassVar[Reach] = "documents"
    triggers: ClassVar[tuple[Trigger, ...]] = ("at_step",)

    rate: Annotated[float, Bias((0.05, 0.001))] = Field(
        ge=0.001, le=0.05, description="Share of yielded documents that are paraphrases."
    )
    swap: Annotated[float, Bias((1.0, 0.5))] = Field(
        default=0.8, gt=0, le=1, description="Chance that a word with a synonym is swapped."
    )
    reorder: Annotated[float, Bias((0.0, 1.0))] = Field(
        default=0.5, ge=0, le=1, description="Chance that two adjacent sentences trade places."
    )
    pool: Annotated[int, Bias(upto=64)] = Field(
        default=16, ge=1, description="Paraphrases are of the first this many documents seen."
    )
    source: str | None = Field(
        default=None, min_length=1, description="Only paraphrase documents from this source."
    )


class _Paraphraser:
    """Each copy a fresh paraphrase of its original, drawn from the copy's own seed."""

    def __init__(self, spec: ParaphraseContaminationSpec) -> None:
        self.spec = spec

    def __call__(self, text: str, rng: random.Random) -> tuple[str, str]:
        """The copy's text and its contamination kind."""
        return paraphrase(text, self.spec.swap, self.spec.reorder, rng), "paraphrase"


class ParaphraseContaminationInjector(Injector[ParaphraseContaminationSpec]):
    """Its step hooks do nothing: the agent hands the trainer `wrap_documents`."""

    def wrap_documents(self, documents: Iterable[Any]) -> ContaminatedStream:
        """The stream over ``documents`` with paraphrased copies in it."""
        return ContaminatedStream(self.spec, documents, copies=_Paraphraser(self.spec))
