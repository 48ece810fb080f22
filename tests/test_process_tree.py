"""The process tree as /proc shows it (harness/running/process_tree.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from faults.proc_stat import state as proc_state
from harness.running.process_tree import descendants


def test_a_child_that_ended_unreaped_serves_nobody_but_is_still_below_its_parent() -> None:
    """A warm-start server is idle once what it forked ended, before it reaps it: the
    zombie is left out on request, and a running child never (its negative control)."""
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        deadline = time.monotonic() + 30
        while proc_state(ended.pid) != "Z":  # ended; this process has not waited for it
            assert time.monotonic() < deadline, "the child never ended"
            time.sleep(0.05)
        assert {ended.pid, running.pid} <= set(descendants(os.getpid()))
        live = set(descendants(os.getpid(), zombies=False))
        assert running.pid in live and ended.pid not in live
    finally:
        running.kill()
        running.wait()
        ended.wait()
