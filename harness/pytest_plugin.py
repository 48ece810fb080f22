"""pytest plugin for scenario suites (registered by the ``pytest11`` entry point).

Reserved: scenario collection, the ``tightrope`` option group and the
``tightrope_run`` fixture arrive with the scenario harness. Until then the plugin
registers nothing, so installing tightrope leaves other test suites untouched.
"""

from __future__ import annotations
