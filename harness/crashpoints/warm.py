"""Whether a crash point's runs may be forked from a zygote (`harness.crashpoints.zygote`)
rather than each started afresh: the zygote imports torch, tightrope's agent and the
installed modules the first fault-free run imported (never the program's own), and one more
fault-free run, forked from it, must leave what a fresh one left (the same file events and
checkpoints as one of the two fresh runs: a job's first run may write what later ones
find in a cache; the same parameters after every step) before any point uses it.
Otherwise every point runs as fresh processes, and the matrix says why.
"""

from __future__ import annotations

from pathlib import Path

from harness.crashpoints.explore import CrashPointsError, FaultFree, fault_free, same_run
from harness.crashpoints.job import Target, start_zygote
from harness.crashpoints.plan import imported_modules
from harness.crashpoints.zygote import Zygote
from harness.inside.crash_hook import log_path

#: The folder of the fault-free run forked from the zygote, beside the two fresh ones.
FORKED = "fault-free-forked"


def _files(run: FaultFree) -> tuple[object, object]:
    keys = {r: [e.key for e in es] for r, es in run.events.items()}
    return keys, sorted((step, sorted(files)) for step, files in run.contents)


def _same_evidence(fresh: tuple[FaultFree, FaultFree], forked: FaultFree) -> bool:
    return same_run(fresh[0], forked) and _files(forked) in (_files(fresh[0]), _files(fresh[1]))


def warm_zygote(
    target: Target,
    fresh: tuple[FaultFree, FaultFree],
    out: Path,
    notes: list[str],
    *,
    use_cache: bool = True,
) -> Zygote | None:
    """A zygote whose forked fault-free run matched the ``fresh`` ones; None when the
    job cannot be forked (several ranks, not ``python SCRIPT``) or the runs differed (then
    a note says so); None too for a job that does not import torch (nothing to share)."""
    clean = fresh[0]
    preload = imported_modules(Path(log_path(str(clean.run_dir.parent / "events"), 0)))
    if "torch" not in preload:  # what a zygote shares is torch's import
        return None
    zygote = start_zygote(target, out / "zygote.log", preload)
    if zygote is None:
        return None
    try:
        forked = fault_free(target, out / FORKED, use_cache=use_cache, zygote=zygote)
    except CrashPointsError:
        forked = None
    if forked is not None and _same_evidence(fresh, forked):
        return zygote
    zygote.close()
    notes.append(
        f"a fault-free run forked from a warm interpreter ({out / FORKED}) did not leave "
        "what a fresh one left: every point ran as fresh processes"
    )
    return None
