"""Source runs through the real backend: submission, verified outputs, output failures, submission ids,
spec refusals, staged models, scopes, and runs queueing on the same device slots as training jobs."""

from __future__ import annotations

import hashlib
import http.server
import io
import json
import subprocess
import sys
import tarfile
import threading
import uuid

import httpx
import pytest

from cortex_nb import Client, RetryPolicy
from cortex_nb.errors import (
    BadRequestError,
    ConflictError,
    NotFoundError,
    OutputVerificationError,
    PermissionError,
    RunFailed,
    SubmissionOutcomeUnknown,
)

from .backend_process import start_backend
from .run_projects import wait_for_log, write_project

WRITE_OUTPUTS = """
    import json, os
    os.makedirs("out", exist_ok=True)
    rows = [{"n": n, "square": n * n} for n in range(5)]
    json.dump({"rows": rows, "cwd": os.getcwd()}, open("out/metrics.json", "w"))
    open("out/table.csv", "w").write("n,square\\n" + "".join(f"{r['n']},{r['square']}\\n" for r in rows))
    print("wrote", len(rows), "rows")
"""


def test_happy_path_outputs_verified_downloaded_and_reported(runs_client, tmp_path):
    spec = write_project(
        tmp_path / "project",
        WRITE_OUTPUTS,
        name="happy",
        outputs={
            "metrics": {"path": "out/metrics.json"},
            "table": {"path": "out/table.csv", "max_bytes": 4096},
        },
    )
    handle = runs_client.run(spec)
    final = handle.wait(120)
    assert final["status"] == "done", final
    assert final["failure_code"] is None

    metrics = handle.outputs("metrics", tmp_path / "downloads" / "m.json")
    assert json.loads(metrics.read_text())["rows"][3] == {"n": 3, "square": 9}
    table = handle.outputs("table", str(tmp_path / "downloads") + "/")
    assert table == tmp_path / "downloads" / "table.csv"
    assert table.read_text().splitlines()[2] == "1,1"
    recorded = {row["name"]: row for row in handle.output_list()}
    assert recorded["table"]["sha256"] == hashlib.sha256(table.read_bytes()).hexdigest()
    assert recorded["table"]["bytes"] == table.stat().st_size

    report = handle.report()
    assert report["exit_code"] == 0 and report["signal"] is None
    assert report["device_seconds"] > 0 and report["wall_seconds"] > 0
    assert report["device_kind"] == "cpu" and report["devices"] == ["cpu"]
    assert report["peak_memory_bytes"] > 1_000_000  # a Python process, in bytes
    assert report["cpu_seconds"] > 0
    assert report["isolation_tier"] == "netns"
    assert report["limits"]["address_space_bytes"] == 1024 * 2**20
    assert "wrote 5 rows" in handle.logs()


def test_run_logs_are_in_the_logbook_with_streams(runs_client, tmp_path):
    spec = write_project(
        tmp_path,
        """
        import sys
        print("to stdout")
        print("to stderr", file=sys.stderr)
    """,
        name="streams",
    )
    handle = runs_client.run(spec)
    handle.wait(120)
    page = handle.log_page(0, limit=100)
    by_stream = {(entry["stream"], entry["line"]) for entry in page["lines"]}
    assert ("stdout", "to stdout") in by_stream and ("stderr", "to stderr") in by_stream
    assert any(stream == "system" and line.startswith("sandbox: ") for stream, line in by_stream)
    assert all(entry["sub_job_id"] == "main" for entry in page["lines"])
    assert [entry["seq"] for entry in page["lines"]] == sorted(entry["seq"] for entry in page["lines"])
    assert page["run_status"] == "done"


def test_output_tampered_after_collection_fails_client_verification(runs_client, runs_backend, tmp_path):
    spec = write_project(
        tmp_path / "project", WRITE_OUTPUTS, name="tamper", outputs={"metrics": {"path": "out/metrics.json"}}
    )
    handle = runs_client.run(spec)
    assert handle.wait(120)["status"] == "done"
    stored = runs_backend.data_dir / "runs" / handle.run_id / "outputs" / "metrics"
    original = stored.read_bytes()

    flipped = bytearray(original)
    flipped[5] ^= 0x01
    stored.write_bytes(bytes(flipped))  # same length, other bytes
    dest = tmp_path / "got.json"
    with pytest.raises(OutputVerificationError) as caught:
        handle.outputs("metrics", dest)
    assert caught.value.code == "output_corrupted" and "SHA-256" in caught.value.message
    assert not dest.exists() and not (tmp_path / "got.json.partial").exists()

    stored.write_bytes(original + b" ")  # other length
    with pytest.raises(OutputVerificationError) as caught:
        handle.outputs("metrics", dest)
    assert caught.value.detail["received_bytes"] == len(original) + 1

    stored.write_bytes(original)
    assert handle.outputs("metrics", dest).read_bytes() == original


