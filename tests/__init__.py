"""The test suite of celery_redlock (a package, so its support code imports by name)."""
