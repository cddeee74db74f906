"""docs/codecs.md's custom codec example runs as written."""

from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "codecs.md"


def test_the_custom_codec_example_runs() -> None:
    """The compressed JSON codec of docs/codecs.md round-trips its rows (its assert)."""
    blocks = [
        block
        for block in re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
        if "class CompressedJSON" in block
    ]
    assert len(blocks) == 1, "docs/codecs.md has one custom codec example"
    exec(compile(blocks[0], str(DOC), "exec"), {"__name__": "codecs_doc_example"})
