"""Inside a job run by ``tightrope crashpoints``: count the file events under its run dir,
and kill it at one of them.

The bootstrap's ``sitecustomize`` (`harness.inside._bootstrap`) calls `arm_from_env` when
`ENV_LOG` is set, before the program's first line. Events come from two sources:

- Python's audit events: ``open`` for writing, ``os.rename`` (``os.replace`` is told apart
  by a wrapper of its own), ``os.remove``, ``os.mkdir``, ``os.rmdir``, ``shutil.rmtree``,
  ``shutil.copyfile``; a write through Python's ``open`` is counted by a wrapper of
  ``open`` instead, so its file can be torn at its close;
- the writers that write from native code and raise no audit event: ``torch.save`` and
  safetensors' ``save_file``, wrapped right after their modules are imported (outside the
  agent's own wrappers, so the agent still hashes what was saved whole).

Each event is one JSON line in this process's log (``LOG.rank-R``, outside the run dir):
its number, ``op``, path relative to the run dir, whether it can be torn, wall time. At the
point named by `ENV_AT` (``RANK:MODE:K:KEY``: the K-th event of that rank whose `event_key`
is the JSON ``KEY``, so that events of other files, whose number varies from run to run, as
two ranks racing to make a folder do, move nothing), the process kills itself with SIGKILL
before the event happens (``before``) or, for a torn event, once the writer finished,
after cutting the file to half its size (``torn``); the log's last line says so.

Standard library only: it is imported before the program imports anything. Paths named in
`ENV_IGNORE` (tightrope's own files: the journal, the lock, ...) are not counted. A forked
child (a data loader worker) counts nothing.
"""

from __future__ import annotations

import atexit
import builtins
import importlib.util
import io
import json
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from importlib.abc import MetaPathFinder
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

ENV_LOG = "TIGHTROPE_CRASH_LOG"
ENV_WATCH = "TIGHTROPE_CRASH_WATCH"
ENV_AT = "TIGHTROPE_CRASH_AT"
ENV_IGNORE = "TIGHTROPE_CRASH_IGNORE"
ENV_RANKS = "TIGHTROPE_CRASH_RANKS"

#: Audit events that change the file tree, and the op each is logged as.
_AUDITED = {
    "os.rename": "rename",
    "os.remove": "remove",
    "os.mkdir": "mkdir",
    "os.rmdir": "rmdir",
    "shutil.rmtree": "rmtree",
    "shutil.copyfile": "copyfile",
}
_TWO_PATHS = {"os.rename", "shutil.copyfile"}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


class _State:
    def __init__(self) -> None:
        self.watch = ""
        self.ignore: tuple[str, ...] = ()
        self.fd: int | None = None
        self.n = 0
        self.at: tuple[str, str, str | None] | None = None
        self.occurrence = 0
        self.seen: dict[tuple[str, str, str | None], int] = {}
        self.mode = "before"
        self.pid = -1
        self.lock = threading.Lock()
        self.local = threading.local()


_state = _State()


def log_path(base: str, rank: int) -> str:
    """The event log of ``rank`` beside ``base``."""
    return f"{base}.rank-{rank}"


def event_key(op: str, path: str, to: str | None) -> tuple[str, str, str | None]:
    """What names an event alike in two runs: its op and paths, a temporary file named
    after its process (``tokenizer.tmp27184``) matching whatever the pid."""

    def unpid(p: str) -> str:
        return re.sub(r"(tmp)\d+", r"\1*", p)

    return (op, unpid(path), None if to is None else unpid(to))


def point_spec(rank: int, mode: str, occurrence: int, key: tuple[str, str, str | None]) -> str:
    """The `ENV_AT` value of a point: ``rank`` dies at the ``occurrence``-th event ``key``."""
    return f"{rank}:{mode}:{occurrence}:{json.dumps(list(key))}"


