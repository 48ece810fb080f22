"""A warm start for the trainer processes of a launch: one interpreter that has imported
torch once forks each trainer process, instead of each starting Python and importing torch
anew (about 2.5 s of CPU a process; most of a small run's cost).

The launcher (`harness.running.warm_start`) starts it with the launch's environment less
what differs from process to process, as ``python -c "... serve(path, socket)"``; it
imports torch and ``torch._dynamo`` (`harness.inside.zygote.PRELOAD`), puts them out of the
collector's reach, and listens on a Unix socket. Each trainer process is started as a small
client instead (`harness.inside.warm_client`: standard library only, a few milliseconds),
by the launcher or by torchrun as one of its workers; the client sends its command line,
environment and working folder with its standard streams (``SCM_RIGHTS``), and the server
forks a child that becomes the program (`harness.inside.zygote.become`) on those streams,
and says so on its stderr (``forked PID: ARGS``).
The client stands for the child to whoever started it: it forwards the signals it gets and
ends as the child ended (its exit code, or killed by the same signal). When the client goes
away (SIGKILL: a watchdog, torchrun's shutdown) the server kills the child, so nothing
outlives its launch. When stdin closes (the launcher went away) the server kills every
child and ends.

A request is refused, and the client starts the program afresh itself, when its
environment differs from the server's in anything but `VARYING` (what torchrun sets per
worker, tightrope's per-run variables, pytest's current test): a variable read at import
time would otherwise be the server's, not the program's.

The bare server (one that preloads and attaches nothing and has no PYTHONPATH) also serves
a request whose environment differs from its own in PYTHONPATH too (this checkout, the
agent's bootstrap): the child rebuilds ``sys.path`` as a fresh interpreter with that
PYTHONPATH would have made it (`harness.inside.zygote.fresh_path`) and imports the
``sitecustomize`` it finds there, as ``site`` would have. So the launcher's other servers
(``python -c``, as any program) and the crash points' zygote are forked from it instead of
importing torch anew. Any server refuses a request whose path (its script's folder, or
the working folder of ``-m`` and ``-c``, then its PYTHONPATH) holds a module the server has
already imported from elsewhere (`_shadowed`): a fresh start would have imported that one.

Standard library only until the preload.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import socket
import sys
from typing import Any

from harness.inside.zygote import (
    AGENT_PRELOAD,
    become,
    pythonpath_folders,
    read_on_import,
    reaped,
    warm_up,
)

#: What torchrun sets for each of its workers: a rank's and its job's variables, its
#: elastic agent's (`PER_RANK_PREFIX`). A server whose preload read one of them when
#: imported (Lightning reads ``RANK``) serves one process of a job only (`_refusal`).
PER_RANK_NAMES = frozenset(
    {
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "GROUP_WORLD_SIZE",
        "ROLE_RANK",
        "ROLE_NAME",
        "ROLE_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    }
)
PER_RANK_PREFIX = "TORCHELASTIC_"

#: Variables that may differ between the server and a request: none of them is read when
#: torch is imported. torchrun's per-worker ones (its compile caches too), tightrope's per-run
#: ones, pytest's.
VARYING_NAMES = PER_RANK_NAMES | {
    "TORCHINDUCTOR_CACHE_DIR",  # read when inductor compiles, not when imported
    "TRITON_CACHE_DIR",
    "PYTEST_CURRENT_TEST",
}
VARYING_PREFIXES = (PER_RANK_PREFIX, "TIGHTROPE_")

#: The word a server's ready line ends with when it serves one process of a job only.
ONE_PROCESS = "one-process"

#: The most bytes a request may hold (its command line and environment).
MAX_REQUEST = 1 << 20


def reads_a_rank(names: frozenset[str]) -> bool:
    """``names`` (what a preload read when imported, ``*`` for all) hold a rank's variable."""
    return "*" in names or any(n in PER_RANK_NAMES or n.startswith(PER_RANK_PREFIX) for n in names)


def varying(name: str) -> bool:
    """``name`` may differ between the server's environment and a request's."""
    return name in VARYING_NAMES or name.startswith(VARYING_PREFIXES)


def static(env: dict[str, str]) -> dict[str, str]:
    """``env`` less what may vary: equal for the server and every request it serves."""
    return {k: v for k, v in env.items() if not varying(k)}


