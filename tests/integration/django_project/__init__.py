"""A Django project for the tests: a shop whose tasks are LockedTasks (``shop``), the
lock dashboard at ``/locks/``, settings from ``CRL_*`` variables (see ``settings``).

A worker runs it as ``celery -A tests.integration.django_project worker``.
"""

from .celery import app as celery_app

__all__ = ["celery_app"]
