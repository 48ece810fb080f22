"""Hypothesis strategies that draw valid fault specs and plans, biased toward known-bad choices.

For your own property tests (hypothesis is a dev dependency: only this module imports it)::

    from hypothesis import given
    from harness.suites.strategies import fault_plans

    @given(fault_plans(kinds=["nan_grad", "inf_grad"], max_step=20))
    def test_my_guard_survives(plan):
        assert my_training_loop(plan, steps=20).finite

Every drawn spec went through its kind's own validation (`faults.registry.parse_fault`),
carries a drawn ``seed`` and, unless timed, fires at least once in [1, max_step]. The first
and last steps, checkpoint saves, rank 0 and exponent bits come far more often than uniform
draws would give, because that is where guards break. See docs/strategies.md.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any, Literal, TypeVar, get_args, get_origin

import annotated_types
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as seeded
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument
from hypothesis.strategies import SearchStrategy
from pydantic.fields import FieldInfo

from faults.bias import Bias
from faults.bitflip import LAYOUTS
from faults.plan import FaultPlan
from faults.registry import kinds as registered_kinds
from faults.registry import parse_fault
from faults.spec import FaultSpec

__all__ = ["bit_positions", "drawn_from_seed", "fault_plans", "fault_specs", "ranks", "steps"]

T = TypeVar("T")
Fields = SearchStrategy[dict[str, Any]]
Specs = dict[str, SearchStrategy[FaultSpec]]
_DTYPES = {str(dtype).removeprefix("torch."): layout for dtype, layout in LAYOUTS.items()}


def _check_int(name: str, value: object, least: int, *, optional: bool = False) -> None:
    """Raise InvalidArgument unless ``value`` is an int >= ``least`` (or None when optional)."""
    if optional and value is None:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        either = " or None" if optional else ""
        raise InvalidArgument(f"{name}={value!r}: expected an integer >= {least}{either}")


def _check_names(name: str, values: object) -> tuple[str, ...]:
    """A non-empty sequence of non-empty strings (a bare string is refused), deduplicated."""
    if isinstance(values, str) or not isinstance(values, Sequence) or not values:
        raise InvalidArgument(f"{name}={values!r}: expected a non-empty list of strings")
    if not all(isinstance(v, str) and v for v in values):
        raise InvalidArgument(f"{name}={values!r}: every item must be a non-empty string")
    return tuple(dict.fromkeys(values))


def _check_kinds(kinds: object) -> tuple[str, ...]:
    """Kind names to draw from: by default every registered kind this module can draw."""
    table = registered_kinds()
    drawable = sorted(DRAWN_KINDS)
    names = tuple(drawable) if kinds is None else _check_names("kinds", kinds)
    for name in names:
        if name not in table:
            known = ", ".join(sorted(table))
            raise InvalidArgument(f"kinds: unknown fault kind {name!r}; expected one of {known}")
        if name not in drawable:
            raise InvalidArgument(f"kinds: {name!r} has required fields this module cannot draw")
    return names


def _pick(*options: SearchStrategy[T]) -> SearchStrategy[T]:
    """One of ``options`` with equal chances (repeat one to weight it); shrinks to the first."""
    return st.integers(0, len(options) - 1).flatmap(options.__getitem__)


def steps(*, max_step: int = 100, checkpoint_every: int | None = None) -> SearchStrategy[int]:
    """Steps in [1, max_step], biased to the first, the last, each save and the step after."""
    _check_int("max_step", max_step, 1)
    _check_int("checkpoint_every", checkpoint_every, 1, optional=True)
    every = range(checkpoint_every or max_step + 1, max_step + 1, checkpoint_every or 1)
    saves = sorted({*every[:100], *every[-100:]})  # the first and last 100 saves at most
    edges = st.sampled_from(sorted({1, max_step, *saves}))
    anywhere = st.integers(1, max_step)
    after = [s + 1 for s in saves if s < max_step]
    return _pick(edges, edges, st.sampled_from(after) if after else anywhere, anywhere)


def ranks(*, world_size: int = 2) -> SearchStrategy[list[int] | str]:
    """A ``ranks`` value, biased to [0], [world_size - 1], "all" and "random"."""
    _check_int("world_size", world_size, 1)
    special: list[list[int] | str] = [[0], [world_size - 1], "all", "random"]
    fresh = st.sampled_from(special).map(lambda r: list(r) if isinstance(r, list) else r)
    some = st.lists(st.integers(0, world_size - 1), min_size=1, max_size=world_size, unique=True)
    return fresh | some.map(sorted)


def bit_positions(*, dtype: str = "float32") -> SearchStrategy[int | str]:
    """A bitflip ``bit`` valid for ``dtype``, biased to exponent bits, the top one above all."""
    if not isinstance(dtype, str) or dtype not in _DTYPES:
        raise InvalidArgument(f"dtype={dtype!r}: expected one of {', '.join(sorted(_DTYPES))}")
    layout = _DTYPES[dtype]
    exponent = layout.positions("exponent")
    # Flipping the top exponent bit turns 1.0 into inf and 0.5 into ~1e38 (float32).
    worst: list[int | str] = ["exponent", exponent[-1]]
    other: list[int | str] = ["sign", "mantissa"]
    rare = st.sampled_from(other) | st.integers(0, layout.width - 1)
    return _pick(*[st.sampled_from(worst) | st.sampled_from(exponent)] * 3, rare)


def _fields(required: dict[str, SearchStrategy[Any]] | None = None, /, **optional: Any) -> Fields:
    """Kind-specific fields; each optional one is sometimes left to its default."""
    return st.fixed_dictionaries(required or {}, optional=optional)


def _bias(info: FieldInfo) -> Bias | None:
    """The field's `faults.bias.Bias` mark; None: the field keeps its default."""
    return next((m for m in info.metadata if isinstance(m, Bias)), None)


