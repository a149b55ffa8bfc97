"""Celery's own integration suite, with every task a ``LockedTask``.

``tox -e celery-suite`` (or ``python tests/celery_suite/run.py``) downloads the
sdist of the installed Celery from PyPI, unpacks its ``t/`` folder into a cache
folder (``.tox/celery-suite`` by default, never committed), and runs Celery's
``t/integration/test_tasks.py``, ``test_canvas.py`` and ``test_inspect.py``
against redis-server processes it starts on free loopback ports (one for the
broker and the result backend, three lock nodes) and stops when done:

- ``plain``: Celery as it ships, the reference;
- ``wait``: every app's task class is ``celery_redlock:LockedTask`` (Celery's
  built-in tasks too), with ``redlock_on_duplicate="wait"``;
- ``limit64``: the same with ``redlock_limit=64``.

The plugin runs go through ``shim/sitecustomize.py``, which the runner puts on
``PYTHONPATH``; a duplicate under ``wait`` runs after the first, and under a
limit of 64 permits runs alongside it, so the suite's identical calls
(``add(1, 1)`` in many tests) all run, as in plain Celery. A task class that
derives from ``celery.Task`` itself stays as it is (two in Celery's
``t/integration/tasks.py``: ``ClassBasedAutoRetryTask``, ``StampedTaskOnReplace``).

At the end the runner lists the tests that passed plain but failed with the
plugin, and exits non-zero if there is any (or if a run broke off). Options:
``--config`` (repeatable) picks configurations, ``--timeout`` the per-test
limit, and whatever follows ``--`` goes to pytest (``-- -k chord``).

Celery's suite needs, beyond this package's test extra, ``pydantic`` (its
``t/integration/tasks.py``) and ``pytest-rerunfailures`` (its ``flaky``
reruns), from its ``requirements/test*.txt``.

Nothing here is collected by this project's own ``pytest`` run (see
``collect_ignore`` in ``tests/conftest.py``).
"""
