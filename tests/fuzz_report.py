"""Run schemathesis against a live backend and read its NDJSON report (tests/test_openapi_fuzz.py and
bench/bench_openapi_fuzz.py): requests sent, statuses, operations covered, failures by kind."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHECKS = "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance"


@dataclass
class FuzzReport:
    returncode: int
    output: str
    requests: int = 0
    statuses: collections.Counter = field(default_factory=collections.Counter)
    operations: set[str] = field(default_factory=set)
    failures: collections.Counter = field(default_factory=collections.Counter)  # check name -> count
    errors: list[str] = field(
        default_factory=list
    )  # what schemathesis could not do (hung requests among them)

    @property
    def server_errors(self) -> int:
        return sum(count for status, count in self.statuses.items() if status is not None and status >= 500)


def _failures_section(stdout: str) -> str:
    """schemathesis's account of what failed (each with a curl line that reproduces it), else its tail."""
    start = stdout.find("= FAILURES =") if "= FAILURES =" in stdout else stdout.find("= ERRORS =")
    if start < 0:
        return stdout[-4000:]
    end = stdout.find("= WARNINGS =", start)
    return stdout[start : end if end > 0 else None][:12000]


def fuzz(
    url: str,
    token: str,
    report_dir: Path,
    seconds: int,
    seed: int = 1,
    workers: int = 1,
    *,
    document: Path | None = None,
    header: str = "Authorization: Bearer {token}",
    checks: str = CHECKS,
    max_examples: int | None = None,
    phases: str | None = None,
) -> FuzzReport:
    """`schemathesis run` against `url`'s own document (or `document`, a file, served at `url`), every request
    with `token`: `max_examples` per operation, or else for `seconds` (the process is stopped after `seconds`
    plus four minutes either way)."""
    source = [str(document), "--url", url] if document is not None else [f"{url}/v1/openapi.json"]
    examples = ["--max-examples", str(max_examples)] if max_examples is not None else []
    examples += ["--phases", phases] if phases is not None else []
    command = [
        str(Path(sys.executable).with_name("schemathesis")),
        "run",
        *source,
        "-H",
        header.format(token=token),
        "--checks",
        checks,
        *examples,
        # schemathesis keeps fuzzing until --max-time when it is given, whatever --max-examples says.
        *(["--max-time", str(seconds)] if max_examples is None else []),
        "--request-timeout",
        "30",
        "--workers",
        str(workers),
        "--seed",
        str(seed),
        "--no-color",
        "--report",
        "ndjson",
        "--report-dir",
        str(report_dir),
    ]
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "tests.schemathesis_hooks", "PYTHONPATH": str(ROOT)}
    # From the report dir: schemathesis keeps a cache (.schemathesis/) in its working directory.
    result = subprocess.run(
        command, cwd=report_dir, env=env, capture_output=True, text=True, timeout=seconds + 240
    )
    report = FuzzReport(result.returncode, _failures_section(result.stdout) + result.stderr[-2000:])
    for path in report_dir.glob("*.ndjson"):
        for line in path.read_text().splitlines():
            event = json.loads(line)
            kind, body = next(iter(event.items()))
            if kind == "NonFatalError":
                report.errors.append(json.dumps(body)[:500])
            if kind != "ScenarioFinished":
                continue
            recorder = body.get("recorder", {})
            report.operations.add(recorder.get("label", ""))
            for interaction in recorder.get("interactions", {}).values():
                report.requests += 1
                report.statuses[(interaction.get("response") or {}).get("status_code")] += 1
            for checks in recorder.get("checks", {}).values():
                for check in checks:
                    if check.get("status") == "failure":
                        report.failures[check.get("name", "?")] += 1
    report.operations.discard("")
    return report
