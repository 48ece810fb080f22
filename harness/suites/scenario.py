"""Scenario suites as typed models: what to run, which faults to inject, what to expect.

A suite file (YAML) holds ``suite`` (its name), ``defaults`` (a trainer, expectations and
a weight every scenario starts from) and ``scenarios``. Reading and validating a file,
with errors that name the file, line and dotted path, is `harness.suites.suite_loader`'s job;
this module holds the models and their own consistency rules. `docs/scenarios.md` is
the reference.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    create_model,
    field_serializer,
    field_validator,
    model_validator,
)

from faults import FaultPlan, FaultSpec
from faults.errors import FaultSpecError
from faults.registry import parse_fault
from faults.spec import MAX_STEP, FaultClass
from harness.data_mixes import DATA_MIXES
from harness.mechanisms import MECHANISMS, OPT_IN
from harness.optimizers import OPTIMIZERS
from harness.oracles import ORACLES
from harness.records.detectors import check_detectors
from harness.suites.crashpoints_spec import CrashpointsSpec

#: Trainer presets the harness knows by name: the reference trainer with every stability
#: mechanism on, and the same trainer with all of them off (the negative control).
TRAINER_PRESETS = ("reference", "fragile")
#: Model sizes of the reference trainer.
MODELS = ("tiny", "small")
#: The most sequences per rank per micro-step a trainer is asked for (the reference
#: trainer's ``--batch-size`` too): a billion would only end in an out-of-memory kill.
MAX_BATCH_SIZE = 1 << 16


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _known(value: list[str], names: dict[str, str], what: str) -> list[str]:
    """``value`` when every name in it is one of ``names``."""
    unknown = [m for m in value if m not in names]
    if unknown:
        raise ValueError(
            f"unknown {what} {', '.join(unknown)}; expected some of {', '.join(names)}"
        )
    return value


class OptimizerSpec(_Model):
    """The reference trainer's optimizer; a field left out keeps the preset's value. Written
    as a mapping, or as a bare name (``optimizer: sophia``)."""

    name: str = Field(default="adamw", description="One of harness.optimizers.OPTIMIZERS.")
    lr: float | None = Field(
        default=None, gt=0, allow_inf_nan=False, description="Peak learning rate."
    )
    beta1: float | None = Field(default=None, ge=0, lt=1)
    beta2: float | None = Field(default=None, ge=0, lt=1)

    @model_validator(mode="before")
    @classmethod
    def _bare_name(cls, value: Any) -> Any:
        return {"name": value} if isinstance(value, str) else value

    @field_validator("name")
    @classmethod
    def _known_optimizer(cls, value: str) -> str:
        _known([value], OPTIMIZERS, "optimizer")
        return value

    def flags(self) -> list[str]:
        """The reference trainer's flags for this optimizer."""
        argv = ["--optimizer", self.name]
        for name in ("lr", "beta1", "beta2"):
            value = getattr(self, name)
            if value is not None:
                argv += [f"--{name}", repr(value)]
        return argv


