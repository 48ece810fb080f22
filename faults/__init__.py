"""Fault injectors: each a small typed spec plus an injector, in a registry by kind.

The injectors arrive with the faults issue; the package exists now so that the
dependency direction (faults <- harness <- reference_trainer) is fixed from the start.
"""
