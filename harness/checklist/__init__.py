"""The monitoring checklist (docs/checklist.md): its catalogue as data, which items a run
directory emitted and which a suite exercises."""
