"""Warm starts (harness/running/warm_start.py): the reference trainer's processes forked
from an interpreter that imported torch once leave what fresh processes leave, stand for
their child to whoever started them (signals in, exit status out), and never outlive it.

make test starts the suites' trainer processes warm (tests/conftest.py); these tests are
what makes that a faithful shortcut."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from faults.proc_stat import state as proc_state
from harness.errors import JournalError
from harness.inside import warm_server
from harness.inside.exec_env import BOOTSTRAP_DIR
from harness.inside.warm_client import SOCKET_ENV
from harness.records.journal import read_journal
from harness.running import warm_command, warm_start
from harness.running.launch import run_process
from harness.running.process_tree import descendants
from reference_trainer.processes.preemption import EXIT_PREEMPTED

from .test_trainer import assert_same_tensors, final_state

pytestmark = pytest.mark.slow

TINY = ["--preset", "tiny", "--steps", "6", "--checkpoint-every", "3", "--log-every", "1000"]
#: Without a PYTHONPATH of the caller's: then a launch's server is the bare one, which serves
#: its programs itself, not one forked from it for that PYTHONPATH (the tests count servers).
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
ENV |= {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def _one(run_dir: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "reference_trainer", "--run-dir", str(run_dir), *TINY, *extra]


def _two(run_dir: Path, *extra: str) -> list[str]:
    head = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    head += ["--nproc-per-node", "2", "--max-restarts", "0"]
    return [*head, "-m", "reference_trainer", "--run-dir", str(run_dir), *TINY, *extra]


@pytest.fixture
def warm() -> Iterator[None]:
    """Warm starts on for the test, and as the session had them after."""
    was = warm_start.enabled()
    warm_start.enable()
    yield
    if not was:
        warm_start.close_all()


@pytest.fixture
def own_servers(warm: None, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Warm starts from servers of the test's own, ended after it: the servers the session's
    other tests use are neither counted nor ended (each costs a start of torch anew)."""
    monkeypatch.setattr(warm_start, "_servers", {})
    yield
    for server in list(warm_start._servers.values()):
        server.close()


@pytest.fixture(scope="module")
def module_bare() -> Iterator[dict[Any, Any]]:
    """The bare server of `ENV` (its registry entry), started once for this module's tests
    that fork servers of their own from it (`forked_servers`), ended after them."""
    registry: dict[Any, Any] = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(warm_start, "_servers", registry)
        patch.setattr(warm_start, "_enabled", True)
        assert warm_start._server_for(dict(ENV)) is not None
    yield dict(registry)
    for server in registry.values():
        server.close()


