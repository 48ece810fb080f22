"""Registers the fault kinds that ship with tightrope."""

from __future__ import annotations

import faults.bitflip
import faults.checkpoint
import faults.data
import faults.node
import faults.numeric
import faults.process  # noqa: F401
