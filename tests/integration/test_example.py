"""The example project runs with one command and every check it makes holds."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.integration
@pytest.mark.slow
def test_the_example_project_runs_and_every_check_holds():
    proc = subprocess.run(
        [sys.executable, "-m", "example_project"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "FAIL" not in proc.stdout
    assert "checks hold" in proc.stdout