def test_missing_required_output_fails_output_missing(runs_client, tmp_path):
    spec = write_project(
        tmp_path,
        "print('forgot to write it')",
        name="missing",
        outputs={
            "metrics": {"path": "out/metrics.json"},
            "optional": {"path": "extra.txt", "required": False},
        },
    )
    handle = runs_client.run(spec)
    final = handle.wait(120)
    assert final["status"] == "failed" and final["failure_code"] == "output_missing"
    assert "metrics" in final["failure_message"] and "optional" not in final["failure_message"]
    with pytest.raises(RunFailed) as caught:
        handle.raise_for_status()
    assert caught.value.code == "output_missing"


def test_optional_output_may_be_absent(runs_client, tmp_path):
    spec = write_project(
        tmp_path,
        "open('a.txt', 'w').write('a')",
        name="optional",
        outputs={"a": {"path": "a.txt"}, "b": {"path": "b.txt", "required": False}},
    )
    handle = runs_client.run(spec)
    assert handle.wait(120)["status"] == "done"
    rows = {row["name"]: row for row in handle.output_list()}
    assert rows["a"]["collected"] and not rows["b"]["collected"]
    with pytest.raises(ConflictError) as caught:
        handle.outputs("b", tmp_path / "b.txt")
    assert caught.value.code == "output_not_available"


def test_too_large_output_fails_output_too_large(runs_client, tmp_path):
    spec = write_project(
        tmp_path,
        "open('big.bin', 'wb').write(b'x' * 1000)",
        name="too-large",
        outputs={"big": {"path": "big.bin", "max_bytes": 100}},
    )
    final = runs_client.run(spec).wait(120)
    assert final["failure_code"] == "output_too_large"
    assert "1000 bytes" in final["failure_message"] and "100" in final["failure_message"]


def test_undeclared_output_is_refused_with_its_code(runs_client, runs_backend, tmp_path):
    spec = write_project(
        tmp_path,
        "open('a.txt', 'w').write('a'); open('secret.txt', 'w').write('s')",
        name="undeclared",
        outputs={"a": {"path": "a.txt"}},
    )
    handle = runs_client.run(spec)
    assert handle.wait(120)["status"] == "done"
    with pytest.raises(NotFoundError) as caught:
        handle.outputs("secret", tmp_path / "s.txt")
    assert caught.value.code == "output_not_declared"
    response = httpx.get(
        f"{runs_backend.url}/v1/runs/{handle.run_id}/outputs/secret",
        headers={"Authorization": f"Bearer {runs_backend.token}"},
    )
    assert response.status_code == 404 and response.json()["error"]["code"] == "output_not_declared"
    assert not (runs_backend.data_dir / "runs" / handle.run_id / "outputs" / "secret").exists()


def test_output_symlink_is_not_followed(runs_client, tmp_path):
    spec = write_project(
        tmp_path,
        "import os; os.symlink('/etc/hostname', 'leak.txt')",
        name="symlink",
        outputs={"leak": {"path": "leak.txt"}},
    )
    final = runs_client.run(spec).wait(120)
    assert final["failure_code"] == "output_missing" and "symlink" in final["failure_message"]


def test_failing_command_reports_exit_code(runs_client, tmp_path):
    spec = write_project(
        tmp_path, "import sys; print('bad input', file=sys.stderr); sys.exit(3)", name="exit-3"
    )
    handle = runs_client.run(spec)
    final = handle.wait(120)
    assert final["failure_code"] == "workload_runtime_failed" and final["exit_code"] == 3
    assert "code 3" in final["failure_message"] and "bad input" in final["failure_message"]
    assert handle.report()["exit_code"] == 3
    missing = runs_client.run(
        write_project(tmp_path / "missing", "", name="no-such-command", command=["no-such-command"])
    )
    final = missing.wait(120)
    assert (
        final["failure_code"] == "workload_runtime_failed"
        and "could not start the command" in final["failure_message"]
    )
    assert final["exit_code"] == 127


