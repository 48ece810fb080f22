"""The command line's tables: whole cells in a pipe (plain aligned text), rich on a terminal."""

from __future__ import annotations

import io
import os
import pty
import select
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console
from rich.text import Text

from harness.suites.suite_loader import load_suite
from harness.tables import Column, command_console, plain_table, print_table

ROOT = Path(__file__).resolve().parents[1]
CORE = "scenarios/core.yaml"
LIST = [sys.executable, "-m", "harness.commands.main", "list", CORE]
# A terminal or a pipe 80 columns wide, and no hint from the test runner's own terminal.
ENV = {**os.environ, "COLUMNS": "80", "LINES": "24", "TERM": "xterm"}
for name in ("FORCE_COLOR", "NO_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE"):
    ENV.pop(name, None)


def _rows(text: str) -> dict[str, str]:
    """Each scenario's line of a plain listing, by the scenario's name (its first word)."""
    lines = text.splitlines()[3:]
    return {line.split()[0]: line for line in lines if line.strip()}


def test_a_piped_listing_keeps_every_cell_whole() -> None:
    out = subprocess.run(LIST, cwd=ROOT, env=ENV, capture_output=True, text=True, check=True)
    suite = load_suite(ROOT / CORE)
    rows = _rows(out.stdout)
    assert set(rows) == {s.name for s in suite.scenarios}
    for s in suite.scenarios:
        line = rows[s.name]
        assert ", ".join(s.expect.checks()) in line, line
        assert f"{s.trainer.steps} steps" in line, line
    header, rule = out.stdout.splitlines()[1:3]
    assert header.split() == ["scenario", "class", "faults", "checks", "trainer", "weight"]
    assert set(rule) <= {"-", " "}
    assert not any(ch in out.stdout for ch in "┃━│┏")


def test_rich_at_80_columns_would_fold_the_same_listing() -> None:
    """The negative control: the table rich draws for a terminal 80 columns wide cuts the
    checks apart, so the test above can tell plain text from a rich table."""
    suite = load_suite(ROOT / CORE)
    console = Console(file=io.StringIO(), width=80, force_terminal=True, color_system=None)
    rows = [[s.name, ", ".join(s.expect.checks())] for s in suite.scenarios]
    print_table(console, "t", ["scenario", Column("checks", wrap=True)], rows)
    drawn = console.file.getvalue()  # type: ignore[attr-defined]
    assert "┃" in drawn or "│" in drawn
    assert not all(row[1] in drawn for row in rows)


def test_on_a_terminal_the_listing_is_a_rich_table() -> None:
    leader, follower = pty.openpty()
    proc = subprocess.Popen(LIST, cwd=ROOT, env=ENV, stdout=follower, stderr=subprocess.PIPE)
    os.close(follower)
    chunks: list[bytes] = []
    while True:
        ready, _, _ = select.select([leader], [], [], 30)
        if not ready:
            break
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the child closed its end
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    assert proc.wait(timeout=30) == 0, proc.stderr.read() if proc.stderr else ""
    text = b"".join(chunks).decode()
    assert "┃" in text or "│" in text, text[:400]
    assert "nan-grad-rank0" in text


def test_plain_text_aligns_columns_and_shows_text_not_markup() -> None:
    text = plain_table(
        "title",
        ["name", Column("n", justify="right")],
        [["[red]a[/]", "1"], [Text("long-name", style="bold"), "100"]],
    )
    assert text.splitlines() == [
        "title",
        "name         n",
        "---------  ---",
        "[red]a[/]    1",
        "long-name  100",
    ]


def test_a_console_that_is_not_a_terminal_gets_plain_text() -> None:
    console = Console(file=io.StringIO(), width=20)
    print_table(console, "scores", ["scenario", "status"], [["a-very-long-scenario-name", "PASS"]])
    out = console.file.getvalue()  # type: ignore[attr-defined]
    assert "a-very-long-scenario-name  PASS" in out


def test_off_a_terminal_a_long_line_stays_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    line = "    final_loss_within: 0.31, expected <= 0.05: " + "the loss did not come back " * 6
    command_console().print(line, highlight=False)
    assert capsys.readouterr().out == line + "\n"
    wrapped = Console(file=io.StringIO(), width=80)  # rich's default: wrapped at 80
    wrapped.print(line, highlight=False)
    assert wrapped.file.getvalue().count("\n") > 1  # type: ignore[attr-defined]