class TrainerSpec(_Model):
    """The trainer under test and how to run it."""

    preset: Literal["reference", "fragile"] = Field(
        default="reference",
        description="reference: every stability mechanism on; fragile: all of them off.",
    )
    model: Literal["tiny", "small"] = Field(
        default="tiny", description="Model size of the reference trainer."
    )
    command: str | None = Field(
        default=None,
        description="Run this trainer instead of the reference one, through the zero-code "
        "attach (`tightrope exec`). Placeholders: {run_dir}, {steps}, {seed}, {world_size}, "
        "{python} (the interpreter tightrope runs on).",
    )
    world_size: int = Field(default=1, ge=1, le=64, description="Ranks (torchrun when > 1).")
    launcher: Literal["local", "docker"] = Field(
        default="local",
        description="local: processes on this machine; docker: each node a container "
        "running torchrun's agent (reference trainer only).",
    )
    nodes: int = Field(default=1, ge=1, le=16, description="Nodes (docker launcher).")
    min_nodes: int | None = Field(
        default=None,
        ge=1,
        description="Elastic membership: the job goes on with as few as this many nodes "
        "(torchrun --nnodes MIN:MAX); default: all of them.",
    )
    precision: Literal["fp32", "bf16", "fp16"] = Field(default="fp32")
    steps: int = Field(default=40, ge=1, le=MAX_STEP, description="Step the run trains to.")
    seed: int = Field(
        default=0, ge=0, le=2**32 - 1, description="Training seed, recorded with the result."
    )
    checkpoint_every: int = Field(default=10, ge=1, description="Steps between checkpoints.")
    batch_size: int | None = Field(
        default=None,
        ge=1,
        le=MAX_BATCH_SIZE,
        description="Sequences per rank per step (default: the model's).",
    )
    resume_after: int | None = Field(
        default=None,
        ge=1,
        description="Stop with a checkpoint after this step, then resume from the latest "
        "checkpoint, as a rescheduled job would (reference trainer only).",
    )
    stop_after: int | None = Field(
        default=None,
        ge=1,
        description="End the run after this step, with a checkpoint; the learning-rate "
        "schedule still spans `steps`, so the run trains exactly what a longer one trains up "
        "to there (reference trainer only).",
    )
    max_restarts: int = Field(
        default=3,
        ge=0,
        le=100,
        description="Restarts torchrun may make after a failed worker (0 under `fragile` or "
        "with `restarts` disabled).",
    )
    disable: list[str] = Field(
        default_factory=list,
        description="Stability mechanisms to switch off (reference); `restarts` means no "
        "torchrun restarts.",
    )
    enable: list[str] = Field(
        default_factory=list,
        description="Opt-in mechanisms to switch on (reference): see harness.mechanisms.OPT_IN.",
    )
    optimizer: OptimizerSpec | None = Field(
        default=None,
        description="The optimizer and its settings (reference): a name, or a mapping of "
        "name, lr, beta1, beta2; default: the preset's AdamW.",
    )
    data_mix: str | None = Field(
        default=None,
        description="The corpus's named mix (reference): see harness.data_mixes.DATA_MIXES; "
        "default: the trainer's default mix.",
    )
    timeout: float = Field(
        default=300.0,
        gt=0,
        description="Seconds before the watchdog kills the run and scores it as an error.",
    )
    env: dict[str, str] = Field(default_factory=dict, description="Extra environment.")
    sample_command: str | None = Field(
        default=None,
        description="How a command trainer samples generations from its final weights "
        "(max_phrase_collapse); the reference trainer has its own. Placeholders: {run_dir}, "
        "{k}, {max_tokens}, {seed}, {top_k} (0: all tokens), {out} (the JSON file to write), "
        "{python}.",
    )
    cwd: str | None = Field(
        default=None,
        min_length=1,
        description="Working directory of a command trainer; default: the scenario's own run "
        "dir, so files a trainer writes next to itself (./snapshot.pt) belong to one scenario. "
        "Arguments that name files where tightrope runs are passed as absolute paths.",
    )

    @field_validator("disable")
    @classmethod
    def _known_mechanisms(cls, value: list[str]) -> list[str]:
        return _known(value, MECHANISMS, "mechanism(s)")

    @field_validator("enable")
    @classmethod
    def _known_opt_ins(cls, value: list[str]) -> list[str]:
        return _known(value, OPT_IN, "opt-in mechanism(s)")

    @field_validator("data_mix")
    @classmethod
    def _known_mix(cls, value: str | None) -> str | None:
        if value is not None:
            _known([value], DATA_MIXES, "data mix")
        return value

    @model_validator(mode="after")
    def _command_or_reference(self) -> TrainerSpec:
        if self.command is not None and not self.command.strip():
            raise ValueError("command is empty")
        if self.command is not None and (
            self.disable or self.enable or self.resume_after is not None or self.stop_after
        ):
            raise ValueError(
                "disable, enable, resume_after and stop_after apply to the reference trainer, "
                "not to a command"
            )
        if self.command is not None and self.data_mix is not None:
            raise ValueError("data_mix applies to the reference trainer, not to a command")
        if self.command is not None and self.optimizer is not None:
            raise ValueError(
                "optimizer applies to the reference trainer; a command trainer takes its "
                "settings from its command line or env"
            )
        if self.cwd is not None and self.command is None:
            raise ValueError("cwd applies to a command trainer; the reference trainer has none")
        if self.sample_command is not None and (
            self.command is None or not self.sample_command.strip()
        ):
            raise ValueError(
                "sample_command must be a command line, given with a trainer command "
                "(the reference trainer samples with its own)"
            )
        if self.launcher == "docker":
            if self.command is not None:
                raise ValueError("launcher docker runs the reference trainer, not a command")
            if self.world_size % self.nodes:
                raise ValueError(
                    f"world_size {self.world_size} does not split over {self.nodes} nodes"
                )
        elif self.nodes > 1 or self.min_nodes is not None:
            raise ValueError("nodes and min_nodes need launcher: docker")
        if self.min_nodes is not None and self.min_nodes > self.nodes:
            raise ValueError(f"min_nodes {self.min_nodes} is more than nodes {self.nodes}")
        if self.resume_after is not None and self.resume_after >= self.steps:
            raise ValueError(f"resume_after {self.resume_after} must be before steps {self.steps}")
        if self.stop_after is not None:
            if self.stop_after > self.steps:
                raise ValueError(f"stop_after {self.stop_after} is past steps {self.steps}")
            if self.resume_after is not None or self.launcher == "docker":
                raise ValueError("stop_after goes with neither resume_after nor launcher docker")
        if self.checkpoint_every > self.steps:
            raise ValueError(
                f"checkpoint_every {self.checkpoint_every} is past steps {self.steps}: "
                "the run would never save one"
            )
        return self

    @property
    def restarts(self) -> int:
        """Restarts torchrun is allowed: none for the fragile preset or with `restarts` off."""
        if self.preset == "fragile" or "restarts" in self.disable:
            return 0
        return self.max_restarts

    def identity(self) -> dict[str, Any]:
        """What makes two runs the same configuration (the baseline cache key's part)."""
        # How the run is launched (a stop and resume, containers) is not what it computes.
        # The optimizer's key appears only when one is chosen, so that keys made before
        # there was a choice still name the same runs.
        return self.model_dump(
            mode="json",
            exclude=({"optimizer"} if self.optimizer is None else set())
            | {
                "timeout",
                "resume_after",
                "launcher",
                "nodes",
                "min_nodes",
                "cwd",
                "sample_command",
            },
        )


