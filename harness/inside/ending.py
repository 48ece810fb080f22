"""How a program forked from a warm interpreter (`harness.inside.zygote.become`) ends: as a
fresh ``python`` running it would have ended, less taking apart what it was forked with.

An interpreter's exit waits for its threads, runs the atexit functions, flushes its streams
and then takes every module apart. After a fork, taking torch's modules apart (the program
did not import them) writes to each of their pages (reference counts), so the kernel copies
each page: a forked program that does nothing took 0.46 s of CPU on a 2-core machine,
0.11 s ending so. The program ends instead with what it can see of that end, in the order
of CPython 3.11's (``Py_FinalizeEx``):

1. a ``SystemExit`` whose code is not a number printed to stderr (exit status 1);
2. its threads waited for (``threading._shutdown``), then its atexit functions run, and
   the standard streams flushed;
3. the modules it imported itself, and ``__main__``, taken apart as the interpreter does
   (`_take_apart`): ``sys.argv``, ``sys.path`` and the rest set to None, the builtins as
   they were at the start (no ``open``), a collection (finalizers first: an object's
   ``__del__`` sees its module's globals), then the globals of what is still held set to
   None; every file left open for writing flushed first;
4. Python's and C's output streams flushed, and ``os._exit`` with the program's status;
   a program that ended on an unhandled KeyboardInterrupt kills itself with SIGINT, as
   Python does.

What it skips, which a fresh interpreter would have done: the ``__del__`` of the program's
objects that only the modules it was forked with hold (torch's registries), the clearing of
those modules' own globals, the C++ destructors of static objects, and the
``weakref.finalize`` callbacks of objects made before the fork: torch's operator libraries,
each taking its kernels out of the dispatcher (17% of py-spy's samples of ten forked
one-step training runs, server included; every other finalizer, the program's, runs).
tests/test_warm_start.py compares the two ends (threads, atexit, ``__del__``, files, C's
output, exit status and message).

Standard library only.
"""

from __future__ import annotations

import _io
import atexit
import builtins
import contextlib
import ctypes
import gc
import io
import os
import signal
import sys
import weakref
from collections.abc import Iterable
from types import ModuleType
from typing import NoReturn

#: What ``builtins`` held when this interpreter started (this module is imported before
#: the preload), less what CPython 3.11 adds after it copies the builtins at its start (its
#: end restores that copy before taking the modules apart: a ``__del__`` then finds no
#: ``open``).
_BUILTINS = {
    k: v
    for k, v in vars(builtins).items()
    if k not in ("open", "help", "exit", "quit", "copyright", "credits", "license", "_")
}


#: This process's C library (its ``fflush``; loaded before the fork).
_LIBC = ctypes.CDLL(None)

#: What of ``sys`` CPython 3.11's end sets to None before it takes the modules apart.
_SYS_DROPPED = (
    "path",
    "argv",
    "ps1",
    "ps2",
    "last_type",
    "last_value",
    "last_traceback",
    "path_hooks",
    "path_importer_cache",
    "meta_path",
    "__interactivehook__",
)


def status_of(code: object) -> int:
    """The exit status of ``SystemExit(code)``, as the interpreter makes it (a code that is
    neither a number nor None is printed to stderr first, and the status is 1)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    with contextlib.suppress(Exception):
        print(code, file=sys.stderr)
    return 1


def finalizers() -> list[weakref.finalize[..., object]]:
    """The ``weakref.finalize`` objects alive now (those the interpreter would call at its
    exit); read at the fork, so that the program's end leaves them alone."""
    # CPython keeps them in a class-level registry; it has no public way to list them.
    return list(getattr(weakref.finalize, "_registry", {}))


def end(
    status: int,
    forked_with: Iterable[str],
    *,
    interrupted: bool = False,
    forked_finalizers: Iterable[weakref.finalize[..., object]] = (),
) -> NoReturn:
    """End this process as its interpreter would after its program, with ``status``
    (see the module); ``forked_with``: the names in ``sys.modules`` when it was forked;
    ``forked_finalizers``: the `finalizers` then."""
    try:
        threading = sys.modules.get("threading")
        if threading is not None:
            with contextlib.suppress(Exception):
                threading._shutdown()
        for finalizer in forked_finalizers:
            # The server's (torch's operator libraries), not the program's: not called at
            # the exit, and not let go either (what they hold would be freed, just as slowly)
            finalizer.atexit = False
        atexit._run_exitfuncs()
        _flush()
        _take_apart(set(forked_with))
        _flush()
        if interrupted:
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
    finally:
        os._exit(status)  # whatever happened above: never back into the server's code


def _take_apart(forked_with: set[str]) -> None:
    """What the interpreter's end does to the modules, for those the program imported and
    ``__main__``: out of ``sys.modules``, the builtins as they were at the start, a
    collection (what nothing else holds is freed, its finalizers run first), then the
    globals of those still held set to None, newest first (those starting with one
    underscore first), and a last collection."""
    for name in _SYS_DROPPED:
        setattr(sys, name, None)
    sys.stdin, sys.stdout, sys.stderr = sys.__stdin__, sys.__stdout__, sys.__stderr__
    # __main__ (the program's own, in place of the server's) and what the program imported
    names = ["__main__", *(n for n in sys.modules if n not in forked_with)]
    held: list[weakref.ref[ModuleType]] = []
    for name in names:
        module = sys.modules.pop(name, None)
        if isinstance(module, ModuleType):
            held.append(weakref.ref(module))
        del module
    namespace = vars(builtins)
    namespace.clear()
    namespace.update(_BUILTINS)
    _flush_files()
    gc.collect()
    for ref in reversed(held):  # __main__ last
        module = ref()
        if module is not None:
            _clear(module.__dict__)
        del module
    gc.collect()


def _clear(namespace: dict[str, object]) -> None:
    """As CPython clears a module's dict at its end: names with one leading underscore
    first, then every other name but ``__builtins__``."""
    for single in (True, False):
        for key in list(namespace):
            if key == "__builtins__" or namespace.get(key) is None:
                continue
            if not single or (key.startswith("_") and not key.startswith("__")):
                with contextlib.suppress(Exception):
                    namespace[key] = None


def _flush_files() -> None:
    """Flush every file the program left open for writing: an interpreter's end flushes
    them as it frees them, but a collection frees a file in a cycle in no set order (its
    buffer may be closed first, and what it held lost). (The C base class of every file
    object is tested: ``io.IOBase`` is an ABC, whose test of each of the process's objects
    took 7% of py-spy's samples of a forked one-step run.)"""
    for obj in gc.get_objects():
        if isinstance(obj, _io._IOBase) and not isinstance(obj, io.RawIOBase):
            with contextlib.suppress(Exception):
                if not obj.closed and obj.writable():
                    obj.flush()


def _flush() -> None:
    """Flush Python's standard streams and every C stream (``exit`` would have)."""
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        with contextlib.suppress(Exception):
            if stream is not None:
                stream.flush()
    with contextlib.suppress(Exception):
        _LIBC.fflush(None)
