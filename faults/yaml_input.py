"""Reading a YAML file someone else wrote (a suite, a fault plan, a sweep), within limits.

``yaml.safe_load`` never runs code, but a few hundred bytes of nested aliases expand into
gigabytes once anything walks the result, a few hundred nested brackets end PyYAML's
recursive composer (and every later walk) in a `RecursionError`, a huge file ends in a
`MemoryError`, a FIFO or a link to ``/dev/zero`` never ends, and bytes that are not UTF-8
end in a `UnicodeDecodeError`. Each of these is refused here with a message that names
the file and the limit (`faults.input_limits` holds the limits shared with JSON).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from faults.input_limits import MAX_DEPTH, InputLimitError, read_bytes

#: The largest suite or plan read, in bytes.
MAX_BYTES = 1 << 20
#: The most values (mappings, lists, scalars) a document may hold once aliases are
#: expanded: far past any real suite, far short of an alias bomb.
MAX_VALUES = 200_000


class YamlInputError(InputLimitError):
    """A YAML file was refused; the message names the file and why."""


def read_text(path: Path, what: str) -> str:
    """The file's text: a regular file of at most `MAX_BYTES`, UTF-8."""
    try:
        data = read_bytes(path, what, MAX_BYTES)
    except YamlInputError:
        raise
    except InputLimitError as exc:
        raise YamlInputError(str(exc)) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise YamlInputError(f"{path}:{line}: {what} is not UTF-8 text ({exc.reason})") from None


class _BoundedLoader(yaml.SafeLoader):
    """``SafeLoader`` whose composer refuses a collection nested past `MAX_DEPTH` before
    descending into it (PyYAML's parser keeps its own stack; only the composer recurses)."""

    where = "<text>"

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        """The next node, counted when it opens a list or mapping."""
        nests = self.check_event(yaml.SequenceStartEvent, yaml.MappingStartEvent)
        if nests:
            self._depth += 1
            if self._depth > MAX_DEPTH:
                line = self.peek_event().start_mark.line + 1  # type: ignore[no-untyped-call]
                raise YamlInputError(
                    f"{self.where}:{line}: nested more than {MAX_DEPTH} levels deep; refused"
                )
        try:
            return super().compose_node(parent, index)
        finally:
            if nests:
                self._depth -= 1


def _loader(text: str, where: str) -> _BoundedLoader:
    loader = _BoundedLoader(text)
    loader.where = where
    return loader


def load(text: str, where: str) -> Any:
    """``yaml.safe_load`` of ``text``, refused when it nests past `MAX_DEPTH` or aliases
    make it expand past `MAX_VALUES` values."""
    loader = _loader(text, where)
    try:
        data = loader.get_single_data()
    finally:
        loader.dispose()
    count_values(data, where)
    return data


def compose(text: str, where: str) -> yaml.Node | None:
    """``yaml.compose`` of ``text`` (its nodes carry line numbers), bounded as `load`."""
    loader = _loader(text, where)
    try:
        node: yaml.Node | None = loader.get_single_node()
        return node
    finally:
        loader.dispose()


def count_values(data: Any, where: str) -> int:
    """How many values ``data`` holds with every alias expanded; `YamlInputError` past
    `MAX_VALUES` (counted without expanding anything in memory)."""
    total = 0
    stack = [data]
    while stack:
        value = stack.pop()
        total += 1
        if total > MAX_VALUES:
            raise YamlInputError(
                f"{where}: more than {MAX_VALUES} values once its aliases are expanded; "
                "refused (an alias bomb?)"
            )
        if isinstance(value, dict):
            stack.extend(value.keys())
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    return total
