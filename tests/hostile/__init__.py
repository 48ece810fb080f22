"""Every command against hostile inputs (tests/hostile/test_hostile_inputs.py)."""
