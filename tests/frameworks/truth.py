"""What a framework run really did, read from the framework's own files and nothing of tightrope.

Each helper takes a run directory (the trainer's working directory: ``checkpoint-N/`` of the
Hugging Face Trainer, ``ckpt/last.ckpt`` of Lightning, ``ckpt/step_N/`` of Accelerate,
``ckpt/step-N/`` of DCP) and its ``trainer.log`` (the trainer's own output, which the
scripts and frameworks print). These facts are how tests/frameworks/expected.py derives the
verdict tightrope must give, so none of them may read the journal:

- :func:`weights_finite`: the weights of the last checkpoint the framework wrote, loaded with
  the framework's own format (safetensors, Lightning's ``state_dict``, DCP's reader).
- :func:`resumed_from`: the step of each checkpoint a restarted process resumed from, as
  the framework's state says (``trainer_state.json`` ``global_step`` of the folder
  ``get_last_checkpoint`` named, the ``global_step`` Lightning handed ``on_load_checkpoint``,
  the step in the Accelerate or DCP folder name); with the kill step, the steps lost.
- :func:`final_step`: the step the last process reached (``final loss X at step N``).
- :func:`damaged_files`: the files of one checkpoint whose bytes differ from the same
  checkpoint of an undamaged run of the same trainer (the runs are deterministic, so the
  bytes at save time are those of the reference run), i.e. what a fault did on disk.
- :func:`load_outcome`: what the framework did with a damaged newest checkpoint: refused it
  (raised on load; none of these frameworks falls back to an older one) or loaded it and
  trained on, its final weights then compared with the undamaged run's.

The undamaged run of a damage scenario is the kill scenario of the same trainer: the same
command and kill, its resume from an intact checkpoint of step 16.
"""

from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch

Framework = Literal["hf", "lightning", "accelerate", "dcp"]
LOG = "trainer.log"

_FINAL = re.compile(r"^(?:\[rank\d+\]:)?final loss (\S+) at step (\d+)", re.M)
_RESUMED = {
    # Every rank prints it: two ranks' lines can run into each other ("...checkpoint-16Checkp
    # oint detected, ..."), so the folder's name ends at its number.
    "hf": re.compile(r"Checkpoint detected, resuming training at (\S*?checkpoint-\d+)"),
    "lightning": re.compile(r"resuming at step (\d+)"),
    "accelerate": re.compile(r"Resumed from checkpoint: (\S+)"),
    "dcp": re.compile(r"resumed from (\S+) at step \d+"),
}
#: Where each framework raised on a checkpoint it could not read, as its traceback shows.
_LOAD_ERRORS = re.compile(
    r"SafetensorError|PytorchStreamReader failed|UnpicklingError|CheckpointException"
    r"|EOFError|unexpected EOF|RuntimeError: .*(?:storage|size|deserializ)"
)


def framework_of(name: str) -> Framework:
    """The framework of a scenario, by its name's prefix (``hf-kill`` -> ``hf``)."""
    prefix = name.split("-")[0]
    if prefix not in _RESUMED:
        raise ValueError(f"scenario {name!r}: no framework prefix (hf-, lightning-, ...)")
    return prefix  # type: ignore[return-value]


def _step_of(path: Path) -> int:
    return int(re.split(r"[-_=]", path.name)[-1].removesuffix(".ckpt"))


def checkpoints(run_dir: Path, framework: Framework) -> dict[int, Path]:
    """Step -> the checkpoint the framework left for it (Lightning: only ``last.ckpt``)."""
    if framework == "lightning":
        last = run_dir / "ckpt" / "last.ckpt"
        if not last.exists():
            return {}
        return {int(torch.load(last, map_location="cpu", weights_only=False)["global_step"]): last}
    pattern = {"hf": "checkpoint-*", "accelerate": "ckpt/step_*", "dcp": "ckpt/step-*"}[framework]
    return {_step_of(p): p for p in run_dir.glob(pattern) if p.is_dir()}