def test_command_string_runs_through_sh(runs_client, tmp_path):
    spec = write_project(
        tmp_path,
        "",
        name="shell",
        command="echo one | tr a-z A-Z > shout.txt",
        outputs={"shout": {"path": "shout.txt"}},
    )
    handle = runs_client.run(spec)
    assert handle.wait(120)["status"] == "done"
    assert handle.outputs("shout", tmp_path / "shout.txt").read_text() == "ONE\n"


def test_inputs_arrive_at_their_paths(runs_client, tmp_path):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "numbers.txt").write_text("3\n4\n5\n")
    spec = write_project(
        tmp_path,
        """
        total = sum(int(line) for line in open("data/numbers.txt"))
        open("sum.txt", "w").write(str(total))
    """,
        name="inputs",
        inputs={"numbers": {"path": "data/numbers.txt"}},
        outputs={"sum": {"path": "sum.txt"}},
    )
    handle = runs_client.run(spec)
    assert handle.wait(120)["status"] == "done"
    assert handle.outputs("sum", tmp_path / "sum-out.txt").read_text() == "12"


def test_models_are_staged_read_only(runs_client, gpt2_dir, tmp_path):
    spec = write_project(
        tmp_path,
        """
        import json, os
        found = sorted(os.listdir("models/small-gpt2"))
        config = json.load(open("models/small-gpt2/config.json"))
        try:
            open("models/small-gpt2/config.json", "a").write("x")
            writable = True
        except OSError as exc:
            writable = str(exc)
        mounts = [line.split() for line in open("/proc/self/mountinfo")]
        options = [fields[5] for fields in mounts if fields[4].endswith("/models/small-gpt2")]
        json.dump({"files": found, "model_type": config["model_type"], "writable": writable, "options": options},
                  open("seen.json", "w"))
    """,
        name="models",
        models=["small-gpt2"],
        outputs={"seen": {"path": "seen.json"}},
    )
    handle = runs_client.run(spec)
    assert handle.wait(120)["status"] == "done", handle.info
    seen = json.loads(handle.outputs("seen", tmp_path / "seen.json").read_text())
    assert seen["files"] == sorted(path.name for path in gpt2_dir.iterdir())
    assert seen["model_type"] == json.loads((gpt2_dir / "config.json").read_text())["model_type"]
    assert seen["writable"] is not True
    assert len(seen["options"]) == 1 and "ro" in seen["options"][0].split(",")  # a read-only bind mount


def test_duplicate_submission_id_runs_once(runs_client, tmp_path):
    marker = f"ran-{uuid.uuid4().hex[:8]}"
    spec = write_project(tmp_path, f"print('{marker}')", name="dup")
    submission_id = f"dup-{uuid.uuid4().hex[:8]}"
    first = runs_client.run(spec, submission_id=submission_id)
    second = runs_client.run(spec, submission_id=submission_id)
    assert second.run_id == first.run_id
    first.wait(120)
    third = runs_client.run(spec, submission_id=submission_id)  # after it finished, too
    assert third.run_id == first.run_id
    assert [run["run_id"] for run in runs_client.list_runs(submission_id=submission_id)] == [first.run_id]
    assert first.logs().count(marker) == 1
    assert runs_client.resume(submission_id).run_id == first.run_id
    (tmp_path / "main.py").write_text("print('something else')")
    with pytest.raises(ConflictError) as caught:
        runs_client.run(spec, submission_id=submission_id)  # same id, other files: refused, not run
    assert caught.value.detail["run_id"] == first.run_id


