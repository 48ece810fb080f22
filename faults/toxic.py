"""Data fault: contaminate the training stream with toxic documents.

`ToxicStream` wraps the trainer's document iterator like `faults.data.ContaminatedStream`:
before each yielded document it decides, from the seed and the slot number alone, whether
that slot is an injected toxic document (with probability ``rate``) or the next original.
An injected document is a short post of one to three generic insults, harassment or mild
threats (no slurs, no group of people named), with a benign chat sentence before it now
and then (probability ``context``), so a filter that only reads a document's first words
misses some. Its texts come from templates of this module only, disjoint from those the
toxicity classifier is trained and judged on, so a scenario does not grade memorized
sentences.

Injected document number k (counting from 1) has index ``-k``, source ``social_chatter``
(or ``source``), ``contamination_kind`` "toxic" and, in ``contamination_of``, the index of
the last original before it (-1 before the first one). Originals come through unchanged.
Like duplicate contamination, the kind's reach is ``documents`` and its only trigger is
``at_step`` (give ``at_step: 1``); a plan holds at most one documents fault.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field

from faults.bias import Bias
from faults.document_stream import InjectedStream, StreamDocument
from faults.injector import Injector
from faults.spec import FaultClass, FaultSpec, Reach, Trigger, seeded

KIND = "toxic_contamination"

_ADJ = ("worthless", "pathetic", "stupid", "useless", "brainless", "miserable")
_NOUN = ("idiot", "moron", "loser", "clown", "fool", "joke")
_TEMPLATES = (
    "you are the most {adj} {noun} I have ever seen",
    "shut up and get lost, {noun}",
    "nobody wants your {adj} opinions here",
    "I will find you, so watch your back",
    "everyone hates you, {noun}, go away",
    "you {adj} {noun}, I promise you will regret this",
    "keep it up and I will destroy you",
    "what a {adj} little {noun}, nobody cares what you think",
    "get out of here and never come back, you {noun}",
    "I am coming for you, {noun}",
    "you are a {adj} excuse for a person",
    "say that again and I will hurt you",
)
_CONTEXT = (
    "Just saw your post about the new cafe downtown.",
    "Read the whole thread this morning.",
    "Ok I have to say something about this.",
    "Saw your reply on the release notes.",
)
_ENDS = (".", "!", "!!", "...")


class ToxicContaminationSpec(FaultSpec):
    """Mix generic toxic posts (insults, harassment, mild threats) into the stream."""

    kind: Literal["toxic_contamination"] = "toxic_contamination"
    description: ClassVar[str] = "Inject toxic posts (insults, harassment, threats)."
    fault_class: ClassVar[FaultClass] = "data"
    reach: ClassVar[Reach] = "documents"
    #: The stream is contaminated from its first document; no other trigger means anything.
    triggers: ClassVar[tuple[Trigger, ...]] = ("at_step",)

    rate: Annotated[float, Bias((0.2, 0.001))] = Field(
        ge=0.001, le=0.2, description="Share of yielded documents that are injected toxic posts."
    )
    context: Annotated[float, Bias((0.0, 1.0))] = Field(
        default=0.3, ge=0, le=1, description="Share that start with a benign sentence."
    )
    source: str = Field(
        default="social_chatter", min_length=1, description="Source the posts claim."
    )


def toxic_text(seed: int, number: int, context: float) -> str:
    """Injected post ``number``'s text: a pure function of the seed, number and share."""
    rng = seeded(seed, KIND, "text", number)
    sentences = []
    for _ in range(rng.randint(1, 3)):
        template = rng.choice(_TEMPLATES)
        sentence = template.format(adj=rng.choice(_ADJ), noun=rng.choice(_NOUN))
        sentences.append(sentence[0].upper() + sentence[1:] + rng.choice(_ENDS))
    if rng.random() < context:
        sentences.insert(0, rng.choice(_CONTEXT))
    return " ".join(sentences)


class ToxicStream(InjectedStream):
    """Documents (anything with .index, .source, .text) plus tagged toxic posts."""

    state_name = "toxic-stream"

    def __init__(self, spec: ToxicContaminationSpec, documents: Iterable[Any]) -> None:
        super().__init__(spec, documents)
        self.spec: ToxicContaminationSpec = spec
        self._last_index = -1  # the last original's (resume the documents just after it)

    def _inject(self, slot: int) -> StreamDocument:
        text = toxic_text(self.spec.seed, self._injected, self.spec.context)
        return StreamDocument(-self._injected, self.spec.source, text, self._last_index, "toxic")

    def _passed(self, doc: StreamDocument) -> None:
        self._last_index = doc.index

    def _extra_state(self) -> dict[str, Any]:
        return {"last_index": self._last_index}

    def _read_extra(self, state: dict[str, Any]) -> int:
        return int(state["last_index"])

    def _set_extra(self, extra: int) -> None:
        self._last_index = extra


class ToxicContaminationInjector(Injector[ToxicContaminationSpec]):
    """Its step hooks do nothing: the agent hands the trainer `wrap_documents`."""

    def wrap_documents(self, documents: Iterable[Any]) -> ToxicStream:
        """The stream over ``documents`` with toxic posts mixed in."""
        return ToxicStream(self.spec, documents)
