"""SQLite persistence for tokens, jobs, sub-jobs, requests, request events, idempotency keys, logs,
the job/request event feed, device samples, checkpoints, datasets and jobs' progress records.

Everything the service remembers goes through this one module, so another database can replace it.
Calls are short and made from the IO loop thread (and the device monitor's thread, serialised by one
lock). Reads use a connection of their own: with WAL they never wait for a writer, even one of another
process holding the database lock, so a held lock cannot stop the backend answering GETs. A write waits
for another process's lock at most `busy_timeout_ms` (the backend keeps that short and retries: see
storage_faults.py), never the IO loop's whole attention.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from .pagination import ListingFilter, newest_first_query

SCHEMA = """
CREATE TABLE IF NOT EXISTS tokens (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    owner TEXT NOT NULL,
    token_hash TEXT NOT NULL UNIQUE,
    scopes TEXT NOT NULL,
    created_at REAL NOT NULL,
    revoked_at REAL
);
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    name TEXT,
    experiment TEXT,
    status TEXT NOT NULL,
    failure_code TEXT,
    failure_message TEXT,
    spec TEXT NOT NULL,
    created_at REAL NOT NULL,
    started_at REAL,
    finished_at REAL,
    last_activity_at REAL NOT NULL,
    held_seconds REAL NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS jobs_owner_created ON jobs(owner, created_at);
CREATE TABLE IF NOT EXISTS sub_jobs (
    job_id TEXT NOT NULL,
    id TEXT NOT NULL,
    position INTEGER NOT NULL,
    type TEXT NOT NULL,
    status TEXT NOT NULL,
    spec TEXT NOT NULL,
    device TEXT,
    failure_code TEXT,
    failure_message TEXT,
    info TEXT NOT NULL DEFAULT '{}',
    PRIMARY KEY (job_id, id)
);
CREATE TABLE IF NOT EXISTS requests (
    id TEXT PRIMARY KEY,
    job_id TEXT NOT NULL,
    sub_job_id TEXT NOT NULL,
    op TEXT NOT NULL,
    status TEXT NOT NULL,
    params TEXT NOT NULL,
    result TEXT,
    tensors BLOB,
    error_code TEXT,
    error_message TEXT,
    created_at REAL NOT NULL,
    started_at REAL,
    finished_at REAL
);
CREATE INDEX IF NOT EXISTS requests_job ON requests(job_id, created_at);
CREATE TABLE IF NOT EXISTS request_events (
    request_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    at REAL NOT NULL,
    type TEXT NOT NULL,
    data TEXT NOT NULL,
    PRIMARY KEY (request_id, seq)
);
CREATE TABLE IF NOT EXISTS idempotency (
    owner TEXT NOT NULL,
    key TEXT NOT NULL,
    body_sha256 TEXT NOT NULL,
    status INTEGER NOT NULL,
    response TEXT NOT NULL,
    created_at REAL NOT NULL,
    PRIMARY KEY (owner, key)
);
CREATE TABLE IF NOT EXISTS logs (
    job_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    sub_job_id TEXT NOT NULL,
    at REAL NOT NULL,
    stream TEXT NOT NULL,
    line TEXT NOT NULL,
    PRIMARY KEY (job_id, seq)
);
-- A row exists only for a checkpoint whose directory is complete and renamed into place.
CREATE TABLE IF NOT EXISTS checkpoints (
    job_id TEXT NOT NULL,
    id TEXT NOT NULL,
    owner TEXT NOT NULL,
    sub_job_id TEXT NOT NULL,
    type TEXT NOT NULL,
    step INTEGER NOT NULL,
    size_bytes INTEGER NOT NULL,
    base_model TEXT NOT NULL,
    manifest TEXT NOT NULL,
    request_id TEXT,
    created_at REAL NOT NULL,
    expires_at REAL,
    public INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (job_id, id)
);
CREATE INDEX IF NOT EXISTS checkpoints_owner ON checkpoints(owner);
-- A checkpoint marked keep: no bulk delete removes it, and a plain delete or its job's delete is refused.
CREATE TABLE IF NOT EXISTS kept_checkpoints (
    job_id TEXT NOT NULL,
    id TEXT NOT NULL,
    kept_at REAL NOT NULL,
    PRIMARY KEY (job_id, id)
);
-- Each export of a checkpoint, for its lineage (the tar left the backend: where it went is not known).
CREATE TABLE IF NOT EXISTS checkpoint_exports (
    job_id TEXT NOT NULL,
    checkpoint_id TEXT NOT NULL,
    at REAL NOT NULL,
    contents TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS checkpoint_exports_job ON checkpoint_exports(job_id);
CREATE TABLE IF NOT EXISTS runs (
    id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    submission_id TEXT NOT NULL,
    name TEXT NOT NULL,
    status TEXT NOT NULL,
    failure_code TEXT,
    failure_message TEXT,
    spec TEXT NOT NULL,
    manifest TEXT NOT NULL,
    devices TEXT NOT NULL DEFAULT '[]',
    isolation TEXT,
    outputs TEXT NOT NULL DEFAULT '{}',
    report TEXT NOT NULL DEFAULT '{}',
    created_at REAL NOT NULL,
    started_at REAL,
    finished_at REAL,
    UNIQUE (owner, submission_id)
);
CREATE INDEX IF NOT EXISTS runs_owner_created ON runs(owner, created_at);
-- observability: the event feed, written by triggers so no status change can bypass it ------------
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    at REAL NOT NULL,
    kind TEXT NOT NULL,
    owner TEXT NOT NULL,
    job_id TEXT NOT NULL,
    request_id TEXT,
    sub_job_id TEXT,
    op TEXT,
    status TEXT NOT NULL,
    failure_code TEXT
);
CREATE INDEX IF NOT EXISTS events_owner_seq ON events(owner, seq);
CREATE TRIGGER IF NOT EXISTS events_job_created AFTER INSERT ON jobs BEGIN
    INSERT INTO events (at, kind, owner, job_id, status, failure_code)
    VALUES ((julianday('now') - 2440587.5) * 86400.0, 'job', NEW.owner, NEW.id, NEW.status, NEW.failure_code);
