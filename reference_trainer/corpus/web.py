"""The `web` source of the built-in corpus: web-page-like prose (navigation crumbs, a
heading, a byline, short paragraphs under subheadings, bullet lists, a footer), composed
from word lists and templates (`templates`). Every choice comes from the
`random.Random` passed in, so a page is a pure function of its seed."""

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

_SECTIONS = MappingProxyType(
    {
        "Travel": phrases("""city guides, weekend trips, road trips, budget travel, train
journeys, island hopping, mountain towns, food tours"""),
        "Food": phrases("""weeknight dinners, baking, meal prep, soups and stews, street food,
vegetarian recipes, breakfast ideas, pantry basics"""),
        "Home": phrases("""small repairs, gardening, decluttering, kitchen upgrades, paint and
color, storage ideas, energy savings, houseplants"""),
        "Money": phrases("""budgeting, saving for a house, credit cards, retirement basics,
side income, taxes made simple, family finances"""),
        "Health": phrases("""running for beginners, strength training, sleep habits, healthy
snacks, stretching, walking routines, stress and focus"""),
        "Pets": phrases("""puppy training, cat care, aquariums, pet nutrition, adopting a
pet, senior dogs, small animals"""),
    }
)


def _budget(rng: random.Random) -> str:
    low = between(rng, 3, 240)
    return f"${low} to ${low + between(rng, 5, 150)}"


_TIPS = phrases("""start small, write it down, check the weather, set a timer, keep the
receipt, measure twice, ask a neighbor, compare three prices, read the label, take a photo
first, do it in the morning, keep a spare""")
_MONTHS = words(
    "January February March April May June July August September October November December"
)
_WEB_FILLS: Mapping[str, Fill] = MappingProxyType(
    {
        "place": words("""Lisbon Kyoto Oaxaca Tallinn Porto Hanoi Bergen Cusco Seville Quebec
Tbilisi Ljubljana Valparaiso Hobart Galway Split Matera Hoi-An Bruges Asheville Leiden"""),
        "thing": phrases("""a cast iron pan, a rain jacket, a good pair of shoes, a slow
cooker, a reusable bottle, a folding bike, a paper planner, a pocket knife, a travel pillow,
a spare key, a first aid kit, a cheap tripod, a label maker, a sturdy ladder"""),
        "food": phrases("""lentil soup, banana bread, fried rice, tomato sauce, roasted
vegetables, overnight oats, chili, flatbread, fish tacos, pancakes, curry, potato salad"""),
        "task": phrases("""fixing a leaky tap, repotting a plant, packing a carry-on, planning
a budget, cleaning the oven, training for a 5k, choosing a mattress, booking cheap flights,
painting a room, starting a compost bin, filing a tax return, walking a new puppy"""),
        "adj": words("""simple easy quick cheap honest practical essential surprising useful
complete friendly smart realistic little-known proven"""),
        "mistake": phrases("""skipping the first step, buying too much at once, ignoring the
label, rushing the last part, forgetting to measure, trusting the first review you read,
leaving it until the weekend, doing it without a plan"""),
        "tip": _TIPS,
        "cap_tip": tuple(cap(t) for t in _TIPS),
        "who": phrases("""our editors, readers, a local guide, one of our writers, my
neighbor, a retired carpenter, a nurse we spoke to, a long-time subscriber"""),
        "n": ints(2, 12),
        "big": ints(15, 95),
        "price": lambda r: f"${between(r, 3, 240)}",
        "budget": _budget,
        "year": ints(2009, 2025),
        "site": words("""Everyday-Notes HomeBase TrailMix KitchenTable Penny-Wise WellDone
Pawprint OpenRoad Sunday-Post Hearth HandyHub"""),
    }
)
_W_TITLE = templates("""{n} {adj} tips for {task} | How to start {task} without stress |
The {adj} guide to {task} | Why {thing} is worth {price} | {n} things to do in {place} |
What nobody tells you about {task} | Our {adj} recipe for {food} | A weekend in {place}
on {price}""")
_W_HEAD = templates("""Before you start | What you need | Step {n}: {tip} | Common mistakes |
Our verdict | Where to stay in {place} | How much it costs | Frequently asked questions |
Why it works | The short version | Getting there | Tips from {who}""")
_W_SENT = templates("""Most people spend about {price} on {thing}, but you can do it for less. |
It takes around {n} minutes, and the hardest part is {mistake}. |
We tried this {n} times, and the {adj} version worked best. |
If you only remember one thing, {tip}. | According to {who}, the trick is to {tip}. |
In {place} you can find {food} for under {price}. |
Around {big} percent of readers said {task} took longer than planned. |
The biggest mistake is {mistake}. | You do not need {thing}, but it helps. |
Plan for {n} hours if this is your first time. |
Last updated in {year}: prices and opening times may have changed. |
Our tester in {place} said it was {adj} and cost {price}. |
Keep {thing} nearby, you will need it in step {n}. |
When {task} feels slow, {tip} and take a short break.""")
_W_ITEM = templates("""{thing} ({price}) | {cap_tip} | About {n} minutes of prep |
Avoid {mistake} | Pack {food} for the road | Works for {n} people | Budget: {budget}""")


def web_page(rng: random.Random) -> str:
    """One web page: crumbs, title, byline, sections of short paragraphs and lists."""
    section = pick(rng, tuple(_SECTIONS))
    slots = Slots(rng, _WEB_FILLS)
    crumb = cap(pick(rng, _SECTIONS[section]))
    title = cap(slots.fill(_W_TITLE))
    byline = (
        f"By {slots['who']} | Updated {between(rng, 1, 28)} "
        f"{pick(rng, _MONTHS)} {slots['year']} | {slots['n']} min read"
    )
    parts = [f"Home > {section} > {crumb}", "", f"# {title}", byline, ""]
    parts.append(" ".join(slots.fill(_W_SENT) for _ in range(between(rng, 1, 3))))
    target, count = between(rng, 80, 420), sum(len(p.split()) for p in parts)
    while count < target:
        head = "## " + cap(slots.fill(_W_HEAD))
        if rng.random() < 0.6:
            body = " ".join(slots.fill(_W_SENT) for _ in range(between(rng, 1, 4)))
        else:
            body = "\n".join(f"- {slots.fill(_W_ITEM)}" for _ in range(between(rng, 3, 6)))
        parts += ["", head, body]
        count += len(head.split()) + len(body.split())
    related = " | ".join(cap(slots.fill(_W_TITLE)) for _ in range(between(rng, 1, 3)))
    parts += [
        "",
        f"Related: {related}",
        f"(c) {slots['year']} {slots['site']}. All rights reserved.",
    ]
    return "\n".join(parts) + "\n"
