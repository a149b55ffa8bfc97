"""Settings from the environment: ``CRL_DJANGO_DB`` (a PostgreSQL database on
``CRL_DJANGO_DB_HOST``:``CRL_DJANGO_DB_PORT``, user postgres) or
``CRL_DJANGO_SQLITE`` (a file), and the topology's ``CRL_BROKER_URL``,
``CRL_BACKEND_URL`` (default: django-celery-results' ``django-db``), ``CRL_NODES``,
``CRL_PREFIX``."""

from __future__ import annotations

import os

SECRET_KEY = "for-the-tests-only"
DEBUG = False
ALLOWED_HOSTS = ["testserver", "127.0.0.1", "localhost"]
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django_celery_results",
    "django_celery_beat",
    "tests.integration.django_project.shop",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
]
ROOT_URLCONF = "tests.integration.django_project.urls"
LOGIN_URL = "/login/"

if os.environ.get("CRL_DJANGO_DB"):
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": os.environ["CRL_DJANGO_DB"],
            "USER": "postgres",
            "HOST": os.environ.get("CRL_DJANGO_DB_HOST", "127.0.0.1"),
            "PORT": int(os.environ.get("CRL_DJANGO_DB_PORT", "5432")),
        }
    }
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": os.environ.get("CRL_DJANGO_SQLITE", ":memory:"),
        }
    }

CELERY_BROKER_URL = os.environ.get("CRL_BROKER_URL", "memory://")
CELERY_RESULT_BACKEND = os.environ.get("CRL_BACKEND_URL", "django-db")
CELERY_REDLOCK_NODES = os.environ["CRL_NODES"].split(",") if os.environ.get("CRL_NODES") else None
CELERY_REDLOCK_KEY_PREFIX = os.environ.get("CRL_PREFIX", "redlock")
CELERY_REDLOCK_NODE_TIMEOUT = 0.5
