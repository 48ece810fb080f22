"""A Chaos Toolkit control: the experiment's own job, started before it and stopped after.

Declared under the experiment's ``controls``; its ``arguments`` are those of
`actions.start_training`. Starting before the steady-state hypothesis means the
hypothesis is checked against a job that is really training, and stopping after the
experiment (whatever its status, even when the hypothesis failed and Chaos Toolkit plays
no rollback) means nothing is left running.
"""

from __future__ import annotations

import logging
from typing import Any

from harness.errors import TightropeError
from harness.integrations.chaostoolkit.actions import start_training, stop_training

_log = logging.getLogger("chaostoolkit")


def before_experiment_control(context: Any, run_dir: str, **start: Any) -> None:
    """Start the job on ``run_dir``; interrupt the experiment when it will not start."""
    try:
        started = start_training(run_dir, **start)
    except (TightropeError, TypeError) as exc:
        from chaoslib.exceptions import InterruptExecution

        _log.error("tightrope: the experiment's job did not start: %s", exc)
        raise InterruptExecution(f"tightrope: the experiment's job did not start: {exc}") from exc
    _log.info("tightrope: job started in %s (pid %s)", started["run_dir"], started["pid"])


def after_experiment_control(context: Any, run_dir: str, **_: Any) -> None:
    """Stop the job on ``run_dir`` if it still runs."""
    stopped = stop_training(run_dir)
    if stopped["was_running"]:
        _log.info("tightrope: job in %s stopped: %s", run_dir, stopped)
