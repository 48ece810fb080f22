"""``python -m harness.running.ray_reaper WORKER_PID TOKEN``: wait for a Ray worker to die,
then kill every process whose environment carries ``TIGHTROPE_RAY_TASK=TOKEN``.

A task that ends kills its reaper first; a worker that dies mid-task (its node's raylet
gone, an out-of-memory kill) leaves the reaper to end the trainer it had started, which
would otherwise train on, orphaned, beside the attempt the cluster runs again elsewhere.
"""

from __future__ import annotations

import os
import sys
import time

from harness.running.process_tree import kill_marked

TASK_ENV = "TIGHTROPE_RAY_TASK"  # (harness.running.ray_node names it too)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def main(argv: list[str]) -> int:
    worker, token = int(argv[0]), argv[1]
    while _alive(worker) and os.getppid() == worker:
        time.sleep(0.5)
    kill_marked(token, grace=0.0, name=TASK_ENV)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
