"""The dashboard in a real headless Chromium (Debian's chromium and chromium-driver, Selenium).

Real nodes and a real prefork worker (tests/integration/conftest.py): a long
locked task's row appears with its holder and a falling time left; a claim
and a throttle schedule appear; a stopped node is marked down while the page
keeps working; with actions on and logged in, the lock is released through
the confirmation and its key is gone from every node; with actions off there
is no button and a forged POST is refused. A screenshot is saved under the
test's tmp dir.

Without /usr/bin/chromium or chromedriver (or Selenium) the tests skip,
except under ``CI=true``, where they fail.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cli_app
import pytest

from celery_redlock.plan import plan_of
from celery_redlock.web import make_app, server
from tests.support.harness import Topology, WorkerHandle, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

CHROMIUM = "/usr/bin/chromium"
TOKEN = "browser-test-token"


def _driver_or_skip() -> Any:
    missing = []
    chromedriver = shutil.which("chromedriver") or "/usr/bin/chromedriver"
    if not os.path.exists(CHROMIUM):
        missing.append(CHROMIUM)
    if not os.path.exists(chromedriver):
        missing.append("chromedriver (chromium-driver)")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        missing.append("the selenium package")
    if missing:
        reason = "browser tests need " + ", ".join(missing)
        if os.environ.get("CI") == "true":
            pytest.fail(reason + " (CI=true: they must run)")
        pytest.skip(reason)
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    profile = tempfile.mkdtemp(prefix="crl-chromium-")
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1500,1100",
        f"--user-data-dir={profile}",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(chromedriver), options=options)
    driver.crl_profile = profile  # type: ignore[attr-defined]
    return driver


@pytest.fixture
def browser() -> Iterator[Any]:
    driver = _driver_or_skip()
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(driver.crl_profile, ignore_errors=True)


@pytest.fixture
def serve() -> Iterator[Any]:
    started = []

    def start(app: Any) -> str:
        httpd = server(app, "127.0.0.1", 0)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        started.append((httpd, app))
        return f"http://127.0.0.1:{httpd.server_address[1]}/"

    yield start
    for httpd, app in started:
        httpd.shutdown()
        httpd.server_close()
        app.close()


def css(driver: Any, selector: str) -> list[Any]:
    from selenium.webdriver.common.by import By

    return driver.find_elements(By.CSS_SELECTOR, selector)


def row_of(driver: Any, task_id: str) -> Any:
    rows = css(driver, f'tr.row.lock[data-task-id="{task_id}"]')
    return rows[0] if rows else None


def seconds_left(driver: Any, task_id: str) -> float | None:
    try:
        text = row_of(driver, task_id).find_element("css selector", "td.left").text
        return float(text.split()[0])
    except Exception:  # the table was re-rendered between the two calls
        return None


def lock_keys(topology: Topology) -> list[str]:
    """Every lock and permit key on every running quorum node."""
    return [k for keys in topology.lock_keys().values() for k in keys]


def test_the_dashboard_live_in_a_browser(
    browser: Any, serve: Any, prefork_worker: WorkerHandle, run: str, tmp_path: Path
):
    topology = prefork_worker.topology
    url = serve(make_app(prefork_worker.app, actions=True, auth=TOKEN, refresh=1.0))
    browser.get(url)
    wait_for(lambda: css(browser, "#login:not([hidden])"), 20, "the login form")
    css(browser, "#token")[0].send_keys(TOKEN)
    css(browser, "#login button")[0].click()
    wait_for(lambda: css(browser, "table.nodes tr.node.up"), 20, "the nodes table")
    assert len(css(browser, "table.nodes tr.node.up")) == 3

    # A long locked task: its row, holder and a time left that falls. It holds its
    # lock until the release below (its heartbeat then finds the lease lost).
    slow = prefork_worker.task("held_until_lost").apply_async(
        kwargs={"key": f"web-{run}", "run": run, "duration": 60.0}
    )
    wait_for(lambda: row_of(browser, slow.id), 30, "the lock's row")
    seen = [wait_for(lambda: seconds_left(browser, slow.id), 10, "a time left")]

    def falls() -> bool:
        """The time left shown fell since the value before (the heartbeat raises it
        at each renewal: a first value caught just before one stays the lowest)."""
        left = seconds_left(browser, slow.id)
        if left is None or left == seen[-1]:
            return False
        seen.append(left)
        return left < seen[-2]

    wait_for(falls, 10, "the time left to fall")
    assert slow.id in row_of(browser, slow.id).text

    # A claim (a call queued with a countdown) and a throttle schedule.
    queued = prefork_worker.task("once_finished").apply_async(
        kwargs={"key": f"web-claim-{run}", "run": run, "duration": 0.05}, countdown=10
    )
    throttled = prefork_worker.task("throttled")
    for _ in range(2):
        throttled.apply_async(kwargs={"key": f"web-thr-{run}", "run": run})
    wait_for(
        lambda: any(queued.id in r.text for r in css(browser, "tr.row.claim")), 20, "the claim"
    )
    wait_for(lambda: css(browser, "tr.row.throttle"), 20, "the throttle schedule")
    screenshot = tmp_path / "dashboard.png"
    browser.save_screenshot(str(screenshot))
    assert screenshot.stat().st_size > 10_000
    print(f"\nscreenshot: {screenshot}")

    # A node stops: it is marked down, the lock's row stays.
    topology.quorum[2].stop()
    try:
        wait_for(lambda: css(browser, "table.nodes tr.node.down"), 20, "the node marked down")
        assert row_of(browser, slow.id) is not None
        assert len(css(browser, "table.nodes tr.node.up")) == 2
        assert not css(browser, "#banner:not([hidden])")
    finally:
        topology.quorum[2].start()
    wait_for(lambda: len(css(browser, "table.nodes tr.node.up")) == 3, 20, "the node back")

    # Release through the confirmation, which names the holder.
    wait_for(lambda: row_of(browser, slow.id) is not None, 20, "the lock's row again")
    row_of(browser, slow.id).find_element("css selector", "button.release").click()
    wait_for(lambda: css(browser, "#confirm:not([hidden])"), 10, "the confirmation")
    assert slow.id in css(browser, "#confirm-text")[0].text
    css(browser, "#confirm-ok")[0].click()
    wait_for(lambda: row_of(browser, slow.id) is None, 20, "the row to go")
    holder = prefork_worker.task("held_until_lost")
    name = plan_of(holder).keys.build([], {"key": f"web-{run}", "run": run})
    assert not [k for k in lock_keys(topology) if name in k], lock_keys(topology)
    assert slow.get(timeout=60) == {"lost": True}  # the holder was told, and stopped
    queued.get(timeout=60)


def test_a_read_only_dashboard_has_no_button_and_refuses_a_forged_post(
    browser: Any, serve: Any, prefork_worker: WorkerHandle, run: str
):
    holder = prefork_worker.task("held_until_lost")
    slow = holder.apply_async(kwargs={"key": f"web-ro-{run}", "run": run, "duration": 60.0})
    url = serve(make_app(prefork_worker.app))
    browser.get(url)
    wait_for(lambda: row_of(browser, slow.id), 30, "the lock's row")
    assert not css(browser, "button.action")
    status = browser.execute_async_script(
        """
        const done = arguments[arguments.length - 1];
        fetch("api/release", {method: "POST", headers: {"Content-Type": "application/json"},
                              body: JSON.stringify({name: "x", owner: "y"})})
          .then((r) => done(r.status), () => done(-1));
        """
    )
    assert status == 403
    assert row_of(browser, slow.id) is not None
    # still held; freed here, its holder stops
    plan = plan_of(holder)
    name = plan.keys.build([], {"key": f"web-ro-{run}", "run": run})
    assert plan.redlock.release_owned_by(name, slow.id) > 0
    assert slow.get(timeout=60) == {"lost": True}


def test_each_kind_of_node_shows_its_own_checks(
    browser: Any, serve: Any, redis_nodes3: Any, postgres_node1: Any, etcd_node1: Any
):
    """A mixed quorum: the Redis node's row has its eviction verdict, the
    PostgreSQL and etcd rows none, each with its own kind's settings instead."""
    urls = [redis_nodes3.urls[0], postgres_node1.urls[0], etcd_node1.urls[0]]
    browser.get(serve(make_app(cli_app.make_app(urls))))
    wait_for(lambda: len(css(browser, "table.nodes tr.node.up")) == 3, 30, "the nodes table")
    head = css(browser, "table.nodes thead")[0].text
    assert "Eviction" not in head and "Durability" in head
    redis_row = css(browser, "table.nodes tr.node.redis td.checks")[0].text
    assert "maxmemory-policy noeviction" in redis_row and "unsafe" not in redis_row
    pg_row = css(browser, "table.nodes tr.node.postgres td.checks")[0].text
    etcd_row = css(browser, "table.nodes tr.node.etcd td.checks")[0].text
    for row in (pg_row, etcd_row):
        assert "maxmemory" not in row and "eviction" not in row.lower() and "aof" not in row
    # the test servers run without fsync, and the etcd one with one member: said in red
    assert "fsync off (unsafe)" in pg_row and "full_page_writes on" in pg_row
    unsafe = [e.text for e in css(browser, "table.nodes tr.node.postgres .check.error")]
    assert unsafe == ["fsync off (unsafe)"]
    assert "members 1 (quorum 1) (unsafe)" in etcd_row
    findings = " ".join(e.text for e in css(browser, ".finding"))
    assert "fsync off: a crash" in findings and "maxmemory-policy" not in findings


def test_a_lone_postgres_node_is_described_as_one_database(
    browser: Any, serve: Any, postgres_node1: Any
):
    browser.get(serve(make_app(cli_app.make_app(postgres_node1.urls))))
    wait_for(lambda: css(browser, "table.nodes tr.node.up.postgres"), 30, "the nodes table")
    about = css(browser, ".about")[0].text
    assert "ONE node, a PostgreSQL database" in about and "Redis" not in about
