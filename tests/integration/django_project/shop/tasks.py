"""The shop's tasks, on the project's app (``@shared_task`` would add them to every app
of the test process; ``tests/unit/test_django_task.py`` shows it in a process of its own)."""

from __future__ import annotations

from django.db.models import F

from celery_redlock import LockedTask

from ..celery import app
from .models import Order, Report


@app.task(base=LockedTask, bind=True, lock_on=("order_id",), lock_on_duplicate="retry")
def charge(self, order_id, amount, fencing_token=None):
    """The fenced ORM update: a write of an older lock holder changes nothing."""
    return Order.objects.filter(pk=order_id, fence__lt=fencing_token).update(
        balance=F("balance") - amount, fence=fencing_token
    )


@app.task(base=LockedTask, lock_on=("report_id",), lock_enqueue="until_finished")
def rebuild_report(report_id):
    """Reads the row its transaction created: it must not run before the commit."""
    return Report.objects.filter(pk=report_id).update(builds=F("builds") + 1)


@app.task(base=LockedTask, lock_on=("order_id",), lock_debounce=0.3)
def annotate(order_id, note):
    return Order.objects.filter(pk=order_id).update(note=note)
