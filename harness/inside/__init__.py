"""What runs inside the trainer's process: the agent, the zero-code attach, its hooks and
evidence, and the bootstrap of `tightrope exec`."""
