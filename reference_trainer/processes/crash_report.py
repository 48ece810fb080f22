"""Crash reports: what killed a rank, written down by the rank, journaled with the rank
blamed, and named in the restart that follows.

Two ways a rank dies on its own (a kill from outside is `rank_lost`'s):

- **An exception** reaches the top of the run: the rank journals ``detected``
  (``rank_crash``, or ``out_of_memory`` for ``torch.OutOfMemoryError`` and
  ``MemoryError``) with the exception's type and message, and ``rank_blamed`` for itself,
  before it exits. An exception that says a *peer* failed (the process group's
  connection closed, a collective's timeout) blames no one: the rank that raised first
  is the one to name.
- **A fatal signal** (SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL): no Python code runs
  after it, so each rank keeps ``faulthandler`` writing into a file of its own
  (`RunLayout.crash_file`); the handler writes its "Fatal Python error: ..." report and
  the tracebacks there before the process dies. After torchrun restarts the job, rank 0
  reads the reports of the attempt that failed and journals ``detected`` (``rank_crash``,
  with the signal) and ``rank_blamed`` for each rank that died so.

The restart's ``reason`` says it in words: which rank died, how, at which step.
"""

from __future__ import annotations

import contextlib
import faulthandler
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import torch

from harness.inside.agent import Agent
from harness.records.events import Claim, Detected, RankBlamed, Restart, RunEnd, StepObserved
from harness.records.journal import read_journal
from harness.run_layout import RunLayout

#: faulthandler's words for each fatal signal it reports, and the signal's name.
SIGNAL_WORDS = {
    "Segmentation fault": "SIGSEGV",
    "Aborted": "SIGABRT",
    "Bus error": "SIGBUS",
    "Floating-point exception": "SIGFPE",
    "Floating point exception": "SIGFPE",
    "Illegal instruction": "SIGILL",
}
#: What an exception says when it only reports that a peer of the process group failed.
PEER_WORDS = ("Connection closed by peer", "Connection reset by peer", "Broken pipe")


@dataclass(frozen=True, slots=True)
class Cause:
    """How one rank died: by an exception (its type) or a fatal signal (its name)."""

    rank: int
    step: int
    how: str  # "exception" or "signal"
    what: str  # the exception type, or the signal's name
    message: str = ""

    @property
    def detector(self) -> str:
        """``out_of_memory`` for an allocation failure, else ``rank_crash``."""
        oom = self.how == "exception" and self.what in ("OutOfMemoryError", "MemoryError")
        return "out_of_memory" if oom else "rank_crash"

    def words(self) -> str:
        """The cause in one line."""
        if self.how == "signal":
            return f"rank {self.rank} died by {self.what} after step {self.step}" + (
                f" ({self.message})" if self.message else ""
            )
        return f"rank {self.rank} raised {self.what} at step {self.step}: {self.message}"

    def claims(self) -> list[Claim]:
        """``detected`` with the figures, and ``rank_blamed`` for the rank."""
        details = {"rank": self.rank, "how": self.how, "cause": self.what}
        if self.message:
            details["message"] = self.message
        return [
            Detected(detector=self.detector, details=details),
            RankBlamed(blamed_rank=self.rank, detector=self.detector, reason=self.words()),
        ]


def peer_failure(exc: BaseException) -> bool:
    """True when ``exc`` only reports that another rank of the process group failed."""
    dist_errors = tuple(
        kind
        for name in ("DistBackendError", "DistNetworkError", "DistStoreError")
        if isinstance(kind := getattr(torch.distributed, name, None), type)
    )
    text = str(exc)
    return isinstance(exc, dist_errors) or any(words in text for words in PEER_WORDS)


def exception_cause(exc: BaseException, rank: int, step: int) -> Cause | None:
    """The cause an exception that ends a rank's run names; None for a peer's failure."""
    if peer_failure(exc):
        return None
    first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return Cause(rank, step, "exception", type(exc).__name__, first_line[:500])


def signal_of(report: str) -> str | None:
    """The fatal signal a faulthandler report names, or None."""
    for line in report.splitlines():
        if line.startswith("Fatal Python error: "):
            words = line.removeprefix("Fatal Python error: ").strip()
            return SIGNAL_WORDS.get(words, words)
    return None


def where(report: str) -> str:
    """The innermost Python frame of the thread that crashed, as faulthandler wrote it
    (``File "x.py", line 7 in f``); empty when the report has none."""
    lines = report.splitlines()
    for n, line in enumerate(lines):
        if line.startswith("Current thread"):
            frames = [f.strip() for f in lines[n + 1 :] if f.strip().startswith("File ")]
            return frames[0] if frames else ""
    return ""


