"""The chaos soak: one long run of the reference trainer while faults arrive at random.

`plan` draws the faults (Poisson arrivals, each fault drawn by `harness.suites.strategies`,
all from one seed), `measures` reads what they cost from the journal (effective training
time, goodput, time to recover), `shrink` cuts a plan that broke an invariant down to a
smallest one that still breaks it, and `soak` runs the whole thing. See docs/soak.md.
"""
