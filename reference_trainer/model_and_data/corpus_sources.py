"""The four sources of the built-in corpus: word lists, sentence templates and the
generators that compose them. Every choice comes from the `random.Random` passed in, so a
document is a pure function of its seed (see `reference_trainer.model_and_data.corpus`)."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType

# A slot is filled from a tuple (one item at random; an item holding `{slots}` is filled in
# turn, which is how compound values such as paths are built) or by a function.
_Fill = tuple[str, ...] | Callable[[random.Random], str]


def _w(text: str, sep: str | None = None) -> tuple[str, ...]:
    # Deduplicate so an accidental repeat in a list cannot skew the sampling odds.
    items = text.split() if sep is None else text.replace("\n", " ").split(sep)
    return tuple(dict.fromkeys(s.strip() for s in items if s.strip()))


def _p(text: str) -> tuple[str, ...]:
    return _w(text, ",")


def _t(text: str) -> tuple[str, ...]:
    # Templates are separated by "|" so that short ones can share a source line.
    return _w(text, "|")


def _pick(rng: random.Random, seq: Sequence[str]) -> str:
    # rng.random() is several times cheaper than rng.choice and just as reproducible.
    return seq[int(rng.random() * len(seq))]


def _between(rng: random.Random, lo: int, hi: int) -> int:
    return lo + int(rng.random() * (hi - lo + 1))


def _ints(lo: int, hi: int) -> Callable[[random.Random], str]:
    return lambda rng: str(_between(rng, lo, hi))


def _num(rng: random.Random) -> str:
    # A mix of small, power-of-two and large values, like real configs and logs.
    r = rng.random()
    if r < 0.5:
        return str(_between(rng, 1, 99))
    return str(2 ** _between(rng, 3, 14) if r < 0.75 else _between(rng, 100, 20000))


def _cap(text: str) -> str:
    return text[:1].upper() + text[1:]


class _Slots:
    """Answers every `{key}` of a template with a fresh random value (or a per-document one)."""

    __slots__ = ("_fills", "_random", "_rng")

    def __init__(self, rng: random.Random, fills: Mapping[str, _Fill]) -> None:
        self._rng, self._random = rng, rng.random  # the bound method saves a lookup per slot
        # A private copy, so per-document values can be pinned with `pin`.
        self._fills: dict[str, _Fill | str] = dict(fills)

    def __getitem__(self, key: str) -> str:
        fill = self._fills[key]
        if isinstance(fill, tuple):
            value = fill[int(self._random() * len(fill))]
            return value.format_map(self) if "{" in value else value
        return fill if isinstance(fill, str) else fill(self._rng)

    def pin(self, key: str, value: str) -> str:
        self._fills[key] = value
        return value

    def fill(self, templates: Sequence[str]) -> str:
        return templates[int(self._random() * len(templates))].format_map(self)


# ---------------------------------------------------------------- technical_docs
_T_PROJECT = _w("""Kestrel Ferrite Nimbus Osprey Quarry Halyard Lattice Tamarack Cobalt Juniper
Meridian Basalt Corvid Heron Vantage Sable Tundra Orchard Beacon Pylon Cinder Marlin Zephyr
Granite Fathom Lumen Sparrow Aster Talon Ridge Ember Harbor Pinecone Wren Obsidian Comet Anvil""")
_TECH_FILLS: Mapping[str, _Fill] = MappingProxyType(
    {
        "n": _w("""server cache buffer queue worker scheduler endpoint daemon cluster node replica
shard index partition pipeline gateway proxy listener socket session token certificate secret
volume snapshot backup metric counter histogram dashboard alert probe handler middleware plugin
module package registry container image runtime kernel driver thread pool connection cursor
transaction schema table column migration planner optimizer compiler loader parser tokenizer
encoder decoder checkpoint tensor batch dataset sampler allocator heap router balancer resolver
controller webhook job task agent collector exporter watcher journal ledger lease lock mirror
bucket archive manifest profile namespace tenant quota budget policy rule filter hook stream
topic consumer producer"""),
        "v": _w("""configure enable disable restart deploy rotate flush compress validate inspect