def _send(conn: socket.socket, record: dict[str, Any]) -> None:
    with contextlib.suppress(OSError):
        conn.sendall((json.dumps(record) + "\n").encode())


def _receive(conn: socket.socket) -> tuple[dict[str, Any], list[int]] | None:
    """One request and its three streams, or None for a malformed one."""
    data, fds, _flags, _addr = socket.recv_fds(conn, MAX_REQUEST, 3)
    while not data.endswith(b"\n") and len(data) < MAX_REQUEST:
        more = conn.recv(MAX_REQUEST)
        if not more:
            break
        data += more
    try:
        request = json.loads(data)
    except ValueError:
        request = None
    if not isinstance(request, dict) or len(fds) != 3:
        for fd in fds:
            os.close(fd)
        return None
    return request, fds


def _shadowed(folders: list[str]) -> str | None:
    """A module this interpreter has imported that a fresh one would have found in one of
    ``folders`` (put first on its path) rather than where this one found it, or None;
    ``usercustomize`` too, which a fresh one would have run."""
    for folder in folders:
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        for name in names:
            top = name.partition(".")[0]
            if top == "usercustomize":
                return top
            module = sys.modules.get(top) if top else None
            if module is None:
                continue
            where = getattr(module, "__file__", None) or next(
                iter(getattr(module, "__path__", [])), ""
            )
            if not where or not os.path.abspath(where).startswith(os.path.join(folder, "")):
                return top
    return None


def _path_refusal(request: dict[str, Any], program: list[str]) -> str | None:
    """Why ``request`` cannot be forked from here because of where a fresh start would look
    first (its script's folder or, for ``-m`` and ``-c``, its working folder; then its
    PYTHONPATH), or None."""
    pythonpath = str(request["env"].get("PYTHONPATH", ""))
    cwd = str(request.get("cwd") or "") or os.getcwd()
    script = program[0] not in ("-m", "-c")
    entry = os.path.dirname(os.path.join(cwd, program[0])) if script else cwd
    folders = [os.path.abspath(entry), *pythonpath_folders(pythonpath, cwd)]
    clash = _shadowed(list(dict.fromkeys(folders)))
    return f"its path holds {clash}, imported here from elsewhere" if clash else None


def _refusal(
    request: dict[str, Any],
    env: dict[str, str],
    unbuffered: bool,
    one_process: bool = False,
    *,
    bare: bool = False,
) -> str | None:
    """Why ``request`` cannot be forked from here, or None. ``one_process``: the server
    preloaded installed modules that read a rank's variables when imported (Lightning reads
    ``RANK`` and ``LOCAL_RANK``), so it serves no process of a job of several.
    ``bare``: it preloads and attaches nothing and has no PYTHONPATH, so it may serve
    another PYTHONPATH too."""
    argv = request.get("argv")
    if not isinstance(argv, list) or len(argv) < 2 or argv[0] != sys.executable:
        return "not this interpreter"
    if argv[1] == "-u" and not unbuffered:
        return "-u, and this interpreter's output is buffered"
    program = argv[2:] if argv[1] == "-u" else argv[1:]
    if not program or (program[0].startswith("-") and program[0] not in ("-m", "-c")):
        return "an interpreter option other than -u, or no program"
    if program[0] == "-m" and (len(program) < 2 or program[1].startswith("-")):
        return "-m without a module"
    if program[0] == "-c" and len(program) < 2:
        return "-c without a program"
    wanted = request.get("env")
    if one_process and isinstance(wanted, dict) and wanted.get("WORLD_SIZE", "1") != "1":
        return "one of several processes, and modules preloaded that read a rank's variables"
    theirs = static(wanted) if isinstance(wanted, dict) else {}
    if bare:  # any PYTHONPATH: the child's path is rebuilt for it (`become`)
        theirs.pop("PYTHONPATH", None)
    if not isinstance(wanted, dict) or theirs != env:
        differ = sorted(set(theirs.items()) ^ set(env.items()))
        return "another environment: " + ", ".join(sorted({k for k, _ in differ}))[:200]
    return _path_refusal(request, program)


