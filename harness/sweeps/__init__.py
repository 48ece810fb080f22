"""Stability sweeps: one scenario over a grid of trainer settings and many seeds, each cell's
success rate with its interval, losses and costs, and which cells differ (docs/sweeps.md)."""
