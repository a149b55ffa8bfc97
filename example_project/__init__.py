"""A runnable Celery project that uses every feature of celery_redlock.

Run it with ``python -m example_project``: it starts three Redis lock nodes and
a broker node on free loopback ports, a prefork worker and two beats, shows
each feature, prints what happened and stops everything.
"""
