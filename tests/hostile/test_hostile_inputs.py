"""Every command against every hostile input it can be handed: deep nesting in YAML and
JSON, huge counts, negative and NaN numbers, empty files, FIFOs, links to ``/dev/zero``,
folders, bytes that are not UTF-8, files past the size limit, alias bombs.

Each is bad input, so each ends the same way: exit 2, exactly one line on stderr, and
nothing written anywhere. All of it runs in-process and trains nothing (the table guards
itself: a command that got as far as launching anything fails the test instead).
A journal is the exception by contract: its readers skip a line they cannot read, with
a warning, and go on (`test_journal_readers_skip_a_hostile_line`).
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from faults.input_limits import MAX_DEPTH
from faults.yaml_input import MAX_BYTES
from harness.commands.main import main as tightrope
from harness.live.control import ensure_secret
from reference_trainer.cli import main as trainer

DEEP = "[" * 500 + "]" * 500
NESTED_MAPPINGS = '{"a": ' * 500 + "1" + "}" * 500
BLOCK_YAML = "".join(f"{'  ' * i}a:\n" for i in range(300)) + "  " * 300 + "b: 1\n"
ALIAS_BOMB = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 10)}]\n" for i in range(6)
)


# -- hostile files ---------------------------------------------------------------------------


def _text(content: str | bytes) -> Callable[[Path], None]:
    def make(path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content.encode() if isinstance(content, str) else content)

    return make


def _fifo(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(path)


def _dev_zero(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to("/dev/zero")


def _folder(path: Path) -> None:
    path.mkdir(parents=True)


#: Hostile whatever the file is meant to hold.
ANY_FILE: dict[str, Callable[[Path], None]] = {
    "deep_lists": _text(DEEP),
    "deep_mappings": _text(NESTED_MAPPINGS),
    "fifo": _fifo,
    "link_to_dev_zero": _dev_zero,
    "folder": _folder,
    "not_utf8": _text(b"\xff\xfe\x00\x81"),
}
#: Hostile as YAML (block nesting, size, aliases; an empty file holds nothing).
YAML_FILE = {
    **ANY_FILE,
    "deep_block_yaml": _text(BLOCK_YAML),
    "past_size_limit": _text("#" * (MAX_BYTES + 1)),
    "alias_bomb": _text(ALIAS_BOMB),
    "empty": _text(""),
}


def _suite(fault: str) -> Callable[[Path], None]:
    """A suite of one scenario with ``fault`` (a YAML flow mapping)."""
    return _text(
        "scenarios: [{name: s, trainer: {steps: 20}, expect: {completed: true}, "
        "faults: [" + fault + "]}]"
    )


#: Hostile numbers, for each kind of YAML file.
SUITE_NUMBERS = {
    "huge_step": _suite("{kind: nan_grad, at_step: 1000000000000}"),
    "huge_rank": _suite("{kind: nan_grad, at_step: 3, ranks: [1000000000000]}"),
    "negative_step": _suite("{kind: nan_grad, at_step: -1}"),
    "nan_probability": _suite("{kind: nan_grad, probability: .nan}"),
    "huge_batch": _text(
        "scenarios: [{name: s, trainer: {steps: 20, batch_size: 1000000000}, "
        "expect: {completed: true}}]"
    ),
}
PLAN_NUMBERS = {
    "huge_step": _text("faults: [{kind: nan_grad, at_step: 1000000000000}]"),
    "huge_rank": _text("faults: [{kind: nan_grad, at_step: 3, ranks: [1000000000000]}]"),
    "negative_step": _text("faults: [{kind: nan_grad, at_step: -1}]"),
    "nan_probability": _text("faults: [{kind: nan_grad, probability: .nan}]"),
    "empty_target": _text("faults: [{kind: nan_grad, at_step: 3, target: ''}]"),
}
_SWEEP = "scenario: {trainer: {steps: 20, checkpoint_every: 5}, expect: {completed: true}}\n"
SWEEP_NUMBERS = {
    "huge_seed_count": _text(_SWEEP + "seeds: 1000000000000\n"),
    "negative_seed_count": _text(_SWEEP + "seeds: -1\n"),
    "nan_min_success": _text(_SWEEP + "min_success: .nan\n"),
    "huge_grid": _text(_SWEEP + f"grid: {{checkpoint_every: {list(range(1, 2001))}}}\nseeds: 10\n"),
}


@dataclass(frozen=True)
class Consumer:
    """A command that reads one file: where that file goes, and the command line."""

    name: str
    place: Callable[[Path], Path]  # the hostile file's path under the test's folder
    argv: Callable[[Path, Path], list[str]]  # (the folder, the file) -> the command line
    trainer: bool = False  # the reference trainer's CLI, not `tightrope`


def _file(name: str) -> Callable[[Path], Path]:
    return lambda root: root / name


SUITE_READERS = [
    Consumer("list", _file("suite.yaml"), lambda r, p: ["list", str(p)]),
    Consumer(
        "run", _file("suite.yaml"), lambda r, p: ["run", str(p), "--scorecard", str(r / "out")]
    ),
    Consumer("checklist", _file("suite.yaml"), lambda r, p: ["checklist", str(p)]),
]
PLAN_READERS = [
    Consumer(
        "exec --plan",
        _file("plan.yaml"),
        lambda r, p: ["exec", "--run-dir", str(r / "run"), "--plan", str(p), "--", "true"],
    ),
    Consumer(
        "reference_trainer --fault-plan",
        _file("plan.yaml"),
        lambda r, p: ["--run-dir", str(r / "run"), "--steps", "10", "--fault-plan", str(p)],
        trainer=True,
    ),
]
SWEEP_READERS = [
    Consumer("sweep", _file("sweep.yaml"), lambda r, p: ["sweep", str(p), "--out", str(r / "o")])
]
SCORECARD_READERS = [
    Consumer("report", _file("out/scorecard.json"), lambda r, p: ["report", str(p.parent)]),
    Consumer("compare", _file("a.json"), lambda r, p: ["compare", str(p), str(p)]),
]
JOURNAL = "run/journal/rank-0.jsonl"
JOURNAL_READERS = [
    Consumer("status", _file(JOURNAL), lambda r, p: ["status", str(r / "run")]),
    Consumer("summary", _file(JOURNAL), lambda r, p: ["summary", str(r / "run")]),
    Consumer("watch --once", _file(JOURNAL), lambda r, p: ["watch", str(r / "run"), "--once"]),
    Consumer(
        "export",
        _file(JOURNAL),
        lambda r, p: ["export", str(r / "run"), "--tensorboard", str(r / "tb")],
    ),
]
CONTROL_READERS = [
    Consumer(
        "inject", _file("run/control/secret"), lambda r, p: ["inject", str(r / "run"), "nan_grad"]
    ),
]
REVIEW_READERS = [
    Consumer(
        "review",
        _file("run/data/review-queue.jsonl"),
        lambda r, p: ["review", str(r / "run"), "--accept", "x"],
    ),
]

FILE_CASES = [
    *[(c, i, m) for c in SUITE_READERS for i, m in {**YAML_FILE, **SUITE_NUMBERS}.items()],
    *[(c, i, m) for c in PLAN_READERS for i, m in {**YAML_FILE, **PLAN_NUMBERS}.items()],
    *[(c, i, m) for c in SWEEP_READERS for i, m in {**YAML_FILE, **SWEEP_NUMBERS}.items()],
    *[(c, i, m) for c in SCORECARD_READERS for i, m in {**ANY_FILE, "empty": _text("")}.items()],
    *[
        (c, i, m)
        for c in [*JOURNAL_READERS, *CONTROL_READERS]
        for i, m in ANY_FILE.items()
        if i in ("fifo", "link_to_dev_zero", "folder")
    ],
    *[(c, i, m) for c in REVIEW_READERS for i, m in ANY_FILE.items()],
]

# -- hostile arguments -----------------------------------------------------------------------

ARG_CASES: list[tuple[str, list[str]]] = [
    ("no command", []),
    *[
        ("inject", ["inject", "{run}", "nan_grad", *extra])
        for extra in (
            ["--wait", "-1"],
            ["--wait", "nan"],
            ["--wait", "inf"],
            ["--rank", "1000000000000"],
            ["--rank", "-1"],
            ["--in-steps", "-1"],
            ["--in-steps", "1000000000000"],
            ["target="],
            ["target=" + "[" * (MAX_DEPTH + 10)],
            ["fraction=nan"],
        )
    ],
    ("watch", ["watch", "{run}", "--rank", "1000000000000"]),
    ("watch", ["watch", "{run}", "--interval", "nan"]),
    ("watch", ["watch", "{run}", "--interval", "-1"]),
    ("run", ["run", "{suite}", "--min-score", "nan"]),
    ("run", ["run", "{suite}", "--cores", "0"]),
    ("sweep", ["sweep", "{suite}", "--seeds", "0"]),
    ("exec", ["exec", "--run-dir", "{root}/x", "--timeout", "nan", "--", "true"]),
    ("exec", ["exec", "--run-dir", "{root}/x", "--timeout", "-1", "--", "true"]),
    ("soak", ["soak", "--minutes", "nan"]),
    ("soak", ["soak", "--steps", "-1"]),
    ("soak", ["soak", "--rate", "nan"]),
    ("soak", ["soak", "--minutes", "inf"]),
    ("soak", ["soak", "--steps", "1000000000000"]),
    ("soak", ["soak", "--world-size", "1000000000000"]),
    ("soak", ["soak", "--max-stall", "inf"]),
    ("summary", ["summary", "{root}/missing"]),
    ("status", ["status", "{root}/missing"]),
    ("review", ["review", "{root}/missing"]),
]
TRAINER_ARG_CASES: list[list[str]] = [
    ["--batch-size", "1000000000"],
    ["--steps", "1000000000000"],
    ["--grad-accum", "0"],
    ["--seed", "-1"],
    ["--lr", "nan"],
    ["--lr", "inf"],
    ["--beta2", "nan"],
    ["--keep-checkpoints", "1000000000000"],
]


# -- the checks ------------------------------------------------------------------------------


def snapshot(root: Path) -> dict[str, str]:
    """Every entry under ``root``: a regular file with a hash of its bytes, else its type."""
    out = {}
    for path in sorted(root.rglob("*")):
        name = str(path.relative_to(root))
        if path.is_symlink():
            out[name] = "link -> " + os.readlink(path)
        elif path.is_file():
            out[name] = hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            out[name] = "folder" if path.is_dir() else "special"
    return out


@pytest.fixture(autouse=True)
def nothing_launches(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """Bad input never gets as far as training or launching: anything that does fails."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("hostile input got as far as launching something")

    import harness.running.exec
    import harness.running.runner
    import harness.sweeps.run_sweep
    import reference_trainer.train

    monkeypatch.setattr(harness.running.exec.os, "execvpe", refuse)
    monkeypatch.setattr(harness.running.exec.subprocess, "Popen", refuse)
    monkeypatch.setattr(harness.running.runner, "run_suite", refuse)
    monkeypatch.setattr(harness.sweeps.run_sweep, "run_sweep", refuse)
    monkeypatch.setattr(reference_trainer.train, "train", refuse)
    monkeypatch.chdir(tmp_path)  # where a default output folder would be made
    yield