monitor throttle retry replicate migrate upgrade install remove mount export serialize encrypt
sign verify schedule cancel drain scale provision allocate release profile benchmark tune
override reload refresh purge archive restore initialize register evict pin rebalance warm"""),
        "a": _w("""default optional persistent transient global local remote internal external
primary secondary read-only writable idle active stale healthy degraded experimental deprecated
stable legacy verbose quiet strict lenient synchronous asynchronous distributed isolated shared
dedicated ephemeral encrypted compressed cached partial incremental full small large busy"""),
        "oa": _w("max min default initial idle request read write flush retry batch queue pool"),
        "ob": _w("""timeout size limit interval count depth ratio threshold capacity delay window
period budget level factor bytes"""),
        "opt": ("{oa}_{n}_{ob}", "{n}_{ob}"),
        "flag": ("{oa}-{n}-{ob}", "{n}-{ob}"),
        "proj": _T_PROJECT,
        "pl": tuple(p.lower() for p in _T_PROJECT),
        "sub": _w("start stop status apply diff sync plan drain cordon logs describe rollout"),
        "cmd": ("{pl}ctl {sub} --{flag}={int}",),
        "dir": _w("etc var opt srv data home usr/local run"),
        "ext": _w(".yaml .toml .conf .ini .json .env .cfg"),
        "path": ("/{dir}/{pl}/{n}{d}{ext}",),
        "du": _w("seconds milliseconds minutes hours ms"),
        "su": _w("bytes kilobytes megabytes gigabytes KB MB GB MiB GiB"),
        "cu": _w("requests connections threads retries workers entries pages rows files"),
        "q": ("{int} {du}", "{int} {su}", "{int} {cu}"),
        "dur": ("{int} {du}",),
        "size": ("{int} {su}",),
        "d": _ints(1, 9),
        "ver": lambda r: f"{_between(r, 0, 9)}.{_between(r, 0, 30)}.{_between(r, 0, 20)}",
        "int": _num,
        "pct": lambda r: f"{_between(r, 1, 60)} percent",
    }
)
_T_TITLE = _t("""{v} the {a} {n} | {topic} {n} guide | Running {topic} with a {a} {n} |
{topic} {ver} release notes | Tuning the {n} in {topic} | How {topic} handles {a} {n} traffic""")
_T_HEAD = _t("""{v} the {n} | The {a} {n} | Limits for the {n} | Upgrading to {ver} |
{n} and {n} settings | When the {n} is {a} | Sizing the {a} {n} pool | Troubleshooting the {n}""")
_T_INTRO = _t("""The {topic} coordinates every {n} and {n} in a {a} deployment. |
This page explains how the {topic} will {v} a {n} and which options matter. |
Since {ver}, the {topic} can {v} each {a} {n} without a restart. |
Most {a} clusters run the {topic} with {size} of headroom per {n}. |
Read this before you {v} the {topic} on more than {int} nodes.""")
_T_SENT = _t("""Set the {n} timeout to {dur} if the {n} needs to {v} the {n} more often. |
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
_T_STEP = _t("""{v} the {n} with `{cmd}`. | Open {path} and set `{opt}` to {q}. |
Wait {dur} for the {n} to {v} the {n}. | Check that `{opt}` reads {int} in the {n} output. |
Restart the {n} and confirm that it reports version {ver}. |
Run `{cmd}` on each of the {int} nodes. | Copy {path} to {path} before you {v} the {n}. |
Lower `{opt}` to {q} and {v} the {a} {n}.""")
_T_OPTION = _t("""- `{opt}` (default: {dur}): how long the {n} waits before it will {v} the {n}. |
- `{opt}` (default: {int}): the number of {a} {n} slots per {n}. |
- `{opt}` (since {ver}): set to {q} to {v} the {a} {n}. |
- `{opt}`: maximum {size} the {n} may spend on each {n}.""")