def _choices(annotation: Any) -> tuple[Any, ...] | None:
    """A ``Literal``'s values; None for any other annotation."""
    return get_args(annotation) if get_origin(annotation) is Literal else None


def _names_a_bit_part(annotation: Any) -> bool:
    """Whether a field takes a bit by position or by part (``sign``, ``exponent``, ...)."""
    return any("exponent" in (_choices(arg) or ()) for arg in get_args(annotation))


def _range(info: FieldInfo, bias: Bias) -> SearchStrategy[Any]:
    """The field's valid range, from its own bounds (the top capped at ``bias.upto``)."""
    low: Any = None
    high: Any = None
    open_low = open_high = False
    for m in info.metadata:
        if isinstance(m, annotated_types.Ge):
            low = m.ge
        elif isinstance(m, annotated_types.Gt):
            low, open_low = m.gt, True
        elif isinstance(m, annotated_types.Le):
            high = m.le
        elif isinstance(m, annotated_types.Lt):
            high, open_high = m.lt, True
    if bias.upto is not None:
        high, open_high = bias.upto, False
    if bias.above is not None:
        low, open_low = bias.above, True
    if int in (info.annotation, *get_args(info.annotation)):
        return st.integers(low + open_low, high - open_high)
    return st.floats(low, high, exclude_min=open_low, exclude_max=open_high)


def _field(info: FieldInfo, bias: Bias, dtype: str) -> SearchStrategy[Any]:
    """One field's strategy: its biased values as often as the rest of what it takes."""
    if bias.only:
        return st.sampled_from(bias.values)
    if _names_a_bit_part(info.annotation):
        return bit_positions(dtype=dtype)
    if (choices := _choices(info.annotation)) is not None:
        return st.sampled_from(choices)
    if get_origin(info.annotation) is list:
        (item,) = get_args(info.annotation)
        return st.lists(st.sampled_from(_choices(item) or ()), min_size=1, unique=True)
    rest = _range(info, bias)
    if bias.values:
        rest = st.sampled_from(bias.values) | rest
    return st.sampled_from(bias.apart) | rest if bias.apart else rest


