"""tests/typing/check_types.py under ``mypy --strict``: every type it asserts holds, and
each misuse it marks is reported with its code once the mark is taken away (issue 29)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

CHECKED = Path(__file__).with_name("check_types.py")
IGNORE = re.compile(r"  # type: ignore\[([a-z-]+)\]$")


def mypy(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(path)],
        capture_output=True, text=True, timeout=170, check=False,
    )


@pytest.mark.timeout(180)
def test_the_typing_file_passes_and_each_misuse_is_reported(tmp_path: Path) -> None:
    """Clean as written; without its ignore marks, an error of the marked code on
    exactly each marked line."""
    passed = mypy(CHECKED)
    assert passed.returncode == 0, passed.stdout
    lines = CHECKED.read_text().splitlines()
    expected = {
        number: match.group(1)
        for number, line in enumerate(lines, 1)
        if (match := IGNORE.search(line))
    }
    assert len(expected) >= 10
    bare = tmp_path / "check_types.py"
    bare.write_text("\n".join(IGNORE.sub("", line) for line in lines) + "\n")
    failed = mypy(bare)
    reported = {
        (int(number), code)
        for number, code in re.findall(r"check_types\.py:(\d+): error: .*\[([a-z-]+)\]$",
                                       failed.stdout, re.M)
    }
    assert reported == set(expected.items()), failed.stdout