class CrashReport:
    """One attempt of one rank: faulthandler writing into its crash file while it runs."""

    def __init__(self, run_dir: Path, rank: int, restart: int) -> None:
        self.path = RunLayout(run_dir).crash_file(rank, restart)
        self._file: IO[str] | None = None
        self._was_on = False

    def install(self) -> None:
        """Fatal signals are reported into the crash file from now on."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._was_on = faulthandler.is_enabled()  # (python -X faulthandler: to stderr)
        self._file = self.path.open("w")
        faulthandler.enable(file=self._file, all_threads=True)

    def uninstall(self) -> None:
        """The attempt ended without a fatal signal: no report is left behind, and a
        faulthandler that was on before writes to stderr again."""
        if self._file is None:
            return
        faulthandler.disable()
        if self._was_on:
            try:
                faulthandler.enable(all_threads=True)
            except (OSError, ValueError):  # a stderr with no file behind it (captured):
                if sys.__stderr__ is not None:  # the process's own, then
                    faulthandler.enable(file=sys.__stderr__, all_threads=True)
        self._file.close()
        self._file = None
        if self.path.exists() and self.path.stat().st_size == 0:
            self.path.unlink()


def signal_causes(run_dir: Path, attempt: int) -> list[Cause]:
    """The ranks of ``attempt`` that died by a fatal signal, from their crash files and
    the last step each journaled (a rank with a ``run_end`` in that attempt did not)."""
    layout = RunLayout(run_dir)
    events = [e for e in read_journal(run_dir, warn=False) if e.restart == attempt]
    ended = {e.rank for e in events if e.is_(RunEnd)}
    last: dict[int, int] = {}
    for e in events:
        if e.is_(StepObserved):
            last[e.rank] = max(last.get(e.rank, 0), e.step)
    causes = []
    for path in sorted(layout.crashes.glob(f"rank-*-restart-{attempt}.txt")):
        rank = int(path.name.split("-")[1])
        try:
            report = path.read_text(errors="replace")
        except OSError:
            continue
        sig = signal_of(report)
        if sig is not None and rank not in ended:
            causes.append(Cause(rank, last.get(rank, 0), "signal", sig, where(report)))
    return causes


def exception_causes(run_dir: Path, attempt: int) -> list[Cause]:
    """The causes the ranks of ``attempt`` journaled themselves before they exited."""
    found = []
    for e in read_journal(run_dir, warn=False):
        claim = e.as_(Detected) if e.restart == attempt else None
        if claim is not None and claim.detector in ("rank_crash", "out_of_memory"):
            d = claim.details
            if d.get("how") == "exception":
                cause = Cause(int(d["rank"]), e.step, "exception", d["cause"], d.get("message", ""))
                found.append(cause)
    return found


def restart_reason(causes: list[Cause]) -> str:
    """The restart's reason: the causes in words, or what is known without them."""
    if not causes:
        return "launcher restarted the workers"
    return "launcher restarted the workers: " + "; ".join(c.words() for c in causes)


def journal_restart(agent: Agent, run_dir: Path, *, restart: int, main: bool, named: bool) -> None:
    """A restarted rank's ``restart`` claim, its reason the causes of the attempt before
    when ``named`` (the crash reports are on); rank 0 (``main``) also journals the ranks
    that died by a signal, which could not journal it themselves."""
    if not named:
        agent.claim(Restart(count=restart, reason=restart_reason([])))
        return
    by_signal = signal_causes(run_dir, restart - 1)
    causes = sorted([*by_signal, *exception_causes(run_dir, restart - 1)], key=lambda c: c.rank)
    if main:  # the empty reports of killed attempts say nothing (never this attempt's)
        for path in RunLayout(run_dir).crashes.glob("rank-*-restart-*.txt"):
            with contextlib.suppress(OSError, ValueError):
                if int(path.stem.rsplit("-", 1)[1]) < restart and path.stat().st_size == 0:
                    path.unlink()
    if main:  # (before the restart: the restart observed is what backs these claims)
        for cause in by_signal:
            for claim in cause.claims():
                agent.claim(claim, step=cause.step)
    agent.claim(Restart(count=restart, reason=restart_reason(causes)))


def journal_exception(agent: Agent, exc: BaseException, rank: int) -> None:
    """The exception that is ending this rank's run, journaled with the rank blamed
    (nothing for a peer's failure)."""
    cause = exception_cause(exc, rank, agent.step)
    if cause is not None:
        for claim in cause.claims():
            agent.claim(claim)
