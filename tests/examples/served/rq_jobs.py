"""examples/rq/reports.py as the rq workers of the tests import it: its build held
(hold.py). The workers run from examples/rq, where ``reports`` is."""

from __future__ import annotations

import reports as recipe

from . import hold

hold.hold(recipe, "compute_report")
report_job = recipe.report_job
