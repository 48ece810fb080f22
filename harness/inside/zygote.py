"""A zygote for ``tightrope crashpoints``: one interpreter that has imported torch once and
forks a fresh child for each run of a Python job, so a crash point's killed run and its
resume do not each pay Python's start and torch's import (most of a small job's time).

The driver (`harness.crashpoints.zygote`) starts it with the job's own interpreter and the
job's environment less what differs from run to run, as
``python -c "from harness.inside.zygote import serve; serve()"``; it imports torch, wraps
the save and load functions as a fresh start does before the program's first import
(passing straight through until a child arms them), imports the driver's preload (nothing
of the program, nothing of tightrope's agent beyond its import), then reads requests, one
JSON line each on stdin (``{"id", "argv", "env", "cwd", "log"}``), and answers on stdout
``{"id", "pid"}`` once forked and ``{"id", "exit"}`` when the child ended (the exit status,
or minus the signal that killed it, as ``subprocess`` says).

The child becomes what ``python SCRIPT ARGS`` or ``python -m MODULE ARGS`` would be: its own
session, stdin from /dev/null, stdout and stderr appended to the log, the run's environment
(``os.environ`` whole), its working folder, ``sys.argv`` and ``sys.path[0]``, the real
``__main__`` module, numpy's global generator seeded afresh (a fresh interpreter seeds it from
the OS), then the bootstrap's ``sitecustomize.arm()`` (the agent, the crash-point hook, as at
a fresh start: torch is already imported, which the bootstrap handles) and the program. It
ends as an interpreter does: atexit handlers, a traceback and exit 1 for an exception.

Standard library only until the preload.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import selectors
import signal
import sys
import types
from collections.abc import Iterator
from typing import Any, NoReturn

from harness.inside import forked_torchrun
from harness.inside.ending import end, finalizers, status_of

#: What the zygote imports before forking: torch, and ``torch._dynamo``, which torch imports
#: at the first optimizer a program makes (as much again as torch itself); the driver adds
#: the agent's own module (imported, not attached) and the installed modules the fault-free
#: run imported (Lightning, transformers: never the program's own), and checks that a run
#: forked from the zygote leaves what a fresh one leaves before it uses it for points.
PRELOAD = ("torch", "torch._dynamo")


#: The agent's module, in the driver's preload when the job runs through the agent.
AGENT = "harness.inside.exec_runtime"
#: What a server of programs run through the agent imports for them: the agent's module,
#: and the fault kinds its plan is read with (their models are built when first imported:
#: 0.16 s of CPU that each forked child took while its server had not).
AGENT_PRELOAD = (AGENT, "faults.builtin")


def _import(names: tuple[str, ...]) -> None:
    """Import each of ``names``: a module, or ``MODULE:NAME`` for a name the program takes
    from a module (``from transformers import Trainer``: a lazy module imports the
    submodule that defines it only when asked for it)."""
    for entry in names:
        name, _, attribute = entry.partition(":")
        if name not in sys.modules:
            try:
                __import__(name)
            except Exception:  # the program imports it its own way, if at all
                sys.modules.pop(name, None)
                continue
        if attribute and name in sys.modules:
            with contextlib.suppress(Exception):
                getattr(sys.modules[name], attribute)


def _wrap_savers(*, attached: bool) -> None:
    """Wrap the save and load functions as a fresh start wraps them before the program's
    first import (the agent's, then the crash hook's around them), before any installed
    module is preloaded: one that binds a saver when imported (transformers binds
    safetensors' ``save_file`` and ``load_file``) must bind the wrapper, or every child's
    saves through it would go unseen. They pass straight through until a child arms them."""
    if attached:
        from harness.inside.files import install_wrappers

        install_wrappers()
    from harness.inside.crash_hook import wrap_writers

    wrap_writers()


#: The environment variables the preload's imports set (Lightning sets
#: ``PYTORCH_NVML_BASED_CUDA_CHECK`` when imported): a child sets them again over its
#: run's environment, as the imports would have in a fresh start (`become`).
_set_on_import: dict[str, str] = {}

#: The environment variables the preload's imports asked for, through ``os.environ`` or
#: ``os.getenv`` (``*``: one went through all of them), whether set or not; what C code
#: reads with getenv() is not seen. `harness.inside.warm_server` serves a job of several
#: processes from a preload that read none of a rank's variables.
_read_on_import: set[str] = set()


class _Noting(os._Environ[str]):
    """``os.environ``'s class while the preload is imported: notes what is read."""

    def __getitem__(self, key: str) -> str:  # get(), getenv() and ``in`` come here too
        _read_on_import.add(key)
        return super().__getitem__(key)

    def __iter__(self) -> Iterator[str]:  # keys(), items(), copy(), dict(os.environ)
        _read_on_import.add("*")
        return super().__iter__()


@contextlib.contextmanager
def _noting_reads() -> Iterator[None]:
    environ, usual = os.environ, type(os.environ)  # (restored even if an import replaced it)
    environ.__class__ = _Noting
    try:
        yield
    finally:
        environ.__class__ = usual


def read_on_import() -> frozenset[str]:
    """What the preload's imports read of the environment (`_read_on_import`)."""
    return frozenset(_read_on_import)


def warm_up(preload: tuple[str, ...], *, wrap: bool, attached: bool) -> None:
    """Before the first fork: import torch (`PRELOAD`); with ``wrap``, wrap the save and
    load functions (`_wrap_savers`) before ``preload`` is imported; then put everything
    imported out of the collector's reach, so a child's first collections do not walk (and
    copy, page by page) the whole of torch."""
    before = dict(os.environ)
    _import(PRELOAD)
    if wrap:
        _wrap_savers(attached=attached)
    with _noting_reads():
        _import(preload)
    _set_on_import.update({k: v for k, v in os.environ.items() if before.get(k) != v})
    os.environ.clear()
    os.environ.update(before)  # the environment requests are compared with
    gc.collect()
    gc.freeze()


def _exit_status(status: int) -> int:
    if os.WIFSIGNALED(status):
        return -os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def _send(fd: int, record: dict[str, Any]) -> None:
    data = (json.dumps(record) + "\n").encode()
    while data:
        data = data[os.write(fd, data) :]


def serve(path: list[str], preload: tuple[str, ...] = ()) -> None:
    """Preload, then fork a child per request until stdin closes (then kill the rest);
    ``path``: ``sys.path`` as the interpreter made it (before the driver's additions)."""
    inp, out = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)
    warm_up(preload, wrap=True, attached=AGENT in preload)
    children: dict[int, object] = {}
    selector = selectors.DefaultSelector()
    selector.register(inp, selectors.EVENT_READ)
    buffer = b""
    while True:
        ready = selector.select(timeout=0.05)
        _reap(children, out)
        if not ready:
            continue
        chunk = os.read(inp, 65536)
        if not chunk:
            break
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            request = json.loads(line)
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                selector.close()
                os.close(inp)
                os.close(out)
                _child(request, path)  # never returns
            children[pid] = request["id"]
            _send(out, {"id": request["id"], "pid": pid})
    for pid in children:  # the driver went away: nothing of ours outlives it
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)


