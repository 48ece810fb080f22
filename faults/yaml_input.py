"""Reading a YAML file someone else wrote (a suite, a fault plan), within limits.

``yaml.safe_load`` never runs code, but a few hundred bytes of nested aliases expand into
gigabytes once anything walks the result, a huge file ends in a `MemoryError`, and bytes
that are not UTF-8 end in a `UnicodeDecodeError`. Each of these is refused here with a
message that names the file and the limit.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

#: The largest suite or plan read, in bytes.
MAX_BYTES = 1 << 20
#: The most values (mappings, lists, scalars) a document may hold once aliases are
#: expanded: far past any real suite, far short of an alias bomb.
MAX_VALUES = 200_000


class YamlInputError(ValueError):
    """A YAML file was refused; the message names the file and why."""


def read_text(path: Path, what: str) -> str:
    """The file's text: at most `MAX_BYTES`, UTF-8."""
    size = path.stat().st_size
    if size > MAX_BYTES:
        raise YamlInputError(f"{path}: {what} of {size} bytes; at most {MAX_BYTES} are read")
    data = path.read_bytes()[: MAX_BYTES + 1]
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise YamlInputError(f"{path}:{line}: {what} is not UTF-8 text ({exc.reason})") from None


def load(text: str, where: str) -> Any:
    """``yaml.safe_load`` of ``text``, refused when aliases make it expand past
    `MAX_VALUES` values."""
    data = yaml.safe_load(text)
    count_values(data, where)
    return data


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
