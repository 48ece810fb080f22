"""Fault-free baseline runs, cached by a hash of the trainer configuration and the code.

A scenario that compares against a clean run (final loss, false alarms) needs the same
configuration trained with no fault. That run is the same for every scenario sharing
the configuration, and for every suite run until the code changes, so it is kept in a
cache folder (``TIGHTROPE_CACHE``, default ``.tightrope-cache`` in the working directory)
under ``baselines/<key>``, where the key hashes the configuration and the source of the
packages that decide what the run computes.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from harness.errors import TightropeError
from harness.run_layout import RunLayout
from harness.running.launch import (
    custom_command,
    reference_command,
    run_process,
    trainer_cwd,
    trainer_env,
)
from harness.running.run_lock import RunDirLock
from harness.suites.scenario import Scenario, TrainerSpec

_PACKAGES = ("harness", "faults", "reference_trainer")
_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.Lock()


#: The error of a baseline stopped by the user: says nothing of its configuration.
BASELINE_STOPPED = "the fault-free baseline run was stopped (Ctrl-C or SIGTERM)"


class BaselineError(TightropeError):
    """The fault-free run of a configuration failed, so nothing can be compared with it."""


def default_cache_dir() -> Path:
    """Where baselines are cached: ``$TIGHTROPE_CACHE`` or ``./.tightrope-cache``."""
    return Path(os.environ.get("TIGHTROPE_CACHE") or ".tightrope-cache")


def code_version() -> str:
    """SHA-256 over the source files of the packages a run depends on."""
    h = hashlib.sha256()
    for package in _PACKAGES:
        spec = importlib.util.find_spec(package)  # located, not imported
        if spec is None or not spec.submodule_search_locations:
            continue
        root = Path(next(iter(spec.submodule_search_locations)))
        for path in sorted(root.rglob("*.py")):
            h.update(path.relative_to(root.parent).as_posix().encode())
            h.update(path.read_bytes())
    return h.hexdigest()


def baseline_key(spec: TrainerSpec, code: str | None = None) -> str:
    """The cache key of a configuration: its identity and the code version, hashed."""
    identity = spec.identity()
    if spec.command is not None:
        # A user's trainer script is part of what the run computes.
        for word in spec.command.split():
            if Path(word).is_file():
                identity[f"file:{word}"] = hashlib.sha256(Path(word).read_bytes()).hexdigest()
    blob = json.dumps({"trainer": identity, "code": code or code_version()}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def scenario_key(scenario: Scenario) -> str:
    """The cache key of a faulted run: its baseline's key (configuration and code) with
    the faults and the checks it is judged by; the scenario's name is not part of it."""
    blob = json.dumps(
        {
            "baseline": baseline_key(scenario.trainer),
            "faults": scenario.plan(),
            "expect": scenario.expect.model_dump(mode="json", exclude_defaults=True),
        },
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _lock_for(key: str) -> threading.Lock:
    with _locks_guard:
        return _locks.setdefault(key, threading.Lock())


@contextlib.contextmanager
def cache_lock(cache_dir: Path, key: str) -> Iterator[Path]:
    """Hold the cache entry of ``key`` (threads and processes wait for one another); yields
    the entry's run dir."""
    run_dir = cache_dir / "baselines" / key
    with _lock_for(key):
        run_dir.parent.mkdir(parents=True, exist_ok=True)
        with open(run_dir.parent / f"{key}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield run_dir


def baseline_run(
    spec: TrainerSpec,
    cache_dir: Path,
    *,
    use_cache: bool = True,
    on_poll: Callable[[Path], None] | None = None,
    stop: threading.Event | None = None,
) -> Path:
    """The run dir of the fault-free run of ``spec``, running it when not cached.

    Concurrent callers (threads or processes) asking for the same key wait for one run.
    """
    key = baseline_key(spec)
    with cache_lock(cache_dir, key) as run_dir:
        if use_cache and RunLayout(run_dir).baseline_done.is_file():
            return run_dir
        with RunDirLock.acquire(run_dir) as claim:  # (a stray trainer in it is refused)
            claim.clear()
            argv = (
                reference_command(spec, run_dir, None, stop_after=spec.stop_after)
                if spec.command is None
                else custom_command(spec, run_dir, None)
            )
            launch = run_process(
                argv,
                log=RunLayout(run_dir).log,
                deadline=time.monotonic() + spec.timeout,
                env={**trainer_env(spec), **claim.env()},
                on_poll=(lambda: on_poll(run_dir)) if on_poll else None,
                cwd=trainer_cwd(spec, run_dir),
                stop=stop,
            )
        if launch.interrupted:
            raise BaselineError(BASELINE_STOPPED)
        if launch.timed_out or launch.exit_code != 0:
            how = (
                f"timed out after {spec.timeout:g} s"
                if launch.timed_out
                else f"exited with code {launch.exit_code}"
            )
            raise BaselineError(f"the fault-free baseline run {how}; see {RunLayout(run_dir).log}")
        RunLayout(run_dir).baseline_done.write_text(
            json.dumps({"key": key, "trainer": spec.identity(), "seconds": launch.seconds})
        )
    return run_dir
