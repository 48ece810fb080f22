"""Two lanes for ``make test`` (pytest-xdist, two workers): the tests that start several
ranks or containers, or judge wall-clock seconds, run one at a time in one worker while the
other worker takes the rest. Two multi-rank jobs at once would share 2 cores four ways, and a
recovery's seconds would measure the contention rather than the trainer.

The lanes are ``xdist_group`` marks, as xdist's ``--dist loadgroup`` reads them. Its own
scheduler finds a test's group in a suffix that its workers write into the node id, which
this pytest's node ids no longer take; so the workers write each test's group to a file
instead (`record_groups`), and `GroupScheduling` reads it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from xdist.scheduler import LoadScopeScheduling

#: The lane of the tests that run one at a time, first (it is the longest).
SERIAL_GROUP = "one-at-a-time"
#: The marks that put a test in it.
SERIAL_MARKS = ("distributed", "docker", "timed")
#: The file (set by the controller, inherited by its workers) of node id -> group.
GROUPS_FILE_ENV = "TIGHTROPE_TEST_GROUPS"


def is_serial(item: pytest.Item) -> bool:
    """True for a test with one of `SERIAL_MARKS`."""
    return any(item.get_closest_marker(name) for name in SERIAL_MARKS)


def assign_groups(items: list[pytest.Item]) -> None:
    """Mark each test's group: `SERIAL_GROUP`, else its module (so a module-scoped fixture
    is built in one worker only); the serial tests first, then the modules with the most
    ``slow`` tests (the scheduler hands groups out in this order: the longest first leaves
    short ones to even out the two workers' ends)."""
    slow: dict[str, int] = {}
    for item in items:
        group = SERIAL_GROUP if is_serial(item) else item.path.name
        item.add_marker(pytest.mark.xdist_group(group))
        if item.get_closest_marker("slow"):
            slow[group] = slow.get(group, 0) + 1

    # Stable: each module's tests stay together and in their order.
    def order(item: pytest.Item) -> tuple[bool, int]:
        serial = is_serial(item)
        return (not serial, 0 if serial else -slow.get(item.path.name, 0))

    items.sort(key=order)


def record_groups(items: list[pytest.Item]) -> None:
    """In a worker: write every test's ``xdist_group`` to the controller's file (each worker
    writes the same map, atomically)."""
    path = os.environ.get(GROUPS_FILE_ENV)
    if not path:
        return
    groups = {}
    for item in items:
        mark = item.get_closest_marker("xdist_group")
        if mark is not None:
            groups[item.nodeid] = str(mark.args[0] if mark.args else mark.kwargs["name"])
    tmp = Path(f"{path}.{os.getpid()}")
    tmp.write_text(json.dumps(groups))
    os.replace(tmp, path)


class GroupScheduling(LoadScopeScheduling):
    """xdist's scope scheduling with a test's group as its scope (ungrouped: itself)."""

    _groups: dict[str, str] | None = None

    def _split_scope(self, nodeid: str) -> str:
        if self._groups is None:  # first called once every worker has collected
            self._groups = json.loads(Path(os.environ[GROUPS_FILE_ENV]).read_text())
        return self._groups.get(nodeid, nodeid)
