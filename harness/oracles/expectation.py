"""What a check takes under ``expect:``: the value's type and limits, and its line in the docs.

Each oracle declares one `Expectation` beside its name; the scenario model's ``expect``
(`harness.suites.scenario.Expect`) and the checks table of `docs/scenarios.md`
(`harness.oracles.checks_doc`) are both made from these declarations, so a check is
written down once.
"""

from __future__ import annotations

import types
import typing
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict
from pydantic.fields import FieldInfo


class ExpectModel(BaseModel):
    """Base of a check's value when it is a mapping (``mttr: {max_steps: 3}``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


@dataclass(frozen=True, kw_only=True)
class Expectation:
    """One check's key under ``expect:``: what its value may be, and what the docs say of it.

    A key that is left out, null or false asks for no check, so the value's type is
    given without None; ``field`` holds pydantic's limits and the description the JSON
    Schema shows (its default is None whatever it says).
    """

    #: The value's type: bool for a flag, a number for a bound, an `ExpectModel` for a
    #: mapping (``Model | bool`` when ``true`` asks for the model's defaults).
    type: Any
    #: Limits and description of the value: ``Field(ge=0, description=...)``.
    field: FieldInfo | None = None
    #: Where the check is listed among the others: in ``expect:``'s error messages, the
    #: JSON Schema, scorecards and the docs. A new check takes the next number.
    order: int
    #: How a number's value is named in the docs' table (``max_lost_steps: n``).
    symbol: str = ""
    #: When the check passes, in words (the docs' table).
    passes_when: str
    #: What the check measures: the figure of its verdict (the docs' table).
    figure: str
    #: When the check compares with the fault-free run of the same configuration; for
    #: "command", only when the trainer is a command (``completed``: its last step is the
    #: one the fault-free run reaches).
    baseline: Literal["never", "always", "command"] = "never"
    #: The field of the value that counts steps of the run and so may not be past
    #: ``trainer.steps`` ("": the value itself); None: nothing to hold against it.
    step_field: str | None = None
    #: The check judges the plan's faults: a scenario without faults cannot ask for it.
    needs_fault: bool = False

    def pydantic_field(self) -> tuple[Any, FieldInfo]:
        """The key's field of the ``Expect`` model: the type or None, None by default."""
        limits = self.field if self.field is not None else FieldInfo()
        return self.type | None, FieldInfo.merge_field_infos(limits, default=None)

    def bound(self, value: Any) -> tuple[str, int | None]:
        """The dotted part after the key and the number ``step_field`` names in ``value``."""
        if self.step_field is None or value is None:
            return "", None
        if not self.step_field:
            return "", value
        return f".{self.step_field}", getattr(value, self.step_field)

    def written(self, name: str) -> str:
        """How the key is written in the docs' table: ``detected: {within_steps, detector}``
        (or ``true``), ``params_finite: true``, ``max_lost_steps: n``."""
        kinds = typing.get_args(self.type) if isinstance(self.type, types.UnionType) else ()
        model = next((k for k in kinds or (self.type,) if _is_model(k)), None)
        if model is None:
            return f"`{name}: {'true' if self.type is bool else self.symbol}`"
        words = f"`{name}: {{{', '.join(model.model_fields)}}}`"
        return words + (" (or `true`)" if bool in kinds else "")


def _is_model(kind: Any) -> bool:
    return isinstance(kind, type) and issubclass(kind, BaseModel)
