"""The sources of the built-in corpus: technical docs, social chatter and product
reviews here, code in `code`, web pages in `web`, encyclopedia articles in
`encyclopedia`, each composed from word lists and templates
(`templates`). Every choice comes from the `random.Random` passed in, so a document
is a pure function of its seed (see `reference_trainer.corpus.corpus`)."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from types import MappingProxyType

from reference_trainer.corpus.code import code_document
from reference_trainer.corpus.encyclopedia import encyclopedia_article
from reference_trainer.corpus.templates import (
    Fill,
    Slots,
    between,
    cap,
    ints,
    number,
    phrases,
    pick,
    templates,
    words,
)
from reference_trainer.corpus.web import web_page

# ---------------------------------------------------------------- technical_docs
_T_PROJECT = words("""Kestrel Ferrite Nimbus Osprey Quarry Halyard Lattice Tamarack Cobalt Juniper
Meridian Basalt Corvid Heron Vantage Sable Tundra Orchard Beacon Pylon Cinder Marlin Zephyr
Granite Fathom Lumen Sparrow Aster Talon Ridge Ember Harbor Pinecone Wren Obsidian Comet Anvil""")
_TECH_FILLS: Mapping[str, Fill] = MappingProxyType(
    {
        "n": words(
            """server cache buffer queue worker scheduler endpoint daemon cluster node replica
shard index partition pipeline gateway proxy listener socket session token certificate secret
volume snapshot backup metric counter histogram dashboard alert probe handler middleware plugin
module package registry container image runtime kernel driver thread pool connection cursor
transaction schema table column migration planner optimizer compiler loader parser tokenizer
encoder decoder checkpoint tensor batch dataset sampler allocator heap router balancer resolver
controller webhook job task agent collector exporter watcher journal ledger lease lock mirror
bucket archive manifest profile namespace tenant quota budget policy rule filter hook stream
topic consumer producer"""
        ),
        "v": words("""configure enable disable restart deploy rotate flush compress validate inspect
monitor throttle retry replicate migrate upgrade install remove mount export serialize encrypt
sign verify schedule cancel drain scale provision allocate release profile benchmark tune
override reload refresh purge archive restore initialize register evict pin rebalance warm"""),
        "a": words("""default optional persistent transient global local remote internal external
primary secondary read-only writable idle active stale healthy degraded experimental deprecated
stable legacy verbose quiet strict lenient synchronous asynchronous distributed isolated shared
dedicated ephemeral encrypted compressed cached partial incremental full small large busy"""),
        "oa": words("max min default initial idle request read write flush retry batch queue pool"),
        "ob": words("""timeout size limit interval count depth ratio threshold capacity delay window
