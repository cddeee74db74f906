"""examples/django/reports_site.py as gunicorn serves it for the tests: its query held
(hold.py). gunicorn runs from examples/django, where ``reports_site`` is."""

from __future__ import annotations

import reports_site as recipe

from . import hold

hold.hold(recipe, "build_report")
hold.count_joins()
application = recipe.application