class _DropRunAnswers(http.server.BaseHTTPRequestHandler):
    """Forwards to the backend, but answers nothing to POST /v1/runs (the answer is lost on the way)."""

    backend_url = ""
    dropped = 0

    def _forward(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        headers = {
            key: value for key, value in self.headers.items() if key.lower() not in ("host", "content-length")
        }
        response = httpx.request(
            self.command, self.server.backend_url + self.path, headers=headers, content=body, timeout=60
        )
        if self.command == "POST" and self.path.split("?")[0] == "/v1/runs":
            type(self).dropped += 1
            self.close_connection = True
            return
        self.send_response(response.status_code)
        for key, value in response.headers.items():
            if key.lower() not in ("content-length", "transfer-encoding", "connection", "content-encoding"):
                self.send_header(key, value)
        self.send_header("Content-Length", str(len(response.content)))
        self.end_headers()
        self.wfile.write(response.content)

    do_GET = do_POST = do_PUT = _forward

    def log_message(self, *args) -> None:
        pass


def test_lost_submission_answer_is_resumable_and_runs_once(runs_backend, runs_client, tmp_path):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _DropRunAnswers)
    server.backend_url = runs_backend.url
    threading.Thread(target=server.serve_forever, daemon=True).start()
    marker = f"lost-{uuid.uuid4().hex[:8]}"
    spec = write_project(tmp_path, f"print('{marker}')", name="lost-answer")
    try:
        proxied = Client(
            f"http://127.0.0.1:{server.server_address[1]}",
            runs_backend.token,
            retry=RetryPolicy(max_attempts=3, initial_backoff_s=0.05),
        )
        with pytest.raises(SubmissionOutcomeUnknown) as caught:
            proxied.run(spec)
        proxied.close()
    finally:
        server.shutdown()
        server.server_close()
    submission_id = caught.value.submission_id
    assert caught.value.code == "submission_outcome_unknown"
    assert _DropRunAnswers.dropped == 3  # the backend got the submission three times
    handle = runs_client.resume(submission_id)
    assert handle.wait(120)["status"] == "done"
    assert [run["run_id"] for run in runs_client.list_runs(submission_id=submission_id)] == [handle.run_id]
    assert handle.logs().count(marker) == 1
    with pytest.raises(NotFoundError):
        runs_client.resume("never-submitted-" + uuid.uuid4().hex[:6])


def _post_run(backend, body: dict) -> httpx.Response:
    return httpx.post(
        f"{backend.url}/v1/runs", json=body, headers={"Authorization": f"Bearer {backend.token}"}, timeout=30
    )


def test_backend_refuses_bad_specs_naming_the_field(runs_backend):
    spec = {"version": 1, "name": "raw", "command": ["true"]}
    cases = [
        ({**spec, "retries": 3}, "spec_invalid", "retries"),
        (
            {**spec, "outputs": {"m": {"path": "m", "max_bytes": 2**30}}},
            "spec_invalid",
            "outputs.m.max_bytes",
        ),
        ({**spec, "models": ["not-registered"]}, "spec_invalid", "models[0]"),
        ({**spec, "models": ["tiny"]}, "spec_invalid", "models[0]"),
        ({**spec, "resources": {"gpu": {"count": 1}}}, "exceeds_capacity", "resources.gpu.count"),
    ]
    for body_spec, code, field in cases:
        response = _post_run(runs_backend, {"spec": body_spec, "manifest": []})
        assert response.status_code == 400, (field, response.text)
        error = response.json()["error"]
        assert (error["code"], error["detail"]["field"]) == (code, field)
        assert error["message"].startswith(field)


def test_client_refuses_a_bad_spec_before_uploading(runs_client, tmp_path):
    spec = write_project(tmp_path, "", name="bad", outputs={"m": {"path": "m", "max_bytes": 2**30}})
    with pytest.raises(BadRequestError) as caught:
        runs_client.run(spec)
    assert caught.value.detail["field"] == "outputs.m.max_bytes"
    with pytest.raises(BadRequestError) as caught:
        runs_client.run(
            {"version": 1, "name": "x", "command": "true", "source": {"include": ["nothing-*.py"]}},
            base_dir=tmp_path,
        )
    assert caught.value.detail["field"] == "source.include[0]"


