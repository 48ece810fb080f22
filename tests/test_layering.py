"""The doors between the packages open one way: faults <- harness <- reference_trainer."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: What each package may not import.
FORBIDDEN = {"faults": ("harness", "reference_trainer"), "harness": ("reference_trainer",)}


def imports(path: Path) -> list[str]:
    """Every module ``path`` imports, at any depth of the file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.append(node.module)
    return found


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_no_import_goes_the_wrong_way(package: str) -> None:
    wrong = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in sorted((ROOT / package).rglob("*.py"))
        for name in imports(path)
        if name.split(".")[0] in FORBIDDEN[package]
    ]
    assert not wrong, wrong


def test_the_check_sees_a_wrong_way_import(tmp_path: Path) -> None:
    """Negative control: an import the wrong way is found."""
    module = tmp_path / "bad.py"
    module.write_text("def f():\n    from reference_trainer.train import train\n")
    assert imports(module) == ["reference_trainer.train"]
