"""Sphinx configuration of the celery_redlock manual."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the checkout's package, and tests.support for the doctests

import celery_redlock  # noqa: E402

project = "celery_redlock"
author = "celery_redlock contributors"
copyright = "celery_redlock contributors"
release = version = celery_redlock.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.doctest",
    "sphinx.ext.napoleon",  # the docstrings' "Args:" / "Returns:" sections
]

exclude_patterns = ["_build"]
nitpicky = False
default_role = "any"

autodoc_member_order = "bysource"
autodoc_typehints = "description"

try:
    import furo  # noqa: F401
except ImportError:  # alabaster ships with Sphinx
    html_theme = "alabaster"
else:
    html_theme = "furo"
html_title = f"celery_redlock {release}"
