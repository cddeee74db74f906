"""Every recipe folder under examples/ has a README and is linked from the README and
from examples/README.md, and every folder a link names exists."""

from __future__ import annotations

import re

from .servers import EXAMPLES, ROOT


def recipes() -> set[str]:
    return {p.name for p in EXAMPLES.iterdir() if p.is_dir() and not p.name.startswith(("_", "."))}


def test_every_recipe_has_a_readme_and_is_linked_from_both_indexes() -> None:
    """A recipe added without its README or its links fails here; so does a dead link."""
    found = recipes()
    assert found >= {"fastapi", "gunicorn", "django", "rq", "cli"}
    for name in found:
        assert (EXAMPLES / name / "README.md").is_file(), name
    readme = set(re.findall(r"\(examples/(\w+)/README\.md\)", (ROOT / "README.md").read_text()))
    index = set(re.findall(r"\]\((\w+)/\)", (EXAMPLES / "README.md").read_text()))
    assert readme == found
    assert index == found
