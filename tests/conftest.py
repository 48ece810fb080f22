"""Shared fixtures: small, fast configurations and helpers to run the trainer for real."""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import io
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from xdist.remote import Producer

from faults.proc_stat import PPID, STATE, stat_fields
from harness.running import warm_start
from tests import lanes

ROOT = Path(__file__).resolve().parent.parent

# One thread per process, as make test exports (torch is not imported yet): a bare pytest
# then runs as make test does; with a thread per core, the in-process training tests took
# about 2.5 times the CPU (test_layer_stats.py 89 s instead of 35, in a full run).
os.environ.setdefault("OMP_NUM_THREADS", "1")


def require(*modules: str) -> None:
    """Skip the calling test module unless each of ``modules`` is installed, found without
    importing it (``pytest.importorskip`` imports it in every worker at collection: 2.3 s
    for Lightning, whose trainers the tests run in processes of their own)."""
    missing = [name for name in modules if importlib.util.find_spec(name) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)}", allow_module_level=True)


def run_module(
    *args: str, cwd: Path | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m ...`` (or any args) with this interpreter, capturing output; warm
    (forked from this worker's warm-start server) when the session starts warm."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    return subprocess.run(
        warm_start.warm([sys.executable, *args], env),
        cwd=cwd or ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def torchrun(
    nproc: int, *args: str, timeout: float = 300, max_restarts: int = 0
) -> subprocess.CompletedProcess[str]:
    """Launch ``torchrun --nproc-per-node N -m reference_trainer ARGS`` and wait for it."""
    return run_module(
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(nproc),
        "--max-restarts",
        str(max_restarts),
        "-m",
        "reference_trainer",
        *args,
        timeout=timeout,
    )


def end_gloo_group() -> None:
    """Destroy this process's (one-rank, gloo) process group as the test trainers end
    theirs (docs/frameworks.md): torch 2.13's ``~ProcessGroupGloo`` joins gloo's threads
    while holding the GIL, which a thread still freeing a finished collective needs, so a
    barrier and a moment without the GIL let them finish first. A test worker hung there
    once, as a DDP model, the group's last holder, was freed after the group was
    destroyed."""
    import torch.distributed as dist

    dist.barrier()
    time.sleep(0.1)
    dist.destroy_process_group()
    gc.collect()


@pytest.fixture
def quiet() -> contextlib.AbstractContextManager[object]:
    """Silence the trainer's progress lines in in-process runs."""
    return contextlib.redirect_stdout(io.StringIO())


@pytest.fixture
def shared_cache() -> Path:
    """The session's baseline cache, for runs whose test is not about caching: a
    configuration another test already ran is not run again."""
    return Path(os.environ[SHARED_CACHE])


# -- nothing of ours outlives the session -------------------------------------------------

#: Every process a test starts inherits this mark (through the environment), whatever
#: session or parent it ends up in; whatever still carries it at the end was left behind.
SESSION_MARK = "TIGHTROPE_TEST_SESSION"

#: The folder of trained tokenizers every fresh run of the session shares.
TOKENIZER_CACHE = "TIGHTROPE_TOKENIZER_CACHE"

#: Where fault-free baselines are cached (harness/running/baseline.py reads it): one folder
#: for the session, so a configuration's baseline runs once however many tests need it.
BASELINE_CACHE = "TIGHTROPE_CACHE"

#: The same folder, under a name no test changes (a test may set or drop TIGHTROPE_CACHE).
SHARED_CACHE = "TIGHTROPE_TEST_SHARED_CACHE"

#: Set by pytest-xdist in each worker's environment (``make test`` runs two workers).
XDIST_WORKER = "PYTEST_XDIST_WORKER"


@pytest.hookimpl(tryfirst=True)  # before any plugin reads the groups off the marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The two lanes of tests/lanes.py; a worker writes them down for the controller."""
    lanes.assign_groups(items)
    if XDIST_WORKER in os.environ:
        lanes.record_groups(items)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(
    config: pytest.Config, log: Producer
) -> lanes.GroupScheduling | None:
    """``--dist loadgroup``: the groups from the workers' file (tests/lanes.py)."""
    return lanes.GroupScheduling(config, log) if config.getvalue("dist") == "loadgroup" else None


#: ``1``: every trainer process of the tests starts afresh, none forked warm (make test
#: starts the reference trainer's processes through `harness.running.warm_start`).
FRESH = "TIGHTROPE_TEST_FRESH"


def pytest_sessionstart(session: pytest.Session) -> None:
    """Start the reference trainer's processes warm (forked from an interpreter that
    imported torch once; tests/test_warm_start.py shows it changes nothing); mark this
    session's environment, so its processes can be found at the end; give
    its fresh runs one tokenizer cache, so each configuration's BPE is trained once (each
    entry is checked against its digest before use; tests/test_tokenizer_cache.py), and
    one baseline cache (keyed by configuration and code, and locked: tests that do not
    test caching share it, through ``shared_cache`` or a run that takes the default)."""
    if os.environ.get(FRESH) != "1":
        warm_start.enable()
    if XDIST_WORKER in os.environ:
        return  # a worker inherits the controller's mark and cache: one check covers all
    os.environ[SESSION_MARK] = f"{os.getpid()}-{time.time_ns()}"
    os.environ[TOKENIZER_CACHE] = tempfile.mkdtemp(prefix="tightrope-tokenizers-")
    os.environ[SHARED_CACHE] = tempfile.mkdtemp(prefix="tightrope-baselines-")
    os.environ[BASELINE_CACHE] = os.environ[SHARED_CACHE]
    fd, groups = tempfile.mkstemp(prefix="tightrope-test-groups-", suffix=".json")
    os.close(fd)
    os.environ[lanes.GROUPS_FILE_ENV] = groups


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the session when a process it started is still there (stopped ones too), after
    killing it: a trainer, monitor or torchrun left running is a bug of a test or of the
    harness's clean-up."""
    from harness.running.process_tree import _signal

    warm_start.close_all()
    if XDIST_WORKER in os.environ:
        return  # the controller checks, once every worker is done
    for name in (TOKENIZER_CACHE, SHARED_CACHE):
        cache = os.environ.pop(name, "")
        if cache:
            shutil.rmtree(cache, ignore_errors=True)
    os.environ.pop(BASELINE_CACHE, None)
    groups = os.environ.pop(lanes.GROUPS_FILE_ENV, "")
    if groups:
        Path(groups).unlink(missing_ok=True)
    mark = os.environ.get(SESSION_MARK)
    if not mark:
        return
    workers = session.config.pluginmanager.has_plugin("dsession")  # xdist's controller
    deadline = time.monotonic() + 5  # a process reaped a moment after its test is fine
    left = _carrying(SESSION_MARK, mark, spare_children=workers)
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = _carrying(SESSION_MARK, mark, spare_children=workers)
    if not left:
        return
    described = []
    for pid in left:
        try:
            described.append(f"{pid} {Path(f'/proc/{pid}/cmdline').read_bytes()[:150]!r}")
        except OSError:
            described.append(str(pid))
        _signal(pid, signal.SIGKILL)
    print(f"\ntightrope: processes left running by the tests (killed now): {described}")
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """Move every object to the collector's permanent generation as this process's last
    pytest step: the interpreter's collections at exit then skip them. A worker's heap at
    the end (700,000-800,000 objects after make check) took its exit 4-7 s of collecting,
    which the controller waited for (py-spy: ``gc_collect_main``); with this, under a
    second. Nothing is collected after it that a test could observe."""
    gc.freeze()


def _carrying(name: str, value: str, *, spare_children: bool) -> list[int]:
    """Live processes (zombies excluded) whose environment holds ``name=value``, other than
    this one and, with ``spare_children``, its direct children (xdist's workers: they run
    no trainer themselves, and end right after this check)."""
    needle = f"{name}={value}".encode()
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            fields = stat_fields(entry.name)
            if fields[STATE] == "Z" or (spare_children and int(fields[PPID]) == os.getpid()):
                continue
            if needle in Path(entry.path, "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except (OSError, IndexError):
            continue
    return found
