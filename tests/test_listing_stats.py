"""Listing filters and statistics against a store of 1,000 jobs and 60 runs, written through the store
module (fast), then read through HTTP: `GET /v1/stats` agrees with what the filtered listings show."""

from __future__ import annotations

import math
import random
import statistics
import time
from collections import Counter, defaultdict

import httpx
import pytest
from cortex_backend.config import BackendSettings
from cortex_backend.store import Store

from cortex_nb import Client, errors

from .backend_process import start_backend
from .tokens import create_token

JOBS = 1000
RUNS = 60
OWNERS = ("alice", "bob", "carol")
MODELS = ("tiny", "small-gpt2")
DAY = 86400.0


def _seed_store(data_dir) -> float:
    """Finished jobs and runs over the last 4 days (within the backend's history retention)."""
    rng = random.Random(7)
    now = time.time()
    store = Store(BackendSettings(data_dir=data_dir).db_path)
    try:
        for index in range(JOBS):
            owner = OWNERS[index % 3]
            status = rng.choice(("done", "done", "failed", "cancelled"))
            created = now - rng.uniform(0.1, 4) * DAY
            started = None if status == "cancelled" and index % 2 else created + rng.uniform(0, 600)
            finished = (started or created) + rng.uniform(1, 3600)
            subs = [{"type": "sampling", "base_model": MODELS[(index + k) % 2]} for k in range(1 + index % 3)]
            labels = {"team": "nlp" if index % 4 == 0 else "vision"}
            store.insert_job(
                {
                    "id": f"job-seed-{index:04d}",
                    "owner": owner,
                    "name": f"{'sweep' if index % 5 == 0 else 'train'}-{index}",
                    "status": status,
                    "spec": {"sub_jobs": subs, "labels": labels, "priority": 5},
                },
                [
                    {"id": f"sampling-{k}", "type": "sampling", "status": status, "spec": sub}
                    for k, sub in enumerate(subs)
                ],
            )
            store.update_job(
                f"job-seed-{index:04d}", created_at=created, started_at=started, finished_at=finished
            )
        for index in range(RUNS):
            run_id = f"run-seed-{index:03d}"
            created = now - rng.uniform(0.1, 4) * DAY
            spec = {"name": f"eval-{index}", "models": [MODELS[index % 2]] if index % 3 else []}
            if index % 2:
                spec["labels"] = {"team": "nlp"}
            store.insert_run(
                {
                    "id": run_id,
                    "owner": OWNERS[index % 3],
                    "submission_id": f"sub-{index}",
                    "name": spec["name"],
                    "status": "done" if index % 4 else "failed",
                    "spec": spec,
                    "manifest": [],
                }
            )
            store.update_run(
                run_id,
                created_at=created,
                started_at=created + 5,
                finished_at=created + 65,
                devices=["cpu:0"] * (1 + index % 2),
            )
    finally:
        store.close()
    return now


