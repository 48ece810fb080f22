"""Checkpoints: files on disk, manifests, deltas, the manager that saves and verifies them, and
what a run dir must hold."""
