"""The truth a checkpoint fuzzer judges against: two pristine runs trained by the reference
trainer's CLI, the digest of what loads from each of their checkpoints, which checkpoints
of a damaged copy are still valid (byte-identical to the pristine run's under their own
names, their delta parent with them), and running one resume in a forked child with a
timeout. `tests.checkpoint_fuzzer` damages copies and judges against it."""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import re
import subprocess
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from harness.errors import TightropeError
from harness.run_layout import RunLayout
from harness.running import warm_start
from reference_trainer.checkpoints.files import load_rng
from reference_trainer.checkpoints.manager import CheckpointConfig, CheckpointManager
from reference_trainer.checkpoints.run_dir import check_resumable

ROOT = Path(__file__).resolve().parent.parent
STEPS, EVERY = 12, 2
Status = Literal["ok", "refused", "traceback", "hang"]
#: Longest message kept (a loader may quote a 64 MiB ``latest`` in its error).
MESSAGE_LIMIT = 500
_STEP = re.compile(r"step-(\d{8})")


class FuzzerError(Exception):
    """The fuzzer itself cannot go on (the pristine run failed to build or to load)."""


@dataclass(frozen=True, slots=True)
class Resume:
    """What a resume of a run dir settled on."""

    pick: str | None
    """``check_resumable``'s answer; None: the run starts over from step 0."""
    path: str | None = None
    """The checkpoint ``load_valid`` loaded (None when it was not asked)."""
    digest: str | None = None
    """`content_digest` of what it loaded."""


Loader = Callable[[Path], Resume]


def content_digest(path: Path, state: Any) -> str:
    """SHA-256 of a loaded state with the rank-0 RNG states the trainer would restore."""
    h = hashlib.sha256()
    _feed(h, {"state": state, "rng": load_rng(path, 0)})
    return h.hexdigest()


