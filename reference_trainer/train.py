"""A training run: build, optionally resume, train to the target step, recover from
failures as the policy decides, and journal it all through the agent."""

from __future__ import annotations

import math
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from faults import FaultPlan
from harness.errors import TightropeError
from harness.inside.agent import Agent
from harness.inside.microscope import MicroscopeOptions
from harness.records.events import Detected, RankLost, Recovered
from harness.run_layout import RunLayout
from reference_trainer.build import build, seed_everything
from reference_trainer.checkpoints import files as ckpt
from reference_trainer.checkpoints.manager import CheckpointManager
from reference_trainer.checkpoints.run_dir import (
    check_fresh,
    check_run,
    lost_ranks,
    unfinished_start,
)
from reference_trainer.checkpoints.schedule import SaveSchedule
from reference_trainer.config import TrainConfig
from reference_trainer.errors import TrainingFailed
from reference_trainer.processes import distributed
from reference_trainer.processes.collective_blame import blame_failed_collective
from reference_trainer.processes.collective_ledger import CollectiveLedger
from reference_trainer.processes.crash_report import (
    CrashReport,
    journal_exception,
    journal_restart,
)
from reference_trainer.processes.distributed import Topology
from reference_trainer.processes.preemption import Preemption, journal_preemption
from reference_trainer.processes.watchdog import Heartbeat
from reference_trainer.stability.layer_claims import journal_layers, weights_changed
from reference_trainer.stability.layer_diagnosis import DiagnosisReport
from reference_trainer.stability.layer_step import LayerChecks
from reference_trainer.stability.loss_spikes import SpikeMonitor
from reference_trainer.stability.recovery import Failure, RecoveryPolicy
from reference_trainer.stability.recovery_run import RecoveryRun
from reference_trainer.step import StepResult


@dataclass(frozen=True, slots=True)
class RunResult:
    """What one process saw of its run."""

    steps: int
    final_loss: float
    seconds: float
    status: str = "completed"


def _print(topo: Topology, message: str) -> None:
    if topo.is_main:
        print(message, flush=True)


def train(
    cfg: TrainConfig,
    run_dir: Path,
    *,
    resume: bool = False,
    restarted: bool = False,
    device: str = "auto",
    stop_after: int | None = None,
    plan: FaultPlan | None = None,
) -> RunResult:
    """Train ``cfg`` in ``run_dir`` (fresh, or from its latest checkpoint) to ``cfg.steps``.

    ``stop_after`` ends the run early, with a checkpoint, as a preempted job would; the
    learning-rate schedule still spans ``cfg.steps``. ``plan`` names faults to inject.
    Every rank runs this; under torchrun the process group comes from the environment.
    ``restarted`` says torchrun restarted the workers: a fresh start may then find the
    journal of the attempt that failed before its first checkpoint.
    """
    run_dir = Path(run_dir)
    # Every check reads only: no rank may write before all have looked at the same disk.
    # Which checkpoint a resume starts from is the loader's to find, once (the CLI has
    # already named it to the user by the same load).
    # (A start-up killed before the first step left nothing worth keeping: start over.)
    start_over = False
    if resume:
        check_run(run_dir)
    elif not restarted:
        start_over = check_fresh(run_dir) is not None
    else:  # the failed attempt's journal is kept: it tells what happened to it
        start_over = unfinished_start(run_dir) is not None
    watchdog = cfg.stability.watchdog
    topo = distributed.init(device, watchdog.collective_timeout if watchdog.enabled else None)
    try:
        run = Run(cfg, run_dir, topo, plan or FaultPlan(), resume=resume, start_over=start_over)
        return run.execute(resume, stop_after or cfg.steps)
    finally:
        distributed.shutdown(topo)