@pytest.fixture(scope="module")
def seeded(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("stats-backend")
    seeded_at = _seed_store(data_dir)
    backend = start_backend(data_dir, "--devices", "cpu:1", "--warm-workers", "0", "--monitor-interval", "0")
    yield backend, seeded_at
    backend.stop()


def _device_seconds(rows, since, until, now, slots) -> dict[str, float]:
    totals: dict[str, float] = defaultdict(float)
    for row in rows:
        if row["started_at"] is None:
            continue
        end = row["finished_at"] if row["finished_at"] is not None else now
        totals[row["owner"]] += max(0.0, min(end, until) - max(row["started_at"], since)) * slots(row)
    return totals


def test_stats_match_counts_computed_from_the_listing(seeded):
    backend, now = seeded
    since, until = now - 3 * DAY, now - 0.5 * DAY
    with Client(backend.url, backend.token) as admin:
        listed = admin.list_jobs(limit=5000, since=since, until=until)
        runs = admin.list_runs(limit=5000, since=since, until=until)
        stats = admin.stats(since, until)
    assert 300 < len(listed) < JOBS and len({job["job_id"] for job in listed}) == len(listed)
    assert all(since <= job["created_at"] < until for job in listed)
    assert stats["jobs"] == {"total": len(listed), "by_state": dict(Counter(j["status"] for j in listed))}
    assert stats["runs"]["by_state"] == dict(Counter(run["status"] for run in runs))
    waits = sorted(
        row["started_at"] - row["created_at"] for row in (*listed, *runs) if row["started_at"] is not None
    )
    assert stats["queue_wait"]["count"] == len(waits)
    assert stats["queue_wait"]["median_s"] == pytest.approx(statistics.median(waits))
    assert stats["queue_wait"]["p95_s"] == pytest.approx(waits[math.ceil(0.95 * len(waits)) - 1])
    # Device-seconds: every job or run that overlaps the window, also one created before it.
    with Client(backend.url, backend.token) as admin:
        every_job = admin.list_jobs(limit=5000)
        every_run = admin.list_runs(limit=5000)
    assert len(every_job) == JOBS and len(every_run) == RUNS
    expected = _device_seconds(every_job, since, until, now, lambda job: len(job["sub_jobs"]))
    for owner, seconds in _device_seconds(
        every_run, since, until, now, lambda run: len(run["devices"])
    ).items():
        expected[owner] += seconds
    assert stats["device_seconds"]["by_owner"] == pytest.approx(dict(expected), abs=0.01)
    assert stats["device_seconds"]["total"] == pytest.approx(sum(expected.values()), abs=0.05)
    assert sum(stats["device_seconds"]["by_model"].values()) == pytest.approx(
        sum(expected.values()), abs=0.05
    )
    assert set(stats["device_seconds"]["by_model"]) <= {*MODELS, "(none)"}


def test_filters_combine_and_page_by_cursor(seeded):
    backend, now = seeded
    with Client(backend.url, backend.token) as admin:
        every = admin.list_jobs(limit=5000)
        sweeps = admin.list_jobs(limit=5000, name="sweep", label="team=nlp", owner="bob", status="done")
        expected = [
            job
            for job in every
            if "sweep" in job["name"]
            and job["labels"].get("team") == "nlp"
            and job["owner"] == "bob"
            and job["status"] == "done"
        ]
        assert [job["job_id"] for job in sweeps] == [job["job_id"] for job in expected] and sweeps
        # Pages of 7 hold the same rows, newest first, each once.
        pages, cursor = [], None
        while True:
            page = admin.api.list_jobs(None, 7, cursor, label="team", owner="carol")
            pages.extend(page["jobs"])
            cursor = page["next_cursor"]
            if cursor is None:
                break
        assert [job["job_id"] for job in pages] == [job["job_id"] for job in every if job["owner"] == "carol"]
        nlp_runs = admin.list_runs(limit=500, label="team=nlp")
        assert len(nlp_runs) == RUNS // 2 and all(run["labels"] == {"team": "nlp"} for run in nlp_runs)


def test_the_stats_chart_draws_the_backends_figures(seeded):
    """The chart `%cortex stats` shows: one bar per owner, lengths in proportion to their device-seconds,
    and the queue wait's median and p95, in SVG and in its text form."""
    import re

    from cortex_nb.widgets.stats_chart import StatsChart

    backend, now = seeded
    with Client(backend.url, backend.token) as admin:
        stats = admin.stats(now - 5 * DAY, now + 1)
    by_owner = stats["device_seconds"]["by_owner"]
    assert set(OWNERS) <= set(by_owner)
    chart = StatsChart(stats)
    svg = chart._repr_html_()
    drawn = {
        (panel, label): float(width)
        for panel, label, width in re.findall(
            r'data-panel="(\w+)" data-label="([^"]+)"[^>]*width="([\d.]+)"', svg
        )
    }
    top = max(by_owner.values())
    longest = max(width for (panel, _), width in drawn.items() if panel == "owners")
    for owner, seconds in by_owner.items():
        assert drawn[("owners", owner)] == pytest.approx(seconds / top * longest, abs=0.01)
    wait = stats["queue_wait"]
    assert drawn[("queue", "p95")] / drawn[("queue", "median")] == pytest.approx(
        wait["p95_s"] / wait["median_s"], rel=1e-3
    )
    text = repr(chart)
    assert f"queue wait ({wait['count']} started)" in text
    for owner, seconds in by_owner.items():
        assert f"{seconds / 3600:.2f} h" in text and owner in text


def test_an_owner_sees_only_their_own_and_may_not_name_another(seeded):
    backend, now = seeded
    token = create_token(backend.data_dir, "alice", "jobs:read")
    with Client(backend.url, token) as alice, Client(backend.url, backend.token) as admin:
        mine = alice.list_jobs(limit=5000)
        assert mine and {job["owner"] for job in mine} == {"alice"}
        assert alice.stats(now - 5 * DAY)["jobs"] == admin.stats(now - 5 * DAY, owner="alice")["jobs"]
        assert alice.stats(now - 5 * DAY)["jobs"]["total"] == len(mine)
        for call in (lambda: alice.list_jobs(owner="bob"), lambda: alice.stats(owner="bob")):
            with pytest.raises(errors.PermissionError) as info:
                call()
            assert info.value.code == "forbidden"
        frame = alice.stats_frame(now - 5 * DAY)
        assert frame.loc[frame["name"] == "total", "value"].iloc[0] == len(mine)
    bad = httpx.get(
        backend.url + "/v1/jobs",
        params={"label": "Team=x"},
        headers={"Authorization": f"Bearer {backend.token}"},
    )
    assert bad.status_code == 400 and bad.json()["error"]["detail"]["field"] == "label"
    backwards = httpx.get(
        backend.url + "/v1/stats",
        params={"since": now, "until": now - 10},
        headers={"Authorization": f"Bearer {backend.token}"},
    )
    assert backwards.status_code == 400 and backwards.json()["error"]["code"] == "invalid_field"


def test_the_stats_and_speedtest_magics(cortex_shell, client):
    """`%cortex stats` is a DataFrame of the backend's figures; `%cortex speedtest` prints the link's."""
    import pandas as pd

    from .notebook_fixtures import run_cell

    job = client.create_job([{"type": "sampling", "base_model": "tiny"}], name="stats-magic")
    client.cancel_job(job["job_id"])
    stats = run_cell(cortex_shell, "%cortex stats --days 1")
    assert stats.success, stats.stderr
    frame = stats.result
    assert isinstance(frame, pd.DataFrame) and list(frame.columns) == ["section", "name", "value"]
    assert "queue wait (" in stats.stdout and "device-hours per owner" in stats.stdout
    plain = run_cell(cortex_shell, "%cortex stats --days 1 --no-plot")
    assert plain.success and "device-hours per owner" not in plain.stdout
    totals = frame[(frame["section"] == "jobs by state") & (frame["name"] == "total")]["value"]
    assert int(totals.iloc[0]) == client.stats(time.time() - 86400)["jobs"]["total"]
    assert not run_cell(cortex_shell, "%cortex stats --days 0").success
    speed = run_cell(cortex_shell, "%cortex speedtest --mb 1")
    assert speed.success, speed.stderr
    assert "MB/s" in speed.stdout and "latency" in speed.stdout and "(1.0 MB each way)" in speed.stdout
