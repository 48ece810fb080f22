"""Loaded by every Python process whose path starts with this folder (``agent_hook_time.py``
puts it there): when ``TIGHTROPE_HOOK_CLOCK`` names a file, the CPU time of this thread
inside each entry point the trainer calls into tightrope's agent (its hooks on the model,
the backward, the optimizer; the microscope's output hook) is added up, outermost calls
only, and written to that file as a JSON line at exit: from the end of step
``TIGHTROPE_HOOK_CLOCK_WARMUP`` (default 10) on, and the number of steps that covers.
Nothing of the agent changes but that its methods are wrapped."""

from __future__ import annotations

import atexit
import functools
import json
import os
import time
from typing import Any

OUT = os.environ.get("TIGHTROPE_HOOK_CLOCK")
#: The agent's entry points from the trainer (`AttachedAgent`), and the microscope's output
#: hook, which the model calls outside them.
AGENT = ("on_forward", "before_backward", "after_backward", "on_step_begin",
         "closure_returned", "on_step_end")  # fmt: skip
MICROSCOPE = ("_see",)


def _install(out: str) -> None:
    from harness.inside.attached_agent import AttachedAgent
    from harness.inside.microscope import Microscope

    warmup = int(os.environ.get("TIGHTROPE_HOOK_CLOCK_WARMUP", "10"))
    total: dict[str, float] = {}
    at_warmup: dict[str, float] = {}
    steps = [0]

    def wrap(cls: type, name: str, depth: list[int]) -> None:
        inner = getattr(cls, name)

        @functools.wraps(inner)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if depth[0]:
                return inner(*args, **kwargs)
            depth[0] += 1
            began = time.thread_time()
            try:
                return inner(*args, **kwargs)
            finally:
                depth[0] -= 1
                total[name] = total.get(name, 0.0) + time.thread_time() - began
                if name == "on_step_end":
                    steps[0] += 1
                    if steps[0] == warmup:
                        at_warmup.update(total)

        setattr(cls, name, timed)

    agent_depth, microscope_depth = [0], [0]
    for name in AGENT:
        wrap(AttachedAgent, name, agent_depth)
    for name in MICROSCOPE:
        wrap(Microscope, name, microscope_depth)

    def write() -> None:
        if steps[0] <= warmup:
            return
        seconds = {k: v - at_warmup.get(k, 0.0) for k, v in total.items()}
        with open(out, "a") as f:
            f.write(json.dumps({"steps": steps[0] - warmup, "seconds": seconds}) + "\n")

    atexit.register(write)


if OUT:
    _install(OUT)
