"""The example project runs with one command and every check it makes holds, on
three Redis nodes and on one PostgreSQL node (``EXAMPLE_NODES=postgresql``)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import postgres

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize("nodes", ["redis", "postgresql"])
def test_the_example_project_runs_and_every_check_holds(nodes):
    if nodes == "postgresql":
        from celery_redlock.testing.postgres import postgres_missing

        postgres.require(postgres_missing())
    proc = subprocess.run(
        [sys.executable, "-m", "example_project"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        env=dict(os.environ, EXAMPLE_NODES=nodes),
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "FAIL" not in proc.stdout
    assert "checks hold" in proc.stdout
    if nodes == "postgresql":
        assert "Redlock nodes postgresql://" in proc.stdout
        assert "tokens grow across the crash" in proc.stdout
