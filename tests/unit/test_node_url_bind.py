"""A node URL whose scheme names no kind is refused at bind, the URL shown whole
(password masked) with the scheme it most likely meant. No server is needed."""

from __future__ import annotations

import pytest
from celery import Celery

from celery_redlock import ImproperlyConfigured, LockedTask


@pytest.mark.parametrize(
    "url, said",
    [
        (
            "postgressql://app:s3cret@127.0.0.1:5432/shop",
            "'postgressql://app:***@127.0.0.1:5432/shop': unknown scheme postgressql://, "
            "did you mean postgresql://?",
        ),
        (
            "postgresql+psycopg://app:s3cret@127.0.0.1:5432/shop",
            "write 'postgresql://app:***@127.0.0.1:5432/shop'",
        ),
    ],
)
def test_a_bad_scheme_is_refused_at_bind_with_the_url(url, said):
    app = Celery("urls", set_as_current=False)
    app.conf.redlock_nodes = [url]

    @app.task(base=LockedTask, shared=False)
    def work(key="k"):
        return key

    with pytest.raises(ImproperlyConfigured) as info:
        app.finalize()
    assert said in str(info.value) and "s3cret" not in str(info.value)
