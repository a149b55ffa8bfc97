"""A Celery app for real ``celery beat`` subprocesses in tests/integration/test_beat.py."""
