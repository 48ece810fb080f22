"""Every file and function of the three packages fits in one sitting: no file over
`MAX_FILE_LINES` lines, no function over `MAX_FUNCTION_LINES` (counted with `ast`)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("faults", "harness", "reference_trainer")
MAX_FILE_LINES = 450
MAX_FUNCTION_LINES = 80


def oversized(package_dir: Path) -> list[str]:
    """Each file over the limit and each function over its limit, with its length."""
    found = []
    for path in sorted(package_dir.rglob("*.py")):
        text = path.read_text()
        name = path.relative_to(package_dir.parent)
        if (lines := text.count("\n")) > MAX_FILE_LINES:
            found.append(f"{name}: {lines} lines")
        for node in ast.walk(ast.parse(text, str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    found.append(f"{name}:{node.lineno} {node.name}: {length} lines")
    return found


@pytest.mark.parametrize("package", PACKAGES)
def test_every_file_and_function_fits_its_limit(package: str) -> None:
    assert oversized(ROOT / package) == []


def test_the_count_sees_a_long_function_and_a_long_file(tmp_path: Path) -> None:
    """Negative control."""
    package = tmp_path / "pkg"
    package.mkdir()
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
    (package / "long.py").write_text(f"def f():\n{body}")
    (package / "big.py").write_text("x = 1\n" * (MAX_FILE_LINES + 1))
    assert oversized(package) == [
        f"pkg/big.py: {MAX_FILE_LINES + 1} lines",
        f"pkg/long.py:1 f: {MAX_FUNCTION_LINES + 1} lines",
    ]
