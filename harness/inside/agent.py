"""The agent: one per process; counts steps, arms faults, observes, writes the journal.

A trainer drives it at fixed points of each step (the reference trainer calls these
methods itself; `harness.inside.attach` and ``tightrope exec`` install hooks that call them for
trainers that know nothing of tightrope)::

    agent.begin_step(step)             faults active at this step arm; forward hooks and
                                       gradient hooks go in
    batch = agent.batch(batch)         bad-data faults may replace the batch
    ... forward, backward ...          gradient faults act as each gradient accumulates
    agent.after_backward()             what they did is journaled
    agent.before_optimizer_step()      learning-rate faults
    ... optimizer.step() ...
    agent.after_optimizer_step()       weight and optimizer-state faults
    agent.observe_step(StepObserved(loss=...))  the `step` event, with the agent's own checks
    ... checkpoint save ...
    agent.end_step()                   file and process faults; temporary changes undone

Observations (the `step` event, `params_finite`) are the agent's own; what the trainer
claims (`detected`, `recovered`, checkpoint events) goes through `agent.claim`. Whether a
step's update happened is observed, not claimed: a step with no ``after_optimizer_step``
(or `note_update`) is journaled ``skipped``.
With no fault planned the agent costs one journal line per step and, every
``check_params_every`` steps, one pass over the parameters; no collective, unless the plan
has ``after_seconds`` faults (rank 0's clock decides when they fire). The microscope
(harness/inside/microscope.py) records per-layer figures only when asked for.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from faults import (
    FaultPlan,
    Injection,
    Injector,
    NothingToDamage,
    StepContext,
)
from harness.inside.exec_env import ENV_FINGERPRINT
from harness.inside.fault_schedule import FaultSchedule
from harness.inside.hooks import GradientHook
from harness.inside.live_inbox import LiveInbox
from harness.inside.metrics import MeteredJournal, Metrics, MetricsOptions
from harness.inside.microscope import Microscope, MicroscopeOptions
from harness.inside.step_evidence import grads_finite, params_fingerprint, params_finite
from harness.records.events import (
    Claim,
    DataWeightsObserved,
    Detected,
    FileLoaded,
    FileLoadFailed,
    FileSaved,
    LayerStatsObserved,
    StepObserved,
)
from harness.records.journal import Event, JournalWriter, read_journal_file
from harness.run_layout import RunLayout


class Agent:
    """Arms the plan's faults at their steps on their ranks and journals what happens."""

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        *,
        rank: int = 0,
        world_size: int = 1,
        restart: int = 0,
        plan: FaultPlan | None = None,
        model: nn.Module | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        check_params_every: int = 10,
        control: bool = True,
        metrics: MetricsOptions | None = None,
        microscope: MicroscopeOptions | None = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.rank = rank
        self.world_size = world_size
        self.plan = plan or FaultPlan()
        self.model = model
        self.optimizer = optimizer
        self.check_params_every = check_params_every
        # `tightrope crashpoints` compares a resumed run with a fault-free one step by step.
        self.fingerprint_every_step = os.environ.get(ENV_FINGERPRINT) == "1"
        previous = RunLayout(self.run_dir).journal_file(rank)
        earlier = _quietly_read(previous) if previous.exists() else []
        # Metrics for dashboards (docs/metrics.md): off unless asked for, here or by
        # TIGHTROPE_METRICS_*; they count what the journal writes.
        options = metrics or MetricsOptions.from_env(self.run_dir, rank)
        self.metrics = Metrics(options, rank) if options.enabled else None
        if self.metrics is None:
            self.journal = JournalWriter(self.run_dir, rank=rank, restart=restart)
        else:
            self.metrics.replay(earlier)
            self.journal = MeteredJournal(self.run_dir, rank, restart, self.metrics)
            self.metrics.serve()
        # The microscope (harness/inside/microscope.py): off unless asked for, here or by
        # TIGHTROPE_MICROSCOPE.
        seen = microscope if microscope is not None else MicroscopeOptions.from_env()
        self.microscope = (
            Microscope(seen, self.run_dir, rank=rank, world_size=world_size, restart=restart)
            if seen.enabled
            else None
        )
        self.step = 0
        self._started = time.monotonic()
        self.faults = FaultSchedule(self.plan, rank, world_size)
        self._active: list[Injector[Any]] = []
        self._injected_this_step = False
        self._current: int | None = None  # plan index of the injector running a hook
        self._grad_hooks: list[RemovableHandle] = []
        #: (plan index, trigger step) of triggered faults waiting for a save
        self._waiting: list[tuple[int, int]] = []
        self._saved: list[str] = []  # files saved since the last step began
        self._updated: bool | None = False  # the step's update happened (None: unknown)
        self._broken_grads = False  # a fault left gradients non-finite after backward
        self._repaired = False  # ... and they were finite when the optimizer stepped
        self.pids: dict[int, int] = {rank: os.getpid()}
        self.remember_fired(earlier)
        self.inbox = LiveInbox(self.run_dir, rank, world_size, restart) if control else None

    # -- the step --------------------------------------------------------------------

    def context(self) -> StepContext:
        """What injectors may touch now."""
        return StepContext(
            step=self.step,
            rank=self.rank,
            world_size=self.world_size,
            model=self.model,
            optimizer=self.optimizer,
            run_dir=str(self.run_dir),
            checkpoints=str(RunLayout(self.run_dir).checkpoints),
            pids=dict(self.pids),
            cwd=os.getcwd(),
            # Process faults that signal this very process journal before they act.
            record_now=self._record,
        )

    def begin_step(self, step: int) -> None:
        """Start step ``step`` (1-based): take live commands, arm the faults active now, call
        their forward hooks."""
        self.step = step
        self._injected_this_step = self._updated = False
        self._broken_grads = self._repaired = False
        self._remove_grad_hooks()
        if self._saved:
            self._damage_saved()
        if self.faults.timed:
            self.faults.agree_timers(step, time.monotonic() - self._started)
        if self.inbox is not None:
            for spec in self.inbox.take(step, self.journal):
                self.faults.add(spec)
        self._active = self.faults.due(step)
        if self._active:
            self._run(lambda inj, ctx: inj.before_forward(ctx))
            self._hook_gradients()
            for injector in self._active:
                index = self.faults.index[id(injector)]
                if injector.waits_for_save() and index not in [i for i, _ in self._waiting]:
                    self._waiting.append((index, step))
        # After the faults' hooks: it sees what they did.
        self._look(lambda m: m.begin_step(self.model, step, faults_hooked=bool(self._active)))

    def file_saved(self, path: str) -> None:
        """The trainer saved ``path``: triggered faults waiting for a save act on it when the
        next step begins (the trainer's own save procedure, a digest beside the file say,
        is over by then)."""
        self._saved.append(path)

    def _damage_saved(self) -> None:
        saved, self._saved = self._saved, []
        for path in saved:
            for index, trigger in list(self._waiting):
                injector = self.faults.injectors[index][1]
                self._current = index
                try:
                    records = injector.on_file_saved(self.context(), path)
                except NothingToDamage as exc:
                    self._skip(index, trigger, str(exc))
                    self._waiting.remove((index, trigger))
                    continue
                if not records:
                    continue
                # Its trigger step, replayed after a restart, does not arm it again.
                self.faults.fired.add((index, trigger))
                self._record([replace(r, details={**r.details, "trigger_step": trigger})
                              for r in records])  # fmt: skip
                self._waiting.remove((index, trigger))
        self._current = None

    def _hook_gradients(self) -> None:
        """Gradient faults act on each parameter as backward accumulates its gradient."""
        for injector in self._active:
            self._current = self.faults.index[id(injector)]
            ctx = self.context()
            for name, param in injector.gradient_params(ctx):
                hook = GradientHook(self, injector, name)
                self._grad_hooks.append(param.register_post_accumulate_grad_hook(hook))  # type: ignore[no-untyped-call]
        self._current = None

    def _remove_grad_hooks(self) -> None:
        for handle in self._grad_hooks:
            handle.remove()
        self._grad_hooks = []

    def batch(self, batch: torch.Tensor) -> torch.Tensor:
        """The batch to train on (a bad-data fault may replace it)."""
        for injector in self._active:
            self._current = self.faults.index[id(injector)]
            batch, records = injector.on_batch(self.context(), batch)
            self._record(records)
        self._current = None
        return batch

    def after_backward(self) -> None:
        """Gradients exist: gradient faults act (and the agent notes whether they left any
        gradient non-finite)."""
        self._run(lambda inj, ctx: inj.after_backward(ctx))
        if self._injected_this_step and self.model is not None:
            self._broken_grads = not grads_finite(self.model)
        self._look(lambda m: m.after_backward())

    def before_optimizer_step(self) -> None:
        """Just before ``optimizer.step``: gradients a fault left non-finite and that are
        finite now were repaired by the trainer; then late gradient faults act."""
        if self._broken_grads and self.model is not None:
            self._repaired = grads_finite(self.model)
        self._run(lambda inj, ctx: inj.before_optimizer_step(ctx))
        self._look(lambda m: m.before_update())

    def after_optimizer_step(self, *, updated: bool = True) -> None:
        """Just after ``optimizer.step``: the update happened (``updated=False``: the step
        ran and changed no parameter, a skip)."""
        self._updated = updated
        self._look(lambda m: m.after_update())
        self._run(lambda inj, ctx: inj.after_optimizer_step(ctx))

    def note_update(self, known: bool = True) -> None:
        """The step's update happened without ``optimizer.step`` (a trainer that updates the
        parameters by hand); ``known=False``: whether it happened cannot be told."""
        self._updated = True if known else None

    @property
    def injected_this_step(self) -> bool:
        """True when a fault acted at this step so far."""
        return self._injected_this_step

    @property
    def check_due(self) -> bool:
        """True when this step's parameters (and gradient norm) are to be checked."""
        return self._injected_this_step or (
            self.check_params_every > 0 and self.step % self.check_params_every == 0
        )

    @property
    def fingerprint_due(self) -> bool:
        """True when this step's parameters are fingerprinted: on the periodic check steps
        (the same steps on every rank, so replicas can be compared), with several ranks; at
        every step when `ENV_FINGERPRINT` asks (``tightrope crashpoints``)."""
        if self.fingerprint_every_step:
            return True
        every = self.check_params_every
        return self.world_size > 1 and every > 0 and self.step % every == 0

    def observe_step(self, observed: StepObserved) -> None:
        """Journal the `step` event with what the agent observed itself: whether the update
        happened (``skipped``) and, when due, whether every parameter is finite."""
        observations = observed.fields()
        if self._updated is not None:
            observations["skipped"] = not self._updated
        if self._repaired and self._updated:
            observations["grads_repaired"] = True
        if self.check_due and self.model is not None:
            observations["params_finite"] = params_finite(self.model)
        if self.fingerprint_due and self.model is not None:
            observations["params_fingerprint"] = f"{params_fingerprint(self.model):016x}"
        self.journal.emit("step", self.step, **observations)
        broken = observations.get("params_finite") is False
        anomaly = self._injected_this_step or broken or observations.get("skipped") is True
        self._look(lambda m: m.end_step(observations, anomaly))

    def end_step(self) -> None:
        """The step is over: file and process faults act, temporary changes are undone."""
        self._remove_grad_hooks()
        if self._active:
            self._run(lambda inj, ctx: inj.end_step(ctx))
        self._active = []

    def document_wrapper(self) -> Callable[[Iterator[Any]], Any] | None:
        """A wrapper for the training document stream when the plan has a fault that acts on
        it (reach ``documents``): that injector's `wrap_documents`.

        Such faults act on the stream every rank reads alike, so they ignore ``ranks``.
        """
        return self.faults.document_wrapper()

    # -- claims and lifecycle ----------------------------------------------------------

    def claim(self, claim: Claim, step: int | None = None) -> None:
        """Journal something the trainer reports about itself (detected, recovered, ...),
        at the current step unless ``step`` says otherwise."""
        self.journal.emit(claim.kind, self.step if step is None else step, **claim.fields())
        if isinstance(claim, Detected):
            self._look(lambda m: m.mark_anomaly())

    def name_layers(self, layer_of: Callable[[str], str]) -> None:
        """The trainer's own names for its layers (parameter name -> layer), for the
        microscope's figures; without it, harness/inside/layer_figures.py decides."""
        if self.microscope is not None:
            self.microscope.layer_of = layer_of

    def watch_data_parallel(self, wrapper: nn.Module) -> None:
        """The trainer's DDP wrapper: the microscope times its bucket all-reduces."""
        self._look(lambda m: m.watch_data_parallel(wrapper))

    def observe_layers(self, event: LayerStatsObserved) -> None:
        """Journal the per-layer statistics the trainer measured at this step."""
        self.journal.emit(event.kind, self.step, **event.fields())

    def observe_data(self, event: DataWeightsObserved) -> None:
        """Journal the corpus's sampling weights the trainer set at this step."""
        self.journal.emit(event.kind, self.step, **event.fields())

    def observe_file(self, event: FileSaved | FileLoaded | FileLoadFailed) -> None:
        """Journal a file the trainer saved or loaded, as the agent saw it."""
        self.journal.emit(event.kind, self.step, **event.fields())

    def checkpoint_loaded(self, path: str | os.PathLike[str]) -> None:
        """Journal that the trainer restored the checkpoint folder ``path``, with the agent's
        own check of it against its manifest, made now (the folder may be gone by the time
        the run is judged)."""
        from harness.oracles.manifests import inspect_checkpoint

        state = inspect_checkpoint(Path(path))
        extra = {"verified_reason": state.reason} if state.reason else {}
        self.journal.emit(
            "checkpoint_loaded", self.step, path=str(path), verified=state.status, **extra
        )

    def start(self, step: int, **fields: Any) -> None:
        """Journal ``run_start`` at ``step`` (0 for a fresh run)."""
        self.step = step
        self.journal.emit(
            "run_start",
            step,
            world_size=self.world_size,
            pid=os.getpid(),
            host=socket.gethostname(),
            **fields,
        )

    def close(self, status: str, reason: str = "", **observed: Any) -> None:
        """Journal ``run_end`` (with what the caller ``observed`` at the end) and close the
        journal."""
        extra = {"reason": reason} if reason else {}
        seconds = time.monotonic() - self._started
        self._look(lambda m: m.close())
        self.journal.emit("run_end", self.step, status=status, seconds=seconds, **extra, **observed)
        self.journal.close()

    # -- internals ---------------------------------------------------------------------

    def _look(self, call: Callable[[Microscope], object]) -> None:
        """One call into the microscope. It must never end a job: a failure is journaled
        (`microscope_failed`, once) and the microscope is off for the rest of the process."""
        scope = self.microscope
        if scope is None:
            return
        try:
            call(scope)
        except Exception as exc:  # whatever broke, training goes on
            self.microscope = None
            with contextlib.suppress(Exception):
                scope.close()
            self.journal.emit("microscope_failed", self.step, error=f"{type(exc).__name__}: {exc}")

    def _run(self, hook: Callable[[Injector[Any], StepContext], list[Injection]]) -> None:
        for injector in list(self._active):
            self._current = self.faults.index[id(injector)]
            try:
                records = hook(injector, self.context())
            except NothingToDamage as exc:
                self._skip(self._current, self.step, str(exc))
                self._active.remove(injector)
                continue
            self._record(records)
        self._current = None

    def _skip(self, index: int, trigger: int, reason: str) -> None:
        """A checkpoint fault found nothing to act on: journaled, and fired for good."""
        self.faults.fired.add((index, trigger))
        self.journal.emit(
            "fault_skipped",
            self.step,
            fault=self.faults.injectors[index][0].kind,
            reason=reason,
            details={"plan_index": index, "trigger_step": trigger},
        )

    def _record(self, records: list[Injection]) -> None:
        if records:
            self._look(lambda m: m.fault_injected())
        for record in records:
            self._injected_this_step = True
            plan: dict[str, Any] = {}
            if self._current is not None:
                self.faults.fired.add((self._current, self.step))
                plan["plan_index"] = self._current
            self.journal.emit("fault_injected", self.step, **record.event_fields(**plan))

    def remember_fired(self, events: Iterable[Any]) -> None:
        """Learn from earlier ``fault_injected`` events (of a previous attempt of this run)
        which faults already happened, so a restarted job does not meet them again."""
        self.faults.remember(events)


def _quietly_read(path: Path) -> list[Event]:
    # A torn tail from a killed attempt is expected here; the writer mends it.
    return read_journal_file(path, warn=False)
