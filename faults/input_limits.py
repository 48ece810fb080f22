"""Bounds on input someone else wrote: which files are read, how deep a document nests.

Every YAML or JSON document tightrope reads from a file it did not just write (a suite, a
plan, a sweep, a scorecard, a journal line, a live-control command) passes through here:

- `read_bytes` reads only a regular file, opened without blocking (a FIFO would stall the
  reader forever) and sized after opening (``fstat``: a symlink to ``/dev/zero`` has no
  size to check beforehand), at most ``max_bytes`` of it;
- `check_json_depth` and the YAML loader of `faults.yaml_input` refuse a document nested
  deeper than `MAX_DEPTH` before a recursive parser or walker meets it (500 brackets
  in a 1 KB file end every recursive walk in a `RecursionError`).

Each refusal is an `InputLimitError`: one line naming the file and the limit. It is also a
`ValueError`, so a reader that skips what it cannot parse (the journal's) skips it too.
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
from pathlib import Path
from typing import Any

from faults.errors import TightropeError

#: The deepest a document may nest (mappings and lists inside each other): far past any
#: file tightrope writes or reads (a scorecard nests 6 deep), far short of a recursion limit.
MAX_DEPTH = 64
#: A JSON string, escapes included: its brackets do not nest.
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKET = re.compile(r"[\[\]{}]")


class InputLimitError(TightropeError, ValueError):
    """A file or document was refused: not a regular file, too large, or nested too deep.
    The message names it and the limit."""


def read_bytes(
    path: str | os.PathLike[str],
    what: str,
    max_bytes: int | None,
    *,
    follow_symlinks: bool = True,
) -> bytes:
    """The bytes of ``path``, a regular file of at most ``max_bytes`` (None: any size).

    Opened with ``O_NONBLOCK`` (``O_NOFOLLOW`` too unless ``follow_symlinks``), then
    checked with ``fstat`` on what was opened, so neither a FIFO nor a link to a device
    can stall or flood the reader. `OSError` when it cannot be opened (its ``strerror``
    says why); `InputLimitError` when it is no regular file or too large."""
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    if not follow_symlinks:
        flags |= os.O_NOFOLLOW
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow_symlinks:
            raise InputLimitError(f"{path}: {what} is a symbolic link; not followed") from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise InputLimitError(f"{path}: {what} is not a regular file ({_file_type(info)})")
        if max_bytes is not None and info.st_size > max_bytes:
            raise InputLimitError(
                f"{path}: {what} of {info.st_size} bytes; at most {max_bytes} are read"
            )
        chunks, total = [], 0
        limit = max_bytes if max_bytes is not None else info.st_size
        while True:  # a file still being appended to is read to its end as of now
            chunk = os.read(fd, max(1 << 16, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if max_bytes is not None and total > max_bytes:
                raise InputLimitError(f"{path}: {what} grew past {max_bytes} bytes as it was read")
        return b"".join(chunks)
    finally:
        os.close(fd)


def _file_type(info: os.stat_result) -> str:
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(info.st_mode):
            return name
    return "not a plain file"


def json_depth(text: str) -> int:
    """How deep ``text``'s JSON nests (``[[1]]`` is 2), without parsing it: strings are
    dropped, then brackets counted."""
    depth = deepest = 0
    for match in _BRACKET.finditer(_JSON_STRING.sub("", text)):
        if match.group() in "[{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


def check_json_depth(text: str, where: str) -> None:
    """`InputLimitError` when ``text`` nests deeper than `MAX_DEPTH`."""
    if text.count("[") + text.count("{") <= MAX_DEPTH:
        return  # it cannot nest deeper: the common case costs two scans in C
    depth = json_depth(text)
    if depth > MAX_DEPTH:
        raise InputLimitError(
            f"{where}: nested {depth} levels deep; at most {MAX_DEPTH} are read (refused)"
        )


def load_json(text: str | bytes, where: str) -> Any:
    """``json.loads`` of a document nested at most `MAX_DEPTH` deep; a `ValueError` (an
    `InputLimitError` for the depth) names ``where``."""
    if isinstance(text, bytes):
        text = text.decode("utf-8")
    check_json_depth(text, where)
    return json.loads(text)


def read_json(path: Path, what: str, max_bytes: int | None) -> Any:
    """A JSON file read with `read_bytes` and `load_json`."""
    return load_json(read_bytes(path, what, max_bytes), str(path))