def _own_fields(spec: type[FaultSpec], targets: Sequence[str], dtype: str) -> Fields:
    """A kind's own fields, derived from the spec: ``target`` always one of the caller's
    globs; each field marked with a `Bias` drawn (those the kind requires always, the others
    sometimes left to their defaults); unmarked fields keep their defaults."""
    required: dict[str, SearchStrategy[Any]] = {}
    optional: dict[str, SearchStrategy[Any]] = {}
    for name, info in spec.model_fields.items():
        if name in _COMMON:
            continue
        if name == "target":
            required[name] = st.sampled_from(targets)
        elif (bias := _bias(info)) is not None:
            (required if info.is_required() else optional)[name] = _field(info, bias, dtype)
    return _fields(required, **optional)


def _drawable(spec: type[FaultSpec]) -> bool:
    """Whether every field the kind requires is drawn here."""
    own = {n: f for n, f in spec.model_fields.items() if n not in _COMMON}
    return all(n == "target" or _bias(f) is not None for n, f in own.items() if f.is_required())


_COMMON = frozenset(FaultSpec.model_fields)
#: Kinds drawn here: every kind whose required fields are all drawn, that is every kind but
#: the node kinds, which act on Docker containers from outside the trainer
#: (tests/test_fault_kinds.py pins it).
DRAWN_KINDS = frozenset(name for name, kind in registered_kinds().items() if _drawable(kind.spec))


def _common(max_step: int, world_size: int, checkpoint_every: int | None, timed: bool) -> Fields:
    """When (mostly ``at_step``), where (``ranks``) and for how long (mostly one step)."""
    at = steps(max_step=max_step, checkpoint_every=checkpoint_every)
    period = st.integers(1, max_step)
    if checkpoint_every is not None:
        period = st.sampled_from([checkpoint_every]) | period  # at every save
    least = max(1 / max_step, 0.01)  # expected to fire within the run, soon
    rare = [
        st.fixed_dictionaries({"every": period}, optional={"at_step": at}),
        _fields({"probability": st.sampled_from([1.0, least]) | st.floats(least, 1)}),
    ]
    if timed:
        rare.append(_fields({"after_seconds": st.sampled_from([0.0]) | st.floats(0, 60)}))
    once = at.map(lambda s: {"at_step": s})
    longer = st.integers(2, max(2, max_step))
    spare = st.sampled_from([(), (0,)] if world_size > 1 else [()]).map(list)  # "not rank 0"
    where: dict[str, SearchStrategy[Any]] = {"ranks": ranks(world_size=world_size)}
    where |= {"spare_ranks": spare, "duration": _pick(*[st.just(1)] * 3, longer)}
    when = _pick(once, once, once, st.one_of(rare))
    return st.tuples(when, st.fixed_dictionaries(where)).map(lambda pair: pair[0] | pair[1])


@st.composite
def _spec(draw: st.DrawFn, kind: str, own: Fields, common: Fields, max_step: int) -> FaultSpec:
    """One validated spec of ``kind``; a probability spec's seed is bumped until it fires."""
    data: dict[str, Any] = {"kind": kind, "seed": draw(st.integers(0, 2**32 - 1)), **draw(own)}
    if _on_documents(kind):
        data["at_step"] = 1  # the stream is contaminated from the start; ranks are ignored
    else:
        data |= draw(common)
        if data["ranks"] != "random":
            del data["spare_ranks"]  # only "random" reads it
    spec = parse_fault(data, f"drawn {kind}")
    while spec.probability is not None and not any(map(spec.fires_at, range(1, max_step + 1))):
        data["seed"] += 1  # rare: the probability is at least max(1/max_step, 1%)
        spec = parse_fault(data, f"drawn {kind}")
    return spec


def _on_documents(kind: str) -> bool:
    """Whether ``kind`` acts on the document stream (a plan holds at most one such fault)."""
    return registered_kinds()[kind].spec.reach == "documents"


