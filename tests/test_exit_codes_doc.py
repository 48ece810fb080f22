"""The README's one table of exit codes names every command the parser has."""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.commands.main import build_parser

ROOT = Path(__file__).resolve().parents[1]


def test_every_command_is_in_the_exit_code_table() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("### Exit codes", 1)[1].split("\n### ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    named = " ".join(line.split(" | ", 1)[0] for line in rows)
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    missing = [c for c in sub.choices if f"`tightrope {c}" not in named and f"`{c}`" not in named]
    assert not missing, f"README.md's exit-code table lacks {missing}"
    assert "`python -m reference_trainer`" in named
