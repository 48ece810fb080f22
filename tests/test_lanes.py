"""The two lanes of ``make test`` (tests/lanes.py): the multi-rank, container and timed tests
share one xdist group that runs first; every other test is grouped with its module."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import lanes

pytest_plugins = ["pytester"]

MODULE = """
import pytest

def test_plain():
    pass

@pytest.mark.distributed
def test_ranks():
    pass

def test_plain_too():
    pass

@pytest.mark.timed
def test_seconds():
    pass

@pytest.mark.docker
def test_containers():
    pass
"""


def test_serial_tests_share_one_group_that_comes_first(
    pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    items = pytester.getitems(MODULE)
    lanes.assign_groups(items)
    assert [item.name for item in items] == [
        "test_ranks", "test_seconds", "test_containers", "test_plain", "test_plain_too",
    ]  # fmt: skip

    # What a worker writes down is what the controller's scheduler groups by.
    monkeypatch.setenv(lanes.GROUPS_FILE_ENV, str(tmp_path / "groups.json"))
    lanes.record_groups(items)
    scheduler = lanes.GroupScheduling(
        pytester.parseconfigure("--tx", "2*popen", "--dist", "loadgroup")
    )
    scopes = {item.name: scheduler._split_scope(item.nodeid) for item in items}
    module = items[-1].path.name
    assert scopes == {
        "test_ranks": lanes.SERIAL_GROUP,
        "test_seconds": lanes.SERIAL_GROUP,
        "test_containers": lanes.SERIAL_GROUP,
        "test_plain": module,
        "test_plain_too": module,
    }


def test_modules_with_more_slow_tests_are_handed_out_first(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_a="def test_quick():\n    pass\n",
        test_b=(
            "import pytest\n\n@pytest.mark.slow\ndef test_long():\n    pass\n\n"
            "def test_short():\n    pass\n"
        ),
    )
    items, _ = pytester.inline_genitems()
    lanes.assign_groups(items)
    assert [item.name for item in items] == ["test_long", "test_short", "test_quick"]