period budget level factor bytes"""),
        "opt": ("{oa}_{n}_{ob}", "{n}_{ob}"),
        "flag": ("{oa}-{n}-{ob}", "{n}-{ob}"),
        "proj": _T_PROJECT,
        "pl": tuple(p.lower() for p in _T_PROJECT),
        "sub": words("start stop status apply diff sync plan drain cordon logs describe rollout"),
        "cmd": ("{pl}ctl {sub} --{flag}={int}",),
        "dir": words("etc var opt srv data home usr/local run"),
        "ext": words(".yaml .toml .conf .ini .json .env .cfg"),
        "path": ("/{dir}/{pl}/{n}{d}{ext}",),
        "du": words("seconds milliseconds minutes hours ms"),
        "su": words("bytes kilobytes megabytes gigabytes KB MB GB MiB GiB"),
        "cu": words("requests connections threads retries workers entries pages rows files"),
        "q": ("{int} {du}", "{int} {su}", "{int} {cu}"),
        "dur": ("{int} {du}",),
        "size": ("{int} {su}",),
        "d": ints(1, 9),
        "ver": lambda r: f"{between(r, 0, 9)}.{between(r, 0, 30)}.{between(r, 0, 20)}",
        "int": number,
        "pct": lambda r: f"{between(r, 1, 60)} percent",
    }
)
_T_TITLE = templates("""{v} the {a} {n} | {topic} {n} guide | Running {topic} with a {a} {n} |
{topic} {ver} release notes | Tuning the {n} in {topic} | How {topic} handles {a} {n} traffic""")
_T_HEAD = templates("""{v} the {n} | The {a} {n} | Limits for the {n} | Upgrading to {ver} |
{n} and {n} settings | When the {n} is {a} | Sizing the {a} {n} pool | Troubleshooting the {n}""")
_T_INTRO = templates("""The {topic} coordinates every {n} and {n} in a {a} deployment. |
This page explains how the {topic} will {v} a {n} and which options matter. |
Since {ver}, the {topic} can {v} each {a} {n} without a restart. |
Most {a} clusters run the {topic} with {size} of headroom per {n}. |
Read this before you {v} the {topic} on more than {int} nodes.""")
_T_SENT = templates("""Set the {n} timeout to {dur} if the {n} needs to {v} the {n} more often. |
By default the {n} will {v} every {dur}, which is fine for {a} setups. |
When `{opt}` exceeds {q}, the {n} falls back to the {a} {n}. |
Version {ver} changed the default of `{opt}` from {int} to {int}. |
You can {v} the {n} with `{cmd}` and then {v} the {n}. |
If the {n} reports {int} errors within {dur}, {v} the {a} {n} first. |
The {topic} keeps a {a} {n} of up to {q} per {n}. |
Each {n} reserves {size} for the {a} {n}, so plan for {int} of them. |
On {a} clusters we recommend {q} for `{opt}` and {q} for `{opt}`. |
Before {ver}, the {topic} would {v} the {n} on every {n} restart. |
Logs for the {n} are written to {path} and rotated after {size}. |
A {a} {n} usually settles within {dur}; anything above {dur} suggests a {a} {n}. |
Use `{cmd}` to {v} the {n} without touching the {a} {n}. |
The {topic} exposes {int} metrics, including `{opt}` and `{opt}`. |
Throughput drops by about {pct} when the {n} has to {v} the {n}. |
Setting `{opt}` to {int} disables the {a} {n} entirely. |
In our benchmarks on {int} nodes, the {n} handled {int} requests per second. |
Keep `{opt}` below {q}, otherwise the {n} may {v} the {n} twice. |
Each {n} must {v} its {n} within {dur} or it is marked {a}. |
Edit {path} and raise `{opt}` to {q} for {a} workloads. |
A typical {a} deployment runs {int} {n} processes with {size} each. |
The {n} retries up to {int} times, waiting {dur} between attempts. |
Errors such as E{int} mean the {n} could not {v} the {n}. |
Ports {int} and {int} must be open between each {n} and the {topic}. |
The {n} caches {size} of {a} data, so {v} it after large changes. |
Large values of `{opt}` trade {size} of memory for fewer {n} stalls. |
The {topic} writes a {n} every {dur} to {path}. |
Only {a} {n} entries older than {dur} are eligible to {v}.""")
_T_STEP = templates("""{v} the {n} with `{cmd}`. | Open {path} and set `{opt}` to {q}. |
Wait {dur} for the {n} to {v} the {n}. | Check that `{opt}` reads {int} in the {n} output. |
Restart the {n} and confirm that it reports version {ver}. |
Run `{cmd}` on each of the {int} nodes. | Copy {path} to {path} before you {v} the {n}. |
Lower `{opt}` to {q} and {v} the {a} {n}.""")
_T_OPTION = templates(
    """- `{opt}` (default: {dur}): how long the {n} waits before it will {v} the {n}. |
- `{opt}` (default: {int}): the number of {a} {n} slots per {n}. |
- `{opt}` (since {ver}): set to {q} to {v} the {a} {n}. |
- `{opt}`: maximum {size} the {n} may spend on each {n}."""
)


def _technical_docs(rng: random.Random) -> str:
    slots = Slots(rng, _TECH_FILLS)
    slots.pin("topic", slots.fill(("{proj} {n}",)))
    # About 7% long documents, so that some exceed a 1024-token context.
    # Targets leave room for the last section, which may overshoot by ~130 words.
    target = between(rng, 1200, 2370) if rng.random() < 0.07 else between(rng, 150, 480)
    title = " ".join(cap(w) for w in slots.fill(_T_TITLE).split())
    intro = " ".join(slots.fill(_T_INTRO) for _ in range(between(rng, 1, 3)))
    parts = [f"# {title}", intro]
    count = len(title.split()) + len(intro.split())
    while count < target:
        head = "## " + cap(slots.fill(_T_HEAD))
        r = rng.random()
        if r < 0.5:
            body = " ".join(slots.fill(_T_SENT) for _ in range(between(rng, 3, 8)))
        elif r < 0.75:
            steps = range(1, between(rng, 3, 7) + 1)
            body = "\n".join(f"{i}. {cap(slots.fill(_T_STEP))}" for i in steps)
        elif r < 0.9:
            body = "\n".join(slots.fill(_T_OPTION) for _ in range(between(rng, 2, 5)))
        else:
            lines = (f"{slots['opt']} = {slots['int']}" for _ in range(between(rng, 2, 6)))
            body = f"```\n[{slots['n']}]\n" + "\n".join(lines) + "\n```"
        parts += ["", head, body]
        count += len(head.split()) + len(body.split())
    return "\n".join(parts) + "\n"


# ---------------------------------------------------------------- social_chatter
_SOCIAL_FILLS: Mapping[str, Fill] = MappingProxyType(
    {
        "h": ("@{name}{nick}{hd}", "@{name}_{nick}{hd}"),
        "name": words("""sam alex jo kim max lee ria dev nina omar zoe ben tess raj mia leo ivy kai
