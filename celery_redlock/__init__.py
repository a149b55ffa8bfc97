"""Run a Celery task at most once at a time per key, safely."""

__version__ = "0.1.0"
