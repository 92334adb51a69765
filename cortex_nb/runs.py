"""Source runs from the client: capture a spec's files, submit them, and follow the run with a `RunHandle`.

    handle = client.run("cortex.yaml")         # files captured, manifest built, uploaded, admitted
    handle.wait()                              # a local timeout never cancels the run
    handle.outputs("metrics", "out/")          # length and SHA-256 checked against the backend's record
    handle.report()                            # device-seconds, peak memory, exit code, isolation tier

Submissions carry a `submission_id`. If the answer to a submission is lost, `SubmissionOutcomeUnknown`
says so and `client.resume(submission_id)` finds the run; submitting again with the same id returns the
same run, never a second one.
"""

from __future__ import annotations

import hashlib
import os
import tarfile
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from . import errors, run_spec
from .api import Api, HasApi, RunLogPage, RunReport, RunRow, api_of
from .protocol import wire
from .protocol.states import JOB_DONE, JOB_TERMINAL

READ_BLOCK = 1 << 20
MAX_ARCHIVE_BYTES = wire.MAX_CHUNKS * wire.CHUNK_BYTES


@dataclass
class Submission:
    """What `client.run` sends: the validated spec, the manifest and the tar archive of the files."""

    spec: dict[str, Any]
    manifest: list[dict[str, Any]]
    archive: IO[bytes]
    archive_bytes: int
    archive_sha256: str

    def close(self) -> None:
        self.archive.close()


