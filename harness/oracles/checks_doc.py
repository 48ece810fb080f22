"""The table of checks in docs/scenarios.md, written from the oracles' declarations
(``python -m harness.oracles.checks_doc`` rewrites it in place);
`tests/test_oracles_registry.py` keeps the checked-in table equal to what this writes."""

from __future__ import annotations

import sys
from pathlib import Path

from harness.oracles import ORACLES

#: The page that holds the table, from the repository's root.
PAGE = Path("docs") / "scenarios.md"
_HEAD = "| check | passes when | figure |\n"


def checks_table() -> str:
    """The table, one row per check in its order."""
    rows = [_HEAD.rstrip("\n"), "|---|---|---|"]
    for name, oracle in ORACLES.items():
        said = oracle.expectation
        rows.append(f"| {said.written(name)} | {said.passes_when} | {said.figure} |")
    return "\n".join(rows) + "\n"


def table_span(page: str) -> tuple[int, int]:
    """Where the table is in the text of the page: from its head to the blank line after."""
    start = page.index(_HEAD)
    return start, page.index("\n\n", start) + 1


def main(root: Path = Path()) -> int:
    """Rewrite the table of ``root``/docs/scenarios.md from the declarations."""
    path = root / PAGE
    page = path.read_text()
    start, end = table_span(page)
    path.write_text(page[:start] + checks_table() + page[end:])
    print(f"wrote the table of {len(ORACLES)} checks into {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
