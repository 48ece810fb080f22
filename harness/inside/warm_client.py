"""The stand-in for a trainer process forked by the warm-start server
(`harness.inside.warm_server`): run as ``python -I -S warm_client.py PYTHON ARGS...`` with
the server's socket in ``TIGHTROPE_WARM_SOCKET`` (or ``--socket=PATH`` first: torchrun's
workers, when its own process was forked from another server than theirs).

It asks the server to fork ``PYTHON ARGS...`` on this process's standard streams, with its
environment and working folder; then forwards every signal it gets to the child and ends as
the child ended (its exit code, or killed by the same signal). When the server refuses, or
cannot be reached, it becomes the program itself (``exec``), as a fresh start. Standard
library only, so that it starts in milliseconds.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sys

SOCKET_ENV = "TIGHTROPE_WARM_SOCKET"
SOCKET_OPTION = "--socket="

#: Forwarded to the child: what torchrun, a shell or the harness may send a worker.
FORWARDED = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
)


def _fresh(argv: list[str]) -> None:
    os.execv(argv[0], argv)


def _end_as(status: int) -> None:
    """Exit with ``status`` as ``subprocess`` reports it: a code, or minus a signal."""
    if status < 0:
        signal.signal(-status, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {-status})
        os.kill(os.getpid(), -status)
        status = 128 - status
    sys.exit(status)


def main() -> None:
    argv = sys.argv[1:]
    address = os.environ.get(SOCKET_ENV, "")
    if argv and argv[0].startswith(SOCKET_OPTION):
        address, argv = argv[0][len(SOCKET_OPTION) :], argv[1:]
    if not argv:
        sys.exit("usage: warm_client.py [--socket=PATH] PYTHON ARGS...")
    child: list[int] = []
    pending: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        if not child:  # before the fork: sent on once the child exists
            pending.append(signum)
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(child[0], signum)

    previous = {signum: signal.signal(signum, forward) for signum in FORWARDED}
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(address)
        request = {"argv": argv, "env": dict(os.environ), "cwd": os.getcwd()}
        socket.send_fds(conn, [(json.dumps(request) + "\n").encode()], [0, 1, 2])
        answers = conn.makefile("rb")
        first = json.loads(answers.readline() or b"{}")
    except (OSError, ValueError):
        first = {}
    if "pid" not in first:
        conn.close()
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if pending:  # as a fresh start would have been: ended by it
            _end_as(-pending[0])
        _fresh(argv)
    child.append(int(first["pid"]))
    for queued in pending:
        forward(queued, None)
    try:
        last = json.loads(answers.readline() or b"{}")
    except (OSError, ValueError):
        last = {}
    if "exit" not in last:
        print("tightrope: the warm-start server ended while the program ran", file=sys.stderr)
        sys.exit(1)
    _end_as(int(last["exit"]))


if __name__ == "__main__":
    main()
