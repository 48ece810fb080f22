"""The reference trainer's optimizers, by name: the one list that a suite's
``trainer.optimizer.name`` and the trainer's ``--optimizer`` are checked against (the trainer
builds them in `reference_trainer.model.optim`)."""

from __future__ import annotations

#: Optimizer name -> what it is (``--optimizer NAME``).
OPTIMIZERS = {
    "adamw": "torch AdamW, layered epsilon per layer (the default)",
    "adamw8bit": "8-bit AdamW: block-wise quantized moments, a stable token embedding",
    "sophia": "Sophia-G: a Gauss-Newton-Bartlett Hessian estimate, element-wise clipped steps",
}
