"""The reference trainer's component rooms keep one-way doors: no room imports the run's
configuration back (`reference_trainer/config.py` composes the configs that sit beside each
component), and no two rooms import each other."""

from __future__ import annotations

import ast
from itertools import combinations
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: The rooms the model and its data live in, each one concern.
ROOMS = ("model", "corpus", "tokenizer", "stages", "stream")


def room_imports(room: Path) -> set[str]:
    """Every `reference_trainer` module the files of ``room`` import, at any depth of a file
    (deferred and type-checking imports too); ``from A import B`` counts as A and A.B."""
    found = set()
    for path in sorted(room.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return {name for name in found if name.split(".")[0] == "reference_trainer"}


def rooms_named(modules: set[str]) -> set[str]:
    """The rooms among ``modules`` (``reference_trainer.ROOM...``)."""
    parts = (name.split(".") for name in modules)
    return {p[1] for p in parts if len(p) > 1 and p[1] in ROOMS}


def mutual_pairs(doors: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Pairs of rooms each of which imports the other."""
    return [(a, b) for a, b in combinations(sorted(doors), 2) if b in doors[a] and a in doors[b]]


@pytest.mark.parametrize("room", ROOMS)
def test_no_room_imports_the_run_configuration(room: str) -> None:
    assert "reference_trainer.config" not in room_imports(ROOT / "reference_trainer" / room)


def test_no_two_rooms_import_each_other() -> None:
    doors = {room: rooms_named(room_imports(ROOT / "reference_trainer" / room)) for room in ROOMS}
    assert mutual_pairs(doors) == []


def test_the_check_sees_two_rooms_that_import_each_other(tmp_path: Path) -> None:
    """Negative control: a door each way between two rooms is found."""
    for room, other in (("corpus", "stream"), ("stream", "corpus")):
        (tmp_path / room).mkdir()
        source = f"def f():\n    from reference_trainer import {other}\n"
        (tmp_path / room / "a.py").write_text(source)
    doors = {room: rooms_named(room_imports(tmp_path / room)) for room in ("corpus", "stream")}
    assert mutual_pairs(doors) == [("corpus", "stream")]
