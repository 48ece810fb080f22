"""Warm starts: the launcher's side of `harness.inside.warm_server`.

Once `enable` has been called in a process (the test suite does, in each of its workers),
`run_process` (and the tests' own ``run_module``) start processes of this interpreter
through a warm-start server of that process: ``python -m MODULE ...`` or ``python
SCRIPT.py ...`` becomes the server's small client (`harness.inside.warm_client`), and
``python -m torch.distributed.run OPTIONS -m MODULE ...`` (a script too, when the job is
one process) runs that client as each of its workers (``--no-python``), so torchrun still
starts, watches, signals and restarts every worker, and the worker is forked from an
interpreter that imported torch once; torchrun itself is forked too (its agent imports
torch as a worker does). That covers the reference trainer's ranks and
tightrope's own commands, which are forked from a server that has imported their modules
too (`harness.running.warm_command.own_preload`). One server serves every launch
whose environment is its own but for what varies per process
(`harness.inside.warm_server.VARYING_NAMES`). A command with interpreter options or another
interpreter starts afresh as before, and so does a request the server refuses.
``tightrope exec`` is forked too; the command it runs (a foreign or framework trainer:
``python SCRIPT.py``, ``python -m MODULE``, or torchrun running a script, or a module as
one worker) is forked from a server of the environment exec gives it (the agent's
bootstrap first on PYTHONPATH), which wraps the save and load functions before forking as
`harness.inside.zygote` does, and has imported the installed modules the script imports
(`harness.running.warm_command.preload_of`: Lightning,
transformers); each child attaches the agent as a fresh start
would (`warm_exec`). torchrun running such a script is forked from the attached server
that preloaded nothing (`EXEC_AGENT_SOCKET_ENV`: a preload's import may set variables, as
Lightning's does, that torchrun would hand on to its workers), its workers from the one
that did, unless the job has several processes and the preload read a rank's variables
when imported (Lightning reads ``RANK``; the server's ready line says so): then from the
one that preloaded nothing too.
At most `MAX_SERVERS` servers; the least recently used idle one makes way for another. A
server whose environment differs from the bare one's (no PYTHONPATH) in PYTHONPATH only, or
that preloads, is forked from the bare one (`harness.inside.warm_server`: ``sys.path``
rebuilt as a fresh start with that PYTHONPATH builds it), so torch is imported once a
worker rather than once a server; refused, its client starts it afresh. So is the crash
points' zygote (`from_bare_server`).

Not on by default: a user's launch starts every process afresh. tests/test_warm_start.py
shows a warm run leaves what a fresh one leaves.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

from harness.inside.exec_env import BOOTSTRAP_DIR, child_env
from harness.inside.forked_torchrun import TORCHRUN
from harness.inside.warm_client import SOCKET_ENV, SOCKET_OPTION
from harness.inside.warm_server import ONE_PROCESS, static
from harness.running.process_tree import MARK, descendants, end_by_stdin
from harness.running.warm_command import (
    Torchrun,
    own_preload,
    parse_torchrun,
    script_preload,
)

_ROOT = Path(__file__).resolve().parents[2]
CLIENT = str(_ROOT / "harness" / "inside" / "warm_client.py")
_SERVE = "import sys; path = list(sys.path); sys.path.append({root!r}); "
_SERVE += "from harness.inside.warm_server import serve; "
_SERVE += "serve(path, {address!r}, attached={attached!r}, preload={preload!r})"

#: Where the launcher tells ``tightrope exec`` the server its command can be forked from.
EXEC_SOCKET_ENV = "TIGHTROPE_WARM_EXEC_SOCKET"
#: ... and the one torchrun's own process can be forked from, when that server preloaded
#: the worker's imports.
EXEC_AGENT_SOCKET_ENV = "TIGHTROPE_WARM_EXEC_AGENT_SOCKET"

#: Servers of this process at most (each holds torch in memory, about 300 MB, 430 MB with
#: Lightning, less where one forked from the bare server still shares its pages: the bare
#: one, the one for this checkout's own programs, the attached one, one per framework a
#: one-process program imports, each of those for a launch that puts this checkout on
#: PYTHONPATH and one that does not). A launch of
#: another environment ends the least recently used server that serves nobody now, else
#: starts afresh. With 4, a worker of make test started 15 servers, 8 of them after ending
#: one; with 8, the two workers started 27, 5 after ending one.
MAX_SERVERS = 10


class _Server:
    """One warm-start server process (see the module); forked from ``base`` when given
    (then its process here is the client that stands for it)."""

    def __init__(
        self, env: dict[str, str], preload: tuple[str, ...], base: _Server | None = None
    ) -> None:
        self.folder = tempfile.mkdtemp(prefix="tightrope-warm-")
        self.address = os.path.join(self.folder, "socket")
        self.base = base
        attached = _attached(env)
        serve = _SERVE.format(
            root=str(_ROOT), address=self.address, attached=attached, preload=preload
        )
        argv = [sys.executable, "-c", serve]
        if base is not None:
            argv = _client(argv, base.address)  # refused: the client starts it afresh
        with open(os.path.join(self.folder, "server.log"), "ab") as log:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                env={**static(env), MARK: uuid.uuid4().hex},
                start_new_session=True,
            )
        assert self.proc.stdout is not None
        ready = self.proc.stdout.readline().split()
        self.ready = len(ready) in (2, 3) and ready[0] == b"ready" and ready[1].isdigit()
        #: It serves one process of a job only: its preload read a rank's variables.
        self.one_process = ready[2:] == [ONE_PROCESS.encode()]
        #: The server's own pid (not its client's, when forked).
        self.pid = int(ready[1]) if self.ready else self.proc.pid
        self.used = time.monotonic()
        if not self.ready:
            self.close()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def idle(self) -> bool:
        """Serving nobody: no child of the server runs (its children are what it forked; one
        that ended and is not reaped yet serves nobody either)."""
        return not self.alive() or not descendants(self.pid, zombies=False)

    def close(self) -> None:
        """End the server (it kills any child still running) and remove its folder."""
        end_by_stdin(self.proc)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        shutil.rmtree(self.folder, ignore_errors=True)


_lock = threading.Lock()
_servers: dict[tuple[frozenset[tuple[str, str]], tuple[str, ...]], _Server] = {}
_enabled = False


def enable() -> None:
    """Start this process's trainer launches warm from now on (the test suite's choice)."""
    global _enabled
    with _lock:
        if not _enabled:
            atexit.register(close_all)
        _enabled = True


def enabled() -> bool:
    """Whether this process's trainer launches start warm."""
    return _enabled


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """Launches start afresh inside; the servers stay for after (a test's fresh run)."""
    global _enabled
    with _lock:
        was, _enabled = _enabled, False
    try:
        yield
    finally:
        with _lock:
            _enabled = was


