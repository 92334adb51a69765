"""The unit layer (`-m "not live"`) holds no test that starts a process; the live layer holds every one that does."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def collected(*args: str) -> set[str]:
    output = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    ).stdout
    return {line.strip() for line in output.splitlines() if "::" in line}


def test_the_live_marker_splits_tests_by_what_they_start():
    files = ["tests/test_wire.py", "tests/test_parity.py", "tests/test_local_backend.py"]
    unit = collected("-m", "not live", *files)
    live = collected("-m", "live", *files)
    assert unit and live and not unit & live
    # Wire frames are pure functions; parity trains on a backend (the `client` fixture); the local backend
    # tests start processes themselves.
    assert all(test.startswith("tests/test_wire.py::") for test in unit)
    assert any(test.startswith("tests/test_parity.py::") for test in live)
    assert any(test.startswith("tests/test_local_backend.py::") for test in live)
    assert unit | live == collected(*files)
