"""A sweep's arms: named sets of the reference trainer's mechanisms switched on, every other
one off, run on the same seeds and the same faults.

```yaml
arms:
  fragile: []                                    # every mechanism off: the fragile preset
  prevention: [clipping, adaptive_warmup, lr_floor]
  prevention + detection: [prevention, spikes, watchdog]   # an earlier arm: its mechanisms
```

An arm sets the run's trainer to ``preset: reference`` with ``disable``: every mechanism of
`harness.mechanisms.MECHANISMS` it does not name, except those the fragile preset keeps
(`KEPT_BY_FRAGILE`), and ``enable``: the opt-ins it names. An empty arm is therefore the
fragile preset, mechanism for mechanism. An arm is one more axis of the grid, the slowest.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from harness.mechanisms import KEPT_BY_FRAGILE, MECHANISMS, OPT_IN
from harness.suites.suite_loader import Problems

#: The trainer fields an arm sets (a grid or the scenario may not set them as well).
ARM_FIELDS = ("preset", "disable", "enable")


@dataclass(frozen=True, slots=True)
class Arm:
    """One arm: its name and the mechanisms it switches on (sorted)."""

    name: str
    on: tuple[str, ...]

    def trainer_fields(self) -> dict[str, Any]:
        """The trainer settings that switch exactly this arm's mechanisms on."""
        return {
            "preset": "reference",
            "disable": [m for m in MECHANISMS if m not in self.on and m not in KEPT_BY_FRAGILE],
            "enable": [m for m in OPT_IN if m in self.on],
        }


def parse_arms(raw: Any, out: Problems) -> tuple[Arm, ...]:
    """The arms of a sweep file (``()`` when it has none); problems go to ``out``."""
    if raw is None:
        return ()
    if not isinstance(raw, dict) or not raw:
        out.add(("arms",), "expected a mapping of arm name -> list of mechanisms switched on")
        return ()
    arms: dict[str, Arm] = {}
    for name, items in raw.items():
        where = ("arms", str(name))
        if str(name) in MECHANISMS or str(name) in OPT_IN:
            out.add(where, f"an arm may not be named like the mechanism {name!r}")
            continue
        on = _mechanisms(items, arms, where, out)
        if on is None:
            continue
        same = [a.name for a in arms.values() if a.on == on]
        if same:
            out.add(where, f"switches on the same mechanisms as the arm {same[0]!r}")
            continue
        arms[str(name)] = Arm(str(name), on)
    return tuple(arms.values())


def _mechanisms(
    items: Any, earlier: dict[str, Arm], where: tuple[str, ...], out: Problems
) -> tuple[str, ...] | None:
    """An arm's list expanded: mechanism names, and earlier arms' names for their lists."""
    if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
        out.add(where, "expected a list of mechanism names (or earlier arms' names)")
        return None
    if len(set(items)) < len(items):
        out.add(where, "lists a name twice")
        return None
    on: set[str] = set()
    unknown = []
    for item in items:
        if item in earlier:
            on.update(earlier[item].on)
        elif item in MECHANISMS or item in OPT_IN:
            on.add(item)
        else:
            unknown.append(item)
    if unknown:
        out.add(
            where,
            f"unknown mechanism(s) {', '.join(map(repr, unknown))}; expected an earlier arm "
            f"({', '.join(earlier) or 'none yet'}) or one of {', '.join([*MECHANISMS, *OPT_IN])}",
        )
        return None
    return tuple(sorted(on))
