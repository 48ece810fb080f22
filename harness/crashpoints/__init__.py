"""Crash-point exploration (``tightrope crashpoints``, docs/crashpoints.md): record the file
events of a fault-free run's saves, kill a fresh run at each (or tear the file it wrote),
resume it with the job's own resume, and classify each point PASS / HARD_FAIL /
SILENT_DIVERGENCE / LOST_WORK from tightrope's own evidence.

`harness.inside.crash_hook` runs inside the job (standard library only, armed by the
bootstrap's ``sitecustomize``); ``job`` launches one run of the job; ``plan`` names the
points; ``evidence`` reads what a point left and ``verdict`` classifies it; ``explore``
runs the fault-free runs and the points, ``exploration`` ties it all, ``report`` writes
the matrix.
"""