noor eli ava finn luca maya theo ruby owen lena cruz ada"""),
        "nick": words("codes bakes runs reads writes hikes games lifts draws vibes eats sings"),
        "hd": lambda r: str(between(r, 1, 999)) if r.random() < 0.6 else "",
        "tag": ("#{tagw}",),
        "tagw": words("""MondayMood TechTwitter coffee weekendvibes devlife booktok running gaming
foodie catsofinstagram gardening throwback nofilter remotework sourdough marathon indiedev
photography rainyday plantparent wfh motivation"""),
        "thing": phrases("""the new album, my sourdough starter, this heatwave, the season finale,
my group chat, the bus route, our office coffee machine, the final boss, my sleep schedule,
this playlist, the city marathon, my landlord, the new update, that podcast episode, my fantasy
team, the farmers market, the gym playlist, my balcony tomatoes, the group project, the power
outage, the late train, my side project, the book club pick, the new cafe downtown, my cat"""),
        "feel": words("""amazing awful unreal wild chaotic wholesome cursed iconic underrated
overrated exhausting hilarious brutal cozy perfect mid elite rough"""),
        "ing": words("""watching reading cooking fixing skipping rewatching organizing debugging
painting planning training streaming learning building"""),
        "slang": words("lol tbh ngl honestly literally lowkey imo idk omg ugh yay wow bruh fr smh"),
        "day": words(
            "Monday Tuesday Wednesday Thursday Friday Saturday Sunday weekend morning night"
        ),
        "who": phrases(
            "my mom, my roommate, the whole team, my neighbor, half the internet, my brother"
        ),
        "int": ints(2, 60),
        "clock": lambda r: f"{between(r, 1, 12)}:{between(r, 0, 59):02d}{pick(r, 'ap')}m",
    }
)
_S_SENT = templates("""just spent {int} hours {ing} {thing} and honestly it was {feel} |
{slang} {thing} is {feel} and I will not be taking questions |
who else is {ing} {thing} at {clock} on a {day} | day {int} of {ing} {thing}, still {feel} |
{who} said {thing} was {feel}, {slang} | hot take: {thing} is {feel}, fight me {h} |
{h} you were right about {thing}, {slang} | woke up at {clock} to {thing} being {feel} again |
{int} likes and {who} still ignores me {slang} | not me {ing} {thing} again at {clock} |
ok {thing} is actually {feel}, {h} thoughts? | can we talk about how {feel} {thing} was on {day} |
{slang} {who} and I spent {int} minutes {ing} | {thing} at {clock}? {feel}. {slang} |
update: {thing} is {feel} now, thanks {h} | rating {thing} a solid {int}/10, {slang} |
missed {thing} by {int} minutes, {feel} {day} | {who} keeps {ing} {thing} and it is {feel}""")


def _social_chatter(rng: random.Random) -> str:
    slots = Slots(rng, _SOCIAL_FILLS)
    target = between(rng, 20, 95)
    parts = [slots["h"] for _ in range(between(rng, 1, 2))] if rng.random() < 0.4 else []
    count = len(parts)
    while count < target:
        sentence = slots.fill(_S_SENT)
        parts.append(cap(sentence) + pick(rng, (".", "!", "...", "!!", "")))
        count += sentence.count(" ") + 1
    parts += [slots["tag"] for _ in range(between(rng, 0, 3))]
    return " ".join(parts)


# ---------------------------------------------------------------- product_reviews
_R_CAT = phrases("""blender, wireless headphones, backpack, desk lamp, air fryer, running shoes,
water bottle, phone case, office chair, electric kettle, robot vacuum, yoga mat, smartwatch,
coffee grinder, bluetooth speaker, hiking boots, laptop stand, rice cooker, camping tent,
mechanical keyboard, space heater, toaster, webcam, cast iron pan, standing desk""")
_REVIEW_FILLS: Mapping[str, Fill] = MappingProxyType(
    {
        "brand": words("""Nordvik Zentrix Halden Brightloom Corvo Pellucid Ardent Tovana Quillon