def _tar(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _upload(backend, data: bytes) -> dict:
    upload_id = "test-" + uuid.uuid4().hex
    response = httpx.put(
        f"{backend.url}/v1/runs/uploads/{upload_id}/chunks/0",
        content=data,
        headers={
            "Authorization": f"Bearer {backend.token}",
            "X-Cortex-Chunk-Sha256": hashlib.sha256(data).hexdigest(),
            "X-Cortex-Chunk-Count": "1",
        },
    )
    assert response.status_code == 200, response.text
    return {"upload_id": upload_id, "sha256": hashlib.sha256(data).hexdigest()}


def test_archive_that_differs_from_its_manifest_is_refused(runs_backend):
    spec = {"version": 1, "name": "raw", "command": ["python", "main.py"]}
    real = b"print('hi')\n"
    manifest = [
        {"path": "main.py", "bytes": len(real), "sha256": hashlib.sha256(real).hexdigest(), "kind": "source"}
    ]
    cases = {
        "content": _tar({"main.py": b"print('HI')\n"}),
        "extra member": _tar({"main.py": real, "other.py": b""}),
        "missing member": _tar({}),
    }
    for case, archive in cases.items():
        response = _post_run(
            runs_backend, {"spec": spec, "manifest": manifest, "archive": _upload(runs_backend, archive)}
        )
        assert response.status_code == 400, case
        assert response.json()["error"]["code"] == "manifest_mismatch", (case, response.text)
    link = io.BytesIO()
    with tarfile.open(fileobj=link, mode="w") as tar:
        info = tarfile.TarInfo("main.py")
        info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(info)
    response = _post_run(
        runs_backend, {"spec": spec, "manifest": manifest, "archive": _upload(runs_backend, link.getvalue())}
    )
    assert response.json()["error"]["code"] == "manifest_mismatch"
    escaping = [{**manifest[0], "path": "../main.py"}]
    response = _post_run(
        runs_backend,
        {"spec": spec, "manifest": escaping, "archive": _upload(runs_backend, _tar({"main.py": real}))},
    )
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_field"
    ok = _post_run(
        runs_backend,
        {"spec": spec, "manifest": manifest, "archive": _upload(runs_backend, _tar({"main.py": real}))},
    )
    assert ok.status_code == 201, ok.text


def test_submitting_needs_runs_write_and_reading_needs_jobs_read(runs_backend, runs_client, tmp_path):
    def token(*scopes: str) -> str:
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "cortex_backend",
                "token",
                "create",
                "--name",
                "scoped",
                "--scopes",
                *scopes,
                "--data-dir",
                str(runs_backend.data_dir),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        return result.stdout.strip()

    spec = write_project(tmp_path, "print('scoped')", name="scoped")
    with Client(runs_backend.url, token("jobs:read", "jobs:write")) as no_runs:
        with pytest.raises(PermissionError) as caught:
            no_runs.run(spec)
        assert caught.value.missing_scopes == ["runs:write"]
    with Client(runs_backend.url, token("jobs:read", "runs:write")) as runner:
        handle = runner.run(spec)
        assert handle.wait(120)["status"] == "done"
        assert [run["run_id"] for run in runner.list_runs()] == [handle.run_id]  # owners see their own runs
    with Client(runs_backend.url, token("runs:write")) as blind:
        with pytest.raises(PermissionError) as caught:
            blind.get_run(handle.run_id)
        assert caught.value.missing_scopes == ["jobs:read"]
    assert handle.run_id in {run["run_id"] for run in runs_client.list_runs(limit=200)}  # admin sees all


def test_history_lists_recent_runs_newest_first(runs_client, tmp_path):
    spec = write_project(tmp_path, "print('h')", name="history")
    handles = [runs_client.run(spec) for _ in range(2)]
    for handle in handles:
        handle.wait(120)
    frame = runs_client.history(limit=2)
    assert list(frame["run_id"]) == [handles[1].run_id, handles[0].run_id]
    assert list(frame.columns[:4]) == ["run_id", "name", "status", "failure_code"]
    assert set(frame["status"]) == {"done"} and set(frame["isolation_tier"]) == {"netns"}


def test_runs_queue_behind_training_jobs_on_the_same_slots(tmp_path):
    backend = start_backend(
        tmp_path / "backend", "--devices", "cpu:1", "--warm-workers", "0", "--worker-threads", "1"
    )
    try:
        with Client(backend.url, backend.token) as client:
            job = client.create_job([{"type": "training", "base_model": "tiny"}])
            spec = write_project(tmp_path / "project", "print('my turn')", name="queued")
            handle = client.run(spec)
            assert handle.status() == "pending"
            assert client.get_capacity()["pending"] == 1
            client.cancel_job(job["job_id"])
            assert handle.wait(120)["status"] == "done"
            assert "my turn" in handle.logs()
            # and a job queues behind a running run
            sleeper = client.run(
                write_project(tmp_path / "sleeper", "import time; time.sleep(60)", name="sleeper")
            )
            wait_for_log(sleeper, "sandbox: ")
            queued = client.create_job([{"type": "sampling", "base_model": "tiny"}])
            assert client.get_job(queued["job_id"])["status"] == "pending"
            sleeper.cancel()
            assert sleeper.wait(60)["status"] == "cancelled"
            assert client.wait_for_job(queued["job_id"], timeout_s=120)["status"] in ("starting", "running")
            client.cancel_job(queued["job_id"])
    finally:
        backend.stop()