def close_all() -> None:
    """End every server of this process (at exit, or to start cold again): those forked
    from another first (a server ending kills what it forked, not what that forked)."""
    global _enabled
    with _lock:
        _enabled = False
        servers = sorted(_servers.values(), key=lambda server: server.base is None)
        _servers.clear()
    for server in servers:
        server.close()


def server_pids() -> set[int]:
    """The pids of this process's running servers, and of the clients that stand for those
    forked from another (not their children)."""
    with _lock:
        return {pid for s in _servers.values() if s.alive() for pid in (s.pid, s.proc.pid)}


def forked() -> list[int]:
    """The pid of every program this process's servers forked (from their logs; the servers
    forked from the bare one are not counted)."""
    pids = []
    with _lock:
        folders = [server.folder for server in _servers.values()]
    for folder in folders:
        with contextlib.suppress(OSError), open(os.path.join(folder, "server.log")) as log:
            lines = [line.split(" ", 2) for line in log if line.startswith("forked ")]
            pids += [int(pid.rstrip(":")) for _, pid, rest in lines if not _is_server(rest)]
    return pids


def _is_server(command: str) -> bool:
    """``command`` (a forked program's, as its server logs it) is this module's server."""
    return command.startswith("-c ") and "from harness.inside.warm_server import serve" in command