def _relative(path: object) -> str | None:
    """``path`` relative to the run dir, or None when outside it or ignored."""
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    if not isinstance(path, (str, os.PathLike)) or not _state.watch:  # not armed yet
        return None
    where = os.path.abspath(os.fspath(path))
    if where != _state.watch and not where.startswith(_state.watch + os.sep):
        return None
    rel = os.path.relpath(where, _state.watch)
    if any(rel == i or rel.startswith(i + os.sep) for i in _state.ignore):
        return None
    return rel


def _write(record: dict[str, Any]) -> None:
    if _state.fd is not None:  # os.write raises no audit event
        os.write(_state.fd, (json.dumps(record) + "\n").encode())


def _kill() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _event(op: str, rel: str, *, tornable: bool, to: str | None = None) -> bool:
    """Count one event; kill the process here when it is the point (``before``). Returns
    True when the caller must tear the file once written, then call `_tear`."""
    if os.getpid() != _state.pid:
        return False
    key = event_key(op, rel, to)
    with _state.lock:
        _state.n += 1
        n = _state.n
        count = _state.seen[key] = _state.seen.get(key, 0) + 1
        record: dict[str, Any] = {"n": n, "op": op, "path": rel, "tornable": tornable}
        if to is not None:
            record["to"] = to
        record["wall"] = time.time()
        _write(record)
    if _state.at != key or _state.occurrence != count:
        return False
    if _state.mode == "torn" and tornable:
        return True
    _write({"killed": n, "mode": "before", "wall": time.time()})
    _kill()
    return False  # not reached


def _tear(path: str) -> None:
    """Cut ``path`` to half its size, say so, and die."""
    whole = os.path.getsize(path)
    os.truncate(path, whole // 2)
    _write(
        {
            "killed": _state.n,
            "mode": "torn",
            "whole_bytes": whole,
            "torn_bytes": os.path.getsize(path),
            "wall": time.time(),
        }
    )
    _kill()


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if _state.fd is None or (event != "open" and event not in _AUDITED):
        return
    try:
        _audited(event, args)
    except Exception:  # an audit hook that raises would break the job's own call
        return


def _audited(event: str, args: tuple[Any, ...]) -> None:
    if event == "open":
        path, mode, flags = args
        if isinstance(mode, str):
            if not any(c in mode for c in "wax+"):
                return
        elif not (isinstance(flags, int) and flags & _WRITE_FLAGS):
            return
        rel = _relative(path)
        if rel is None:
            return
        if getattr(_state.local, "counted", None) == rel:  # the open() wrapper counted it
            _state.local.counted = None
            return
        _event("open", rel, tornable=False)
        return
    if event in _TWO_PATHS:
        src, dst = _relative(args[0]), _relative(args[1])
        if src is None and dst is None:
            return
        op = _AUDITED[event]
        if op == "rename" and getattr(_state.local, "replacing", False):
            op = "replace"
        _event(op, src if src is not None else dst or "", tornable=False, to=dst)
        return
    rel = _relative(args[0])
    if rel is not None:
        _event(_AUDITED[event], rel, tornable=False)


class _TornFile:
    """A file opened for writing at the torn point: at its close, cut it to half and die."""

    def __init__(self, f: Any, path: str) -> None:
        object.__setattr__(self, "_f", f)
        object.__setattr__(self, "_path", path)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._f, name)

    def __iter__(self) -> Any:
        return iter(self._f)

    def __enter__(self) -> _TornFile:
        self._f.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._f.close()
        _tear(self._path)


def _wrap_open(original: Callable[..., Any]) -> Callable[..., Any]:
    def open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        writes = isinstance(mode, str) and any(c in mode for c in "wax+")
        rel = _relative(file) if writes and not isinstance(file, int) else None
        if rel is None or os.getpid() != _state.pid:
            return original(file, mode, *args, **kwargs)
        tear = _event("open", rel, tornable=True)
        _state.local.counted = rel
        try:
            f = original(file, mode, *args, **kwargs)
        finally:
            _state.local.counted = None
        return _TornFile(f, os.fspath(file)) if tear else f

    open._tightrope_crash = True  # type: ignore[attr-defined]
    return open