class _Checks(_Model):
    """The checks of a scenario; each key is one oracle, omitted keys are not checked."""

    if TYPE_CHECKING:
        # One field per registered check, made below (`Expect`).
        def __init__(self, **checks: Any) -> None: ...
        def __getattr__(self, name: str) -> Any: ...

    def checks(self) -> list[str]:
        """Names of the checks asked for (a value of false or null asks for none)."""
        return [name for name, value in self if value is not None and value is not False]

    def needs_baseline(self, command: bool = False) -> bool:
        """True when a check compares against the fault-free run; for a command trainer,
        ``completed`` too (its last step is the one the fault-free run reaches)."""
        uses = {ORACLES[name].expectation.baseline for name in self.checks()}
        return "always" in uses or (command and "command" in uses)


if TYPE_CHECKING:
    Expect = _Checks
else:
    #: ``expect:``: a field per registered check, as its oracle declares it.
    Expect = create_model(
        "Expect",
        __base__=_Checks,
        __doc__=_Checks.__doc__,
        __module__=__name__,
        **{name: oracle.expectation.pydantic_field() for name, oracle in ORACLES.items()},
    )


class Scenario(_Model):
    """One scenario: a trainer, its faults, the checks, and its weight in the score."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=80)
    description: str = ""
    fault_class: FaultClass | None = Field(
        default=None, alias="class", description="Scored under; from the faults if omitted."
    )
    trainer: TrainerSpec = Field(default_factory=TrainerSpec)
    faults: list[FaultSpec] = Field(default_factory=list)
    expect: Expect = Field(default_factory=Expect)
    weight: float = Field(default=1.0, gt=0, le=100)
    crashpoints: CrashpointsSpec | None = Field(
        default=None, description="A crash-point exploration instead of trainer and faults."
    )

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @field_validator("faults", mode="before")
    @classmethod
    def _parse_faults(cls, value: Any) -> Any:
        if not isinstance(value, list):
            return value
        # Each fault is validated by its own kind's model (the registry), so the error
        # names that kind's fields.
        try:
            return [
                f if isinstance(f, FaultSpec) else parse_fault(f, f"faults[{i}]")
                for i, f in enumerate(value)
            ]
        except FaultSpecError as exc:
            raise ValueError(str(exc)) from None

    @field_serializer("faults")
    def _dump_faults(self, faults: list[FaultSpec]) -> list[dict[str, Any]]:
        return [f.model_dump(mode="json", exclude_defaults=True) | {"kind": f.kind} for f in faults]

    @model_validator(mode="after")
    def _consistent(self) -> Scenario:
        if self.crashpoints is not None:  # its checks are its points; it runs no trainer
            return self
        if not self.expect.checks():
            raise ValueError("expect asks for no check; a scenario needs at least one")
        steps = self.trainer.steps
        for i, fault in enumerate(self.faults):
            self._check_node(i, fault)
        problems = FaultPlan(tuple(self.faults)).problems(
            steps, self.trainer.world_size, ("trainer.steps", "trainer.world_size")
        )
        if problems:
            raise ValueError(problems[0])
        for name, oracle in ORACLES.items():
            where, bound = oracle.expectation.bound(getattr(self.expect, name))
            if bound is not None and bound > steps:
                raise ValueError(
                    f"expect.{name}{where} {bound} is past trainer.steps {steps}; it cannot bind"
                )
        for name in self.expect.checks():
            if ORACLES[name].expectation.needs_fault and not self.faults:
                raise ValueError(f"expect.{name} needs a fault to detect; faults is empty")
        # The reference trainer's detectors are known; a command trainer may claim its own
        # (`harness.claim`), so only the reference trainer's names are checked.
        named = getattr(self.expect.detected, "detector", None)  # `detected: true` names none
        if named is not None and self.trainer.command is None:
            try:
                check_detectors(named)
            except ValueError as exc:
                raise ValueError(f"expect.detected.detector: {exc}") from None
        return self

    def _check_node(self, i: int, fault: FaultSpec) -> None:
        """A node fault must name a node the (Docker) trainer has."""
        node = fault.target_node()
        if node is None:
            return
        trainer = self.trainer
        if trainer.launcher != "docker":
            raise ValueError(
                f"faults[{i}] ({fault.kind}) targets node {node}, but node faults need "
                "launcher: docker"
            )
        if node >= trainer.nodes:
            raise ValueError(
                f"faults[{i}] ({fault.kind}) targets node {node}, but the trainer has "
                f"nodes 0..{trainer.nodes - 1}"
            )

    @property
    def scored_class(self) -> str:
        """The fault class this scenario counts under."""
        if self.fault_class is not None:
            return self.fault_class
        if not self.faults:
            return "checkpoint" if self.crashpoints is not None else "none"
        return self.faults[0].fault_class

    def plan(self) -> dict[str, Any]:
        """The fault plan the trainer receives (`faults.FaultPlan.from_dict` reads it)."""
        return {"faults": self._dump_faults(self.faults)}


class SuiteDefaults(_Model):
    """What every scenario of a suite starts from; a scenario's own keys win."""

    trainer: dict[str, Any] = Field(default_factory=dict)
    expect: dict[str, Any] = Field(default_factory=dict)
    weight: float | None = Field(default=None, gt=0, le=100)


class Suite(_Model):
    """A named list of scenarios."""

    name: str
    description: str = ""
    scenarios: list[Scenario]
    #: Where the suite was read from, for messages (not part of the file).
    source: str = Field(default="<memory>", exclude=True)

    @model_validator(mode="after")
    def _unique_names(self) -> Suite:
        seen: set[str] = set()
        for s in self.scenarios:
            if s.name in seen:
                raise ValueError(f"two scenarios are named {s.name!r}; names must be unique")
            seen.add(s.name)
        if not self.scenarios:
            raise ValueError("scenarios is empty")
        return self
