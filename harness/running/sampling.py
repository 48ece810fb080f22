"""Draw generations from a finished run's final weights, by the trainer's own command.

The collapse check (``max_phrase_collapse``) reads what the model says, and the harness
never imports the trainer: the reference trainer samples with
``python -m reference_trainer.sample`` (its command line lives here, next to the trainer's
own in `harness.running.launch`); a command trainer with its ``trainer.sample_command``.
Without one, no samples are written and the check is not judged. The sampler runs in
the scenario's run dir for the faulted run and for its fault-free baseline, writes
``samples.json`` and ``baseline-samples.json`` there (`RunLayout`), and appends its
output to the run's ``trainer.log``.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

from harness.oracles.collapse import PhraseCollapseExpect
from harness.run_layout import RunLayout
from harness.running.launch import run_process, split_command, trainer_cwd, trainer_env
from harness.suites.scenario import Scenario, TrainerSpec


def sample_command(
    spec: TrainerSpec, run_dir: Path, out: Path, asked: PhraseCollapseExpect
) -> list[str] | None:
    """The command that samples ``asked.k`` generations of ``run_dir`` into ``out``;
    None for a command trainer that gives no ``sample_command``."""
    if spec.command is None:
        return [
            sys.executable,
            "-m",
            "reference_trainer.sample",
            "--run-dir",
            str(run_dir),
            "--k",
            str(asked.k),
            "--max-tokens",
            str(asked.max_tokens),
            "--seed",
            str(asked.seed),
            "--out",
            str(out),
            *(["--top-k", str(asked.top_k)] if asked.top_k is not None else []),
        ]
    if spec.sample_command is None:
        return None
    return split_command(
        spec.sample_command,
        run_dir=run_dir.resolve(),
        k=asked.k,
        max_tokens=asked.max_tokens,
        seed=asked.seed,
        top_k=asked.top_k or 0,
        out=out.resolve(),
        python=sys.executable,
    )


def take_samples(
    scenario: Scenario,
    run_dir: Path,
    baseline_dir: Path | None,
    stop: threading.Event | None = None,
) -> None:
    """Sample the faulted run and its baseline when the scenario asks for the collapse
    check; each sampler gets the scenario's trainer timeout. A failed sampler leaves no
    file, which the check reports."""
    asked = scenario.expect.max_phrase_collapse
    if asked is None:
        return
    spec, layout = scenario.trainer, RunLayout(run_dir)
    for stale in (layout.samples, layout.baseline_samples):
        stale.unlink(missing_ok=True)  # nothing old may pass for this run's generations
    jobs = [(run_dir, layout.samples)]
    if baseline_dir is not None:
        jobs.append((baseline_dir, layout.baseline_samples))
    for source, out in jobs:
        argv = sample_command(spec, source, out, asked)
        if argv is None or (stop is not None and stop.is_set()):
            continue
        run_process(
            argv,
            log=layout.log,
            deadline=time.monotonic() + spec.timeout,
            env=trainer_env(spec),
            cwd=trainer_cwd(spec, run_dir),
            stop=stop,
        )