@pytest.fixture
def forked_servers(
    warm: None, module_bare: dict[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    """As `own_servers`, but with the module's bare server in place (it only ever forks
    servers, which `warm_start.forked` leaves out): what the test starts is forked from it,
    and ended after the test, the bare one kept."""
    monkeypatch.setattr(warm_start, "_servers", dict(module_bare))
    yield
    for key, server in list(warm_start._servers.items()):
        if key not in module_bare:
            server.close()


def _run(argv: list[str], log: Path) -> None:
    launch = run_process(argv, log=log, deadline=time.monotonic() + 240, env=dict(ENV))
    assert launch.exit_code == 0 and launch.left_behind == 0, log.read_text()[-3000:]


def _same_run(a: Path, b: Path, ranks: int) -> None:
    ja, jb = read_journal(a), read_journal(b)
    assert ja.ranks == jb.ranks == list(range(ranks))
    for rank in range(ranks):
        assert ja.losses(rank) == jb.losses(rank) and len(ja.losses(rank)) == 6
    assert_same_tensors(final_state(a), final_state(b))


def test_a_launch_is_timed_from_its_start_not_from_its_servers(
    tmp_path: Path, own_servers: None
) -> None:
    """The first launch of an environment starts its server (which imports torch) before the
    program starts: that is not the launch's time, which ETTR and recovery times divide by
    (a fault-free run made first would otherwise look slower than the faulted one after)."""
    script = tmp_path / "quick.py"
    script.write_text("pass\n")
    env = dict(ENV)
    before = time.monotonic()
    launch = run_process([sys.executable, str(script), "-"], log=tmp_path / "log",
                         deadline=before + 120, env=env)  # fmt: skip
    took = time.monotonic() - before
    assert launch.exit_code == 0, (tmp_path / "log").read_text()
    assert len(warm_start.server_pids()) == 1  # started for it, and it was forked
    assert launch.seconds < took - 0.5, (launch.seconds, took)


@pytest.mark.distributed
@pytest.mark.parametrize(("command", "ranks"), [(_one, 1), (_two, 2)], ids=["one", "torchrun"])
def test_a_warm_run_leaves_what_a_fresh_one_leaves(
    command: Callable[..., list[str]], ranks: int, tmp_path: Path, warm: None
) -> None:
    before = set(warm_start.forked())
    with warm_start.paused():
        _run(command(tmp_path / "fresh"), tmp_path / "fresh.log")
    assert set(warm_start.forked()) <= before
    _run(command(tmp_path / "warm"), tmp_path / "warm.log")
    # Every rank was forked, none started afresh, and so was torchrun's agent.
    assert len(set(warm_start.forked()) - before) == ranks + (command is _two)
    _same_run(tmp_path / "fresh", tmp_path / "warm", ranks)
    # Negative control: the comparison sees a run that differs (another seed).
    _run(command(tmp_path / "other", "--seed", "1"), tmp_path / "other.log")
    with pytest.raises(AssertionError):
        _same_run(tmp_path / "fresh", tmp_path / "other", ranks)


def _start(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    env = dict(ENV)
    warm_argv = warm_start.warm(argv, env)
    assert warm_argv != argv
    with open(log, "ab") as out:
        return subprocess.Popen(warm_argv, env=env, stdout=out, stderr=subprocess.STDOUT)


def _wait_for(condition: Callable[[], bool], what: str, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def _steps(run_dir: Path) -> int:
    """Steps rank 0 journaled so far (0 before its journal exists)."""
    try:
        return len(read_journal(run_dir, warn=False).losses(0))
    except JournalError:
        return 0


def _alive(pid: int) -> bool:
    try:
        return proc_state(pid) != "Z"
    except OSError:
        return False


def test_a_signal_reaches_the_child_and_its_exit_comes_back(tmp_path: Path, warm: None) -> None:
    """SIGTERM to the client is the trainer's preemption notice: it saves and exits with
    the preempted code, which the client exits with, as the fresh process does."""
    codes = {}
    for name in ("fresh", "warm"):
        run_dir = tmp_path / name
        argv = _one(run_dir, "--steps", "100000")
        if name == "fresh":
            proc = subprocess.Popen(argv, env=dict(ENV), stdout=subprocess.DEVNULL)
        else:
            proc = _start(argv, tmp_path / "warm.log")
        try:
            _wait_for(lambda d=run_dir: _steps(d) >= 2, "two steps")
            proc.send_signal(signal.SIGTERM)
            codes[name] = proc.wait(timeout=120)
        finally:
            proc.kill()
        assert final_state(run_dir)  # the preempted run saved
    assert codes == {"fresh": EXIT_PREEMPTED, "warm": EXIT_PREEMPTED}


#: A program that leaves a trace of each thing an interpreter's end does for it: a thread
#: waited for, an atexit function, a ``weakref.finalize`` of its own (the server's are not
#: called), the ``__del__`` of objects of ``__main__`` and of a module of its own, a file it
#: never closed (flushed), C's buffered output; then it ends as ``argv[2]`` says.
ENDING = """\
import atexit, ctypes, sys, threading, time, weakref
import helper

trace = sys.argv[1]
def note(what, open=open):  # (an interpreter's end takes open from the builtins first)
    with open(trace, "a") as f:
        f.write(what + "\\n")

class Noted:
    def __del__(self):
        note("del main")

kept = Noted()
class Box:
    pass
box = Box()
weakref.finalize(box, note, "finalize")
left_open = open(trace + ".unclosed", "w")
left_open.write("buffered")
atexit.register(note, "atexit")
threading.Thread(target=lambda: (time.sleep(0.3), note("thread"))).start()
ctypes.CDLL(None).printf(b"from C")
how = sys.argv[2]
if how == "raise":
    raise ValueError("raised")
if how == "interrupt":
    raise KeyboardInterrupt
sys.exit(3 if how == "code" else "said on the way out")
"""
HELPER = """\
import sys
class Noted:
    def __del__(self, open=open, trace=sys.argv[1]):  # (and sets sys.argv to None)
        with open(trace, "a") as f:
            f.write("del helper\\n")
kept = Noted()
"""


def test_a_forked_program_ends_as_a_fresh_one_does(tmp_path: Path, warm: None) -> None:
    """A forked program does not take apart the modules it was forked with, but what its
    end shows is a fresh end's: its threads waited for, its atexit functions and
    finalizers, the objects of its own modules finalized, its files and C's output flushed,
    and the same exit status (a message, a traceback, a code, Ctrl-C)."""
    (tmp_path / "ending.py").write_text(ENDING)
    (tmp_path / "helper.py").write_text(HELPER)
    for how, status in [("code", 3), ("say", 1), ("raise", 1), ("interrupt", -signal.SIGINT)]:
        ends = {}
        for name in ("fresh", "warm"):
            trace = tmp_path / f"{how}-{name}"
            argv = [sys.executable, str(tmp_path / "ending.py"), str(trace), how]
            env = dict(ENV)
            started = warm_start.warm(argv, env) if name == "warm" else argv
            assert (started != argv) == (name == "warm")
            done = subprocess.run(started, env=env, capture_output=True, text=True, timeout=60)
            said = done.stderr.strip().splitlines()[-1:] if done.stderr else []
            lines = sorted(trace.read_text().splitlines())
            ends[name] = (done.returncode, done.stdout, said, lines)
            assert (tmp_path / f"{how}-{name}.unclosed").read_text() == "buffered"
        assert ends["warm"] == ends["fresh"], how
        assert ends["fresh"][0] == status
        assert ends["fresh"][1] == "from C"
        assert ends["fresh"][3] == ["atexit", "del helper", "del main", "finalize", "thread"]


def test_a_killed_client_takes_its_child_with_it(tmp_path: Path, warm: None) -> None:
    before = set(warm_start.forked())
    run_dir = tmp_path / "run"
    proc = _start(_one(run_dir, "--steps", "100000"), tmp_path / "log")
    try:
        _wait_for(lambda: _steps(run_dir) >= 1, "a step")
        (child,) = set(warm_start.forked()) - before
        assert _alive(child)
    finally:
        proc.kill()  # as a watchdog or torchrun's shutdown kills a worker
    assert proc.wait(timeout=30) == -signal.SIGKILL
    _wait_for(lambda: not _alive(child), "the child to end with its client", 10)


def test_a_refused_request_starts_afresh(tmp_path: Path, warm: None) -> None:
    """A client whose environment differs from its server's in what may be read at import
    (here a variable of its own) runs the program itself, and right."""
    env = dict(ENV)
    warm_argv = warm_start.warm(_one(tmp_path / "warm"), env)
    before = warm_start.forked()
    log = tmp_path / "log"
    with open(log, "ab") as out:
        code = subprocess.call(
            warm_argv, env={**env, "SOMETHING_ELSE": "1"}, stdout=out, stderr=out
        )
    assert code == 0, log.read_text()[-3000:]
    assert warm_start.forked() == before
    assert len(read_journal(tmp_path / "warm").losses(0)) == 6
    # An interpreter option the server cannot honour in a fork: refused, run afresh too.
    optioned = [sys.executable, "-X", "utf8", *_one(tmp_path / "optioned")[1:]]
    client = [*warm_argv[: warm_argv.index(sys.executable, 1)], *optioned]
    with open(log, "ab") as out:
        code = subprocess.call(client, env=env, stdout=out, stderr=out)
    assert code == 0 and warm_start.forked() == before, log.read_text()[-3000:]
    assert len(read_journal(tmp_path / "optioned").losses(0)) == 6
    # Negative control: the same client with the server's own environment is forked.
    with open(log, "ab") as out:
        code = subprocess.call(
            warm_start.warm(_one(tmp_path / "again"), env), env=env, stdout=out, stderr=out
        )
    assert code == 0 and len(warm_start.forked()) == len(before) + 1
    assert SOCKET_ENV in env


#: What a program sees of its interpreter's start: its path, and the sitecustomize it ran.
#: What a program sees of its interpreter's start: its arguments, its path, the
#: sitecustomize it ran, how its main module was loaded.
PROBE = (
    "import sys; print(sys.argv, sys.path); "
    "print(getattr(sys.modules.get('sitecustomize'), '__file__', 0), type(__loader__))"
)


@pytest.mark.parametrize(
    "pythonpath",
    ["{root}", "{bootstrap}:{root}", "rel::{root}:{root}"],
    ids=["checkout", "bootstrap", "relative-empty-twice"],
)
def test_a_server_of_another_pythonpath_is_forked_from_the_bare_one(
    pythonpath: str, tmp_path: Path, forked_servers: None
) -> None:
    """A server whose environment differs from the bare one's in PYTHONPATH only is forked
    from it, as a ``python -c`` program (not started anew: torch is not imported again),
    and a script or a ``-c`` program it forks sees the arguments, path and sitecustomize
    a fresh interpreter with that PYTHONPATH sees."""
    root = str(Path(__file__).resolve().parents[1])
    env = {**ENV, "PYTHONPATH": pythonpath.format(root=root, bootstrap=BOOTSTRAP_DIR)}
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE + "\n")
    server = warm_start._server_for(env)  # (`warm` leaves an attached one to exec)
    assert server is not None and server.base is not None
    assert f"forked {server.pid}: -c " in (Path(server.base.folder) / "server.log").read_text()
    assert server.pid in descendants(server.base.pid)
    for argv in ([sys.executable, str(probe), "a"], [sys.executable, "-c", PROBE, "a"]):
        fresh = subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
        warm_argv = warm_start._client(argv, server.address)
        warm = subprocess.run(warm_argv, env=env, capture_output=True, text=True, check=True)
        assert warm.stdout == fresh.stdout
        assert ("_bootstrap" in fresh.stdout.splitlines()[1]) is ("bootstrap" in pythonpath)
    assert len(warm_start.forked()) == 2  # the probes, from the forked server


def test_a_server_asked_of_a_server_that_cannot_fork_it_starts_afresh(
    tmp_path: Path, forked_servers: None
) -> None:
    """Only the bare server serves another PYTHONPATH: a server asked of another (here the
    attached one) is started afresh by its client, and serves as well."""
    attached = warm_start._server_for({**ENV, "PYTHONPATH": str(BOOTSTRAP_DIR)})
    assert attached is not None and attached.base is not None
    server = warm_start._Server({**ENV, "PYTHONPATH": str(tmp_path)}, (), base=attached)
    try:
        assert server.ready and server.pid == server.proc.pid  # the client became it
        log = (Path(attached.folder) / "server.log").read_text()
        assert "refused: another environment: PYTHONPATH" in log
    finally:
        server.close()


def test_a_path_that_would_shadow_an_imported_module_is_refused(tmp_path: Path) -> None:
    """A folder new on the path (on PYTHONPATH, or the script's or ``-m``'s working folder,
    first on a fresh start's path) that holds a module the server imported from elsewhere
    (here ``json``; or a copy of this checkout's ``harness``) would give a fresh interpreter
    another module: not served. The checkout itself, where ``harness`` was imported from,
    shadows nothing."""
    (tmp_path / "json.py").write_text("")
    root = str(Path(__file__).resolve().parents[1])
    assert warm_server._shadowed([str(tmp_path)]) == "json"
    assert warm_server._shadowed([root, str(BOOTSTRAP_DIR)]) is None
    bare = warm_server.static({k: v for k, v in ENV.items() if k != "PYTHONPATH"})
    env = {**ENV, "PYTHONPATH": f"{BOOTSTRAP_DIR}:{tmp_path.name}"}
    request = {"argv": [sys.executable, "-c", "pass"], "cwd": str(tmp_path.parent), "env": env}
    reason = "its path holds json, imported here from elsewhere"
    assert warm_server._refusal(request, bare, True, bare=True) == reason
    # Not the bare server: another PYTHONPATH is another environment.
    assert "another environment: PYTHONPATH" in str(warm_server._refusal(request, bare, True))
    # Negative control: the same request with a folder that shadows nothing is served.
    request["env"] = {**ENV, "PYTHONPATH": f"{BOOTSTRAP_DIR}:{root}"}
    assert warm_server._refusal(request, bare, True, bare=True) is None
    # Where the program starts: a script beside json.py, -m in its folder, or in a copy
    # of the checkout (its harness, not the one imported here).
    plain = {k: v for k, v in ENV.items() if k != "PYTHONPATH"}
    copy = tmp_path / "copy"
    (copy / "harness").mkdir(parents=True)
    (copy / "harness" / "__init__.py").write_text("")
    for argv, cwd, clash in [
        ([sys.executable, str(tmp_path / "train.py")], root, "json"),
        ([sys.executable, "-m", "train"], str(tmp_path), "json"),
        ([sys.executable, "-m", "harness", "--help"], str(copy), "harness"),
    ]:
        request = {"argv": argv, "cwd": cwd, "env": plain}
        said = f"its path holds {clash}, imported here from elsewhere"
        assert warm_server._refusal(request, bare, True, bare=True) == said, argv
    request = {"argv": [sys.executable, "-m", "harness", "--help"], "cwd": root, "env": plain}
    assert warm_server._refusal(request, bare, True, bare=True) is None


TESTS = Path(__file__).parent
FINAL = "final.safetensors"
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--max-restarts", "0"]


def _inplace(run_dir: Path, *extra: str) -> list[str]:
    """A foreign one-process trainer (torch only)."""
    script = str(TESTS / "trainers" / "inplace_ckpt.py")
    return [sys.executable, script, "--out", str(run_dir / "ckpt"), "--steps", "6", *extra]


def _lightning(run_dir: Path, *extra: str) -> list[str]:
    """Lightning under torchrun, one worker: forked from a server that imported Lightning.
    Its checkpoints hold their folder's path, so its final weights are what is compared."""
    script = str(TESTS / "frameworks" / "lightning_trainer.py")
    user = [script, "--out", str(run_dir / "out"), "--steps", "6", "--save-every", "3"]
    user += ["--final-weights", str(run_dir / FINAL), *extra]
    return [*TORCHRUN, "--nproc-per-node", "1", *user]


def _ddp(run_dir: Path, *extra: str) -> list[str]:
    """A foreign DDP trainer on two ranks under torchrun: a script's job of several."""
    script = str(TESTS / "trainers" / "ddp_snapshot.py")
    user = [script, "--steps", "6", "--batches-per-epoch", "3", "--save-every", "1"]
    user += ["--snapshot", str(run_dir / "snapshot.pt"), *extra]
    return [*TORCHRUN, "--nproc-per-node", "2", *user]


def _exec(user: list[str], run_dir: Path) -> list[str]:
    """``user`` through ``tightrope exec`` (the agent attached)."""
    return [sys.executable, "-m", "harness", "exec", "--run-dir", str(run_dir), "--", *user]


def _observed(run_dir: Path) -> tuple[dict[int, list[float]], list[object]]:
    """What the agent saw: each rank's losses and each save's file and bytes (where the
    program writes its final weights apart: each save's file, and those weights' bytes)."""
    journal = read_journal(run_dir)
    final = run_dir / FINAL
    saves = [
        (Path(e["path"]).name, "" if final.exists() else e["sha256"])
        for e in journal.of_kind("file_saved")
    ]
    if final.exists():
        saves.append((FINAL, hashlib.sha256(final.read_bytes()).hexdigest()))
    return {rank: journal.losses(rank) for rank in journal.ranks}, sorted(saves)


@pytest.mark.parametrize(
    ("command", "preload", "ranks"),
    [
        pytest.param(_inplace, (), 1, id="one-process"),
        pytest.param(_lightning, ("lightning",), 1, id="lightning"),
        pytest.param(_ddp, (), 2, id="two-ranks", marks=pytest.mark.distributed),
    ],
)
def test_a_program_run_by_exec_is_attached_and_observed_as_fresh(
    command: Callable[..., list[str]],
    preload: tuple[str, ...],
    ranks: int,
    tmp_path: Path,
    warm: None,
) -> None:
    assert set(preload) <= {n.split(":")[0] for n in warm_command.preload_of(command(tmp_path))}
    before = set(warm_start.forked())
    with warm_start.paused():
        _run(_exec(command(tmp_path / "fresh"), tmp_path / "fresh"), tmp_path / "fresh.log")
    _run(_exec(command(tmp_path / "warm"), tmp_path / "warm"), tmp_path / "warm.log")
    # Exec itself, then each process of the program it runs, and torchrun's agent (from
    # the server that preloaded nothing where the worker's preloaded Lightning).
    assert len(set(warm_start.forked()) - before) == 1 + ranks + (command is not _inplace)
    fresh, warm_run = _observed(tmp_path / "fresh"), _observed(tmp_path / "warm")
    # The agent saw every step of every rank, and the saves.
    assert sorted(fresh[0]) == list(range(ranks)) and fresh[1], fresh
    assert all(len(losses) == 6 for losses in fresh[0].values()), fresh
    assert warm_run == fresh
    if command is _inplace:  # Negative control: another seed is seen to differ.
        other = _exec(command(tmp_path / "other", "--seed", "1"), tmp_path / "other")
        _run(other, tmp_path / "other.log")
        assert _observed(tmp_path / "other") != fresh


def test_a_server_preloads_only_what_a_script_installs(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        "from __future__ import annotations\nimport json, torch\nimport yaml\n"
        "from torch import nn\nfrom pydantic import BaseModel\nfrom helpers import x\n"
        "def main():\n    import numpy\n"
    )
    one = [sys.executable, str(script)]
    # Installed (yaml, pydantic's name); not the standard library's, torch (every server
    # imports it), the program's own, nor an import inside a function.
    assert warm_command.preload_of(one) == ("yaml", "pydantic:BaseModel")
    for processes in ("1", "2"):  # (a job of several: see the test below)
        torchrun = [*TORCHRUN, "--nproc-per-node", processes, str(script)]
        assert warm_command.preload_of(torchrun) == ("yaml", "pydantic:BaseModel")
    assert warm_command.preload_of([sys.executable, "-X", "dev", str(script)]) == ()


def test_which_torchrun_jobs_are_forked() -> None:
    """A torchrun job is forked when it runs a module or one process; under exec, when it
    runs a script or one process (see warm_start.rewrite and warm_exec)."""
    one = [*TORCHRUN, "--nproc-per-node", "1", "train.py", "--steps", "3"]
    two = [*one[:-4], "2", *one[-3:]]
    module = [*TORCHRUN, "--nproc-per-node", "2", "-m", "reference_trainer", "--steps", "3"]
    assert warm_start.rewrite(one) and warm_start.rewrite(module)
    assert warm_start.rewrite(two) is None
    for command, forked in [(one, True), (two, True), (module, False)]:
        env = {warm_start.EXEC_SOCKET_ENV: "/nowhere/socket"}
        argv = warm_start.warm_exec(command, env)
        assert (argv != command) is forked and (SOCKET_ENV in env) is forked, argv
        assert warm_start.EXEC_SOCKET_ENV not in env
    assert warm_start.warm_exec(one, {}) == one  # no server given: as it is


def test_torchrun_itself_is_forked_but_never_from_a_server_that_preloaded_a_framework() -> None:
    """The agent (torchrun's own process) is forked with its workers, but not from a server
    that preloaded an installed module (a script importing Lightning, under exec):
    Lightning's import sets a variable the agent would hand on to its worker. So the
    launcher gives the agent a server of its own whenever the workers' server preloaded
    (the test below): the agent is forked from that one, its workers from the other; with
    one server given, both from it."""
    client = warm_start._client([])
    module = [*TORCHRUN, "--nproc-per-node", "2", "-m", "reference_trainer", "--steps", "3"]
    assert warm_start.rewrite(module)[: len(client)] == client  # outside exec
    preloaded, bare = "/preloaded/socket", "/bare/socket"
    for processes, given in [(1, False), (2, False), (1, True), (2, True)]:
        command = [*TORCHRUN, "--nproc-per-node", str(processes), "train.py"]
        env = {warm_start.EXEC_SOCKET_ENV: preloaded}
        env |= {warm_start.EXEC_AGENT_SOCKET_ENV: bare} if given else {}
        argv = warm_start.warm_exec(command, env)
        assert argv[: len(client)] == client and argv.count(client[-1]) == 2, argv
        # Each process asks the server it was meant for: the one given torchrun, if any;
        # the one that preloaded the script's imports, its workers.
        assert env[SOCKET_ENV] == (bare if given else preloaded)
        assert (f"--socket={preloaded}" in argv) is given
        assert warm_start.EXEC_AGENT_SOCKET_ENV not in env


@pytest.mark.parametrize(
    ("source", "one_process"),
    [
        ("os.environ.get('RANK')", True),
        ("'LOCAL_RANK' in os.environ", True),
        ("dict(os.environ)", True),  # every variable, a rank's among them
        ("os.getenv('HOME'), os.environ.get('RANKS')", False),
    ],
    ids=["get", "in", "all", "none"],
)
def test_a_preload_that_reads_a_rank_serves_one_process_of_a_job_only(
    source: str, one_process: bool, tmp_path: Path, forked_servers: None
) -> None:
    """A server whose preload read a rank's variable when imported forks one process of a
    job, not a process of a job of several (it runs afresh, and right); one whose preload
    read none forks both. Its ready line says which (`one_process`)."""
    (tmp_path / "framework.py").write_text(f"import os\n{source}\n")
    env = {**ENV, "PYTHONPATH": str(tmp_path)}
    server = warm_start._server_for(env, ("framework",))
    assert server is not None and server.base is not None  # forked from the bare one
    assert server.one_process is one_process
    program = [sys.executable, "-c", "import framework, os; print(os.environ['RANK'])"]
    for ranks in ({"WORLD_SIZE": "1", "RANK": "0"}, {"WORLD_SIZE": "2", "RANK": "1"}):
        argv = warm_start._client(program, server.address)
        done = subprocess.run(argv, env=env | ranks, capture_output=True, text=True, check=True)
        assert done.stdout == ranks["RANK"] + "\n"
    log = (Path(server.folder) / "server.log").read_text()
    assert log.count("forked ") == 2 - one_process, log
    assert ("refused: one of several processes" in log) is one_process


def test_a_job_of_several_has_its_workers_forked_from_a_preload_that_reads_no_rank(
    tmp_path: Path, warm: None
) -> None:
    """Under exec, torchrun running a script that imports installed modules: its workers
    are forked from the server that preloaded them (torchrun itself from the one that
    preloaded nothing) for one process, and for several when the imports read no rank's
    variable (yaml); Lightning's read ``RANK``, so a job of several of it has its workers
    forked from the server that preloaded nothing, like torchrun."""
    (tmp_path / "plain.py").write_text("import yaml\n")
    (tmp_path / "framework.py").write_text("import lightning\n")
    for script, processes, preloaded in [
        ("plain.py", 2, True),
        ("framework.py", 1, True),
        ("framework.py", 2, False),
    ]:
        env = dict(ENV)
        job = [*TORCHRUN, "--nproc-per-node", str(processes), str(tmp_path / script)]
        warm_start.warm(_exec(job, tmp_path / "run"), env)
        assert warm_start.EXEC_SOCKET_ENV in env
        assert (warm_start.EXEC_AGENT_SOCKET_ENV in env) is preloaded, (script, processes)


def test_a_launch_of_another_environment_replaces_an_idle_server(
    tmp_path: Path, own_servers: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The reference trainer's launch takes two: the bare server and the one forked from it
    # that preloads the trainer's modules.
    monkeypatch.setattr(warm_start, "MAX_SERVERS", 2)
    env, other = dict(ENV), {**ENV, "OTHER": "1"}
    long = warm_start.warm(_one(tmp_path / "a", "--steps", "400"), env)
    servers = warm_start.server_pids()
    assert len(warm_start._servers) == 2
    proc = subprocess.Popen(long, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_for(lambda: len(warm_start.forked()) == 1, "the run forked")
        (child,) = warm_start.forked()
        # Both serve the run (the bare one forked the other): another environment's launch
        # starts afresh.
        assert warm_start.warm(_one(tmp_path / "b"), dict(other)) == _one(tmp_path / "b")
        assert warm_start.server_pids() == servers
    finally:
        proc.kill()  # the client: its server kills the child
        proc.wait()
    _wait_for(lambda: not _alive(child), "the child gone")
    # Idle now: they make way for the other environment's two.
    assert warm_start.warm(_one(tmp_path / "c"), dict(other)) != _one(tmp_path / "c")
    assert not servers & warm_start.server_pids() and len(warm_start._servers) == 2
