"""The brokers the integration tests run on: a Redis node of the topology, and RabbitMQ.

RabbitMQ is the one this machine kind runs at 127.0.0.1:5672 (``CRL_AMQP_URL``
overrides it). A user's machine may lack it: the tests that need it skip with
the reason; under ``CI=true`` a missing RabbitMQ fails them instead, so CI
cannot pass without running them.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from kombu import Connection

__all__ = ["AMQP_URL", "delete", "purge", "queued", "require_amqp"]

AMQP_URL = os.environ.get("CRL_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")


def require_amqp() -> str:
    """The RabbitMQ URL, once it answers; else skip (locally) or fail (under ``CI=true``)."""
    try:
        with Connection(AMQP_URL, connect_timeout=2) as conn:
            conn.ensure_connection(max_retries=1, timeout=2)
    except Exception as exc:  # noqa: BLE001 - any failure to connect means "not here"
        why = f"RabbitMQ is not reachable at {AMQP_URL} ({type(exc).__name__}: {exc})"
        if os.environ.get("CI") == "true":
            pytest.fail(why + "; CI=true requires it")
        pytest.skip(why + "; set CI=true to make this a failure")
    return AMQP_URL


def queued(app: Any, queue: str) -> int:
    """Messages waiting in ``queue``, as the broker counts them (0 for no such queue)."""
    with app.connection_for_write() as conn:
        try:
            return conn.default_channel.queue_declare(queue=queue, passive=True).message_count
        except conn.channel_errors:  # Redis drops an empty list: "no queue"
            return 0


def purge(app: Any, queue: str) -> int:
    """Empty ``queue`` on the broker; how many messages it held."""
    with app.connection_for_write() as conn:
        return conn.default_channel.queue_purge(queue) or 0


def delete(app: Any, queue: str) -> None:
    """Delete ``queue`` and, on RabbitMQ, the exchange of the same name Celery declared for it."""
    with app.connection_for_write() as conn:
        channel = conn.default_channel
        channel.queue_delete(queue)
        if conn.transport.driver_type == "amqp":
            channel.exchange_delete(queue)
