"""tightrope's reference trainer: a small GPT trained with DDP under torchrun.

Run it with ``python -m reference_trainer --preset tiny --steps 200 --run-dir runs/x``
or ``torchrun --nproc-per-node 2 -m reference_trainer ...``.
"""
