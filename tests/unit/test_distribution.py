"""What the distribution says of itself agrees with what is tested and shipped."""

from __future__ import annotations

import configparser
import re
from pathlib import Path

import celery_redlock

ROOT = Path(__file__).resolve().parents[2]


def setup_cfg() -> configparser.ConfigParser:
    parser = configparser.ConfigParser()
    parser.read(ROOT / "setup.cfg")
    return parser


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.rst").read_text()
    command = re.search(r"Run the tests[^:]*::\n\n    (.+)\n", readme).group(1)
    lines = (ROOT / ".ci" / "run").read_text().strip().splitlines()
    assert lines[-1] == command


def test_the_classifiers_name_the_pythons_tox_runs():
    cfg = setup_cfg()
    classifiers = cfg["metadata"]["classifiers"].split("\n")
    named = {c.rsplit(" ", 1)[1] for c in classifiers if re.fullmatch(r".*Python :: 3\.\d+", c)}
    tox = (ROOT / "tox.ini").read_text()
    envs = re.search(r"^    py\{([\d,]+)\}-\{unit,integration\}$", tox, re.MULTILINE).group(1)
    assert named == {f"{v[0]}.{v[1:]}" for v in envs.split(",")}
    oldest = min(named, key=lambda v: tuple(map(int, v.split("."))))
    assert cfg["options"]["python_requires"] == f">={oldest}"


def test_the_changelog_has_an_entry_for_this_version():
    changelog = (ROOT / "docs" / "changelog.rst").read_text()
    assert re.search(rf"^{re.escape(celery_redlock.__version__)}\b.*\n=+\n", changelog, re.M)


def test_the_readme_has_no_relative_image():
    """A package index shows the README without the checkout beside it."""
    readme = (ROOT / "README.rst").read_text()
    targets = re.findall(r"^\.\. (?:image|figure):: (\S+)", readme, re.MULTILINE)
    assert all(t.startswith("https://") for t in targets), targets
