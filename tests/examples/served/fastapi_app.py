"""examples/fastapi/app.py as uvicorn serves it for the tests: its build held (hold.py)."""

from __future__ import annotations

import sys
from pathlib import Path

from . import hold

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "examples" / "fastapi"))

import app as recipe

hold.hold(recipe, "build_report")
hold.count_joins()
app = recipe.app