def _wrap_replace(original: Callable[..., Any]) -> Callable[..., Any]:
    def replace(*args: Any, **kwargs: Any) -> Any:
        _state.local.replacing = True
        try:
            return original(*args, **kwargs)
        finally:
            _state.local.replacing = False

    return replace


def _wrap_writer(original: Callable[..., Any], op: str, position: int, keyword: str) -> Any:
    def save(*args: Any, **kwargs: Any) -> Any:
        where = args[position] if len(args) > position else kwargs.get(keyword)
        rel = _relative(where) if isinstance(where, (str, os.PathLike)) else None
        if rel is None:
            return original(*args, **kwargs)
        tear = _event(op, rel, tornable=True)
        result = original(*args, **kwargs)
        if tear:
            _tear(os.fspath(where))  # type: ignore[arg-type]
        return result

    save._tightrope_crash = True  # type: ignore[attr-defined]
    return save


def wrap_writers() -> None:
    """Wrap torch.save and safetensors' save_file, where loaded and not yet wrapped; until
    `arm_from_env`, the wrappers count nothing and pass straight through."""
    torch: Any = sys.modules.get("torch")
    if torch is not None and not getattr(torch.save, "_tightrope_crash", False):
        save = _wrap_writer(torch.save, "torch.save", 1, "f")
        torch.save = save
        serialization: Any = sys.modules.get("torch.serialization")
        if serialization is not None:
            serialization.save = save
    st: Any = sys.modules.get("safetensors.torch")
    if st is not None and not getattr(st.save_file, "_tightrope_crash", False):
        st.save_file = _wrap_writer(st.save_file, "safetensors.save_file", 1, "filename")


class _AfterImport(MetaPathFinder):
    """Finds nothing itself; wraps the writers once torch or safetensors.torch loaded."""

    names = ("torch", "safetensors.torch")

    def __init__(self) -> None:
        self.busy: set[str] = set()

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname not in self.names or fullname in self.busy:
            return None
        self.busy.add(fullname)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self.busy.discard(fullname)
        if spec is None or spec.loader is None:
            return spec
        load = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            load(module)
            wrap_writers()

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def arm_from_env() -> None:
    """Start counting (and, at the point, killing) in this process, as the environment
    says; does nothing in a launcher process of a job of several ranks (no ``RANK``)."""
    base = os.environ.get(ENV_LOG)
    if not base or _state.fd is not None:
        return
    if int(os.environ.get(ENV_RANKS, "1")) > 1 and "RANK" not in os.environ:
        return  # torchrun itself: its workers count
    rank = int(os.environ.get("RANK", "0"))
    _state.watch = os.path.abspath(os.environ[ENV_WATCH])
    _state.ignore = tuple(p for p in os.environ.get(ENV_IGNORE, "").split(os.pathsep) if p)
    at = os.environ.get(ENV_AT)
    if at:
        who, mode, occurrence, key = at.split(":", 3)
        if int(who) == rank:
            op, path, to = json.loads(key)
            _state.at, _state.occurrence, _state.mode = (op, path, to), int(occurrence), mode
    _state.pid = os.getpid()
    _state.fd = os.open(log_path(base, rank), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    wrapper = _wrap_open(builtins.open)
    builtins.open = wrapper
    io.open = wrapper
    os.replace = _wrap_replace(os.replace)
    wrap_writers()
    sys.meta_path.insert(0, _AfterImport())
    sys.addaudithook(_audit)
    if _state.at is None:
        atexit.register(_log_modules)


def installed(where: str) -> bool:
    """``where`` (a module's file or folder) is of an installed package: in site- or
    dist-packages, not the standard library's nor the program's own."""
    return f"-packages{os.sep}" in where


def _log_modules() -> None:
    """A recording run's last line: the installed modules it imported, in order (what a
    zygote may import once for the runs that follow: `harness.inside.zygote`)."""
    if os.getpid() != _state.pid:
        return
    names = []
    for name, module in list(sys.modules.items()):
        where = getattr(module, "__file__", None)
        if isinstance(where, str) and installed(where):
            names.append(name)
    _write({"modules": names})
