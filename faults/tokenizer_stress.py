"""Tokenizer stress: mix documents a tokenizer handles badly into the training stream.

`StressedStream` wraps the trainer's document iterator like the duplicate-contamination
stream (faults/data.py): before each yielded document it decides, from the seed and the
slot number alone, whether that slot is a stress document (with probability ``rate``) or
the next original. A stress document is one of ``kinds``, drawn per slot:

- ``scripts``: words in Cyrillic, Greek, Devanagari, Arabic, CJK and emoji, with some in
  full-width and mathematical Latin letters (which NFKC normalization turns back to ASCII);
- ``digits``: plain words around very long runs of digits (100 to 400 digits each, one
  in ten words and at least one);
- ``control``: plain words with control characters (NUL, BEL, ESC, DEL, ...) between letters;
- ``broken``: plain words with lone surrogates (the undecodable bytes a reader keeps with
  ``errors="surrogateescape"``) and U+FFFD between them.

Originals come through unchanged, in order. Stress document number k (counting from 1) has
index ``-k``, the source of the last original before it, ``contamination_kind``
"tokenizer_stress" and ``contamination_of`` None (it copies nothing). The first slot is
always an original. Reach ``documents``, trigger ``at_step`` only (give ``at_step: 1``).
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field

from faults.bias import Bias
from faults.document_stream import InjectedStream, StreamDocument
from faults.injector import Injector
from faults.spec import FaultClass, FaultSpec, Reach, Trigger, seeded

KIND = "tokenizer_stress"
StressKind = Literal["scripts", "digits", "control", "broken"]
STRESS_KINDS: tuple[StressKind, ...] = ("scripts", "digits", "control", "broken")
_BLOCK = 1024  # slot decisions are drawn this many at a time (one seeded RNG per block)
_PLAIN = ("the", "data", "value", "system", "model", "order", "report", "token", "stream")
_SCRIPTS = (
    "привет мир данные модель поток",  # Cyrillic
    "γεια σου κόσμε δεδομένα",  # Greek
    "नमस्ते दुनिया डेटा मॉडल",  # Devanagari
    "مرحبا بالعالم بيانات",  # Arabic
    "你好世界 数据 模型 训练",  # CJK
    "😀 🚀 🧪 🔥 ✨",  # emoji
    "ｆｕｌｌ ｗｉｄｔｈ ｄａｔａ",  # full width (NFKC: ASCII)
    "𝐛𝐨𝐥𝐝 𝐦𝐚𝐭𝐡 𝐭𝐞𝐱𝐭",  # mathematical bold (NFKC: ASCII)
)
_CONTROL = "\x00\x01\x07\x08\x0b\x0c\x1b\x7f"
_BROKEN = ("\udc80", "\udcff", "\udce9", "\udcc3", "\ufffd")


class TokenizerStressSpec(FaultSpec):
    """Mix documents of unusual scripts, digit runs, control characters or broken bytes
    into the training stream."""

    kind: Literal["tokenizer_stress"] = "tokenizer_stress"
    description: ClassVar[str] = (
        "Inject documents of unusual scripts, long digit runs, control characters and broken UTF-8."
    )
    fault_class: ClassVar[FaultClass] = "data"
    reach: ClassVar[Reach] = "documents"
    #: The stream is stressed from its first document; no other trigger means anything.
    triggers: ClassVar[tuple[Trigger, ...]] = ("at_step",)

    rate: Annotated[float, Bias((0.5, 0.001))] = Field(
        ge=0.001, le=0.5, description="Share of yielded documents that are stress documents."
    )
    kinds: Annotated[list[StressKind], Bias()] = Field(
        default_factory=lambda: list(STRESS_KINDS),
        min_length=1,
        description="The kinds of stress document to draw from.",
    )
    words: Annotated[int, Bias((4, 1000))] = Field(
        default=40, ge=4, le=1000, description="Words in each stress document."
    )


def _word(rng: random.Random) -> str:
    return rng.choice(_PLAIN)


def stress_text(kind: StressKind, words: int, rng: random.Random) -> str:
    """One stress document of ``kind`` with about ``words`` words."""
    out: list[str] = []
    for i in range(words):
        if kind == "scripts":
            out.append(rng.choice(rng.choice(_SCRIPTS).split()))
        elif kind == "digits":
            if rng.random() < 0.1 or i == words // 2:  # at least one run
                out.append("".join(rng.choice("0123456789") for _ in range(rng.randint(100, 400))))
            else:
                out.append(_word(rng))
        elif kind == "control":
            word = _word(rng)
            cut = rng.randrange(len(word) + 1)
            out.append(word[:cut] + rng.choice(_CONTROL) + word[cut:])
        else:
            out.append(_word(rng) + "".join(rng.choice(_BROKEN) for _ in range(rng.randint(1, 3))))
    return " ".join(out)


class StressedStream(InjectedStream):
    """Documents (anything with .index, .source, .text) plus tagged stress documents."""

    state_name = "tokenizer-stress stream"
    injected_key = "stressed"

    def __init__(self, spec: TokenizerStressSpec, documents: Iterable[Any]) -> None:
        super().__init__(spec, documents)
        self.spec: TokenizerStressSpec = spec
        self._last_source: str | None = None

    def _draw(self, slot: int) -> float:
        block, offset = divmod(slot, _BLOCK)
        return seeded(self.spec.seed, KIND, "slots", block, offset).random()

    def _may_inject(self) -> bool:
        return self._last_source is not None  # it comes as from the last original's source

    def _inject(self, slot: int) -> StreamDocument:
        rng = seeded(self.spec.seed, KIND, "doc", slot)
        kind = self.spec.kinds[rng.randrange(len(self.spec.kinds))]
        text = stress_text(kind, self.spec.words, rng)
        assert self._last_source is not None
        return StreamDocument(-self._injected, self._last_source, text, None, KIND)

    def _passed(self, doc: StreamDocument) -> None:
        self._last_source = doc.source

    def _extra_state(self) -> dict[str, Any]:
        return {"last_source": self._last_source}

    def _read_extra(self, state: dict[str, Any]) -> str | None:
        last = state["last_source"]
        return None if last is None else str(last)

    def _set_extra(self, extra: str | None) -> None:
        self._last_source = extra


class TokenizerStressInjector(Injector[TokenizerStressSpec]):
    """Its step hooks do nothing: the agent hands the trainer `wrap_documents`."""

    def wrap_documents(self, documents: Iterable[Any]) -> StressedStream:
        """The stressed stream over ``documents``."""
        return StressedStream(self.spec, documents)
