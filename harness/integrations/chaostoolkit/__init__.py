"""A Chaos Toolkit extension: actions, probes and a control that drive a tightrope job.

Chaos Toolkit (``pip install 'tightrope[chaos]'``) loads each as a Python provider by
module and function name: `actions` (start and stop a job or a suite, inject a fault),
`probes` (run status, training progress, finite loss, detection, scorecard figures) and
`control` (a job that lives exactly as long as the experiment). See docs/chaostoolkit.md
and examples/chaostoolkit/experiment.json. Nothing here imports Chaos Toolkit itself,
except the control, to interrupt an experiment whose job would not start.
"""