def _feed(h: Any, value: Any) -> None:
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous()
        h.update(f"T{t.dtype}{tuple(t.shape)}:".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    elif isinstance(value, dict):
        h.update(b"{")
        for key in sorted(value, key=repr):
            h.update(repr(key).encode() + b":")
            _feed(h, value[key])
        h.update(b"}")
    elif isinstance(value, (list, tuple)):
        h.update(b"[" if isinstance(value, list) else b"(")
        for item in value:
            _feed(h, item)
        h.update(b"]")
    else:
        h.update(repr(value).encode() + b";")


def checkpoint_manager(run_dir: Path, config: CheckpointConfig | None = None) -> CheckpointManager:
    """Rank 0's manager of a run's checkpoints, alone (no barrier, nothing journaled)."""
    return CheckpointManager(
        run_dir,
        config or CheckpointConfig(),
        rank=0,
        keep=1000,
        barrier=lambda: None,
        claim=lambda kind, **fields: None,
    )


def trainer_resume(run_dir: Path) -> Resume:
    """Resume as the trainer does: ``check_resumable``, then ``load_valid``."""
    pick = check_resumable(run_dir)
    if pick is None:
        return Resume(None)
    path, state = checkpoint_manager(run_dir).load_valid()
    return Resume(str(pick), str(path), content_digest(path, state))


# -- running one call in a forked child ----------------------------------------------------


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a call in a child ended: ``ok`` (with its value), ``refused``, ``traceback``
    or ``hang``."""

    status: Status
    value: Any = None
    message: str = ""


def in_child(call: Callable[[], Any], timeout: float) -> Outcome:
    """Run ``call`` in a forked child; a `TightropeError` is a refusal, anything else
    raised (or a crash) a traceback, no answer within ``timeout`` seconds a hang."""
    ctx = multiprocessing.get_context("fork")
    reader, writer = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_child_main, args=(call, writer), daemon=True)
    child.start()
    writer.close()
    try:
        if not reader.poll(timeout):
            child.kill()
            return Outcome("hang", message=f"no answer within {timeout:g} s")
        try:
            status, value, message = reader.recv()
        except EOFError:
            child.join()
            return Outcome("traceback", message=f"the child died (exit code {child.exitcode})")
        return Outcome(status, value, message)
    finally:
        child.join()
        reader.close()


def _child_main(call: Callable[[], Any], writer: Any) -> None:
    try:
        answer: tuple[Status, Any, str] = ("ok", call(), "")
    except TightropeError as exc:
        answer = ("refused", None, f"{type(exc).__name__}: {str(exc)[:MESSAGE_LIMIT]}")
    except BaseException as exc:  # the finding itself: report it, whatever it is
        where = traceback.extract_tb(exc.__traceback__)[-1]
        answer = (
            "traceback",
            None,
            f"{type(exc).__name__}: {str(exc)[:MESSAGE_LIMIT]} (at {where.name}:{where.lineno})",
        )
    writer.send(answer)
    writer.close()


# -- the pristine runs and their truth -----------------------------------------------------


@dataclass(frozen=True, slots=True)
class Pristine:
    """The two runs every case is copied from, and what loads from each checkpoint."""

    run: Path
    other: Path
    truth: dict[str, str]
    """Step name -> `content_digest` of this run's checkpoint."""
    other_truth: dict[str, str]
    files: dict[str, dict[str, str]]
    """Step name -> file name -> SHA-256, this run."""
    parents: dict[str, str | None]

    def describe(self, digest: str | None) -> str:
        """Whose content a digest is, in words."""
        for label, table in (("this run's", self.truth), ("the other run's", self.other_truth)):
            for name, known in table.items():
                if known == digest:
                    return f"{label} {name}"
        return "no checkpoint's of either run"


def trainer_env() -> dict[str, str]:
    """The environment a trainer child gets: one thread, this checkout, a single rank."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHELASTIC_", "RANK"))}
    for name in ("WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    return dict(env, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))


def build_pristine(base: Path, timeout: float = 600) -> Pristine:
    """Train the two pristine runs side by side and record their truth."""
    runs = {"run": (base / "run", 0), "other": (base / "other", 1)}
    procs = {}
    for key, (run_dir, seed) in runs.items():
        argv = [sys.executable, "-m", "reference_trainer", "--run-dir", str(run_dir)]
        argv += ["--steps", str(STEPS), "--checkpoint-every", str(EVERY), "--seed", str(seed)]
        argv += ["--keep-checkpoints", "100", "--log-every", "1000"]
        env = trainer_env()  # forked warm when the test session is (tests/conftest.py)
        procs[key] = subprocess.Popen(
            warm_start.warm(argv, env),
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
    for key, proc in procs.items():
        try:
            _, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise FuzzerError(f"training the pristine {key} took over {timeout:g} s") from None
        if proc.returncode != 0:
            tail = err.decode(errors="replace").strip().splitlines()[-3:]
            raise FuzzerError(f"training the pristine {key} exited {proc.returncode}: {tail}")
    run, other = runs["run"][0], runs["other"][0]
    files = tree_digests(run)
    parents = {}
    for name in files:
        manifest = json.loads((RunLayout(run).checkpoints / name / "manifest.json").read_text())
        parents[name] = manifest.get("parent")
    return Pristine(run, other, _truth(run), _truth(other), files, parents)


def _truth(run_dir: Path) -> dict[str, str]:
    """Digest of every checkpoint, each loaded with the loader under test."""
    truth = {}
    manager = checkpoint_manager(run_dir)
    for name in sorted(tree_digests(run_dir)):
        path, state = manager.load_valid(at_most_step=int(name.removeprefix("step-")))
        if path.name != name:
            raise FuzzerError(f"the pristine {name} does not load (the loader took {path})")
        truth[name] = content_digest(path, state)
    return truth


def tree_digests(run_dir: Path) -> dict[str, dict[str, str]]:
    """Step name -> file name -> SHA-256, for every real step directory of a run."""
    root = RunLayout(run_dir).checkpoints
    found: dict[str, dict[str, str]] = {}
    for name in sorted(os.listdir(root)):
        folder = root / name
        if _STEP.fullmatch(name) and folder.is_dir() and not folder.is_symlink():
            found[name] = {f: _sha256(folder / f) for f in sorted(os.listdir(folder))}
    return found


def _sha256(path: Path) -> str:
    if path.is_symlink() or not path.is_file():
        return "not a regular file"
    return hashlib.sha256(path.read_bytes()).hexdigest()


def valid_checkpoints(run_dir: Path, pristine: Pristine) -> set[str]:
    """Checkpoints that, with their whole parent chain, are byte-identical to the
    pristine run's under their own names (a real directory, nothing added or missing)."""
    intact = set()
    for name, expected in pristine.files.items():
        folder = RunLayout(run_dir).checkpoints / name
        if folder.is_symlink() or not folder.is_dir():
            continue
        names = sorted(os.listdir(folder))
        if names == sorted(expected) and all(_sha256(folder / f) == expected[f] for f in names):
            intact.add(name)
    valid = set()
    for name in intact:
        chain: str | None = name
        while chain is not None and chain in intact:
            chain = pristine.parents[chain]
        if chain is None:
            valid.add(name)
    return valid