def load_spec(
    spec: str | os.PathLike | Mapping[str, Any], base_dir: str | os.PathLike | None = None
) -> tuple[dict[str, Any], Path]:
    """A spec file (YAML) or a mapping, validated; returns (spec, the folder its paths are relative to)."""
    if isinstance(spec, Mapping):
        return run_spec.validate_spec(dict(spec)), Path(base_dir or ".").resolve()
    path = Path(spec)
    if not path.is_file():
        raise errors.BadRequestError(
            f"no spec file at {path}", code="spec_invalid", status=400, detail={"field": ""}
        )
    return run_spec.parse_spec_text(path.read_text()), Path(base_dir or path.parent).resolve()


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(READ_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def _included_files(spec: dict[str, Any], base_dir: Path) -> dict[str, Path]:
    """relative path -> file, for every source.include glob; a glob that matches nothing is an error."""
    found: dict[str, Path] = {}
    for index, pattern in enumerate(spec["source"]["include"]):
        matches = sorted(path for path in base_dir.glob(pattern) if path.is_file())
        if not matches:
            raise run_spec.spec_error(
                f"source.include[{index}]", f"{pattern!r} matches no file under {base_dir}"
            )
        for path in matches:
            resolved = path.resolve()
            if base_dir not in resolved.parents:
                raise run_spec.spec_error(
                    f"source.include[{index}]", f"{path} leads outside {base_dir} (a symlink?)"
                )
            relative = run_spec.relative_path(
                path.relative_to(base_dir).as_posix(), f"source.include[{index}]"
            )
            found[relative] = resolved
    return found


def build_submission(
    spec: dict[str, Any], base_dir: Path, files: Mapping[str, bytes | str] | None = None
) -> Submission:
    """Capture the included files, the inputs and any in-memory `files` into a tar with a SHA-256 manifest.

    In-memory files (the `%%cortex run` cell's main.py) replace included files of the same path.
    """
    sources = _included_files(spec, base_dir)
    inline = {
        run_spec.relative_path(path, f"files[{path!r}]"): (
            data.encode() if isinstance(data, str) else bytes(data)
        )
        for path, data in (files or {}).items()
    }
    for path in inline:
        sources.pop(path, None)
    inputs: dict[str, Path] = {}
    for name, entry in spec["inputs"].items():
        path = (base_dir / entry["path"]).resolve()
        if not path.is_file():
            raise run_spec.spec_error(f"inputs.{name}.path", f"no file at {path}")
        size = path.stat().st_size
        if size > run_spec.MAX_INPUT_BYTES:
            raise run_spec.spec_error(
                f"inputs.{name}.path",
                f"{path} is {size} bytes; an input may be at most {run_spec.MAX_INPUT_BYTES}",
            )
        inputs[entry["path"]] = path
        sources.pop(entry["path"], None)
    manifest: list[dict[str, Any]] = []
    archive = tempfile.TemporaryFile()
    try:
        with tarfile.open(fileobj=archive, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for relative, data in sorted(inline.items()):
                manifest.append(
                    {
                        "path": relative,
                        "bytes": len(data),
                        "sha256": hashlib.sha256(data).hexdigest(),
                        "kind": "source",
                    }
                )
                info = tarfile.TarInfo(relative)
                info.size, info.mode, info.mtime = len(data), 0o644, int(time.time())
                tar.addfile(info, fileobj=_BytesReader(data))
            for kind, group in (("source", sources), ("input", inputs)):
                for relative, path in sorted(group.items()):
                    size = path.stat().st_size
                    manifest.append(
                        {"path": relative, "bytes": size, "sha256": _sha256_file(path), "kind": kind}
                    )
                    info = tarfile.TarInfo(relative)
                    info.size, info.mode, info.mtime = size, 0o644, int(path.stat().st_mtime)
                    with open(path, "rb") as handle:
                        tar.addfile(info, fileobj=handle)
        source_bytes = sum(entry["bytes"] for entry in manifest if entry["kind"] == "source")
        if (
            source_bytes > run_spec.MAX_SOURCE_BYTES
            or len(manifest) > run_spec.MAX_SOURCE_FILES + run_spec.MAX_INPUTS
        ):
            raise run_spec.spec_error(
                "source.include",
                f"{len(manifest)} files, {source_bytes} bytes of source; the limits are"
                f" {run_spec.MAX_SOURCE_FILES} files and {run_spec.MAX_SOURCE_BYTES} bytes",
            )
        size = archive.tell()
        if size > MAX_ARCHIVE_BYTES:
            raise run_spec.spec_error(
                "inputs",
                f"the files come to {size} bytes; one submission may carry at most {MAX_ARCHIVE_BYTES}",
            )
        archive.seek(0)
        digest = hashlib.sha256()
        while block := archive.read(READ_BLOCK):
            digest.update(block)
        archive.seek(0)
    except BaseException:
        archive.close()
        raise
    return Submission(spec, manifest, archive, size, digest.hexdigest())


class _BytesReader:
    def __init__(self, data: bytes) -> None:
        self._data, self._offset = data, 0

    def read(self, size: int = -1) -> bytes:
        end = len(self._data) if size < 0 else self._offset + size
        chunk, self._offset = self._data[self._offset : end], min(end, len(self._data))
        return chunk


def upload_archive(client: Api | HasApi, submission: Submission) -> str:
    """Send the archive as SHA-256-checked chunks (each retried safely); returns the upload id."""
    from .link_speed import announce_upload

    upload_id = "runsrc-" + uuid.uuid4().hex
    announce_upload(client, submission.archive_bytes, "the run's source archive")
    count = max(1, -(-submission.archive_bytes // wire.CHUNK_BYTES))
    submission.archive.seek(0)
    for index in range(count):
        data = submission.archive.read(wire.CHUNK_BYTES)
        api_of(client).upload_run_chunk(upload_id, index, data, count)
    return upload_id


def submit(client: Api | HasApi, submission: Submission, submission_id: str | None = None) -> RunRow:
    """Upload and submit; the run's JSON. A lost answer raises `SubmissionOutcomeUnknown`."""
    submission_id = submission_id or f"{submission.spec['name'][:40]}-{uuid.uuid4().hex[:16]}"
    body: dict[str, Any] = {
        "submission_id": submission_id,
        "spec": submission.spec,
        "manifest": submission.manifest,
    }
    if submission.manifest:
        body["archive"] = {
            "upload_id": upload_archive(client, submission),
            "sha256": submission.archive_sha256,
        }
    timeout_s = 60.0 + submission.archive_bytes / (
        20 * 2**20
    )  # the backend re-hashes the archive before answering
    try:
        return api_of(client).create_run(body, idempotency_key=f"run-{submission_id}", timeout_s=timeout_s)
    except (errors.ConnectionError, errors.BackendError) as exc:
        raise errors.SubmissionOutcomeUnknown(submission_id, exc) from exc


class RunHandle:
    """One source run on the backend. Methods call the backend; `info` holds the last state seen.
    `client` is what it was made with (a `Client`, or the `Api` itself)."""

    def __init__(self, client: Api | HasApi, run: dict[str, Any]) -> None:
        self.client = client
        self.api = api_of(client)
        self.run_id: str = run["run_id"]
        self.submission_id: str = run["submission_id"]
        self.info = run

    def refresh(self) -> RunRow:
        self.info = self.api.get_run(self.run_id)
        return self.info

    def status(self) -> str:
        """pending, starting, running, done, failed or cancelled (see `info['failure_code']`)."""
        return self.refresh()["status"]

    @property
    def failure_code(self) -> str | None:
        return self.info.get("failure_code")

    def done(self) -> bool:
        return self.status() in JOB_TERMINAL

    def wait(self, timeout: float | None = None) -> RunRow:
        """Block until the run ends and return its final state. Running out of `timeout` raises
        `TimeoutError`; the run itself keeps going (cancel it with `cancel()`)."""
        poll = self.api.poll
        deadline = time.monotonic() + (timeout if timeout is not None else poll.timeout_s)
        info = self.info
        while info["status"] not in JOB_TERMINAL:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise errors.TimeoutError(
                    f"run {self.run_id} is still {info['status']} after waiting; it keeps running. Wait again, or cancel()",
                    code="timeout",
                )
            info = self.api.get_run(
                self.run_id, wait_s=min(poll.long_poll_s, remaining), while_status=info["status"]
            )
        self.info = info
        return info

    def raise_for_status(self) -> None:
        """Raise `RunFailed` (with the run's failure code) unless the run ended done."""
        if self.info["status"] in JOB_TERMINAL and self.info["status"] != JOB_DONE:
            raise errors.RunFailed(
                f"run {self.run_id} {self.info['status']}: {self.info.get('failure_message')}",
                code=self.info.get("failure_code") or self.info["status"],
                detail={"run": self.info},
            )

    def cancel(self) -> RunRow:
        """Stop the run (its processes get the backend's grace period, then are killed). Idempotent."""
        self.info = self.api.cancel_run(self.run_id)
        return self.info

    def log_page(self, cursor: int = 0, wait_s: float = 0.0, limit: int = 1000) -> RunLogPage:
        """{lines: [{seq, stream, line, at}], cursor, dropped, run_status}; `wait_s` long-polls for new lines."""
        return self.api.run_logs(self.run_id, cursor=cursor, limit=limit, wait_s=wait_s)

    def logs(self, streams: Sequence[str] = ("stdout", "stderr", "system")) -> list[str]:
        """Every log line so far, oldest first."""
        lines, cursor = [], 0
        while True:
            page = self.log_page(cursor, limit=5000)
            lines.extend(entry["line"] for entry in page["lines"] if entry["stream"] in streams)
            if not page["lines"]:
                return lines
            cursor = page["cursor"]

    def follow_logs(self, wait_s: float = 10.0) -> Iterator[dict[str, Any]]:
        """Yield log entries as they arrive, until the run has ended and every line is read."""
        cursor = 0
        while True:
            page = self.log_page(cursor, wait_s=wait_s)
            yield from page["lines"]
            cursor = page["cursor"]
            if page["run_status"] in JOB_TERMINAL and not page["lines"]:
                return

    def report(self) -> RunReport:
        """device_seconds, wall_seconds, peak_memory_bytes, cpu_seconds, exit_code, isolation_tier, limits..."""
        return self.api.run_report(self.run_id)

    def output_list(self) -> list[dict[str, Any]]:
        return self.api.list_run_outputs(self.run_id)["outputs"]

    def outputs(
        self, name: str | None = None, dest: str | os.PathLike = ".", keep_paths: bool = False
    ) -> Path | dict[str, Path]:
        """Download one output (or, with no name, every collected output) into `dest`, verified.

        `dest` may be a folder (the file keeps its declared name, or its whole declared path with
        `keep_paths`) or, for one output, a file path. A length or SHA-256 mismatch raises
        `OutputVerificationError` and leaves nothing at the destination.
        """
        listing = {row["name"]: row for row in self.output_list()}
        if name is not None:
            if name not in listing:
                raise errors.NotFoundError(
                    f"run {self.run_id} declares no output {name!r}; it declares {sorted(listing)}",
                    code="output_not_declared",
                    status=404,
                )
            into_folder = keep_paths or Path(dest).is_dir() or str(dest).endswith(("/", os.sep))
            return self._download(listing[name], Path(dest), keep_paths, into_folder)
        return {
            row["name"]: self._download(row, Path(dest), keep_paths, True)
            for row in listing.values()
            if row["collected"]
        }

    def _download(self, row: dict[str, Any], dest: Path, keep_paths: bool, into_folder: bool) -> Path:
        if into_folder:
            dest = dest / (row["path"] if keep_paths else Path(row["path"]).name)
        return download_output(self.api, self.run_id, row["name"], dest, expected=row)

    def __repr__(self) -> str:
        code = f" ({self.info['failure_code']})" if self.info.get("failure_code") else ""
        return f"<RunHandle {self.run_id} {self.info.get('name')} {self.info['status']}{code}>"


def verify_output_bytes(data: bytes, expected: dict[str, Any], what: str) -> None:
    """Length and SHA-256 against what the backend recorded when it collected the output."""
    if expected.get("bytes") is None or expected.get("sha256") is None:
        raise errors.ConflictError(f"{what} has not been collected", code="output_not_available", status=409)
    if len(data) != expected["bytes"]:
        raise errors.OutputVerificationError(
            f"{what} arrived with {len(data)} bytes but was collected with {expected['bytes']}; it was not saved",
            code="output_corrupted",
            detail={"expected_bytes": expected["bytes"], "received_bytes": len(data)},
        )
    digest = hashlib.sha256(data).hexdigest()
    if digest != expected["sha256"]:
        raise errors.OutputVerificationError(
            f"{what} does not match the SHA-256 recorded at collection; it was not saved",
            code="output_corrupted",
            detail={"expected_sha256": expected["sha256"], "received_sha256": digest},
        )


def run_cell_source(
    client: Api | HasApi,
    code: str,
    *,
    includes: Sequence[str] = (),
    outputs: Mapping[str, str] | None = None,
    gpu: int = 0,
    models: Sequence[str] = (),
    timeout_s: float = run_spec.DEFAULT_TIMEOUT_S,
    workdir: str | os.PathLike | None = None,
    name: str = "cell",
    isolation: str = run_spec.ISOLATION_BEST_EFFORT,
    submission_id: str | None = None,
) -> RunHandle:
    """Run a notebook cell's code as `main.py` on the backend host (what `%%cortex run` calls).

    `includes` are globs relative to `workdir` (the notebook's folder; default the current one) shipped
    beside main.py; `outputs` maps output names to the paths the code writes (each up to the default
    8 MiB); `gpu` is the GPU count, `models` registered model names staged read-only at models/<name>.
    Returns once the run is admitted; follow it with the handle, then `fetch_and_display_outputs`.
    """
    spec = {
        "version": run_spec.SPEC_VERSION,
        "name": name,
        "source": {"include": list(includes)},
        "command": ["python", "main.py"],
        "models": list(models),
        "outputs": {output: {"path": path} for output, path in (outputs or {}).items()},
        "resources": {"gpu": {"count": gpu}},
        "timeout_seconds": timeout_s,
        "isolation": isolation,
    }
    return start_run(
        client, spec, base_dir=workdir or Path.cwd(), files={"main.py": code}, submission_id=submission_id
    )


def start_run(
    client: Api | HasApi,
    spec: str | os.PathLike | Mapping[str, Any],
    *,
    submission_id: str | None = None,
    base_dir: str | os.PathLike | None = None,
    files: Mapping[str, bytes | str] | None = None,
) -> RunHandle:
    """Capture a spec's files, upload them and submit the run (`Client.run`); its handle once admitted."""
    checked, folder = load_spec(spec, base_dir)
    submission = build_submission(checked, folder, files)
    try:
        return RunHandle(client, submit(client, submission, submission_id))
    finally:
        submission.close()


def resume_run(client: Api | HasApi, submission_id: str) -> RunHandle:
    """The run a submission id created (after `SubmissionOutcomeUnknown`); `NotFoundError` if none was."""
    runs = api_of(client).list_runs(limit=1, submission_id=submission_id)["runs"]
    if not runs:
        raise errors.NotFoundError(
            f"the backend has no run for submission {submission_id!r}: the submission never arrived."
            " Submit again with the same submission_id",
            code="run_not_found",
            status=404,
        )
    return RunHandle(client, runs[0])


def download_output(
    client: Api | HasApi,
    run_id: str,
    name: str,
    dest: str | os.PathLike,
    expected: dict[str, Any] | None = None,
) -> Path:
    """Save one output at `dest` after checking its length and SHA-256 against the backend's record."""
    api = api_of(client)
    if expected is None:
        rows = {row["name"]: row for row in api.list_run_outputs(run_id)["outputs"]}
        if name not in rows:
            raise errors.NotFoundError(
                f"run {run_id} declares no output {name!r}", code="output_not_declared", status=404
            )
        expected = rows[name]
    content = api.get_run_output(run_id, name)
    verify_output_bytes(content, expected, f"output {name!r} of run {run_id}")
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(dest.name + ".partial")
    partial.write_bytes(content)
    partial.replace(dest)
    return dest