def _client(argv: Sequence[str], server: str = "") -> list[str]:
    """The warm client running ``argv``, from ``server`` (else the one in its environment)."""
    option = [SOCKET_OPTION + server] if server else []
    return [sys.executable, "-I", "-S", CLIENT, *option, *argv]


def _warm_torchrun(argv: Sequence[str], job: Torchrun, workers_at: str = "") -> list[str]:
    """torchrun ``argv``, forked from the server in the environment, running the warm client
    as each of its workers (forked from server ``workers_at``, else that one too)."""
    warm_job = [*argv[:3], *job.options, "--no-python", *_client(job.worker, workers_at)]
    return _client(warm_job)


def _forked(job: Torchrun, *, under_exec: bool) -> bool:
    """Whether torchrun ``job`` runs forked: a job of one process always; of several, a
    module's (the reference trainer, tightrope's own) outside exec and a script's under
    exec. Outside exec, the one script job of several, a plain DCP job's, hung forked as it
    ended (the gloo teardown deadlock of docs/frameworks.md, which its script now avoids,
    more often forked than fresh); under exec, a module's job of several once lost 3 steps
    to a kill warm where fresh lost 2."""
    return job.processes == 1 or (job.worker[2] == "-m") != under_exec


def rewrite(argv: Sequence[str]) -> list[str] | None:
    """The warm form of ``argv``, or None when it has none (see the module; a torchrun
    job's: `_forked`)."""
    if len(argv) < 2 or argv[0] != sys.executable:
        return None
    if argv[1] == "-m" and len(argv) < 3:
        return None
    if argv[1] == "-m" and argv[2] == TORCHRUN:
        job = parse_torchrun(argv)
        if job is None or not _forked(job, under_exec=False):
            return None
        return _warm_torchrun(argv, job)
    if argv[1] == "-m" and not argv[2].startswith("-"):
        return _client(argv)
    if argv[1].endswith(".py") and not argv[1].startswith("-"):
        return _client(argv)
    return None


def _attached(env: dict[str, str]) -> bool:
    return str(BOOTSTRAP_DIR) in env.get("PYTHONPATH", "").split(os.pathsep)


def warm(argv: Sequence[str], env: dict[str, str]) -> list[str]:
    """``argv`` to run with ``env`` (which gains the server's socket): its warm form once
    `enable` was called and a server runs for ``env``, else ``argv`` itself.

    ``tightrope exec`` (``python -m harness exec ...``) is forked too, and given a second
    server, of the environment it gives its command (the agent's bootstrap first on
    PYTHONPATH), in `EXEC_SOCKET_ENV`: `warm_exec` starts the command from there (and,
    when that server preloads what torchrun's worker imports, torchrun itself from the
    attached one that preloads nothing, in `EXEC_AGENT_SOCKET_ENV`: a preload's import may
    set variables, as Lightning's does, that torchrun would hand on to its workers). A job
    of several processes has its workers forked from the server that preloaded nothing
    when the preload read a rank's variables (Lightning reads ``RANK``)."""
    if not _enabled or _attached(env):
        return list(argv)
    rewritten = rewrite(argv)
    if rewritten is None:
        return list(argv)
    server = _server_for(env, own_preload(argv))
    if server is None:
        return list(argv)
    if list(argv[1:4]) == ["-m", "harness", "exec"]:
        command = argv[argv.index("--") + 1 :] if "--" in argv else []
        job = parse_torchrun(command)  # (parsed once: torchrun's own parser)
        preload = script_preload(job.worker if job is not None else command)
        attached_env = child_env(env, Path(os.getcwd()), None)
        attached = _server_for(attached_env, preload)
        plain = None
        if attached is not None and job is not None and preload:
            # torchrun is forked from the plain server (never from one that preloaded), and
            # so are the workers of a job of several when the preload read a rank's
            # variables; without the plain server, nothing is forked.
            plain = _server_for(attached_env)
            if plain is None or (job.processes != 1 and attached.one_process):
                attached = plain
        if attached is not None:
            env[EXEC_SOCKET_ENV] = attached.address
            if plain is not None and plain is not attached:
                env[EXEC_AGENT_SOCKET_ENV] = plain.address
    env[SOCKET_ENV] = server.address
    return rewritten


