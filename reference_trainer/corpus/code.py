"""The ``code`` source of the built-in corpus: small Python modules with imports,
functions and classes whose names stay in scope, composed from the templates below."""

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
    number,
    pick,
    templates,
    words,
)

_CODE_FILLS: Mapping[str, Fill] = MappingProxyType(
    {
        "noun": words("""user item order record row node edge path file line token word chunk batch
frame packet message event job task request response header payload buffer cache key value entry
score weight total count index offset size limit width height price amount balance step epoch
retry timeout delay config option setting flag state status result error queue stack tree graph
matrix vector point color name label tag page block slot bucket shard peer seed"""),
        "verb": words("""get set load save parse build make compute count find filter sort merge
split join read write send fetch update delete create check validate normalize encode decode
render format collect flush reset apply scale clamp shift rotate pack unpack group sum"""),
        "mod": words(
            "max min total last first next prev raw clean new old tmp local active pending"
        ),
        "suf": words("count idx id list map set len ids"),
        # Repeats weight the choice: plain nouns and modifier_noun names are the most common.
        "var": ("{noun}", "{noun}", "{mod}_{noun}", "{mod}_{noun}", "{noun}_{suf}"),
        "f": ("{verb}_{noun}", "{verb}_{mod}_{noun}"),
        "ptype": ("int", "str", "float", "bool", "list[int]"),
        "type": templates(
            "int | str | float | bool | list[int] | dict[str, int] | None | tuple[int, int]"
        ),
        "imp": words("""os sys math json re time random itertools functools collections pathlib
logging heapq bisect statistics string"""),
        "ext": words("json csv txt log bin"),
        "str": ('"{noun}_{k}.{ext}"',),
        "k": ints(0, 64),
        "big": number,
    }
)
_C_SIMPLE = templates("""{new} = {a} + {k} | {new} = {f}({a}, {k}) | {new} = {a} * {k} - {a} |
{a} += {k} | {new} = [{a} for {a} in range({k}) if {a} % {k} == 0] |
{new} = {{{str}: {k}, {str}: {big}}} | {a}.append({a} // {k}) | {new} = min({a}, {big}) |
{new} = max({a}, {a}) % {k} | {new} = len({a}) + {k} | {new} = {a}[{k}:{k}] |
{new} = sorted({a}, reverse=True)[:{k}] | {new} = {a} if {a} else {big} | {f}({a}, {a}, {k}) |
{new} = round({a} / {k}, {k}) | {new} = {str} | {a} -= {a} * {k} | {new} = ({a}, {k}) |
assert {a} >= {k}, {str} | {new} = {a}.get({str}, {big}) | {a}[{k}] = {f}({a})""")
_C_HEAD = templates("""if {a} > {k}: | if {a} is None: | if not {a}: | if len({a}) >= {k}: |
if {a} % {k} == 0: | for {new} in range({k}): | for {new} in {a}: | for {new} in sorted({a}): |
while {a} < {big}: | with open({str}) as {new}: | if isinstance({a}, {ptype}):""")
_C_COMMENT = templates("""# keep {a} under {big} so the {noun} fits in one page |
# {k} is enough here; more only slows the {noun} down |
# {verb} before we {verb}, otherwise {a} goes stale |
# the {noun} may be empty on the first {k} calls | # TODO({k}): {verb} the {noun} lazily |
# {a} can exceed {big} when the {noun} is large""")
_C_DOC = templates(
    """{verb} the {noun} and return the {noun}. | Return {k} {noun} entries from {a}. |
{verb} each {noun} in {a}, at most {big} times."""
)


class _Scope(Slots):
    """Code slots that track the names in scope, so statements reuse and add variables."""

    __slots__ = ("names",)

    def __init__(self, rng: random.Random) -> None:
        super().__init__(rng, _CODE_FILLS)
        names: list[str] = []
        fresh = Slots(rng, _CODE_FILLS)  # not `self`, to keep the closures free of cycles
        self.names = names
        self._fills["a"] = lambda r: pick(r, names)
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
            _body(rng, scope, pad + "    ", between(rng, 1, min(4, left - 2)), out)
        elif left >= 2 and r < 0.4:  # a comment never ends a block, which would be a syntax error
            out += [pad + scope.fill(_C_COMMENT), pad + scope.fill(_C_SIMPLE)]
        else:
            out.append(pad + scope.fill(_C_SIMPLE))


def _function(rng: random.Random, pad: str, budget: int, out: list[str], method: bool) -> None:
    scope = _Scope(rng)
    scope.names += dict.fromkeys(scope["var"] for _ in range(between(rng, 1, 3)))
    args = ", ".join(f"{p}: {scope['ptype']}" if rng.random() < 0.6 else p for p in scope.names)
    out.append(f"{pad}def {scope['f']}({'self, ' if method else ''}{args}) -> {scope['type']}:")
    if rng.random() < 0.4:
        out.append(f'{pad}    """{cap(scope.fill(_C_DOC))}"""')
    _body(rng, scope, pad + "    ", budget, out)
    out.append(f"{pad}    return {scope['a']}")


def code_document(rng: random.Random) -> str:
    top = _Scope(rng)
    target = between(rng, 10, 58)
    out = [f"# {top['verb']} {top['noun']} data"] if rng.random() < 0.5 else []
    out += [f"import {m}" for m in dict.fromkeys(top["imp"] for _ in range(between(rng, 0, 3)))]
    out += [
        f"{top['mod']}_{top['noun']}".upper() + f" = {top['big']}"
        for _ in range(between(rng, 0, 3))
    ]
    # Blocks are sized to the room left, so a file never exceeds 60 lines.
    while (room := 60 - len(out) - 2) >= 5 and len(out) < target:
        out += ["", ""] if out else []
        if room >= 14 and rng.random() < 0.3:
            attrs = list(dict.fromkeys(top["var"] for _ in range(between(rng, 1, 3))))
            cls = top["noun"].capitalize() + top["noun"].capitalize()
            out += [f"class {cls}:", f"    def __init__(self, {attrs[0]}: int) -> None:"]
            out += [f"        self.{a} = {top['big'] if i else a}" for i, a in enumerate(attrs)]
            out.append("")
            _function(rng, "    ", between(rng, 2, min(8, room - 8 - len(attrs))), out, True)
        else:
            _function(rng, "", between(rng, 2, min(12, room - 3)), out, False)
    return "\n".join(out) + "\n"
