"""A source run's retry policy: an attempt killed from outside (`worker_crashed`) is run again and the
second attempt succeeds, each attempt in the report and the log; a failure the policy does not name ends
the run at once; the policy's keys are checked."""

from __future__ import annotations

import contextlib
import os
import signal

import pytest

from cortex_nb import errors
from cortex_nb.run_spec import validate_spec

from .notebook_fixtures import wait_until
from .run_projects import processes_with, wait_for_log, write_project

CRASH_ONCE = """
import os, sys, time
attempt = os.environ["CORTEX_RUN_ATTEMPT"]
print("attempt", attempt, "MARKER-{marker}", flush=True)
if attempt == "1":
    time.sleep(120)  # killed from outside while it sleeps
os.makedirs("out", exist_ok=True)
open("out/result.txt", "w").write("done on attempt " + attempt)
"""


def test_a_killed_first_attempt_is_retried_and_the_second_succeeds(runs_client, tmp_path):
    marker = os.urandom(6).hex()
    spec = write_project(
        tmp_path / "crashy",
        CRASH_ONCE.replace("{marker}", marker),
        name="crash-once",
        outputs={"result": {"path": "out/result.txt"}},
        retry={"max": 2, "on": ["worker_crashed"], "backoff_s": 0.5},
        command=["python", "main.py", f"MARKER-{marker}"],  # how the test finds its process on the host
    )
    handle = runs_client.run(spec)
    wait_for_log(handle, f"attempt 1 MARKER-{marker}")
    wait_until(lambda: processes_with(f"MARKER-{marker}"), 30)
    for pid in processes_with(f"MARKER-{marker}"):
        with contextlib.suppress(ProcessLookupError):  # a wrapper of the run that ended meanwhile
            os.kill(pid, signal.SIGKILL)
    final = handle.wait(180)
    assert final["status"] == "done", final
    result = handle.outputs("result", tmp_path / "result.txt")
    assert result.read_text() == "done on attempt 2"
    attempts = handle.report()["attempts"]
    assert [(a["attempt"], a["status"], a["failure_code"], a["retry_reason"]) for a in attempts] == [
        (1, "failed", "workload_runtime_failed", "worker_crashed"),
        (2, "done", None, None),
    ]
    assert attempts[0]["signal"] == signal.SIGKILL and attempts[1]["exit_code"] == 0
    assert attempts[0]["finished_at"] <= attempts[1]["started_at"]
    logs = "\n".join(handle.logs())
    assert "attempt 1 failed (worker_crashed: workload_runtime_failed)" in logs
    assert "retrying in 0.5 s (attempt 2 of at most 3)" in logs


def test_a_failure_the_policy_does_not_name_is_not_retried(runs_client, tmp_path):
    spec = write_project(
        tmp_path / "exits",
        "import sys; sys.exit(3)",
        name="exits",
        retry={"max": 3, "on": ["worker_crashed", "oom"], "backoff_s": 0},
    )
    handle = runs_client.run(spec)
    final = handle.wait(120)
    assert final["status"] == "failed" and final["failure_code"] == "workload_runtime_failed"
    assert [(a["attempt"], a["retry_reason"]) for a in handle.report()["attempts"]] == [(1, None)]


def test_the_retry_policy_is_checked():
    base = {"version": 1, "name": "r", "command": "true"}
    assert validate_spec({**base, "retry": {"max": 2}})["retry"] == {
        "max": 2,
        "on": ["worker_crashed"],
        "backoff_s": 10,
    }
    for retry, field in (
        ({"on": ["oom"]}, "retry.max"),
        ({"max": 11}, "retry.max"),
        ({"max": 1, "on": ["host_lost"]}, "retry.on[0]"),
        ({"max": 1, "backoff_s": -1}, "retry.backoff_s"),
        ({"max": 1, "every": 2}, "retry.every"),
    ):
        with pytest.raises(errors.BadRequestError) as info:
            validate_spec({**base, "retry": retry})
        assert info.value.detail["field"] == field
