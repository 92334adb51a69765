"""The script gate: what the AST scan finds (and what it lets pass), a strict backend refusing a run with
`ctypes` or a file it cannot parse before anything runs, and the default (warn) reporting and running."""

from __future__ import annotations

import textwrap

import pytest
from cortex_backend.runs.script_gate import scan_source, scan_workdir

from cortex_nb import Client

from .backend_process import start_backend
from .run_projects import write_project

FLAGGED = """
import ctypes
from socket import create_connection
import os, subprocess
from pathlib import Path
os.system("ls")
subprocess.run("ls", shell=True)
subprocess.check_output(["ls"], shell=flag)
open("/etc/cron.d/x", "w")
open("../../escape.txt", mode="a")
Path("/root/.bashrc").write_text("x")
__import__("ctypes.util")
"""

ALLOWED = """
import json, subprocess
from pathlib import Path
subprocess.run(["python", "-V"], check=True)
subprocess.run("ls", shell=False)
open("out/metrics.json", "w").write(json.dumps({}))
open("/etc/hostname").read()
open("/dev/null", "w")
open("/tmp/cortex-run/out/x.txt", "w")
Path("out/y.txt").write_text("ok")
mode = "w"
open("/etc/anything", mode)  # not a literal mode: beyond a static check
"""


def test_the_scan_finds_each_rule_on_its_line():
    found = [(f.line, f.rule) for f in scan_source(FLAGGED.encode(), "main.py", ["/tmp/cortex-run"])]
    assert found == [
        (2, "ctypes"),
        (3, "network"),
        (6, "shell"),
        (7, "shell"),
        (8, "shell"),
        (9, "write_outside_workdir"),
        (10, "write_outside_workdir"),
        (11, "write_outside_workdir"),
        (12, "ctypes"),
    ]
    assert scan_source(ALLOWED.encode(), "main.py", ["/tmp/cortex-run"]) == []


def test_unparsable_files_are_findings_and_rules_can_be_allowed(tmp_path):
    (tmp_path / "main.py").write_text("import ctypes\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "broken.py").write_text("def f(:\n")
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "staged.py").write_text("import ctypes\n")  # staged by the backend: not read
    findings, scanned = scan_workdir(tmp_path)
    assert scanned == 2
    assert [(f.path, f.rule) for f in findings] == [("main.py", "ctypes"), ("pkg/broken.py", "unparsable")]
    allowed, _ = scan_workdir(tmp_path, allowed_rules=["ctypes"])
    assert [f.rule for f in allowed] == ["unparsable"]


@pytest.fixture(scope="module")
def strict_backend(tmp_path_factory):
    process = start_backend(
        tmp_path_factory.mktemp("strict-gate"),
        "--devices",
        "cpu:2",
        "--warm-workers",
        "0",
        "--run-script-gate",
        "strict",
    )
    yield process
    process.stop()


def test_strict_refuses_ctypes_before_the_run_starts(strict_backend, tmp_path):
    with Client(strict_backend.url, strict_backend.token) as client:
        spec = write_project(
            tmp_path / "ctypes",
            """
            import ctypes
            open("ran.txt", "w").write("it ran")
            print("RAN")
            """,
            name="native",
        )
        handle = client.run(spec)
        final = handle.wait(120)
        assert final["status"] == "failed" and final["failure_code"] == "script_refused"
        assert "main.py:2" in final["failure_message"]
        report = handle.report()
        assert report["script_gate"]["refused"] is True and report["script_gate"]["mode"] == "strict"
        assert [(f["path"], f["line"], f["rule"]) for f in report["script_gate"]["findings"]] == [
            ("main.py", 2, "ctypes")
        ]
        assert report.get("exit_code") is None and report.get("wall_seconds") is None
        logs = "\n".join(handle.logs())
        assert "script gate (strict): main.py:2" in logs and "RAN" not in logs


def test_strict_refuses_a_file_it_cannot_parse_and_runs_a_clean_one(strict_backend, tmp_path):
    with Client(strict_backend.url, strict_backend.token) as client:
        broken = write_project(
            tmp_path / "broken",
            "print('fine')\n",
            name="broken",
            extra_files={"helper.py": "def oops(:\n    pass\n"},
        )
        refused = client.run(broken).wait(120)
        assert refused["failure_code"] == "script_refused" and "helper.py" in refused["failure_message"]
        clean = client.run(write_project(tmp_path / "clean", "print('clean run')\n", name="clean"))
        assert clean.wait(120)["status"] == "done"
        assert clean.report()["script_gate"] == {
            "mode": "strict",
            "files_scanned": 1,
            "refused": False,
            "findings": [],
        }


def test_warn_reports_and_runs(runs_client, tmp_path):
    spec = write_project(
        tmp_path / "warned",
        textwrap.dedent(
            """
            import ctypes
            print("RAN", ctypes.sizeof(ctypes.c_int))
            """
        ),
        name="warned",
    )
    handle = runs_client.run(spec)
    assert handle.wait(120)["status"] == "done"
    gate = handle.report()["script_gate"]
    assert gate["mode"] == "warn" and gate["refused"] is False
    assert [f["rule"] for f in gate["findings"]] == ["ctypes"]
    logs = "\n".join(handle.logs())
    assert "script gate (warn): main.py:2" in logs and "RAN 4" in logs