def call(command: Callable[[list[str]], int], argv: list[str], seconds: float = 30) -> int:
    """The exit code of ``command(argv)``; the test fails (rather than hangs) when the
    command blocks past ``seconds``, as a read of a FIFO would."""
    codes: list[int] = []
    errors: list[BaseException] = []

    def work() -> None:
        try:
            codes.append(command(argv))
        except SystemExit as exc:
            codes.append(exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1)
        except BaseException as exc:
            errors.append(exc)

    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), f"{argv} still running after {seconds} s (blocked?)"
    if errors:
        raise errors[0]
    return codes[0]


def assert_refused(code: int, capsys: pytest.CaptureFixture[str]) -> str:
    """Exit 2 with exactly one line on stderr, naming the error; that line."""
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert code == 2, err
    assert len(lines) == 1, err
    assert lines[0].startswith(("tightrope", "reference_trainer")), lines[0]
    assert ": error: " in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize(
    ("consumer", "hostile", "make"),
    FILE_CASES,
    ids=[f"{c.name}-{i}" for c, i, _ in FILE_CASES],
)
def test_hostile_file(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    consumer: Consumer,
    hostile: str,
    make: Callable[[Path], None],
) -> None:
    root = tmp_path
    if consumer in [*JOURNAL_READERS, *CONTROL_READERS, *REVIEW_READERS]:
        (root / "run" / "journal").mkdir(parents=True)
        (root / "run" / "config.json").write_text("{}")
    if consumer in CONTROL_READERS:
        ensure_secret(root / "run")
        (root / "run" / "control" / "secret").unlink()
    path = consumer.place(root)
    make(path)
    before = snapshot(root)
    code = call(trainer if consumer.trainer else tightrope, consumer.argv(root, path))
    assert_refused(code, capsys)
    assert snapshot(root) == before, "bad input wrote something"