Maxwell Ostara Vireo Kinetica Lumaro Fenwick Solace Trekkon Arbor Calyx Dunmore"""),
        "model": words("Pro Max Mini Lite Plus Air Go Flex Ultra Neo"),
        "anycat": _R_CAT,
        "other": ("{brand} {anycat} {model} {pn}",),
        "pn": ints(2, 900),
        "feat": phrases("""battery life, build quality, sound, the hinge, the zipper, the handle,
noise level, the app, setup, the manual, cleaning, the cord, the buttons, the lid, the fit,
the grip, heat output, the finish, the charging port, the straps, the display, support"""),
        "pos": words("""excellent solid sturdy great impressive reliable quiet comfortable sleek
well-made responsive generous smooth fantastic dependable"""),
        "neg": words("""flimsy loud disappointing cheap awkward fragile sluggish clunky noisy
useless inconsistent annoying overpriced wobbly mediocre"""),
        "who": phrases(
            "my partner, my kids, my roommate, my dad, our whole team, my sister, the dog"
        ),
        "int": ints(2, 40),
        "price": ("${dollars}.{cents}",),
        "dollars": ints(5, 499),
        "cents": ("99", "95", "49", "00", "89"),
        "time": ("{tn} days", "{tn} weeks", "{tn} months"),
        "tn": ints(2, 11),
    }
)
_R_GOOD = templates("""I bought the {product} for {price} and {feat} is {pos}. |
After {time} of daily use, {feat} is still {pos}. |
{who} uses the {cat} every day and loves how {pos} {feat} is. |
Compared to the {other}, {feat} is far more {pos}. |
Worth every cent of {price}; {feat} alone is {pos}. |
Setup took {int} minutes and {feat} felt {pos} right away. |
Honestly the most {pos} {cat} I have owned in {int} years. |
It survived {time} of travel and {feat} stayed {pos}.""")
_R_BAD = templates("""For {price} I expected better, {feat} is {neg}. |
After {time} {feat} became {neg} and support took {int} days to reply. |
{who} returned it because {feat} was {neg}. |
The {other} costs less and its {feat} is not this {neg}. |
{feat} is {neg}, and the {cat} stopped working after {time}. |
I gave it {int} tries but {feat} is just {neg}. |
Mine arrived with {feat} already {neg}, replacement took {time}.""")
_R_MEH = templates("""It does the job, but {feat} is {neg} while {feat} is {pos}. |
At {price} the {cat} is fine, nothing more. | {who} likes it, I think {feat} could be less {neg}. |
Shipping took {time} and the box was dented. | I use it maybe {int} times a week.""")


def _product_reviews(rng: random.Random) -> str:
    slots = Slots(rng, _REVIEW_FILLS)
    slots.pin("cat", slots["anycat"])
    product = slots.pin("product", slots.fill(("{brand} {cat} {model} {pn}",)))
    stars = between(rng, 1, 5)
    good = (0.1, 0.25, 0.5, 0.75, 0.9)[stars - 1]
    head = f"{product} - {stars}/5 stars\nPrice paid: {slots['price']}"
    pros = ", ".join(slots.fill(("{feat} is {pos}",)) for _ in range(between(rng, 1, 3)))
    cons = ", ".join(slots.fill(("{feat} is {neg}",)) for _ in range(between(rng, 1, 3)))
    votes = between(rng, 0, 300)
    tail = f"Pros: {pros}\nCons: {cons}\n\n{between(rng, 0, votes)} of {votes} people found this"
    body: list[str] = []
    count, target = len(head.split()) + len(tail.split()) + 1, between(rng, 40, 230)
    while count < target or not body:
        r = rng.random()
        sentence = slots.fill(_R_MEH if r < 0.2 else _R_GOOD if r < 0.2 + 0.8 * good else _R_BAD)
        body.append(cap(sentence))
        count += sentence.count(" ") + 1
    return f"{head}\n\n{' '.join(body)}\n\n{tail} helpful.\n"


GENERATORS: Mapping[str, Callable[[random.Random], str]] = MappingProxyType(
    {
        "technical_docs": _technical_docs,
        "social_chatter": _social_chatter,
        "product_reviews": _product_reviews,
        "code": code_document,
        "web": web_page,
        "encyclopedia": encyclopedia_article,
    }
)