def reaped() -> Iterator[tuple[int, int]]:
    """(pid, exit status as `_exit_status` says) of each child that has ended, reaped
    without waiting."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        yield pid, _exit_status(status)


def _reap(children: dict[int, object], out: int) -> None:
    for pid, code in reaped() if children else ():
        ident = children.pop(pid, None)
        if ident is not None:
            _send(out, {"id": ident, "exit": code})


def _child(request: dict[str, Any], path: list[str]) -> None:
    """Become the program of ``request``, its output to its log, and end as its
    interpreter would."""
    os.setsid()
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    become(request, path)


def become(request: dict[str, Any], path: list[str]) -> NoReturn:
    """In a forked child whose standard streams are set: become what ``python ARGV``
    (``request["argv"]``: the interpreter, then a script, ``-m MODULE`` or ``-c CODE``
    and its arguments) would be with ``request["env"]`` in ``request["cwd"]``, and end as
    its interpreter would, without taking apart what it was forked with
    (`harness.inside.ending`; never returns). ``path``: ``sys.path`` as this interpreter's
    start made it; rebuilt (`fresh_path`) when the request's PYTHONPATH is not its own,
    and the ``sitecustomize`` that start would have run imported then, not armed again."""
    forked_with, forked_finalizers = list(sys.modules), finalizers()
    pythonpath = request["env"].get("PYTHONPATH", "")
    rebuilt = pythonpath != os.environ.get("PYTHONPATH", "")
    os.environ.clear()
    os.environ.update(request["env"])
    os.environ.update(_set_on_import)
    if request.get("cwd"):
        os.chdir(request["cwd"])
    argv: list[str] = request["argv"][1:]
    sys.path[:] = fresh_path(pythonpath, path) if rebuilt else path
    _reseed()
    module = argv[1] if argv[0] == "-m" else None
    code = argv[1] if argv[0] == "-c" else None
    script = None if module or code is not None else argv[0]
    sys.argv = [argv[0], *argv[2:]] if module or code is not None else list(argv)
    if code is not None:
        sys.path[0] = ""
    else:
        sys.path[0] = os.getcwd() if module else os.path.dirname(os.path.abspath(argv[0]))
    # Its own __main__, held by sys.modules alone, as at a fresh start (the server's is
    # held by the server's frames, and would outlive the program's end).
    sys.modules["__main__"] = types.ModuleType("__main__")
    status, interrupted = 0, False
    try:
        _site_customize() if rebuilt else _arm()
        if module:
            import runpy

            if module == forked_torchrun.TORCHRUN:
                forked_torchrun.lighten()

            runpy._run_module_as_main(module, alter_argv=True)  # type: ignore[attr-defined]
        else:
            _run_script(script, code)
    except SystemExit as stop:
        status = status_of(stop.code)
    except BaseException as exc:  # an interpreter prints the traceback and exits 1
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
            tb = tb.tb_next
        exc = exc.with_traceback(tb)
        # As the interpreter does for the exception it exits on, before its hook: the
        # agent's end-of-run record reads the reason from sys.last_value.
        sys.last_type, sys.last_value, sys.last_traceback = type(exc), exc, tb
        sys.excepthook(type(exc), exc, tb)
        status, interrupted = 1, isinstance(exc, KeyboardInterrupt)
        del tb
    end(status, forked_with, interrupted=interrupted, forked_finalizers=forked_finalizers)


def pythonpath_folders(pythonpath: str, cwd: str) -> list[str]:
    """The folders a fresh interpreter started in ``cwd`` puts on its path for
    ``pythonpath``: each made absolute (an empty one is ``cwd``), each once."""
    if not pythonpath:
        return []
    folders = (os.path.abspath(os.path.join(cwd, p)) for p in pythonpath.split(os.pathsep))
    return list(dict.fromkeys(folders))


def fresh_path(pythonpath: str, path: list[str]) -> list[str]:
    """``sys.path`` as a fresh interpreter run with ``pythonpath`` in the working folder
    would make it, from ``path``, that of one run without PYTHONPATH: its folders
    (`pythonpath_folders`) after the script's entry and before the rest."""
    added = pythonpath_folders(pythonpath, os.getcwd())
    return [path[0], *added, *(p for p in path[1:] if p not in added)]


