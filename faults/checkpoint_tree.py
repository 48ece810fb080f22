"""The names in a checkpoint tree, written once::

    ROOT/step-00000040/state.pt, rng-rank-R.pt, manifest.json    a full save
    ROOT/step-00000050/delta.bin, rng-rank-R.pt, manifest.json   a delta of an earlier one
    ROOT/latest                                                   the text "step-00000050\\n"
    ROOT/.step-00000060.tmp/                                      a save in progress

The reference trainer writes this tree (`reference_trainer.checkpoints`), checkpoint faults
damage it (`faults.checkpoint_files`) and the oracles read it (`harness.oracles.manifests`).
The names live here, in the lowest package, because it is the only one all three may import
(faults <- harness <- reference_trainer).
"""

from __future__ import annotations

import re

#: The file naming the newest durable checkpoint.
LATEST = "latest"
#: A full save's model, optimizer, scaler, step and data state.
STATE_FILE = "state.pt"
#: A delta save's data, in place of the state file.
DELTA_FILE = "delta.bin"
#: The hashes of every other file of a checkpoint, written last.
MANIFEST = "manifest.json"
#: A checkpoint folder's name; the group is its step.
STEP_NAME = re.compile(r"step-(\d{8})")
#: A save in progress (never a checkpoint, never a fault's target).
TMP_NAME = re.compile(r"\.step-\d{8}\.tmp")
#: What a checkpoint fault's ``checkpoint`` field may name.
WHICH = r"^(latest|previous|step-\d{8})$"


def checkpoint_name(step: int) -> str:
    """Directory name of the checkpoint taken after ``step`` steps."""
    return f"step-{step:08d}"