@pytest.mark.parametrize(("command", "argv"), ARG_CASES, ids=[c for c, _ in ARG_CASES])
def test_hostile_argument(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, argv: list[str]
) -> None:
    run = tmp_path / "run"
    ensure_secret(run)
    (tmp_path / "suite.yaml").write_text("scenarios: [{name: s, expect: {completed: true}}]")
    names = {"run": str(run), "root": str(tmp_path), "suite": str(tmp_path / "suite.yaml")}
    before = snapshot(tmp_path)
    code = call(tightrope, [a.format(**names) for a in argv])
    assert_refused(code, capsys)
    assert snapshot(tmp_path) == before, "bad input wrote something"


@pytest.mark.parametrize("argv", TRAINER_ARG_CASES, ids=[" ".join(a) for a in TRAINER_ARG_CASES])
def test_hostile_trainer_argument(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    code = call(trainer, [*argv, "--run-dir", str(tmp_path / "run")])
    assert_refused(code, capsys)
    assert not list(tmp_path.iterdir()), "bad input wrote something"


def _journal_line(**fields: Any) -> str:
    common = {"v": 1, "wall": time.time(), "mono": 1.0, "rank": 0, "restart": 0, "step": 0}
    return json.dumps({**common, **fields})


@pytest.mark.parametrize(
    "argv",
    [["status"], ["summary"], ["watch", "--once"], ["checklist"], ["export", "--tensorboard"]],
    ids=lambda a: a[0],
)
def test_journal_readers_skip_a_hostile_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    pytest.importorskip("tensorboard") if argv[0] == "export" else None
    run = tmp_path / "run"
    (run / "journal").mkdir(parents=True)
    deep = _journal_line(kind="step", step=1)[:-1] + ', "x": ' + "[" * 10**5 + "]" * 10**5 + "}"
    lines = [_journal_line(kind="run_start"), deep, _journal_line(kind="run_start")]
    (run / "journal" / "rank-0.jsonl").write_text("\n".join(lines) + "\n")
    command = [argv[0], str(run), *argv[1:]]
    if argv[0] == "export":
        command.append(str(tmp_path / "tb"))
    code = call(tightrope, command)
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "Traceback" not in out.err + out.out
