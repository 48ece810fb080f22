"""Warm starts: the launcher's side of `harness.inside.warm_server`.

Once `enable` has been called in a process (the test suite does, in each of its workers),
`run_process` (and the tests' own ``run_module``) start processes of this interpreter
through a warm-start server of that process: ``python -m MODULE ...`` or ``python
SCRIPT.py ...`` becomes the server's small client (`harness.inside.warm_client`), and
``python -m torch.distributed.run OPTIONS -m MODULE ...`` runs that client as each of its
workers (``--no-python``), so torchrun still starts, watches, signals and restarts every
worker, and the worker is forked from an interpreter that imported torch once. That covers
the reference trainer's ranks and tightrope's own commands. One server serves every launch
whose environment is its own but for what varies per process
(`harness.inside.warm_server.VARYING_NAMES`). A command with interpreter options or another
interpreter starts afresh as before, and so does a request the server refuses; so does
what ``tightrope exec`` runs (it is forked, but replaces itself with its command, which
starts afresh with the agent's bootstrap: a foreign or framework trainer), and what runs
with the bootstrap on PYTHONPATH.

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
import uuid
from collections.abc import Sequence
from pathlib import Path

from harness.inside.exec_env import BOOTSTRAP_DIR
from harness.inside.warm_client import SOCKET_ENV
from harness.inside.warm_server import static
from harness.running.process_tree import MARK, kill_tree

_ROOT = Path(__file__).resolve().parents[2]
CLIENT = str(_ROOT / "harness" / "inside" / "warm_client.py")
_SERVE = "import sys; path = list(sys.path); sys.path.append({root!r}); "
_SERVE += "from harness.inside.warm_server import serve; serve(path, {address!r})"
_TORCHRUN = "torch.distributed.run"

#: Servers of this process at most (each holds torch in memory); a launch of another
#: environment still starts afresh.
MAX_SERVERS = 3


class _Server:
    """One warm-start server process (see the module)."""

    def __init__(self, env: dict[str, str]) -> None:
        self.folder = tempfile.mkdtemp(prefix="tightrope-warm-")
        self.address = os.path.join(self.folder, "socket")
        serve = _SERVE.format(root=str(_ROOT), address=self.address)
        with open(os.path.join(self.folder, "server.log"), "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", serve],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                env={**static(env), MARK: uuid.uuid4().hex},
                start_new_session=True,
            )
        assert self.proc.stdout is not None
        self.ready = self.proc.stdout.readline().strip() == b"ready"
        if not self.ready:
            self.close()

    def close(self) -> None:
        """End the server (it kills any child still running) and remove its folder."""
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            kill_tree(self.proc.pid)
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        shutil.rmtree(self.folder, ignore_errors=True)


_lock = threading.Lock()
_servers: dict[frozenset[tuple[str, str]], _Server] = {}
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


def close_all() -> None:
    """End every server of this process (at exit, or to start cold again)."""
    global _enabled
    with _lock:
        _enabled = False
        servers = list(_servers.values())
        _servers.clear()
    for server in servers:
        server.close()


def server_pids() -> set[int]:
    """The pids of this process's running servers (not their children)."""
    with _lock:
        return {s.proc.pid for s in _servers.values() if s.proc.poll() is None}


def forked() -> list[int]:
    """The pid of every process this process's servers forked (from their logs)."""
    pids = []
    with _lock:
        folders = [server.folder for server in _servers.values()]
    for folder in folders:
        with contextlib.suppress(OSError), open(os.path.join(folder, "server.log")) as log:
            pids += [int(line.split()[1].rstrip(":")) for line in log if line.startswith("forked ")]
    return pids


def _client(argv: Sequence[str]) -> list[str]:
    return [sys.executable, "-I", "-S", CLIENT, *argv]


def rewrite(argv: Sequence[str]) -> list[str] | None:
    """The warm form of ``argv``, or None when it has none (see the module)."""
    if len(argv) < 3 or argv[0] != sys.executable:
        return None
    if argv[1] == "-m" and argv[2] == _TORCHRUN:
        rest = list(argv[3:])
        if "-m" not in rest or "--no-python" in rest or "--no_python" in rest:
            return None
        at = rest.index("-m")
        if at + 1 >= len(rest) or rest[at + 1].startswith("-"):
            return None
        worker = [sys.executable, "-u", *rest[at:]]
        return [*argv[:3], *rest[:at], "--no-python", *_client(worker)]
    if argv[1] == "-m" and not argv[2].startswith("-"):
        return _client(argv)
    if argv[1].endswith(".py") and not argv[1].startswith("-"):
        return _client(argv)
    return None


def warm(argv: Sequence[str], env: dict[str, str]) -> list[str]:
    """``argv`` to run with ``env`` (which gains the server's socket): its warm form once
    `enable` was called and a server runs for ``env``, else ``argv`` itself."""
    if not _enabled or str(BOOTSTRAP_DIR) in env.get("PYTHONPATH", "").split(os.pathsep):
        return list(argv)
    rewritten = rewrite(argv)
    if rewritten is None:
        return list(argv)
    server = _server_for(env)
    if server is None:
        return list(argv)
    env[SOCKET_ENV] = server.address
    return rewritten


def _server_for(env: dict[str, str]) -> _Server | None:
    key = frozenset({**static(env), "": os.getcwd()}.items())
    with _lock:
        if not _enabled:
            return None
        server = _servers.get(key)
        if server is not None and server.proc.poll() is None:
            return server
        if server is None and len(_servers) >= MAX_SERVERS:
            return None  # a launch of yet another environment starts afresh
        server = _Server(env)
        if not server.ready:
            _servers.pop(key, None)
            return None
        _servers[key] = server
        return server