def _site_customize() -> None:
    """As ``site`` does at a start: import the first ``sitecustomize`` on the path (the
    agent's bootstrap arms itself when imported)."""
    try:
        import sitecustomize  # type: ignore[import-not-found]  # noqa: F401
    except ImportError as exc:
        if exc.name != "sitecustomize":
            raise


def _reseed() -> None:
    numpy: Any = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()


def _arm() -> None:
    """What the bootstrap's ``sitecustomize`` does at a fresh start, under the run's env."""
    site = sys.modules.get("sitecustomize")
    arm = getattr(site, "arm", None)
    if arm is not None:
        arm()


def _run_script(script: str | None, code: str | None = None) -> None:
    """Run ``script`` as ``__main__``, or ``code`` as ``python -c`` runs it."""
    import builtins
    import io
    from importlib.machinery import BuiltinImporter, SourceFileLoader

    main = sys.modules["__main__"]
    main.__dict__.clear()
    main.__dict__.update(__name__="__main__", __doc__=None, __package__=None, __spec__=None)
    main.__dict__.update(__builtins__=builtins)
    if script is None:
        assert code is not None
        main.__dict__.update(__loader__=BuiltinImporter)
        exec(compile(code, "<string>", "exec"), main.__dict__)
        return
    main.__dict__.update(__file__=script, __cached__=None)
    main.__dict__.update(__loader__=SourceFileLoader("__main__", script))
    with io.open_code(script) as f:
        compiled = compile(f.read(), script, "exec")
    exec(compiled, main.__dict__)