def _technical_docs(rng: random.Random) -> str:
    slots = _Slots(rng, _TECH_FILLS)
    slots.pin("topic", slots.fill(("{proj} {n}",)))
    # About 7% long documents, so that some exceed a 1024-token context.
    # Targets leave room for the last section, which may overshoot by ~130 words.
    target = _between(rng, 1200, 2370) if rng.random() < 0.07 else _between(rng, 150, 480)
    title = " ".join(_cap(w) for w in slots.fill(_T_TITLE).split())
    intro = " ".join(slots.fill(_T_INTRO) for _ in range(_between(rng, 1, 3)))
    parts = [f"# {title}", intro]
    count = len(title.split()) + len(intro.split())
    while count < target:
        head = "## " + _cap(slots.fill(_T_HEAD))
        r = rng.random()
        if r < 0.5:
            body = " ".join(slots.fill(_T_SENT) for _ in range(_between(rng, 3, 8)))
        elif r < 0.75:
            steps = range(1, _between(rng, 3, 7) + 1)
            body = "\n".join(f"{i}. {_cap(slots.fill(_T_STEP))}" for i in steps)
        elif r < 0.9:
            body = "\n".join(slots.fill(_T_OPTION) for _ in range(_between(rng, 2, 5)))
        else:
            lines = (f"{slots['opt']} = {slots['int']}" for _ in range(_between(rng, 2, 6)))
            body = f"```\n[{slots['n']}]\n" + "\n".join(lines) + "\n```"
        parts += ["", head, body]
        count += len(head.split()) + len(body.split())
    return "\n".join(parts) + "\n"