END;
CREATE TRIGGER IF NOT EXISTS events_job_status AFTER UPDATE OF status ON jobs WHEN NEW.status IS NOT OLD.status BEGIN
    INSERT INTO events (at, kind, owner, job_id, status, failure_code)
    VALUES ((julianday('now') - 2440587.5) * 86400.0, 'job', NEW.owner, NEW.id, NEW.status, NEW.failure_code);
END;
CREATE TRIGGER IF NOT EXISTS events_request_created AFTER INSERT ON requests BEGIN
    INSERT INTO events (at, kind, owner, job_id, request_id, sub_job_id, op, status, failure_code)
    VALUES ((julianday('now') - 2440587.5) * 86400.0, 'request',
            COALESCE((SELECT owner FROM jobs WHERE id = NEW.job_id), ''), NEW.job_id, NEW.id, NEW.sub_job_id, NEW.op,
            NEW.status, NEW.error_code);
END;
CREATE TRIGGER IF NOT EXISTS events_request_status AFTER UPDATE OF status ON requests WHEN NEW.status IS NOT OLD.status BEGIN
    INSERT INTO events (at, kind, owner, job_id, request_id, sub_job_id, op, status, failure_code)
    VALUES ((julianday('now') - 2440587.5) * 86400.0, 'request',
            COALESCE((SELECT owner FROM jobs WHERE id = NEW.job_id), ''), NEW.job_id, NEW.id, NEW.sub_job_id, NEW.op,
            NEW.status, NEW.error_code);
END;
-- observability: device samples from the monitor (one row per device per tick) ---------------------
CREATE TABLE IF NOT EXISTS device_samples (
    device TEXT NOT NULL,
    at REAL NOT NULL,
    data TEXT NOT NULL,
    PRIMARY KEY (device, at)
);
CREATE INDEX IF NOT EXISTS device_samples_at ON device_samples(at);
CREATE INDEX IF NOT EXISTS sub_jobs_status ON sub_jobs(status);
-- managed training: uploaded datasets (the bytes live in a file named by the id) and progress records
CREATE TABLE IF NOT EXISTS datasets (
    owner TEXT NOT NULL,
    id TEXT NOT NULL,
    rows INTEGER NOT NULL,
    bytes INTEGER NOT NULL,
    created_at REAL NOT NULL,
    PRIMARY KEY (owner, id)
);
CREATE TABLE IF NOT EXISTS progress (
    job_id TEXT PRIMARY KEY,
    data TEXT NOT NULL,
    updated_at REAL NOT NULL
);
"""


def make_private(db_path: Path) -> None:
    """The store's folder (the backend's data dir: tokens, store, checkpoints) only its user may enter, and
    the database file only its user may read, from the very first use: `token create` before any `serve`
    too. SQLite gives its -wal and -shm files the database file's mode."""
    folder = db_path.parent
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        folder.chmod(0o700)
    except OSError:
        pass
    os.close(os.open(db_path, os.O_RDWR | os.O_CREAT, 0o600))
    try:
        db_path.chmod(0o600)
    except OSError:
        pass


# A checkpoint's row with whether it is kept.
_CHECKPOINT_SELECT = (
    "SELECT c.*, (k.id IS NOT NULL) AS kept FROM checkpoints c"
    " LEFT JOIN kept_checkpoints k ON k.job_id = c.job_id AND k.id = c.id"
)


def _loads(value: str | None) -> Any:
    return None if value is None else json.loads(value)


# A request's row as polled: everything but the result tensors, and their size.
REQUEST_COLUMNS = (
    "id, job_id, sub_job_id, op, status, params, result, error_code, error_message, created_at, started_at,"
    " finished_at, length(tensors) AS tensors_bytes"
)


