"""Support code shared by the tests: the test app, the process harness, helpers.

Nothing here is a test; nothing here edits ``sys.path``. This package imports no
Celery itself: the core's tests (``tests/core``) use its Celery-free modules
(``recorded_grants``, ``fencing_history``, ``refuse``).
"""