# ---------------------------------------------------------------- social_chatter
_SOCIAL_FILLS: Mapping[str, _Fill] = MappingProxyType(
    {
        "h": ("@{name}{nick}{hd}", "@{name}_{nick}{hd}"),
        "name": _w("""sam alex jo kim max lee ria dev nina omar zoe ben tess raj mia leo ivy kai
noor eli ava finn luca maya theo ruby owen lena cruz ada"""),
        "nick": _w("codes bakes runs reads writes hikes games lifts draws vibes eats sings"),
        "hd": lambda r: str(_between(r, 1, 999)) if r.random() < 0.6 else "",
        "tag": ("#{tagw}",),
        "tagw": _w("""MondayMood TechTwitter coffee weekendvibes devlife booktok running gaming
foodie catsofinstagram gardening throwback nofilter remotework sourdough marathon indiedev
photography rainyday plantparent wfh motivation"""),
        "thing": _p("""the new album, my sourdough starter, this heatwave, the season finale,
my group chat, the bus route, our office coffee machine, the final boss, my sleep schedule,
this playlist, the city marathon, my landlord, the new update, that podcast episode, my fantasy
team, the farmers market, the gym playlist, my balcony tomatoes, the group project, the power
outage, the late train, my side project, the book club pick, the new cafe downtown, my cat"""),
        "feel": _w("""amazing awful unreal wild chaotic wholesome cursed iconic underrated
overrated exhausting hilarious brutal cozy perfect mid elite rough"""),
        "ing": _w("""watching reading cooking fixing skipping rewatching organizing debugging
painting planning training streaming learning building"""),
        "slang": _w("lol tbh ngl honestly literally lowkey imo idk omg ugh yay wow bruh fr smh"),
        "day": _w("Monday Tuesday Wednesday Thursday Friday Saturday Sunday weekend morning night"),
        "who": _p(
            "my mom, my roommate, the whole team, my neighbor, half the internet, my brother"
        ),
        "int": _ints(2, 60),
        "clock": lambda r: f"{_between(r, 1, 12)}:{_between(r, 0, 59):02d}{_pick(r, 'ap')}m",
    }
)
_S_SENT = _t("""just spent {int} hours {ing} {thing} and honestly it was {feel} |
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
    slots = _Slots(rng, _SOCIAL_FILLS)
    target = _between(rng, 20, 95)
    parts = [slots["h"] for _ in range(_between(rng, 1, 2))] if rng.random() < 0.4 else []
    count = len(parts)
    while count < target:
        sentence = slots.fill(_S_SENT)
        parts.append(_cap(sentence) + _pick(rng, (".", "!", "...", "!!", "")))
        count += sentence.count(" ") + 1
    parts += [slots["tag"] for _ in range(_between(rng, 0, 3))]
    return " ".join(parts)


# ---------------------------------------------------------------- product_reviews
_R_CAT = _p("""blender, wireless headphones, backpack, desk lamp, air fryer, running shoes,
water bottle, phone case, office chair, electric kettle, robot vacuum, yoga mat, smartwatch,
coffee grinder, bluetooth speaker, hiking boots, laptop stand, rice cooker, camping tent,
mechanical keyboard, space heater, toaster, webcam, cast iron pan, standing desk""")
_REVIEW_FILLS: Mapping[str, _Fill] = MappingProxyType(
    {
        "brand": _w("""Nordvik Zentrix Halden Brightloom Corvo Pellucid Ardent Tovana Quillon
Maxwell Ostara Vireo Kinetica Lumaro Fenwick Solace Trekkon Arbor Calyx Dunmore"""),
        "model": _w("Pro Max Mini Lite Plus Air Go Flex Ultra Neo"),
        "anycat": _R_CAT,
        "other": ("{brand} {anycat} {model} {pn}",),
        "pn": _ints(2, 900),
        "feat": _p("""battery life, build quality, sound, the hinge, the zipper, the handle,
noise level, the app, setup, the manual, cleaning, the cord, the buttons, the lid, the fit,
the grip, heat output, the finish, the charging port, the straps, the display, support"""),
        "pos": _w("""excellent solid sturdy great impressive reliable quiet comfortable sleek
well-made responsive generous smooth fantastic dependable"""),
        "neg": _w("""flimsy loud disappointing cheap awkward fragile sluggish clunky noisy
useless inconsistent annoying overpriced wobbly mediocre"""),
        "who": _p("my partner, my kids, my roommate, my dad, our whole team, my sister, the dog"),
        "int": _ints(2, 40),
        "price": ("${dollars}.{cents}",),
        "dollars": _ints(5, 499),
        "cents": ("99", "95", "49", "00", "89"),
        "time": ("{tn} days", "{tn} weeks", "{tn} months"),
        "tn": _ints(2, 11),
    }
)
_R_GOOD = _t("""I bought the {product} for {price} and {feat} is {pos}. |
After {time} of daily use, {feat} is still {pos}. |
{who} uses the {cat} every day and loves how {pos} {feat} is. |
Compared to the {other}, {feat} is far more {pos}. |
Worth every cent of {price}; {feat} alone is {pos}. |
Setup took {int} minutes and {feat} felt {pos} right away. |
Honestly the most {pos} {cat} I have owned in {int} years. |
It survived {time} of travel and {feat} stayed {pos}.""")
_R_BAD = _t("""For {price} I expected better, {feat} is {neg}. |
After {time} {feat} became {neg} and support took {int} days to reply. |
{who} returned it because {feat} was {neg}. |
The {other} costs less and its {feat} is not this {neg}. |
{feat} is {neg}, and the {cat} stopped working after {time}. |
I gave it {int} tries but {feat} is just {neg}. |
Mine arrived with {feat} already {neg}, replacement took {time}.""")
_R_MEH = _t("""It does the job, but {feat} is {neg} while {feat} is {pos}. |
At {price} the {cat} is fine, nothing more. | {who} likes it, I think {feat} could be less {neg}. |
Shipping took {time} and the box was dented. | I use it maybe {int} times a week.""")


def _product_reviews(rng: random.Random) -> str:
    slots = _Slots(rng, _REVIEW_FILLS)
    slots.pin("cat", slots["anycat"])
    product = slots.pin("product", slots.fill(("{brand} {cat} {model} {pn}",)))
    stars = _between(rng, 1, 5)
    good = (0.1, 0.25, 0.5, 0.75, 0.9)[stars - 1]
    head = f"{product} - {stars}/5 stars\nPrice paid: {slots['price']}"
    pros = ", ".join(slots.fill(("{feat} is {pos}",)) for _ in range(_between(rng, 1, 3)))
    cons = ", ".join(slots.fill(("{feat} is {neg}",)) for _ in range(_between(rng, 1, 3)))
    votes = _between(rng, 0, 300)
    tail = f"Pros: {pros}\nCons: {cons}\n\n{_between(rng, 0, votes)} of {votes} people found this"
    body: list[str] = []
    count, target = len(head.split()) + len(tail.split()) + 1, _between(rng, 40, 230)
    while count < target or not body:
        r = rng.random()
        sentence = slots.fill(_R_MEH if r < 0.2 else _R_GOOD if r < 0.2 + 0.8 * good else _R_BAD)
        body.append(_cap(sentence))
        count += sentence.count(" ") + 1
    return f"{head}\n\n{' '.join(body)}\n\n{tail} helpful.\n"


# ---------------------------------------------------------------- code
_CODE_FILLS: Mapping[str, _Fill] = MappingProxyType(
    {
        "noun": _w("""user item order record row node edge path file line token word chunk batch
frame packet message event job task request response header payload buffer cache key value entry
score weight total count index offset size limit width height price amount balance step epoch
retry timeout delay config option setting flag state status result error queue stack tree graph
matrix vector point color name label tag page block slot bucket shard peer seed"""),
        "verb": _w("""get set load save parse build make compute count find filter sort merge
split join read write send fetch update delete create check validate normalize encode decode
render format collect flush reset apply scale clamp shift rotate pack unpack group sum"""),
        "mod": _w("max min total last first next prev raw clean new old tmp local active pending"),
        "suf": _w("count idx id list map set len ids"),
        # Repeats weight the choice: plain nouns and modifier_noun names are the most common.
        "var": ("{noun}", "{noun}", "{mod}_{noun}", "{mod}_{noun}", "{noun}_{suf}"),
        "f": ("{verb}_{noun}", "{verb}_{mod}_{noun}"),
        "ptype": ("int", "str", "float", "bool", "list[int]"),
        "type": _t(
            "int | str | float | bool | list[int] | dict[str, int] | None | tuple[int, int]"
        ),
        "imp": _w("""os sys math json re time random itertools functools collections pathlib
logging heapq bisect statistics string"""),
        "ext": _w("json csv txt log bin"),
        "str": ('"{noun}_{k}.{ext}"',),
        "k": _ints(0, 64),
        "big": _num,
    }
)
_C_SIMPLE = _t("""{new} = {a} + {k} | {new} = {f}({a}, {k}) | {new} = {a} * {k} - {a} |
{a} += {k} | {new} = [{a} for {a} in range({k}) if {a} % {k} == 0] |
{new} = {{{str}: {k}, {str}: {big}}} | {a}.append({a} // {k}) | {new} = min({a}, {big}) |
{new} = max({a}, {a}) % {k} | {new} = len({a}) + {k} | {new} = {a}[{k}:{k}] |
{new} = sorted({a}, reverse=True)[:{k}] | {new} = {a} if {a} else {big} | {f}({a}, {a}, {k}) |
{new} = round({a} / {k}, {k}) | {new} = {str} | {a} -= {a} * {k} | {new} = ({a}, {k}) |
assert {a} >= {k}, {str} | {new} = {a}.get({str}, {big}) | {a}[{k}] = {f}({a})""")
_C_HEAD = _t("""if {a} > {k}: | if {a} is None: | if not {a}: | if len({a}) >= {k}: |
if {a} % {k} == 0: | for {new} in range({k}): | for {new} in {a}: | for {new} in sorted({a}): |
while {a} < {big}: | with open({str}) as {new}: | if isinstance({a}, {ptype}):""")
_C_COMMENT = _t("""# keep {a} under {big} so the {noun} fits in one page |
# {k} is enough here; more only slows the {noun} down |
# {verb} before we {verb}, otherwise {a} goes stale |
# the {noun} may be empty on the first {k} calls | # TODO({k}): {verb} the {noun} lazily |
# {a} can exceed {big} when the {noun} is large""")
_C_DOC = _t("""{verb} the {noun} and return the {noun}. | Return {k} {noun} entries from {a}. |
{verb} each {noun} in {a}, at most {big} times.""")


class _Scope(_Slots):
    """Code slots that track the names in scope, so statements reuse and add variables."""

    __slots__ = ("names",)

    def __init__(self, rng: random.Random) -> None:
        super().__init__(rng, _CODE_FILLS)
        names: list[str] = []
        fresh = _Slots(rng, _CODE_FILLS)  # not `self`, to keep the closures free of cycles
        self.names = names
        self._fills["a"] = lambda r: _pick(r, names)
        self._fills["new"] = lambda r: _push(names, fresh["var"])


def _push(names: list[str], name: str) -> str:
    names.append(name)
    return name


def _body(rng: random.Random, scope: _Scope, pad: str, budget: int, out: list[str]) -> None:
    # Exactly `budget` lines, so the caller controls the file's length.
    start = len(out)
    while (left := budget - (len(out) - start)) > 0:
        r = rng.random()
        if left >= 3 and len(pad) < 12 and r < 0.3:
            out.append(pad + scope.fill(_C_HEAD))
            _body(rng, scope, pad + "    ", _between(rng, 1, min(4, left - 2)), out)
        elif left >= 2 and r < 0.4:  # a comment never ends a block, which would be a syntax error
            out += [pad + scope.fill(_C_COMMENT), pad + scope.fill(_C_SIMPLE)]
        else:
            out.append(pad + scope.fill(_C_SIMPLE))


def _function(rng: random.Random, pad: str, budget: int, out: list[str], method: bool) -> None:
    scope = _Scope(rng)
    scope.names += dict.fromkeys(scope["var"] for _ in range(_between(rng, 1, 3)))
    args = ", ".join(f"{p}: {scope['ptype']}" if rng.random() < 0.6 else p for p in scope.names)
    out.append(f"{pad}def {scope['f']}({'self, ' if method else ''}{args}) -> {scope['type']}:")
    if rng.random() < 0.4:
        out.append(f'{pad}    """{_cap(scope.fill(_C_DOC))}"""')
    _body(rng, scope, pad + "    ", budget, out)
    out.append(f"{pad}    return {scope['a']}")


def _code(rng: random.Random) -> str:
    top = _Scope(rng)
    target = _between(rng, 10, 58)
    out = [f"# {top['verb']} {top['noun']} data"] if rng.random() < 0.5 else []
    out += [f"import {m}" for m in dict.fromkeys(top["imp"] for _ in range(_between(rng, 0, 3)))]
    out += [
        f"{top['mod']}_{top['noun']}".upper() + f" = {top['big']}"
        for _ in range(_between(rng, 0, 3))
    ]
    # Blocks are sized to the room left, so a file never exceeds 60 lines.
    while (room := 60 - len(out) - 2) >= 5 and len(out) < target:
        out += ["", ""] if out else []
        if room >= 14 and rng.random() < 0.3:
            attrs = list(dict.fromkeys(top["var"] for _ in range(_between(rng, 1, 3))))
            cls = top["noun"].capitalize() + top["noun"].capitalize()
            out += [f"class {cls}:", f"    def __init__(self, {attrs[0]}: int) -> None:"]
            out += [f"        self.{a} = {top['big'] if i else a}" for i, a in enumerate(attrs)]
            out.append("")
            _function(rng, "    ", _between(rng, 2, min(8, room - 8 - len(attrs))), out, True)
        else:
            _function(rng, "", _between(rng, 2, min(12, room - 3)), out, False)
    return "\n".join(out) + "\n"


GENERATORS: Mapping[str, Callable[[random.Random], str]] = MappingProxyType(
    {
        "technical_docs": _technical_docs,
        "social_chatter": _social_chatter,
        "product_reviews": _product_reviews,
        "code": _code,
    }
)
