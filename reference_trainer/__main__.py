"""``python -m reference_trainer`` and ``torchrun -m reference_trainer``."""

from __future__ import annotations

import sys

from reference_trainer.cli import main

if __name__ == "__main__":
    sys.exit(main())
