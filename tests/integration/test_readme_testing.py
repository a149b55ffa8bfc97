"""The README's "Testing your tasks" example runs as it is written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.rst"

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def readme_files() -> dict[str, str]:
    """The section's Python blocks, by the file name their first line gives."""
    text = README.read_text()
    section = text.split("\nTesting your tasks\n", 1)[1]
    section = re.split(r"\n[^\n]+\n=+\n", section, maxsplit=1)[0]
    files = {}
    for block in re.findall(r"\.\. code-block:: python\n\n((?:    .*\n|\n)+)", section):
        code = "\n".join(line[4:] for line in block.splitlines()).strip() + "\n"
        name = code.splitlines()[0].removeprefix("# ").strip()
        files[name] = code
    return files


def test_the_section_has_a_conftest_and_a_test_module():
    assert set(readme_files()) == {"conftest.py", "test_tasks.py"}


def test_the_example_passes(pytester: pytest.Pytester):
    for name, code in readme_files().items():
        pytester.path.joinpath(name).write_text(code)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q")
    result.assert_outcomes(passed=2)
