"""examples/gunicorn/app.py as gunicorn serves it for the tests: its build held (hold.py).

gunicorn runs from examples/gunicorn, so ``app`` there is the module its config imports.
"""

from __future__ import annotations

import app as recipe

from . import hold

hold.hold(recipe, "build_report")
hold.count_joins()
application = recipe.application