def from_bare_server(argv: Sequence[str], env: dict[str, str]) -> list[str]:
    """``argv`` (``python -c`` or another program of this interpreter, to run with ``env``)
    forked from the bare server of ``env`` less its PYTHONPATH once `enable` was called
    (its client, which starts it afresh if refused), else ``argv`` itself: the crash
    points' zygote, which imports torch as the server did."""
    if not _enabled or argv[:1] != [sys.executable]:
        return list(argv)
    server = _server_for(_bare(env))
    return _client(argv, server.address) if server is not None else list(argv)


def warm_exec(argv: Sequence[str], env: dict[str, str]) -> list[str]:
    """In ``tightrope exec``: the command ``argv`` to run with ``env``, in its warm form
    when the launcher gave exec a server (`EXEC_SOCKET_ENV`; then ``env`` gains its
    socket) and it has one (a torchrun job: as `_forked` says under exec; else as
    `rewrite` says), else ``argv`` itself."""
    address, agent_address = env.pop(EXEC_SOCKET_ENV, ""), env.pop(EXEC_AGENT_SOCKET_ENV, "")
    rewritten = None
    if address and list(argv[1:3]) == ["-m", TORCHRUN]:  # (a user's exec imports no torch)
        job = parse_torchrun(argv)
        if job is not None and _forked(job, under_exec=True):
            # Its workers from the server given for them; torchrun from the one given for
            # it when that is another (the workers' preloaded their imports).
            rewritten = _warm_torchrun(argv, job, workers_at=address if agent_address else "")
            address = agent_address or address
    elif address:
        rewritten = rewrite(argv)
    if rewritten is None:
        env.pop(SOCKET_ENV, None)
        return list(argv)
    env[SOCKET_ENV] = address
    return rewritten


def _bare(env: dict[str, str]) -> dict[str, str]:
    """``env`` less its PYTHONPATH: the bare server's environment."""
    return {k: v for k, v in env.items() if k != "PYTHONPATH"}


def _server_for(env: dict[str, str], preload: tuple[str, ...] = ()) -> _Server | None:
    with _lock:
        return _server_locked(env, preload) if _enabled else None


def _server_locked(env: dict[str, str], preload: tuple[str, ...]) -> _Server | None:
    """The server for ``env`` and ``preload``, started if need be: forked from the bare
    server of ``env`` less its PYTHONPATH (started first if need be) when they differ."""
    key = (frozenset({**static(env), "": os.getcwd()}.items()), preload)
    server = _servers.get(key)
    if server is not None and server.alive():
        server.used = time.monotonic()
        return server
    base = _server_locked(_bare(env), ()) if preload or "PYTHONPATH" in env else None
    if server is None and len(_servers) >= MAX_SERVERS:
        idle = [k for k, s in _servers.items() if s.idle() and s is not base]
        if not idle:
            return None  # a launch of yet another environment starts afresh
        _servers.pop(min(idle, key=lambda k: _servers[k].used)).close()
    server = _Server(env, preload, base)
    if not server.ready:
        _servers.pop(key, None)
        return None
    _servers[key] = server
    return server