class _Server:
    def __init__(
        self, path: list[str], listener: socket.socket, *, one_process: bool, bare: bool
    ) -> None:
        self.path = path
        self.listener = listener
        self.one_process = one_process
        self.bare = bare
        self.env = static(dict(os.environ))
        self.unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
        self.selector = selectors.DefaultSelector()
        self.children: dict[int, socket.socket] = {}  # pid -> its client's connection

    def run(self, control: int) -> None:
        self.selector.register(control, selectors.EVENT_READ, "control")
        self.selector.register(self.listener, selectors.EVENT_READ, "accept")
        while True:
            for key, _ in self.selector.select(timeout=0.05):
                if key.data == "control":
                    if not os.read(control, 4096):
                        self.kill_all()
                        return
                elif key.data == "accept":
                    self.accept(control)
                else:
                    self.client_spoke(key.fileobj)  # type: ignore[arg-type]
            self.reap()

    def accept(self, control: int) -> None:
        with contextlib.suppress(OSError):
            conn, _ = self.listener.accept()
            received = _receive(conn)
            if received is None:
                _send(conn, {"refused": "malformed request"})
                conn.close()
                return
            request, fds = received
            reason = _refusal(request, self.env, self.unbuffered, self.one_process, bare=self.bare)
            if reason is not None:
                for fd in fds:
                    os.close(fd)
                print(f"refused: {reason}", file=sys.stderr, flush=True)
                _send(conn, {"refused": reason})
                conn.close()
                return
            self.fork(request, fds, conn, control)

    def fork(
        self, request: dict[str, Any], fds: list[int], conn: socket.socket, control: int
    ) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            # Closed through their objects: a number closed under an object's feet would be
            # closed again when the object is collected, by then maybe the program's file.
            self.selector.close()
            for sock in (self.listener, conn, *self.children.values()):
                sock.close()
            os.close(control)
            os.setsid()
            for target, fd in enumerate(fds):
                os.dup2(fd, target)
            for fd in fds:
                if fd > 2:
                    os.close(fd)
            if request["argv"][1] == "-u":
                request = {**request, "argv": [request["argv"][0], *request["argv"][2:]]}
            become(request, self.path)  # never returns
        for fd in fds:
            os.close(fd)
        self.children[pid] = conn
        self.selector.register(conn, selectors.EVENT_READ, "client")
        _send(conn, {"pid": pid})
        print(f"forked {pid}: {' '.join(request['argv'][1:])}", file=sys.stderr, flush=True)

    def client_spoke(self, conn: socket.socket) -> None:
        """A client sends nothing after its request: readable means it went away."""
        try:
            data = conn.recv(4096)
        except OSError:
            data = b""
        if data:
            return
        self.selector.unregister(conn)
        for pid in [pid for pid, client in self.children.items() if client is conn]:
            _kill(pid)  # reaped, and its connection closed, by `reap`

    def reap(self) -> None:
        for pid, code in reaped() if self.children else ():
            conn = self.children.pop(pid, None)
            if conn is None:
                continue
            _send(conn, {"exit": code})
            if conn.fileno() in self.selector.get_map():  # its client still waits
                self.selector.unregister(conn)
            conn.close()

    def kill_all(self) -> None:
        for pid in self.children:
            _kill(pid)


def _kill(pid: int) -> None:
    """SIGKILL a child and its session (whatever it started there)."""
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(OSError):
        os.killpg(pid, signal.SIGKILL)


def serve(
    path: list[str], address: str, *, attached: bool = False, preload: tuple[str, ...] = ()
) -> None:
    """Preload, listen on ``address`` and fork a child per request until stdin closes;
    ``path``: ``sys.path`` as the interpreter made it (before the launcher's additions).
    ``attached``: the programs run through the agent's bootstrap (``tightrope exec``); the
    save and load functions are wrapped, and the agent's module imported, as in
    `harness.inside.zygote.serve`, and each child attaches the agent as a fresh start would.
    ``preload``: installed modules the program imports (`harness.inside.zygote._import`);
    when they read a rank's variables, only one process of a job is served (`_refusal`),
    and the ready line says so (`ONE_PROCESS`)."""
    control = os.dup(0)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.close(null)
    warm_up((AGENT_PRELOAD if attached else ()) + preload, wrap=attached, attached=attached)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address)
    listener.listen(64)
    one_process = reads_a_rank(read_on_import())
    print(f"ready {os.getpid()}" + (f" {ONE_PROCESS}" if one_process else ""), flush=True)
    bare = not attached and not preload and not os.environ.get("PYTHONPATH")
    _Server(path, listener, one_process=one_process, bare=bare).run(control)
