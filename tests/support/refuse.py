"""Run code in an interpreter whose import system refuses celery and kombu."""

from __future__ import annotations

import textwrap

__all__ = ["REFUSE_CELERY"]

#: An import system that refuses celery and kombu, for a fresh interpreter.
REFUSE_CELERY = textwrap.dedent(
    """
    import sys

    class RefuseCelery:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("celery", "kombu"):
                raise ImportError(f"{name} refused: the core must not import it")
            return None

    sys.meta_path.insert(0, RefuseCelery())
    """
)
