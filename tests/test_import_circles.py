"""No import circles inside a package: counted from the code's own imports (`ast`), deferred
and type-checking imports included, as `tests/test_layering.py` counts the doors between
packages. A room is a subpackage, or a module directly in the package; two rooms that import
each other are a circle too."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("faults", "harness", "reference_trainer")


def modules(package_dir: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package at ``package_dir``."""
    found = {}
    for path in package_dir.rglob("*.py"):
        parts = list(path.relative_to(package_dir.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imported(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The modules of ``known`` that module ``name`` (file ``path``) imports, at any depth of
    the file. ``from pkg import mod`` names the module ``pkg.mod``, not the package."""
    here = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = here.split(".")[: len(here.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            subs = {f"{base}.{alias.name}" for alias in node.names} & known.keys()
            found |= subs
            if len(subs) < len(node.names):
                found.add(base)
    return (found & known.keys()) - {name}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    found.append(sorted(group))
    return found


def graphs(package: str, root: Path = ROOT) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """The package's import graph between files, and between rooms."""
    known = modules(root / package)
    files = {name: imported(name, path, known) for name, path in known.items()}
    rooms: dict[str, set[str]] = {}
    for name, targets in files.items():
        room = ".".join(name.split(".")[:2])
        rooms.setdefault(room, set()).update(
            ".".join(t.split(".")[:2]) for t in targets if ".".join(t.split(".")[:2]) != room
        )
    return files, rooms


@pytest.mark.parametrize("package", PACKAGES)
def test_no_file_of_the_package_imports_itself_round_a_circle(package: str) -> None:
    files, _ = graphs(package)
    assert circles(files) == []


@pytest.mark.parametrize("package", PACKAGES)
def test_no_two_rooms_of_the_package_import_each_other(package: str) -> None:
    _, rooms = graphs(package)
    mutual = sorted(
        {tuple(sorted((a, b))) for a, bs in rooms.items() for b in bs if a in rooms.get(b, set())}
    )
    assert mutual == []


def test_the_count_sees_a_deferred_circle_and_a_pair_of_rooms(tmp_path: Path) -> None:
    """Negative control: a circle closed by an import inside a function, and two rooms that
    import each other through ``TYPE_CHECKING``, are both found."""
    pkg = tmp_path / "pkg"
    (pkg / "room").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg import b\n")
    (pkg / "b.py").write_text("def f():\n    from pkg.a import x\n")
    (pkg / "room" / "__init__.py").write_text("")
    (pkg / "room" / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.d import y\n"
    )
    (pkg / "d.py").write_text("from .room.c import z\n")
    files, rooms = graphs("pkg", tmp_path)
    assert circles(files) == [["pkg.a", "pkg.b"], ["pkg.d", "pkg.room.c"]]
    assert "pkg.room" in rooms["pkg.d"] and "pkg.d" in rooms["pkg.room"]
