"""The `encyclopedia` source of the built-in corpus: article-like prose (a title, a
defining first sentence, dates, sections such as History and Description, a "See also"
list), composed from word lists and templates (`templates`). Every choice comes
from the `random.Random` passed in, so an article is a pure function of its seed."""

from __future__ import annotations

import random
from collections.abc import Mapping
from types import MappingProxyType

from reference_trainer.corpus.templates import (
    Fill,
    Slots,
    between,
    cap,
    ints,
    phrases,
    pick,
    templates,
    words,
)

_SYL = words("""mar ven tal or is bel dor ka lin sa ro thal en mir ost var ne gal ith pra
cor lu den fa hel ber quin ta sol mo""")


def _proper(rng: random.Random) -> str:
    # Invented names (two or three syllables), so articles do not repeat one another.
    return cap("".join(pick(rng, _SYL) for _ in range(between(rng, 2, 3))))


def _span(rng: random.Random) -> str:
    start = between(rng, 1400, 1990)
    return f"{start} and {start + between(rng, 2, 29)}"


#: Kinds of subject, each with the section names an article about it uses.
_KINDS = MappingProxyType(
    {
        "river": ("Course", "History", "Ecology", "Economy"),
        "town": ("History", "Geography", "Economy", "Culture"),
        "mountain range": ("Geology", "History", "Climate", "Ecology"),
        "species of bird": ("Description", "Distribution", "Behaviour", "Conservation"),
        "chemical compound": ("Properties", "Production", "Uses", "Safety"),
        "treaty": ("Background", "Terms", "Aftermath", "Legacy"),
        "musical instrument": ("Construction", "History", "Playing technique", "Repertoire"),
        "programming language": ("History", "Design", "Syntax", "Adoption"),
    }
)
_ENC_FILLS: Mapping[str, Fill] = MappingProxyType(
    {
        "name": _proper,
        "region": (
            "{name}",
            "{dir} {name}",
            "the {dir} {name} valley",
            "the {name} plateau",
            "the {dir} {name} coast",
        ),
        "dir": words("northern southern eastern western central upper lower"),
        "year": ints(1400, 2019),
        "span": _span,
        "century": lambda r: f"{between(r, 12, 20)}th century",
        "num": ints(3, 980),
        "pct": ints(2, 85),
        "km": lambda r: f"{between(r, 12, 3400)} km",
        "person": ("{title} {name} {name}", "{name} {name}"),
        "title": phrases(
            "the scholar, the engineer, the merchant, the explorer, the botanist, Queen, King"
        ),
        "trait": phrases("""its long history, its unusual shape, its role in trade, the quality of
its materials, its many local variants, its influence on later work, its distinctive sound,
its resistance to heat, its seasonal migration, its early adoption by schools"""),
        "group": phrases("""local farmers, traders from the coast, monks, the royal court, early
naturalists, a small group of engineers, travelling musicians, the first settlers"""),
        "change": words("grew declined recovered doubled spread shrank stabilised"),
        "adj": words("""notable early modern regional traditional rare common important
influential minor lasting widespread"""),
    }
)
_E_DEF = templates("""{subject} is a {kind} in {region}, known for {trait}. |
{subject} is a {adj} {kind} first described in {year}. |
{subject} (from the old {name} word for "{gloss}") is a {kind} associated with {region}. |
{subject} is a {kind} that {group} have used since the {century}.""")
_E_SENT = templates("""In {year}, {person} recorded the first detailed account of {subject}. |
By the {century}, {group} had made {subject} widely known in {region}. |
Between {span} its use {change} by about {pct} percent. |
The earliest surviving reference dates from {year}. |
It covers an area of roughly {km} and lies {num} metres above sea level. |
Estimates published in {year} put the total at {num} thousand. |
{subject} is often compared with {name}, which has a similar history. |
The {adj} form described by {person} differs mainly in {trait}. |
A survey in {year} found {num} distinct local variants. |
Its name was first recorded in {year}, in a letter by {person}. |
Interest {change} again after {year}, when {group} adopted it. |
Sources disagree on whether it predates the {century}. |
{cap_group} still regard it as {adj}, mainly for {trait}.""")
_GLOSS = words("stone water bright far old river crown bell swift green iron path")


def encyclopedia_article(rng: random.Random) -> str:
    """One article: a title, a definition with a date, sections, a "See also" list."""
    kind = pick(rng, tuple(_KINDS))
    slots = Slots(rng, {**_ENC_FILLS, "gloss": _GLOSS})
    slots.pin("kind", kind)
    subject = slots.pin(
        "subject", _proper(rng) + ("" if rng.random() < 0.6 else f" {_proper(rng)}")
    )
    slots.pin("cap_group", cap(slots["group"]))
    lead = [slots.fill(_E_DEF)] + [slots.fill(_E_SENT) for _ in range(between(rng, 1, 3))]
    parts = [subject, "", " ".join(lead)]
    sections = list(_KINDS[kind])
    target, count = between(rng, 120, 600), sum(len(p.split()) for p in parts)
    while count < target and sections:
        head = sections.pop(0)
        paragraphs = [
            " ".join(slots.fill(_E_SENT) for _ in range(between(rng, 2, 5)))
            for _ in range(between(rng, 1, 2))
        ]
        parts += ["", f"== {head} ==", "\n\n".join(paragraphs)]
        count += 2 + sum(len(p.split()) for p in paragraphs)
    see_also = [f"* {_proper(rng)} ({pick(rng, tuple(_KINDS))})" for _ in range(between(rng, 1, 4))]
    parts += ["", "== See also ==", *see_also]
    return "\n".join(parts) + "\n"