def weights(checkpoint: Path, framework: Framework) -> dict[str, torch.Tensor]:
    """The model weights of one checkpoint, read with the framework's own format."""
    if framework in ("hf", "accelerate"):
        from safetensors.torch import load_file

        return load_file(checkpoint / "model.safetensors")
    if framework == "lightning":
        return torch.load(checkpoint, map_location="cpu", weights_only=False)["state_dict"]
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    with tempfile.TemporaryDirectory() as tmp:
        dcp_to_torch_save(checkpoint, Path(tmp) / "state.pt")
        state = torch.load(Path(tmp) / "state.pt", map_location="cpu", weights_only=False)
    return {k: v for k, v in state["model"].items() if isinstance(v, torch.Tensor)}


def final_weights(run_dir: Path, framework: Framework) -> dict[str, torch.Tensor]:
    """The weights of the newest checkpoint the framework wrote."""
    saved = checkpoints(run_dir, framework)
    if not saved:
        raise FileNotFoundError(f"{run_dir}: no {framework} checkpoint")
    return weights(saved[max(saved)], framework)


def weights_finite(run_dir: Path, framework: Framework) -> bool:
    """True when every weight of the framework's last checkpoint is finite."""
    return all(bool(torch.isfinite(t).all()) for t in final_weights(run_dir, framework).values())


def same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    """Bit for bit the same tensors under the same names."""
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _log(run_dir: Path) -> str:
    return (run_dir / LOG).read_text(errors="replace")


def final_step(run_dir: Path) -> int | None:
    """The step the trainer said it ended at (``final loss X at step N``); None: it never ended."""
    found = _FINAL.findall(_log(run_dir))
    return int(found[-1][1]) if found else None


def resumed_from(run_dir: Path, framework: Framework) -> list[int]:
    """The step of the checkpoint each resume loaded, in order (one per process that resumed)."""
    steps = []
    for found in _RESUMED[framework].findall(_log(run_dir)):
        if framework == "hf":
            import json

            state = json.loads((run_dir / Path(found).name / "trainer_state.json").read_text())
            steps.append(int(state["global_step"]))
        elif framework == "lightning":
            steps.append(int(found))
        else:
            steps.append(_step_of(Path(found)))
    return steps


def lost_steps(run_dir: Path, framework: Framework, killed_at: int) -> int:
    """Steps trained before the kill at ``killed_at`` that the resumed run trained again."""
    loaded = resumed_from(run_dir, framework)
    if not loaded:
        raise ValueError(f"{run_dir}: no resume in {LOG}")
    return killed_at - max(loaded)


#: Files a save writes differently each time: DCP's ``.metadata`` holds a random ``save_id``.
_NOT_DETERMINISTIC = {".metadata"}


def damaged_files(run_dir: Path, reference: Path, framework: Framework, step: int) -> list[str]:
    """Files of the checkpoint of ``step`` whose bytes differ from the undamaged run's."""
    ours, theirs = checkpoints(run_dir, framework)[step], checkpoints(reference, framework)[step]
    return sorted(
        p.relative_to(ours).as_posix()
        for p in ours.rglob("*")
        if p.is_file()
        and p.name not in _NOT_DETERMINISTIC
        and (theirs / p.relative_to(ours)).read_bytes() != p.read_bytes()
    )


@dataclass(frozen=True)
class LoadOutcome:
    """What a framework did with its damaged newest checkpoint."""

    refused: bool  # it raised on load (and the job ended without finishing)
    error: str  # the framework's error line, when refused
    #: Loaded and trained on, its final weights differ from the undamaged run's. A load that
    #: was not refused is a corrupted load either way: a flipped bit may land where it changes
    #: no weight (DCP writes each tensor as a small zip record, mostly wrapper).
    diverged: bool


def load_outcome(run_dir: Path, reference: Path, framework: Framework) -> LoadOutcome:
    """Refused (raised on load) or loaded silently, against the undamaged run ``reference``."""
    log = _log(run_dir)
    errors = [line for line in log.splitlines() if _LOAD_ERRORS.search(line)]
    if final_step(run_dir) is None:
        return LoadOutcome(refused=True, error=errors[0] if errors else "", diverged=False)
    diverged = not same_weights(
        final_weights(run_dir, framework), final_weights(reference, framework)
    )
    return LoadOutcome(refused=False, error="", diverged=diverged)