class Store:
    """A thin, typed layer over one SQLite connection."""

    def __init__(self, path: Path, busy_timeout_ms: int = 5000) -> None:
        make_private(path)
        self.busy_timeout_ms = busy_timeout_ms
        self._lock = threading.RLock()
        # The thread inside a write transaction, whose reads must see its own uncommitted writes.
        self._transaction_thread: int | None = None
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA busy_timeout=5000")
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(SCHEMA)
        self._migrate()
        self._db.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
        self._read_lock = threading.RLock()
        self._read_db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._read_db.row_factory = sqlite3.Row
        self._read_db.execute("PRAGMA busy_timeout=1000")

    def _migrate(self) -> None:
        """Bring a store written by an older backend up to date (PRAGMA user_version counts the steps)."""
        with self._lock:
            version = self._db.execute("PRAGMA user_version").fetchone()[0]
            if version < 1:
                # Run logs moved out of the job-log namespace (logs.run_log_key).
                self._db.execute(
                    "UPDATE logs SET job_id = 'run:' || job_id WHERE job_id IN (SELECT id FROM runs)"
                    " AND job_id NOT IN (SELECT id FROM jobs)"
                )
                self._db.execute("PRAGMA user_version = 1")
            if version < 2:
                # A token's own queue-priority cap (NULL: the backend's --token-max-priority).
                columns = {row[1] for row in self._db.execute("PRAGMA table_info(tokens)")}
                if "max_priority" not in columns:
                    self._db.execute("ALTER TABLE tokens ADD COLUMN max_priority INTEGER")
                self._db.execute("PRAGMA user_version = 2")
            if version < 3:
                # Checkpoint lifecycle: an expiry time (NULL: never) and whether other owners may read it.
                columns = {row[1] for row in self._db.execute("PRAGMA table_info(checkpoints)")}
                if "expires_at" not in columns:
                    self._db.execute("ALTER TABLE checkpoints ADD COLUMN expires_at REAL")
                if "public" not in columns:
                    self._db.execute("ALTER TABLE checkpoints ADD COLUMN public INTEGER NOT NULL DEFAULT 0")
                self._db.execute("PRAGMA user_version = 3")
            if version < 4:
                # Device time of a job's earlier spans (before a preemption, a parking, a retry or a restart):
                # `started_at` is the start of the current one.
                columns = {row[1] for row in self._db.execute("PRAGMA table_info(jobs)")}
                if "held_seconds" not in columns:
                    self._db.execute("ALTER TABLE jobs ADD COLUMN held_seconds REAL NOT NULL DEFAULT 0")
                self._db.execute("PRAGMA user_version = 4")

    def close(self) -> None:
        with self._lock, self._read_lock:
            self._db.close()
            self._read_db.close()

    def _lock_wait_s(self) -> float:
        # This backend's own writes are short; a second is far more than one takes.
        return max(self.busy_timeout_ms / 1000, 1.0)

    @contextlib.contextmanager
    def _writing(self) -> Iterator[None]:
        """The write connection, waited for at most as long as another process's lock is."""
        if not self._lock.acquire(timeout=self._lock_wait_s()):
            raise sqlite3.OperationalError("database is locked (another writer of this backend holds it)")
        try:
            yield
        finally:
            self._lock.release()

    def _execute(self, sql: str, params: Iterable[Any] = ()) -> sqlite3.Cursor:
        with self._writing():
            return self._db.execute(sql, tuple(params))

    def _rows(self, sql: str, params: Iterable[Any] = ()) -> list[dict[str, Any]]:
        if self._transaction_thread == threading.get_ident():
            with self._lock:
                return [dict(row) for row in self._db.execute(sql, tuple(params)).fetchall()]
        with self._read_lock:
            return [dict(row) for row in self._read_db.execute(sql, tuple(params)).fetchall()]

    def transaction(self) -> _Transaction:
        return _Transaction(self)

    # tokens ---------------------------------------------------------------------------------
    def add_token(
        self,
        token_id: str,
        name: str,
        owner: str,
        token_hash: str,
        scopes: list[str],
        max_priority: int | None = None,
    ) -> None:
        self._execute(
            "INSERT INTO tokens (id, name, owner, token_hash, scopes, created_at, max_priority)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            (token_id, name, owner, token_hash, json.dumps(sorted(scopes)), time.time(), max_priority),
        )

    def token_by_hash(self, token_hash: str) -> dict[str, Any] | None:
        # Every authenticated request asks: only the columns a principal is made of.
        rows = self._rows(
            "SELECT id, name, owner, scopes, max_priority FROM tokens WHERE token_hash = ? AND revoked_at IS NULL",
            (token_hash,),
        )
        if not rows:
            return None
        row = rows[0]
        row["scopes"] = json.loads(row["scopes"])
        return row

    def list_tokens(self) -> list[dict[str, Any]]:
        rows = self._rows(
            "SELECT id, name, owner, scopes, created_at, revoked_at FROM tokens ORDER BY created_at"
        )
        for row in rows:
            row["scopes"] = json.loads(row["scopes"])
        return rows

    def revoke_token(self, token_id: str) -> bool:
        cursor = self._execute(
            "UPDATE tokens SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL", (time.time(), token_id)
        )
        return cursor.rowcount > 0

    # jobs -----------------------------------------------------------------------------------
    def insert_job(self, job: dict[str, Any], sub_jobs: list[dict[str, Any]]) -> None:
        now = time.time()
        with self.transaction():
            self._execute(
                "INSERT INTO jobs (id, owner, name, experiment, status, spec, created_at, last_activity_at)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    job["id"],
                    job["owner"],
                    job.get("name"),
                    job.get("experiment"),
                    job["status"],
                    json.dumps(job["spec"]),
                    now,
                    now,
                ),
            )
            for position, sub in enumerate(sub_jobs):
                self._execute(
                    "INSERT INTO sub_jobs (job_id, id, position, type, status, spec) VALUES (?, ?, ?, ?, ?, ?)",
                    (job["id"], sub["id"], position, sub["type"], sub["status"], json.dumps(sub["spec"])),
                )

    def job_exists(self, job_id: str) -> bool:
        return bool(self._rows("SELECT 1 FROM jobs WHERE id = ?", (job_id,)))

    def job_owner(self, job_id: str) -> str | None:
        rows = self._rows("SELECT owner FROM jobs WHERE id = ?", (job_id,))
        return rows[0]["owner"] if rows else None

    def get_job(self, job_id: str) -> dict[str, Any] | None:
        rows = self._rows("SELECT * FROM jobs WHERE id = ?", (job_id,))
        if not rows:
            return None
        job = rows[0]
        job["spec"] = json.loads(job["spec"])
        job["sub_jobs"] = self.sub_jobs(job_id)
        return job

    def sub_jobs(self, job_id: str) -> list[dict[str, Any]]:
        rows = self._rows("SELECT * FROM sub_jobs WHERE job_id = ? ORDER BY position", (job_id,))
        for row in rows:
            row["spec"] = json.loads(row["spec"])
            row["info"] = json.loads(row["info"])
        return rows

    def list_jobs(
        self,
        owner: str | None,
        status: str | None,
        limit: int,
        before: tuple[float, str] | None,
        filters: ListingFilter | None = None,
    ) -> list[dict[str, Any]]:
        """Newest first; `before` is the (created_at, id) of the last job of the previous page; `filters`
        (when given) replaces `owner` and `status`."""
        sql, params = newest_first_query("jobs", owner, status, before, filters)
        with self._read_lock:
            jobs = self._rows(sql, [*params, limit])
            if not jobs:
                return []
            # The page's sub-jobs in one query, not one per job.
            marks = ",".join("?" * len(jobs))
            subs = self._rows(
                f"SELECT * FROM sub_jobs WHERE job_id IN ({marks}) ORDER BY position",
                [job["id"] for job in jobs],
            )
        by_job: dict[str, list[dict[str, Any]]] = {job["id"]: [] for job in jobs}
        for row in subs:
            row["spec"] = json.loads(row["spec"])
            row["info"] = json.loads(row["info"])
            by_job[row["job_id"]].append(row)
        for job in jobs:
            job["spec"] = json.loads(job["spec"])
            job["sub_jobs"] = by_job[job["id"]]
        return jobs

    def holder_labels(self, holder_ids: Iterable[str]) -> dict[str, dict[str, Any]]:
        """Owner, name and kind ("job" or "run") of queue holders, in a few queries whatever their number."""
        ids = list(dict.fromkeys(holder_ids))
        labels: dict[str, dict[str, Any]] = {}
        for start in range(0, len(ids), 500):
            batch = ids[start : start + 500]
            marks = ",".join("?" * len(batch))
            for table, kind in (("jobs", "job"), ("runs", "run")):
                for row in self._rows(f"SELECT id, owner, name FROM {table} WHERE id IN ({marks})", batch):
                    labels.setdefault(row["id"], {**row, "kind": kind})
        return labels

    def jobs_with_status(self, statuses: Iterable[str]) -> list[dict[str, Any]]:
        statuses = list(statuses)
        marks = ",".join("?" * len(statuses))
        rows = self._rows(f"SELECT id FROM jobs WHERE status IN ({marks}) ORDER BY created_at, id", statuses)
        return [job for job in (self.get_job(row["id"]) for row in rows) if job is not None]

    def update_job(self, job_id: str, **fields: Any) -> None:
        if not fields:
            return
        columns = ", ".join(f"{name} = ?" for name in fields)
        self._execute(f"UPDATE jobs SET {columns} WHERE id = ?", [*fields.values(), job_id])

    def touch_job(self, job_id: str) -> None:
        self._execute("UPDATE jobs SET last_activity_at = ? WHERE id = ?", (time.time(), job_id))

    def update_sub_job(self, job_id: str, sub_job_id: str, **fields: Any) -> None:
        if "info" in fields:
            fields["info"] = json.dumps(fields["info"])
        columns = ", ".join(f"{name} = ?" for name in fields)
        self._execute(
            f"UPDATE sub_jobs SET {columns} WHERE job_id = ? AND id = ?",
            [*fields.values(), job_id, sub_job_id],
        )

    # requests -------------------------------------------------------------------------------
    def insert_request(self, request: dict[str, Any]) -> None:
        self._execute(
            "INSERT INTO requests (id, job_id, sub_job_id, op, status, params, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                request["id"],
                request["job_id"],
                request["sub_job_id"],
                request["op"],
                request["status"],
                json.dumps(request["params"]),
                time.time(),
            ),
        )

    def request_status(self, request_id: str) -> str | None:
        rows = self._rows("SELECT status FROM requests WHERE id = ?", (request_id,))
        return rows[0]["status"] if rows else None

    def get_request(self, request_id: str, *, tensors: bool = False) -> dict[str, Any] | None:
        """The request's row; its result tensors (a blob of any size) only when asked for: every poll reads
        the row, and only a fetch of the tensors needs them. `tensors_bytes` says whether there are any."""
        columns = REQUEST_COLUMNS + (", tensors" if tensors else "")
        rows = self._rows(f"SELECT {columns} FROM requests WHERE id = ?", (request_id,))
        if not rows:
            return None
        row = rows[0]
        row["params"] = json.loads(row["params"])
        row["result"] = _loads(row["result"])
        return row

    def list_requests(self, job_id: str, limit: int) -> list[dict[str, Any]]:
        rows = self._rows(
            "SELECT id, job_id, sub_job_id, op, status, error_code, error_message, created_at, started_at, finished_at"
            " FROM requests WHERE job_id = ? ORDER BY created_at DESC LIMIT ?",
            (job_id, limit),
        )
        return rows

    def requests_with_status(
        self, statuses: Iterable[str], job_id: str | None = None
    ) -> list[dict[str, Any]]:
        statuses = list(statuses)
        marks = ",".join("?" * len(statuses))
        sql = f"SELECT id, job_id, sub_job_id, op, status FROM requests WHERE status IN ({marks})"
        params: list[Any] = list(statuses)
        if job_id is not None:
            sql += " AND job_id = ?"
            params.append(job_id)
        return self._rows(sql + " ORDER BY created_at", params)

    def update_request(self, request_id: str, **fields: Any) -> None:
        if "result" in fields and fields["result"] is not None:
            fields["result"] = json.dumps(fields["result"])
        columns = ", ".join(f"{name} = ?" for name in fields)
        self._execute(f"UPDATE requests SET {columns} WHERE id = ?", [*fields.values(), request_id])

    def add_request_event(self, request_id: str, type_: str, data: dict[str, Any]) -> int:
        with self.transaction():
            rows = self._rows(
                "SELECT COALESCE(MAX(seq), 0) AS seq FROM request_events WHERE request_id = ?", (request_id,)
            )
            seq = rows[0]["seq"] + 1
            self._execute(
                "INSERT INTO request_events (request_id, seq, at, type, data) VALUES (?, ?, ?, ?, ?)",
                (request_id, seq, time.time(), type_, json.dumps(data)),
            )
        return seq

    def request_events(self, request_id: str, after: int, limit: int) -> list[dict[str, Any]]:
        rows = self._rows(
            "SELECT seq, at, type, data FROM request_events WHERE request_id = ? AND seq > ? ORDER BY seq LIMIT ?",
            (request_id, after, limit),
        )
        for row in rows:
            row["data"] = json.loads(row["data"])
        return rows

    # idempotency ----------------------------------------------------------------------------
    def idempotent_response(self, owner: str, key: str) -> dict[str, Any] | None:
        rows = self._rows("SELECT * FROM idempotency WHERE owner = ? AND key = ?", (owner, key))
        if not rows:
            return None
        row = rows[0]
        row["response"] = json.loads(row["response"])
        return row

    def remember_response(self, owner: str, key: str, body_sha256: str, status: int, response: Any) -> None:
        self._execute(
            "INSERT OR IGNORE INTO idempotency (owner, key, body_sha256, status, response, created_at)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            (owner, key, body_sha256, status, json.dumps(response), time.time()),
        )

    def trim_idempotency(self, older_than: float) -> int:
        return self._execute("DELETE FROM idempotency WHERE created_at < ?", (older_than,)).rowcount

    # retention --------------------------------------------------------------------------------
    def forget_finished_jobs(self, ended_before: float, limit: int) -> list[str]:
        """Delete up to `limit` jobs that ended before `ended_before` and keep no checkpoint, with their
        sub-jobs, requests, request events, logs and events; returns their ids."""
        rows = self._rows(
            "SELECT id FROM jobs WHERE finished_at IS NOT NULL AND finished_at < ?"
            " AND id NOT IN (SELECT job_id FROM checkpoints) ORDER BY finished_at LIMIT ?",
            (ended_before, limit),
        )
        ids = [row["id"] for row in rows]
        with self.transaction():
            for job_id in ids:
                self._execute(
                    "DELETE FROM request_events WHERE request_id IN (SELECT id FROM requests WHERE job_id = ?)",
                    (job_id,),
                )
                for table in ("requests", "sub_jobs", "logs", "events", "progress", "checkpoint_exports"):
                    self._execute(f"DELETE FROM {table} WHERE job_id = ?", (job_id,))
                self._execute("DELETE FROM jobs WHERE id = ?", (job_id,))
        return ids

    def forget_finished_runs(
        self, ended_before: float, limit: int, log_key: Callable[[str], str]
    ) -> list[str]:
        """Delete up to `limit` runs that ended before `ended_before`, with their logs (kept under
        `log_key(run_id)`); returns their ids (their files are the caller's to remove)."""
        rows = self._rows(
            "SELECT id FROM runs WHERE finished_at IS NOT NULL AND finished_at < ? ORDER BY finished_at LIMIT ?",
            (ended_before, limit),
        )
        ids = [row["id"] for row in rows]
        with self.transaction():
            for run_id in ids:
                self._execute("DELETE FROM logs WHERE job_id = ?", (log_key(run_id),))
                self._execute("DELETE FROM runs WHERE id = ?", (run_id,))
        return ids

    # logs -----------------------------------------------------------------------------------
    def append_logs(self, job_id: str, entries: list[tuple[str, float, str, str]]) -> int:
        """Append (sub_job_id, at, stream, line) entries with the next sequence numbers; returns the last."""
        with self.transaction():
            rows = self._rows("SELECT COALESCE(MAX(seq), 0) AS seq FROM logs WHERE job_id = ?", (job_id,))
            seq = rows[0]["seq"]
            for sub_job_id, at, stream, line in entries:
                seq += 1
                self._execute(
                    "INSERT INTO logs (job_id, seq, sub_job_id, at, stream, line) VALUES (?, ?, ?, ?, ?, ?)",
                    (job_id, seq, sub_job_id, at, stream, line),
                )
        return seq

    def read_logs(
        self, job_id: str, after: int, limit: int, sub_job_id: str | None = None
    ) -> list[dict[str, Any]]:
        sql = "SELECT seq, sub_job_id, at, stream, line FROM logs WHERE job_id = ? AND seq > ?"
        params: list[Any] = [job_id, after]
        if sub_job_id is not None:
            sql += " AND sub_job_id = ?"
            params.append(sub_job_id)
        return self._rows(sql + " ORDER BY seq LIMIT ?", [*params, limit])

    def last_log_lines(self, job_id: str, count: int) -> list[str]:
        """A job's newest `count` log lines, oldest first."""
        rows = self._rows("SELECT line FROM logs WHERE job_id = ? ORDER BY seq DESC LIMIT ?", (job_id, count))
        return [row["line"] for row in reversed(rows)]

    def trim_logs(self, job_id: str, keep: int) -> int:
        """Drop the oldest lines beyond `keep`; returns how many were dropped."""
        rows = self._rows("SELECT COALESCE(MAX(seq), 0) AS seq FROM logs WHERE job_id = ?", (job_id,))
        cutoff = rows[0]["seq"] - keep
        if cutoff <= 0:
            return 0
        return self._execute("DELETE FROM logs WHERE job_id = ? AND seq <= ?", (job_id, cutoff)).rowcount

    def first_log_seq(self, job_id: str) -> int:
        rows = self._rows("SELECT COALESCE(MIN(seq), 0) AS seq FROM logs WHERE job_id = ?", (job_id,))
        return rows[0]["seq"]

    # source runs ------------------------------------------------------------------------------
    _RUN_JSON = ("spec", "manifest", "devices", "isolation", "outputs", "report")

    def _run_row(self, row: dict[str, Any]) -> dict[str, Any]:
        for name in self._RUN_JSON:
            row[name] = _loads(row[name])
        return row

    def insert_run(self, run: dict[str, Any]) -> None:
        self._execute(
            "INSERT INTO runs (id, owner, submission_id, name, status, spec, manifest, created_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                run["id"],
                run["owner"],
                run["submission_id"],
                run["name"],
                run["status"],
                json.dumps(run["spec"]),
                json.dumps(run["manifest"]),
                time.time(),
            ),
        )

    def get_run(self, run_id: str) -> dict[str, Any] | None:
        rows = self._rows("SELECT * FROM runs WHERE id = ?", (run_id,))
        return self._run_row(rows[0]) if rows else None

    def run_by_submission(self, owner: str, submission_id: str) -> dict[str, Any] | None:
        rows = self._rows("SELECT * FROM runs WHERE owner = ? AND submission_id = ?", (owner, submission_id))
        return self._run_row(rows[0]) if rows else None

    def list_runs(
        self,
        owner: str | None,
        status: str | None,
        limit: int,
        before: tuple[float, str] | None,
        filters: ListingFilter | None = None,
    ) -> list[dict[str, Any]]:
        """Newest first; `before` is the (created_at, id) of the last run of the previous page; `filters`
        (when given) replaces `owner` and `status`."""
        sql, params = newest_first_query("runs", owner, status, before, filters)
        return [self._run_row(row) for row in self._rows(sql, [*params, limit])]

    def runs_with_status(self, statuses: Iterable[str]) -> list[dict[str, Any]]:
        statuses = list(statuses)
        marks = ",".join("?" * len(statuses))
        rows = self._rows(f"SELECT * FROM runs WHERE status IN ({marks}) ORDER BY created_at, id", statuses)
        return [self._run_row(row) for row in rows]

    def update_run(self, run_id: str, **fields: Any) -> None:
        if not fields:
            return
        for name in self._RUN_JSON:
            if name in fields:
                fields[name] = json.dumps(fields[name])
        columns = ", ".join(f"{name} = ?" for name in fields)
        self._execute(f"UPDATE runs SET {columns} WHERE id = ?", [*fields.values(), run_id])

    # checkpoints ----------------------------------------------------------------------------
    def insert_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self._execute(
            "INSERT INTO checkpoints (job_id, id, owner, sub_job_id, type, step, size_bytes, base_model, manifest,"
            " request_id, created_at, expires_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                checkpoint["job_id"],
                checkpoint["id"],
                checkpoint["owner"],
                checkpoint["sub_job_id"],
                checkpoint["type"],
                checkpoint["step"],
                checkpoint["size_bytes"],
                checkpoint["base_model"],
                json.dumps(checkpoint["manifest"]),
                checkpoint.get("request_id"),
                checkpoint.get("created_at", time.time()),
                checkpoint.get("expires_at"),
            ),
        )

    def set_checkpoint_lifecycle(self, job_id: str, checkpoint_id: str, **fields: Any) -> None:
        """Set `expires_at` (None: never) and/or `public` of one checkpoint."""
        allowed = {name: fields[name] for name in ("expires_at", "public") if name in fields}
        if allowed:
            columns = ", ".join(f"{name} = ?" for name in allowed)
            self._execute(
                f"UPDATE checkpoints SET {columns} WHERE job_id = ? AND id = ?",
                [*allowed.values(), job_id, checkpoint_id],
            )

    def expired_checkpoints(self, now: float) -> list[dict[str, Any]]:
        return self._checkpoint_rows(
            _CHECKPOINT_SELECT
            + " WHERE c.expires_at IS NOT NULL AND c.expires_at <= ? ORDER BY c.expires_at",
            (now,),
        )

    def checkpoints_loaded_by_live_jobs(self, live_statuses: Iterable[str]) -> set[tuple[str, str]]:
        """(job id, checkpoint id) of every checkpoint a load request of a job not yet ended read."""
        statuses = tuple(live_statuses)
        rows = self._rows(
            "SELECT json_extract(r.params, '$.source_job_id') AS source, json_extract(r.params, '$.checkpoint_id')"
            " AS checkpoint FROM requests r JOIN jobs j ON j.id = r.job_id WHERE r.op = 'load' AND j.status IN"
            f" ({', '.join('?' for _ in statuses)})",
            statuses,
        )
        return {(row["source"], row["checkpoint"]) for row in rows if row["source"] and row["checkpoint"]}

    def _checkpoint_rows(self, sql: str, params: Iterable[Any]) -> list[dict[str, Any]]:
        rows = self._rows(sql, params)
        for row in rows:
            row["manifest"] = json.loads(row["manifest"])
        return rows

    def get_checkpoint(self, job_id: str, checkpoint_id: str) -> dict[str, Any] | None:
        rows = self._checkpoint_rows(
            f"{_CHECKPOINT_SELECT} WHERE c.job_id = ? AND c.id = ?", (job_id, checkpoint_id)
        )
        return rows[0] if rows else None

    def list_checkpoints(self, job_id: str) -> list[dict[str, Any]]:
        return self._checkpoint_rows(
            f"{_CHECKPOINT_SELECT} WHERE c.job_id = ? ORDER BY c.created_at, c.id", (job_id,)
        )

    def set_checkpoint_kept(self, job_id: str, checkpoint_id: str, kept: bool) -> None:
        if kept:
            self._execute(
                "INSERT OR IGNORE INTO kept_checkpoints (job_id, id, kept_at) VALUES (?, ?, ?)",
                (job_id, checkpoint_id, time.time()),
            )
        else:
            self._execute("DELETE FROM kept_checkpoints WHERE job_id = ? AND id = ?", (job_id, checkpoint_id))

    def record_export(self, job_id: str, checkpoint_id: str, contents: str) -> None:
        self._execute(
            "INSERT INTO checkpoint_exports (job_id, checkpoint_id, at, contents) VALUES (?, ?, ?, ?)",
            (job_id, checkpoint_id, time.time(), contents),
        )

    def checkpoint_exports(self, job_id: str) -> list[dict[str, Any]]:
        return self._rows(
            "SELECT checkpoint_id, at, contents FROM checkpoint_exports WHERE job_id = ? ORDER BY at",
            (job_id,),
        )

    def storage_by_job(self, owner: str | None) -> list[dict[str, Any]]:
        """Per owner and job holding checkpoints: count, kept count and bytes (`owner` None: everyone's)."""
        sql = (
            "SELECT c.owner, c.job_id, j.name, j.status, COUNT(*) AS checkpoint_count,"
            " COALESCE(SUM(c.size_bytes), 0) AS size_bytes, COUNT(k.id) AS kept_count"
            " FROM checkpoints c LEFT JOIN jobs j ON j.id = c.job_id"
            " LEFT JOIN kept_checkpoints k ON k.job_id = c.job_id AND k.id = c.id"
        )
        params: list[Any] = []
        if owner is not None:
            sql += " WHERE c.owner = ?"
            params.append(owner)
        return self._rows(sql + " GROUP BY c.owner, c.job_id ORDER BY c.owner, size_bytes DESC", params)

    def checkpoint_uses(self, owner: str, job_id: str) -> list[dict[str, Any]]:
        """Load, generate and forward requests of `owner`'s jobs that name a checkpoint of `job_id` (a load's
        source, or a saved adapter `job_id/checkpoint_id`), oldest first, with their params."""
        rows = self._rows(
            "SELECT r.id, r.job_id, r.sub_job_id, r.op, r.status, r.params, r.created_at FROM requests r"
            " JOIN jobs j ON j.id = r.job_id WHERE j.owner = ? AND r.op IN ('load', 'generate', 'forward')"
            " AND (r.params LIKE ? OR r.params LIKE ?) ORDER BY r.created_at",
            # A prefilter ('_' in an id matches any character): the caller checks each row exactly.
            (owner, f'%"source_job_id": "{job_id}"%', f'%"adapter": "{job_id}/%'),
        )
        for row in rows:
            row["params"] = json.loads(row["params"])
        return rows

    def job_loads(self, job_id: str) -> list[dict[str, Any]]:
        """The job's succeeded loads (into any of its sub-jobs), oldest first, with their params."""
        rows = self._rows(
            "SELECT id, sub_job_id, params, created_at FROM requests WHERE job_id = ? AND op = 'load'"
            " AND status = 'succeeded' ORDER BY created_at",
            (job_id,),
        )
        for row in rows:
            row["params"] = json.loads(row["params"])
        return rows

    def job_weight_syncs(self, job_id: str) -> list[dict[str, Any]]:
        rows = self._rows(
            "SELECT id, status, params, result, created_at FROM requests WHERE job_id = ? AND op = 'weight_sync'"
            " ORDER BY created_at",
            (job_id,),
        )
        for row in rows:
            row["params"] = json.loads(row["params"])
            row["result"] = _loads(row["result"])
        return rows

    def forget_job(self, job_id: str) -> None:
        """Delete an ended job's rows (its checkpoints' rows must be gone already)."""
        with self.transaction():
            self._execute(
                "DELETE FROM request_events WHERE request_id IN (SELECT id FROM requests WHERE job_id = ?)",
                (job_id,),
            )
            for table in ("requests", "sub_jobs", "logs", "events", "progress", "checkpoint_exports"):
                self._execute(f"DELETE FROM {table} WHERE job_id = ?", (job_id,))
            self._execute("DELETE FROM jobs WHERE id = ?", (job_id,))

    def all_checkpoints(self) -> list[dict[str, Any]]:
        return self._rows("SELECT job_id, id, owner FROM checkpoints")

    def delete_checkpoint(self, job_id: str, checkpoint_id: str) -> bool:
        with self.transaction():
            self._execute("DELETE FROM kept_checkpoints WHERE job_id = ? AND id = ?", (job_id, checkpoint_id))
            return (
                self._execute(
                    "DELETE FROM checkpoints WHERE job_id = ? AND id = ?", (job_id, checkpoint_id)
                ).rowcount
                > 0
            )

    def checkpoint_bytes(self, owner: str) -> int:
        rows = self._rows(
            "SELECT COALESCE(SUM(size_bytes), 0) AS total FROM checkpoints WHERE owner = ?", (owner,)
        )
        return int(rows[0]["total"])

    # observability: events ---------------------------------------------------------------------
    def events_after(self, after: int, owner: str | None, limit: int) -> list[dict[str, Any]]:
        """Events with seq > `after`, oldest first; only `owner`'s unless owner is None (admin)."""
        sql = "SELECT seq, at, kind, job_id, request_id, sub_job_id, op, status, failure_code FROM events WHERE seq > ?"
        params: list[Any] = [after]
        if owner is not None:
            sql += " AND owner = ?"
            params.append(owner)
        return self._rows(sql + " ORDER BY seq LIMIT ?", [*params, limit])

    def last_event_seq(self) -> int:
        return self._rows("SELECT COALESCE(MAX(seq), 0) AS seq FROM events")[0]["seq"]

    def trim_events(self, keep: int) -> int:
        """Drop the oldest events beyond `keep`; returns how many were dropped."""
        cutoff = self.last_event_seq() - keep
        if cutoff <= 0:
            return 0
        return self._execute("DELETE FROM events WHERE seq <= ?", (cutoff,)).rowcount

    # observability: device samples -----------------------------------------------------------------
    def add_device_samples(self, samples: list[dict[str, Any]]) -> None:
        """Persist monitor samples: each has `at` and `device`; the other fields are kept as JSON."""
        rows = [
            (
                sample["device"],
                sample["at"],
                json.dumps({k: v for k, v in sample.items() if k not in ("device", "at")}),
            )
            for sample in samples
        ]
        with self.transaction():
            for row in rows:
                self._execute(
                    "INSERT OR REPLACE INTO device_samples (device, at, data) VALUES (?, ?, ?)", row
                )

    def device_samples(
        self, devices: list[str], since: float, until: float | None, limit: int
    ) -> list[dict[str, Any]]:
        """Samples of `devices` with since < at <= until, oldest first (ties by device)."""
        if not devices:
            return []
        marks = ",".join("?" * len(devices))
        sql = f"SELECT device, at, data FROM device_samples WHERE device IN ({marks}) AND at > ?"
        params: list[Any] = [*devices, since]
        if until is not None:
            sql += " AND at <= ?"
            params.append(until)
        rows = self._rows(sql + " ORDER BY at, device LIMIT ?", [*params, limit])
        return [{"at": row["at"], "device": row["device"], **json.loads(row["data"])} for row in rows]

    def trim_device_samples(self, older_than: float) -> int:
        return self._execute("DELETE FROM device_samples WHERE at < ?", (older_than,)).rowcount

    def active_sub_jobs(self) -> list[dict[str, Any]]:
        """Sub-jobs (and source runs, as sub-job 'main' of the run, as in their logs) placed on a device
        and not finished: who a device sample is attributed to."""
        rows = self._rows(
            "SELECT job_id, id AS sub_job_id, device FROM sub_jobs WHERE status IN ('starting', 'running')"
            " AND device IS NOT NULL ORDER BY job_id, position"
        )
        for run in self._rows(
            "SELECT id, devices FROM runs WHERE status IN ('starting', 'running') ORDER BY created_at"
        ):
            for device in sorted(set(json.loads(run["devices"] or "[]"))):
                rows.append({"job_id": run["id"], "sub_job_id": "main", "device": device})
        return rows

    # managed training: datasets and progress records -------------------------------------------------
    def insert_dataset(self, owner: str, dataset_id: str, rows: int, size: int) -> None:
        self._execute(
            "INSERT OR IGNORE INTO datasets (owner, id, rows, bytes, created_at) VALUES (?, ?, ?, ?, ?)",
            (owner, dataset_id, rows, size, time.time()),
        )

    def dataset_bytes(self, owner: str) -> int:
        return int(
            self._rows("SELECT COALESCE(SUM(bytes), 0) AS total FROM datasets WHERE owner = ?", (owner,))[0][
                "total"
            ]
        )

    def get_dataset(self, owner: str, dataset_id: str) -> dict[str, Any] | None:
        rows = self._rows("SELECT * FROM datasets WHERE owner = ? AND id = ?", (owner, dataset_id))
        return rows[0] if rows else None

    def save_progress(self, job_id: str, data: dict[str, Any]) -> None:
        self._execute(
            "INSERT OR REPLACE INTO progress (job_id, data, updated_at) VALUES (?, ?, ?)",
            (job_id, json.dumps(data), data.get("updated_at") or time.time()),
        )

    def get_progress(self, job_id: str) -> dict[str, Any] | None:
        rows = self._rows("SELECT data FROM progress WHERE job_id = ?", (job_id,))
        return json.loads(rows[0]["data"]) if rows else None

    # statistics (stats.py) -------------------------------------------------------------------------
    _IN_WINDOW = (
        "((created_at >= ? AND created_at < ?) OR (started_at IS NOT NULL AND started_at < ?"
        " AND (finished_at IS NULL OR finished_at > ?)))"
    )

    def work_for_stats(
        self, owner: str | None, since: float, until: float
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
        """(jobs, their sub-jobs' models, runs) created in [since, until) or on a device during it: only
        the columns the statistics read."""
        where = self._IN_WINDOW
        params: list[Any] = [since, until, until, since]
        if owner is not None:
            where += " AND owner = ?"  # sub_jobs has none of these columns: the same text serves the join
            params.append(owner)
        columns = "id, owner, status, created_at, started_at, finished_at"
        with self._lock:
            jobs = self._rows(f"SELECT {columns}, held_seconds FROM jobs WHERE {where}", params)
            subs = self._rows(
                "SELECT s.job_id, json_extract(s.spec, '$.base_model') AS model FROM sub_jobs s"
                f" JOIN jobs ON jobs.id = s.job_id WHERE {where}",
                params,
            )
            runs = self._rows(
                f"SELECT {columns}, devices, json_extract(spec, '$.models') AS models FROM runs WHERE {where}",
                params,
            )
        for run in runs:
            run["devices"] = json.loads(run["devices"] or "[]")
            run["models"] = json.loads(run["models"] or "[]")
        return jobs, subs, runs

    def job_counts_by_status(self) -> dict[str, int]:
        return {
            row["status"]: row["n"]
            for row in self._rows("SELECT status, COUNT(*) AS n FROM jobs GROUP BY status")
        }


class _Transaction:
    """`with store.transaction():` groups writes atomically (re-entrant on the store's lock)."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._outer = False

    def __enter__(self) -> None:
        store = self._store
        if not store._lock.acquire(timeout=store._lock_wait_s()):
            raise sqlite3.OperationalError("database is locked (another writer of this backend holds it)")
        self._outer = not store._db.in_transaction
        if self._outer:
            try:
                store._db.execute("BEGIN")
            except BaseException:
                store._lock.release()
                raise
            store._transaction_thread = threading.get_ident()

    def __exit__(self, exc_type, exc, tb) -> None:
        db = self._store._db
        try:
            if self._outer:
                self._store._transaction_thread = None
                if exc_type is None:
                    try:
                        db.execute("COMMIT")
                    except BaseException:
                        # A COMMIT refused (disk full, lock held) leaves the transaction open: close it, or
                        # every later write of this connection joins a transaction that never ends.
                        _rollback(db)
                        raise
                else:
                    _rollback(db)
        finally:
            self._store._lock.release()


def _rollback(db: sqlite3.Connection) -> None:
    """Roll back what is open; SQLite may have rolled back already (after SQLITE_FULL, say)."""
    if db.in_transaction:
        with contextlib.suppress(sqlite3.Error):
            db.execute("ROLLBACK")
