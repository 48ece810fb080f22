"""What a torchrun agent forked from a warm-start server (`harness.inside.zygote.become`)
does differently from a fresh one: it names its rendezvous events' methods by walking the
frames, not by `inspect.stack`.

torch's ``dynamic_rendezvous.get_method_name`` builds the whole stack twice for every
rendezvous record (joining, keep-alives, closing), even when no handler takes the event;
for each frame whose file does not exist (``<frozen runpy>``, a server's ``-c`` code)
`inspect` looks through every loaded module, twice. An agent forked from the server of the
reference trainer's runs has some 2,300 modules loaded: there these lookups were 71% of
the agent's main thread in py-spy's samples, and a two-rank job's agent took 1.0 to 1.1 s
of CPU, 0.1 s without them (and the job 1.5 s less time, the rendezvous no longer waiting
on it). The name is the same (`method_name`), so the events are too; a fresh torchrun, as
a user's launch starts it, is left as torch made it.
"""

from __future__ import annotations

import sys

#: The module ``python -m`` runs as torchrun (how the launcher's side of the warm starts,
#: `harness.running.warm_command`, reads a torchrun command too).
TORCHRUN = "torch.distributed.run"
RENDEZVOUS = "torch.distributed.elastic.rendezvous.dynamic_rendezvous"
#: What torch's function returns when the stack is shallower than asked.
NO_NAME = "no_method_name"


def method_name(depth: int = 2) -> str:
    """``inspect.stack()[depth].function`` as seen from torch's ``get_method_name``: the
    name of the function ``depth`` frames above it (this one standing in its place)."""
    try:
        return sys._getframe(depth).f_code.co_name
    except ValueError:  # the stack is not that deep
        return NO_NAME


def lighten() -> None:
    """In the forked agent, before torchrun's ``main``: torch's ``get_method_name`` is
    replaced by `method_name` (nothing is done where torch has no such function)."""
    try:
        __import__(RENDEZVOUS)
    except ImportError:
        return
    module = sys.modules[RENDEZVOUS]
    if callable(getattr(module, "get_method_name", None)):
        module.get_method_name = method_name  # type: ignore[attr-defined]