class Run:
    """One process's part of a run: the loop, checkpoints and recovery."""

    def __init__(
        self,
        cfg: TrainConfig,
        run_dir: Path,
        topo: Topology,
        plan: FaultPlan,
        *,
        resume: bool = False,
        start_over: bool = False,
    ) -> None:
        self.cfg, self.run_dir, self.topo = cfg, run_dir, topo
        if topo.is_main:
            self.start_up(resume=resume, start_over=start_over)
        distributed.barrier(topo)
        watchdog = cfg.stability.watchdog
        # Counts and times every all-reduce; its files name a rank stuck before one.
        self.ledger = (
            CollectiveLedger(run_dir if watchdog.enabled else None, topo.rank, topo.restart)
            if topo.distributed
            else None
        )
        if self.ledger is not None:
            self.ledger.install()
        self.agent = Agent(
            run_dir,
            rank=topo.rank,
            world_size=topo.world_size,
            restart=topo.restart,
            plan=plan,
            # The microscope records unless TIGHTROPE_MICROSCOPE=off says otherwise.
            microscope=MicroscopeOptions.from_env(MicroscopeOptions(enabled=True)),
        )
        self.trainer = build(cfg, run_dir, topo, self.agent)
        recovery = cfg.stability.recovery
        self.checkpoints = CheckpointManager(
            run_dir,
            cfg.stability.checkpoints,
            rank=topo.rank,
            keep=cfg.keep_checkpoints,
            barrier=lambda: distributed.barrier(topo),
            agree=lambda step: distributed.min_max_over_ranks(step, topo),
            claim=self.agent.claim,
            keep_back=recovery.retry_steps if recovery.enabled else 0,
        )
        self.report = DiagnosisReport(RunLayout(run_dir).diagnosis) if topo.is_main else None
        self.policy = RecoveryPolicy(cfg.stability.recovery)
        self.recovery = RecoveryRun(
            self.policy,
            self.checkpoints,
            self.trainer,
            restore=lambda path, state: self.restore(path, state, rollback=True),
            agent=self.agent,
            diagnosis=self.report,
            say=lambda message: _print(topo, message),
            lr_backoff=cfg.stability.recovery.lr_backoff,
            skip_data=cfg.stability.recovery.skip_data,
            retry_steps=cfg.stability.recovery.retry_steps,
            # (Dynamic batching skips micro-batches: grad_accum x world size of them a step.)
            windows_per_step=cfg.global_batch(topo.world_size)
            if not cfg.data.batching.enabled
            else cfg.grad_accum * topo.world_size,
        )
        self.spikes = SpikeMonitor(cfg.stability.spikes)
        self.schedule = SaveSchedule(cfg.checkpoint_every, cfg.checkpoint_every_tokens)
        self.spike_fired: list[str] = []
        self.skips = 0
        self.gave_up = False
        self.preemption = Preemption(cfg.stability.preemption)
        self.trainer.preempt_requested = lambda: self.preemption.requested
        self.heartbeat = (
            Heartbeat(watchdog, run_dir, topo.rank, topo.restart, topo.world_size)
            if watchdog.enabled
            else None
        )
        self.crashes = (
            CrashReport(run_dir, topo.rank, topo.restart) if cfg.stability.crash_report else None
        )
        if self.heartbeat is not None and self.trainer.embedder is not None:
            # Loading the embedding model mid-step takes seconds: not a hang.
            self.trainer.embedder.around_load = self.heartbeat.slow

    def start_up(self, *, resume: bool, start_over: bool) -> None:
        """Rank 0, before anything else is written: the configuration and the run id, each
        whole (written aside, fsynced, renamed), so that a run dir holding anything more
        always holds both, and a start killed earlier is seen as one (`unfinished_start`).
        ``start_over`` first removes what such a start left."""
        layout = RunLayout(self.run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        if start_over:
            for path in layout.start_up_files():
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                else:
                    path.unlink(missing_ok=True)
        if not resume:
            self.cfg.save(self.run_dir)
        has_id = layout.run_id.exists()
        if (not resume and not self.topo.restart) or not (has_id or self._has_checkpoints()):
            ckpt.new_run_id(self.run_dir)  # (a restart before the first save keeps its id)
        ckpt.remove_unfinished(self.run_dir)  # no save is in flight before step 1

    # -- state -------------------------------------------------------------------------

    def state_dict(self, step: int) -> dict[str, Any]:
        """The checkpoint state: the trainer's plus the policy's and the detectors'."""
        state = self.trainer.state_dict(step)
        state["trainer"]["policy"] = self.policy.state_dict()
        state["trainer"]["spikes"] = self.spikes.state_dict()
        state["trainer"]["tokens_trained"] = self.schedule.tokens
        return state

    def restore(self, path: Path, state: dict[str, Any], *, rollback: bool = False) -> int:
        """Load a checkpoint's state (already verified) and this rank's RNG states.

        A rollback keeps the recovery policy where it is: rolling its level back with the
        weights would retry the same level forever.
        """
        step = self.trainer.load_state_dict(state)
        extra = state.get("trainer", {})
        if "policy" in extra and not rollback:
            self.policy.load_state_dict(extra["policy"])
        if "spikes" in extra:
            self.spikes.load_state_dict(extra["spikes"])
        # (A checkpoint from before the count: fixed windows, the same tokens every step.)
        self.schedule.tokens = int(
            extra.get("tokens_trained", step * self.trainer.loader.tokens_per_step())
        )
        rng = self.checkpoints.rng_of(path)
        if rng is not None:
            ckpt.set_rng_state(rng)
        else:  # a rank that did not exist when the checkpoint was taken
            seed_everything(self.cfg.seed + 1 + self.topo.rank + step * 1009)
        self.agent.checkpoint_loaded(path)
        return step

    # -- the loop ----------------------------------------------------------------------

    def execute(self, resume: bool, last: int) -> RunResult:
        """Train to step ``last``; returns what this process saw."""
        cfg, topo, agent = self.cfg, self.topo, self.agent
        started = time.monotonic()
        agent.start(
            0,
            target_steps=cfg.steps,
            preset=cfg.preset,
            seed=cfg.seed,
            precision=cfg.precision,
            device=topo.device.type,
            config=cfg.to_dict(),
        )
        if topo.restart:
            named = self.crashes is not None
            journal_restart(
                agent, self.run_dir, restart=topo.restart, main=topo.is_main, named=named
            )
            if topo.is_main:
                for rank in lost_ranks(self.run_dir, topo.restart - 1):
                    why = f"its process ended without a run_end in attempt {topo.restart - 1}"
                    agent.claim(RankLost(lost_rank=rank, reason=why))
        if topo.join_retries:
            agent.claim(
                Recovered(action="rejoin_retry", details={"failed_tries": topo.join_retries})
            )
        step = 0
        status, reason, loss = "failed", "interrupted", math.nan
        self.preemption.install()
        if self.crashes is not None:
            self.crashes.install()
        try:
            if resume and self._has_checkpoints():
                path, state = self.checkpoints.load_valid()
                step = self.restore(path, state)
            if self.heartbeat is not None:
                self.heartbeat.start(step)
            _print(topo, self._banner(step, last))
            step, loss, status, reason = self._loop(step, last)
        except KeyboardInterrupt:
            status, reason = "stopped", "interrupted by the user"
            raise
        except Exception as exc:
            reason = f"{type(exc).__name__}: {exc}"
            if self.crashes is not None:
                journal_exception(agent, exc, topo.rank)
            if self.ledger is not None and self.ledger.path is not None:
                blame_failed_collective(
                    exc,
                    self.run_dir,
                    world_size=topo.world_size,
                    restart=topo.restart,
                    claim=agent.claim,
                    timeout=cfg.stability.watchdog.min_timeout,
                )
            if isinstance(exc, TightropeError) and not isinstance(exc, TrainingFailed):
                # The run dir has changed by now: no longer bad input (the CLI exits 1).
                raise TrainingFailed(str(exc)) from exc
            raise
        finally:
            try:
                self.checkpoints.wait()  # may raise a failed background save's error...
            finally:  # ...after which the monitor must stop all the same, or kill us
                if self.heartbeat is not None:
                    self.heartbeat.stop()
                self.preemption.uninstall()
                if self.crashes is not None:
                    self.crashes.uninstall()
                if self.ledger is not None:
                    self.ledger.uninstall()
                ended = {"gave_up": True} if self.gave_up else {}
                agent.close("stopped" if status == "preempted" else status, reason, **ended)
        return RunResult(step, loss, time.monotonic() - started, status)

    def _has_checkpoints(self) -> bool:
        return bool(ckpt.complete_checkpoints(self.run_dir))

    def _loop(self, step: int, last: int) -> tuple[int, float, str, str]:
        cfg, agent = self.cfg, self.agent
        loss = math.nan
        step += 1
        while step <= last:
            result = self.trainer.step(step)
            loss = result.observed.loss
            agent.observe_step(result.observed)
            for claim in result.claims:
                agent.claim(claim)
            if result.data is not None:
                agent.observe_data(result.data)
            # Every rank checks (a collective) before any other failure is looked at.
            save_due = self.schedule.due(step, result.observed.tokens) or step == last
            diverged, found = self.trainer.between_steps(step, save_due=save_due)
            for claim in found:
                agent.claim(claim)
            failure = self._failure(step, result.skipped, loss)
            failure = failure or weights_changed(step, result.claims) or diverged
            self._journal_layers(result)
            if failure is not None and cfg.stability.recovery.enabled:
                resumed = self.recovery.recover_or_give_up(failure)
                self.skips = 0
                agent.end_step()
                self._beat(step)
                if resumed is None:
                    self.gave_up = True
                    return (
                        step,
                        loss,
                        "failed",
                        f"recovery exhausted: see {RunLayout(self.run_dir).diagnosis.name}",
                    )
                step = resumed + 1
                continue
            if failure is None:
                self.policy.good_step()
                if self.trainer.end_fp32_retry(step):  # the retried steps are redone
                    details = {"precision": cfg.precision, "after_step": step}
                    agent.claim(Recovered(action="precision_restored", details=details))
            saved = self.schedule.after_step(step, result.observed.tokens) or step == last
            if saved:
                self.checkpoints.save(step, self.state_dict(step) if self.topo.is_main else None)
            if step == last or result.preempted:
                if result.preempted and not saved:
                    self.checkpoints.save(
                        step, self.state_dict(step) if self.topo.is_main else None
                    )
                # The last checkpoint is durable before the step's end, so whatever acts
                # at end_step (a checkpoint fault, a stop) sees it as `latest`.
                self.checkpoints.wait()
            if result.preempted:
                # No rank exits before the emergency checkpoint is durable on rank 0.
                distributed.barrier(self.topo)
                reason = journal_preemption(self.agent, self.preemption, step)
                _print(self.topo, f"preempted: emergency checkpoint at step {step}, exiting")
                return step, loss, "preempted", reason
            agent.end_step()
            self._beat(step)
            if step % cfg.log_every == 0 or step == last:
                obs = result.observed
                _print(
                    self.topo,
                    f"step {step:>6}/{cfg.steps}  loss {loss:8.4f}  lr {obs.lr:.2e}  "
                    f"{obs.step_time * 1e3:7.1f} ms/step",
                )
            step += 1
        done = step - 1
        if done == cfg.steps:
            return done, loss, "completed", ""
        return done, loss, "stopped", f"stopped after step {done} as asked"

    def _journal_layers(self, result: StepResult) -> None:
        """The step's per-layer statistics and diagnosis, when the layer checks are on."""
        layers = self.trainer.mechanism("layer_stats")
        if isinstance(layers, LayerChecks):
            journal_layers(
                self.agent,
                layers.monitor,
                self.report,
                result,
                also_fired=self.spike_fired,
                enabled=self.cfg.stability.layer_stats.enabled,
            )

    def _beat(self, step: int) -> None:
        if self.heartbeat is not None:
            self.heartbeat.beat(step)

    def _failure(self, step: int, skipped: bool, loss: float) -> Failure | None:
        """What, if anything, this step's evidence says went wrong."""
        limit = self.cfg.stability.recovery.max_consecutive_skips
        # In fp16 the loss scaler owns overflow skips; its collapse is the failure.
        counted = skipped and not self.trainer.scaler.active
        self.skips = self.skips + 1 if counted else 0
        if self.skips >= limit:
            return Failure(step, "non_finite_steps", {"skipped_in_a_row": self.skips})
        if self.trainer.scaler.collapsed:
            return Failure(step, "loss_scale_collapsed", {"scale": self.trainer.scaler.scale})
        self.spike_fired = []
        if skipped:
            return None
        claims = self.spikes.observe(step, loss)
        self.spike_fired = [claim.detector for claim in claims]
        for claim in claims:
            self.agent.claim(Detected(detector=claim.detector, details=claim.journal_details()))
        if self.spikes.acting(claims):
            return Failure(step, "loss_spike", {"loss": loss})
        return None

    def _banner(self, start: int, last: int) -> str:
        cfg, topo = self.cfg, self.topo
        return (
            f"tightrope reference trainer: preset {cfg.preset}, "
            f"{self.trainer.model.num_parameters() / 1e6:.2f}M parameters, "
            f"{topo.world_size} rank(s) x {cfg.batch_size * cfg.grad_accum} x "
            f"{cfg.model.block_size} tokens, {cfg.precision} on {topo.device.type}, "
            f"steps {start + 1}..{last} of {cfg.steps}, run dir {self.run_dir}"
        )