def _kind_specs(kinds: object, targets: object, dtype: str, *when: Any) -> Specs:
    """Check the shared arguments at once; one spec strategy per kind name."""
    names, globs, timed = _check_kinds(kinds), _check_names("targets", targets), when[-1]
    if not isinstance(timed, bool):
        raise InvalidArgument(f"timed={timed!r}: expected True or False")
    table, common = registered_kinds(), _common(*when)
    own = {name: _own_fields(table[name].spec, globs, dtype) for name in names}
    return {name: _spec(name, own[name], common, when[0]) for name in names}


def fault_specs(
    *,
    kinds: Sequence[str] | None = None,
    max_step: int = 100,
    world_size: int = 2,
    checkpoint_every: int | None = None,
    targets: Sequence[str] = ("*",),
    timed: bool = False,
    dtype: str = "float32",
) -> SearchStrategy[FaultSpec]:
    """Valid fault specs of the given kinds (default: every registered kind)."""
    specs = _kind_specs(kinds, targets, dtype, max_step, world_size, checkpoint_every, timed)
    return st.sampled_from(sorted(specs)).flatmap(specs.__getitem__)


@st.composite
def _plan(draw: st.DrawFn, specs: Specs, sizes: SearchStrategy[int], swarm: bool) -> FaultPlan:
    """A plan of ``sizes`` faults; with ``swarm``, drawn from a drawn subset of the kinds only."""
    names = sorted(specs)
    on = draw(st.lists(st.sampled_from(names), min_size=1, unique=True)) if swarm else names
    faults: list[FaultSpec] = []
    for _ in range(draw(sizes)):
        # The agent refuses a second fault on the document stream.
        taken = any(_on_documents(f.kind) for f in faults)
        free = [k for k in names if not (taken and _on_documents(k))]
        pool = [k for k in on if k in free] or free
        faults.append(draw(specs[draw(st.sampled_from(pool))]))
    return FaultPlan(tuple(faults))


def fault_plans(
    *,
    kinds: Sequence[str] | None = None,
    min_faults: int = 0,
    max_faults: int = 3,
    max_step: int = 100,
    world_size: int = 2,
    checkpoint_every: int | None = None,
    targets: Sequence[str] = ("*",),
    swarm: bool = True,
    timed: bool = False,
    dtype: str = "float32",
) -> SearchStrategy[FaultPlan]:
    """Valid plans of min_faults..max_faults faults (swarm: few kinds in each plan)."""
    specs = _kind_specs(kinds, targets, dtype, max_step, world_size, checkpoint_every, timed)
    _check_int("min_faults", min_faults, 0)
    _check_int("max_faults", max_faults, 0)
    if not isinstance(swarm, bool):
        raise InvalidArgument(f"swarm={swarm!r}: expected True or False")
    if min_faults > max_faults:
        raise InvalidArgument(f"min_faults={min_faults} must be <= max_faults={max_faults}")
    most = min(max_faults, 1) if all(map(_on_documents, specs)) else max_faults
    if min_faults > most:
        raise InvalidArgument(
            f"min_faults={min_faults}: a plan holds one fault on the document stream "
            f"({', '.join(sorted(specs))})"
        )
    return _plan(specs, st.integers(min_faults, most), swarm)


#: Examples generated for one `drawn_from_seed` value (the first, simplest, is never kept).
_EXAMPLES = 12


def drawn_from_seed(strategy: SearchStrategy[T], seed: int) -> T:
    """One value of ``strategy`` outside a test, the same for the same ``seed`` (and
    Hypothesis version): what a soak draws its faults with, so a seed replays its plan.

    Hypothesis's first example is always its simplest, and the next few steer away from
    what was drawn before, so one of the examples after the first is picked by ``seed``.
    """
    _check_int("seed", seed, 0)
    drawn: list[T] = []

    @seeded(seed)
    @settings(
        max_examples=_EXAMPLES,
        phases=[Phase.generate],
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def keep(value: T) -> None:
        drawn.append(value)

    keep()
    if not drawn:  # pragma: no cover - a strategy that can draw nothing raises above
        raise InvalidArgument(f"{strategy!r} drew no value")
    return random.Random(seed).choice(drawn[1:] or drawn)
