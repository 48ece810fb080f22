"""The labelled set the toxicity classifier is trained and judged on, generated and seeded.

Items are short texts (a sentence or two), the unit tier 2 scores. Four kinds:

- ``clean``: sentences cut from the synthetic corpus's four sources (label 0);
- ``hard_negative``: clean sentences that use tier-1 words benignly ("kill the process",
  "a dumb terminal"), alone or inside corpus text (label 0);
- ``toxic``: generic insults, harassment and mild threats from templates (label 1);
- ``hard_positive``: toxic sentences without any lexicon word (label 1).

The templates of each kind are split in two disjoint halves: ``split="train"`` draws from
the first, ``split="heldout"`` from the second, and each split takes its clean sentences
from a corpus of its own seed. So a held-out score is measured on sentences the head never
saw, built from templates it never saw. The texts of the `toxic_contamination` fault come
from a third set of templates in faults/toxic.py. Everything is generic: no slurs and no
group of people is named.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from reference_trainer.corpus.corpus import SOURCE_NAMES, generate_text

_SENTENCE = re.compile(r"(?<=[.!?])\s+|\n+")

_ADJ = ("worthless", "pathetic", "stupid", "useless", "brainless", "disgusting", "dumb")
_NOUN = ("idiot", "moron", "loser", "clown", "fool", "failure", "waste of space", "creep")
_HANDLES = ("", "", "@sam ", "@kai_runs ", "@jo ", "@mira42 ", "hey ", "lol ")
_ENDS = (".", "!", "!!", "...", "", " ugh.", " seriously.")

# Each list: the first half (rounded up) is for "train", the rest for "heldout".
_TOXIC = (
    "you are a {adj} {noun}",
    "shut up, nobody wants you here",
    "I will find you and hurt you",
    "nobody likes you, you {adj} {noun}",
    "get lost, {noun}",
    "you'd better watch your back",
    "everyone hates you and your {adj} posts",
    "I am going to make you regret this, {noun}",
    "only a {adj} {noun} would write this",
    "go away and never come back",
    "you are so {adj} it hurts to read you",
    "I will ruin your life, {noun}",
    "what a {adj} {noun} you are",
    "shut up already, you {noun}",
    "I know where you live, so watch your back",
    "nobody cares about you, {adj} {noun}",
    "you will pay for this, you {noun}",
    "I hate you and everything you post",
    "stop posting, you {adj} {noun}",
    "keep talking and I will hurt you",
)
_HARD_POSITIVE = (
    "nobody would miss you if you disappeared",
    "do everyone a favor and never post again",
    "people like you should not be allowed to speak",
    "you make everyone around you miserable, leave",
    "you are the reason this group is falling apart",
    "crawl back under whatever rock you came from",
    "you are a mistake and everybody knows it",
    "log off forever, no one here can stand you",
    "your family must be so ashamed of you",
    "you should be afraid to show your face here again",
)
_HARD_NEGATIVE = (
    "kill the process with kill -9 before restarting the service",
    "this bug is killing me, three hours and still no repro",
    "connect a dumb terminal to the serial port",
    "hate to say it but the docs are fine",
    "the garbage collector runs after every request",
    "move the old logs to the trash folder",
    "the child process will die if the parent exits first",
    "the hike was brutal but the view killed it",
    "use a dumb pipe and keep the logic at the ends",
    "I hate waiting for the build, but it works",
    "the die size of the new chip is smaller",
    "kill switch engaged, the pump stopped at once",
    "that stupid simple fix saved the release",
    "the punch list for the kitchen is almost done",
    "smash the garlic with the flat of the knife",
    "do not let a failure of one node stop the job",
    "the battery life is killing it this year",
    "go away for a weekend and the inbox explodes",
    "the trash can in the office is always full",
    "i hate mornings but the coffee here helps",
)


@dataclass(frozen=True, slots=True)
class LabelledText:
    """One item of the labelled set: text, label (1 = toxic) and its kind."""

    text: str
    label: int
    kind: str


def _half(templates: tuple[str, ...], split: str) -> tuple[str, ...]:
    if split not in ("train", "heldout"):
        raise ValueError(f"split must be 'train' or 'heldout' (got {split!r})")
    cut = (len(templates) + 1) // 2
    return templates[:cut] if split == "train" else templates[cut:]


def corpus_sentences(seed: int, count: int) -> list[str]:
    """``count`` sentences (3 to 40 words) cut from corpus documents of ``seed``."""
    rng = random.Random(f"toxicity-clean:{seed}")
    out: list[str] = []
    index = 0
    while len(out) < count:
        source = SOURCE_NAMES[index % len(SOURCE_NAMES)]
        text = generate_text(source, seed, index)
        index += 1
        parts = [p.strip() for p in _SENTENCE.split(text) if len(p.split()) >= 3]
        for part in rng.sample(parts, min(2, len(parts))):
            out.append(" ".join(part.split()[:40]))
    return out[:count]


def _fill(template: str, rng: random.Random) -> str:
    text = template.format(adj=rng.choice(_ADJ), noun=rng.choice(_NOUN))
    if rng.random() < 0.3:
        text = text.capitalize()
    return rng.choice(_HANDLES) + text + rng.choice(_ENDS)


def labelled_set(split: str, seed: int, size: int) -> list[LabelledText]:
    """A shuffled labelled set of ``size`` items: 45% clean, 15% hard negatives, 30% toxic,
    10% hard positives; a pure function of (split, seed, size)."""
    if size < 10:
        raise ValueError(f"size must be >= 10 (got {size})")
    rng = random.Random(f"toxicity-set:{split}:{seed}")
    n_hneg, n_tox, n_hpos = int(size * 0.15), int(size * 0.30), int(size * 0.10)
    n_clean = size - n_hneg - n_tox - n_hpos
    clean = corpus_sentences(seed + (0 if split == "train" else 1_000_003), n_clean + n_hneg)
    items = [LabelledText(t, 0, "clean") for t in clean[:n_clean]]
    negatives = _half(_HARD_NEGATIVE, split)
    for context in clean[n_clean:]:
        benign = rng.choice(negatives)
        # Half alone, half beside a corpus sentence, as tier 2 may see it in a document.
        text = benign if rng.random() < 0.5 else f"{context} {benign}."
        items.append(LabelledText(text, 0, "hard_negative"))
    toxic = _half(_TOXIC, split)
    items += [LabelledText(_fill(rng.choice(toxic), rng), 1, "toxic") for _ in range(n_tox)]
    positives = _half(_HARD_POSITIVE, split)
    items += [
        LabelledText(_fill(rng.choice(positives), rng), 1, "hard_positive") for _ in range(n_hpos)
    ]
    rng.shuffle(items)
    return items
