"""Run uids of root backends: each uid is held by one backend host-wide, a backend never kills another's
runs, and a uid that still owns a process is never handed to a run."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from cortex_backend.runs import uids

from cortex_nb import Client

from .backend_process import start_backend
from .run_projects import processes_with, wait_for_log, write_project

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="run uids exist only for root backends")


def _sleepers(marker: str) -> list[int]:
    """The run's `sleep` itself (bubblewrap's processes carry the command line in their arguments too)."""
    return [
        pid
        for pid in processes_with(f"sleep {marker}")
        if open(f"/proc/{pid}/cmdline", "rb").read().startswith(b"sleep")
    ]


def _uid_of(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("Uid:"):
            return int(line.split()[1])
    raise AssertionError(f"no Uid line for {pid}")


def test_two_pools_on_one_host_never_share_a_uid(tmp_path):
    base = 1_600_000_000 + random.randrange(10**6) * 16
    first, second = uids.UidPool(base, 3, tmp_path), uids.UidPool(base, 3, tmp_path)
    try:
        assert first.claim() == [base, base + 1, base + 2]
        assert second.claim() == [base + 3, base + 4, base + 5]
    finally:
        first.close()
        second.close()
    reclaimed = uids.UidPool(base, 3, tmp_path)  # closed pools give their uids back
    try:
        assert reclaimed.claim() == [base, base + 1, base + 2]
    finally:
        reclaimed.close()


def test_a_uid_with_leftovers_is_quarantined_not_reused(tmp_path):
    base = 1_600_000_000 + random.randrange(10**6) * 16
    pool = uids.UidPool(base, 1, tmp_path)
    try:
        pool.claim()
        uid = pool.acquire()
        pool.release(uid, clean=False)
        with pytest.raises(uids.UidPoolExhausted):
            pool.acquire()
        pool.retry_quarantined(lambda _: True)
        assert pool.acquire() == uid
    finally:
        pool.close()


def test_a_uid_that_owns_a_process_is_skipped(tmp_path):
    base = 1_600_000_000 + random.randrange(10**6) * 16
    marker = str(10**7 + random.randrange(10**7))
    stranger = subprocess.Popen(
        ["setpriv", f"--reuid={base}", f"--regid={base}", "--clear-groups", "sleep", marker]
    )
    try:
        deadline = time.monotonic() + 10
        while not processes_with(f"sleep {marker}") and time.monotonic() < deadline:
            time.sleep(0.05)
        backend = start_backend(
            tmp_path / "backend", "--devices", "cpu:1", "--warm-workers", "0", "--run-uid-base", str(base)
        )
        try:
            with Client(backend.url, backend.token) as client:
                handle = client.run(write_project(tmp_path / "p", "print('hi')", name="uid"))
                assert handle.wait(120)["status"] == "done", handle.info
                assert handle.report()["run_uid"] == base + 1
            assert stranger.poll() is None, "the backend must not kill a process that is not its run's"
        finally:
            backend.stop()
    finally:
        stranger.kill()
        stranger.wait()


def test_a_second_root_backend_leaves_the_first_ones_runs_alone(tmp_path):
    marker = str(10**7 + random.randrange(10**7))
    # Both on one pool of their own (the default one may be in use by other backends on a shared machine).
    base = str(1_600_000_000 + random.randrange(10**6) * 16)
    first = start_backend(
        tmp_path / "first",
        "--devices",
        "cpu:1",
        "--warm-workers",
        "0",
        "--run-kill-grace",
        "1",
        "--run-uid-base",
        base,
    )
    second = None
    try:
        with Client(first.url, first.token) as client:
            handle = client.run(
                write_project(tmp_path / "a", "", name="long", command=f"echo up; exec sleep {marker}")
            )
            wait_for_log(handle, "up")
            deadline = time.monotonic() + 10
            while not _sleepers(marker) and time.monotonic() < deadline:
                time.sleep(0.05)
            [pid] = _sleepers(marker)
            first_uid = _uid_of(pid)
            second = start_backend(
                tmp_path / "second", "--devices", "cpu:1", "--warm-workers", "0", "--run-uid-base", base
            )
            with Client(second.url, second.token) as other:
                quick = other.run(write_project(tmp_path / "b", "print('quick')", name="quick"))
                assert quick.wait(120)["status"] == "done", quick.info
                # Neither the second backend's start-up nor the end of its run touched the first one's run.
                assert _sleepers(marker) == [pid]
                assert handle.status() == "running", handle.info
                assert quick.report()["run_uid"] != first_uid
                assert first_uid == int(base)
            # Killed from outside, it is not said to have run out of memory when the cgroup says it did not.
            os.kill(pid, signal.SIGKILL)
            final = handle.wait(60)
            assert final["status"] == "failed" and "SIGKILL" in final["failure_message"], final
            if handle.report()["isolation"]["memory"].startswith("cgroup"):
                assert "not by its memory limit" in final["failure_message"], final
    finally:
        first.stop()
        if second is not None:
            second.stop()


def test_without_the_sandbox_a_runs_files_in_shared_places_go_before_its_uid_is_reused(tmp_path):
    """With --run-namespaces off a run sees the host's /tmp and /var/tmp: what it leaves there must not
    be waiting for the next run that gets its uid."""
    workspace = Path(tempfile.mkdtemp(prefix="cortex-runs-test-", dir="/tmp"))
    os.chmod(workspace, 0o711)
    marker = f"cortex-left-{random.randrange(10**9)}"
    backend = start_backend(
        tmp_path / "backend",
        "--devices",
        "cpu:1",
        "--warm-workers",
        "0",
        "--run-namespaces",
        "off",
        "--runs-workspace",
        str(workspace),
    )
    try:
        with Client(backend.url, backend.token) as client:
            leaver = client.run(
                write_project(
                    tmp_path / "a",
                    "",
                    name="leaver",
                    command=f"echo secret > /tmp/{marker}; echo secret > /var/tmp/{marker}",
                )
            )
            assert leaver.wait(120)["status"] == "done", (leaver.info, leaver.logs())
            assert not Path("/tmp", marker).exists() and not Path("/var/tmp", marker).exists()
            follower = client.run(write_project(tmp_path / "b", "", name="follower", command="echo next"))
            assert follower.wait(120)["status"] == "done"
            assert follower.report()["run_uid"] == leaver.report()["run_uid"]  # clean, so back in the pool
    finally:
        backend.stop()
        shutil.rmtree(workspace, ignore_errors=True)
        for folder in ("/tmp", "/var/tmp"):
            Path(folder, marker).unlink(missing_ok=True)
