"""What the request path builds once and reuses (compiled route patterns, a reply's validator and
serializer, labelled metric children, one query for a page's sub-jobs) answers and refuses exactly what
the uncached path did. bench/bench_contract.py measures what they save."""

from __future__ import annotations

import json
import math
import re

import pytest
from cortex_backend.operator_metrics import OperatorMetrics
from cortex_backend.store import Store

from cortex_nb.protocol import routes
from cortex_nb.protocol.schemas.base import render, render_bytes
from cortex_nb.protocol.schemas.data_plane import RequestStatus, Submitted
from cortex_nb.protocol.schemas.jobs import JobView


def _example_path(route: routes.Route) -> str:
    return route.url(**{name: f"{name}-1" for name in route.path_params})


def _uncached_match(method: str, path: str, table: tuple[routes.Route, ...]):
    """The route lookup as it was: the template turned into a pattern on every call."""
    for candidate in table:
        pattern = "^" + re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", candidate.template) + "$"
        found = re.match(pattern, path) if candidate.method == method else None
        if found:
            return candidate, found.groupdict()
    return None


def test_every_route_is_matched_as_the_uncached_lookup_matched_it():
    from cortex_backend.compat.tinker.routes import ROUTES as TINKER_ROUTES

    for table in (routes.ROUTES, TINKER_ROUTES):
        for route in table:
            path = _example_path(route)
            for method in ("GET", "POST", "DELETE", "PUT"):
                assert routes.match(method, path, table) == _uncached_match(method, path, table)
            found = routes.match(route.method, path, table)
            assert found is not None and found[1] == {name: f"{name}-1" for name in route.path_params}
    # A face's table and ours are looked up apart, each after the other's first lookup.
    assert routes.match("GET", "/v1/jobs") == (routes.route("list_jobs"), {})
    assert routes.match("GET", _example_path(TINKER_ROUTES[0]), routes.ROUTES) is None


@pytest.mark.parametrize(
    "path",
    ["/v1/jobs/a/b/c", "/v1/jobs/", "/v1//jobs", "/v1/jobs/x/noop/", "/v2/jobs", "v1/jobs", "/v1/jobs?x=1"],
)
def test_paths_no_route_serves_stay_unmatched(path):
    for method in ("GET", "POST"):
        assert routes.match(method, path) is None
        assert _uncached_match(method, path, routes.ROUTES) is None
    assert routes.match("PATCH", "/v1/jobs") is None


JOB_ROW = {
    "job_id": "job-1",
    "owner": "ann",
    "name": None,
    "experiment": None,
    "status": "running",
    "failure_code": None,
    "failure_message": None,
    "created_at": 1.5,
    "started_at": 2.0,
    "finished_at": None,
    "last_activity_at": 3.0,
    "idle_timeout_s": 300.0,
    "labels": {"team": "nlp"},
    "sub_jobs": [
        {
            "sub_job_id": "sampling-0",
            "type": "sampling",
            "status": "running",
            "base_model": "tiny",
            "lora": {},
            "optimizer": {},
            "seed": 0,
            "max_seq_len": None,
            "device": "cpu",
            "failure_code": None,
            "failure_message": None,
            "info": {"device": "cpu", "loss": float("nan")},
        }
    ],
    "training_loop": None,
    "progress": None,
    "queue": None,
    "idle": {"timeout_s": 300.0, "frees_at": 600.0},
    "keep_alive_until": None,
}


def test_a_reply_renders_as_model_dump_json_did():
    for model, value in (
        (JobView, JOB_ROW),
        (Submitted, {"request_id": "req-1", "job_id": "job-1", "sub_job_id": "s-0", "status": "queued"}),
    ):
        expected = model.model_validate(value).model_dump_json(exclude_unset=True)
        assert render_bytes(model, value) == expected.encode()
        assert render(model, value) == expected
        assert render_bytes(model, model.model_validate(value)) == expected.encode()
    # A non-finite number is null, every field is the model's type.
    rendered = json.loads(render_bytes(JobView, JOB_ROW))
    assert rendered["sub_jobs"][0]["info"]["loss"] is None
    assert isinstance(rendered["created_at"], float) and not math.isnan(rendered["created_at"])


def test_a_cached_renderer_still_refuses_what_it_refused():
    undeclared = {**JOB_ROW, "secret_path": "/root/x"}
    # Left out by default, refused under strict replies (as tests run the backend).
    assert "secret_path" not in json.loads(render_bytes(JobView, undeclared))
    for _ in range(2):
        with pytest.raises(TypeError, match="secret_path"):
            render_bytes(JobView, undeclared, strict=True)
    nested = {**JOB_ROW, "sub_jobs": [{**JOB_ROW["sub_jobs"][0], "pid_file": "x"}]}
    with pytest.raises(TypeError, match=r"sub_jobs\.pid_file"):
        render_bytes(JobView, nested, strict=True)
    with pytest.raises(ValueError):
        render_bytes(RequestStatus, {"request_id": "req-1"})  # required fields missing: a 500, not a reply


def _store_with_jobs(tmp_path) -> Store:
    store = Store(tmp_path / "cortex.sqlite3")
    for index, owner in enumerate(("ann", "bo", "ann")):
        subs = [
            {"id": f"s-{position}", "type": "sampling", "status": "pending", "spec": {"seed": position}}
            for position in (2, 0, 1)[: index + 1]
        ]
        store.insert_job(
            {"id": f"job-{index}", "owner": owner, "status": "pending", "spec": {"n": index}}, subs
        )
    store.update_sub_job("job-2", "s-0", info={"device": "cpu"})
    return store


def test_a_page_of_jobs_reads_as_each_job_read_alone(tmp_path):
    store = _store_with_jobs(tmp_path)
    for owner in (None, "ann", "bo", "nobody"):
        page = store.list_jobs(owner, None, 10, None)
        assert page == [store.get_job(job["id"]) for job in page]
        assert len(page) == {None: 3, "ann": 2, "bo": 1, "nobody": 0}[owner]
        assert all(job["owner"] == owner for job in page if owner)
    assert store.list_jobs("nobody", None, 10, None) == []
    both = store.list_jobs(None, None, 2, None)
    last = both[-1]
    rest = store.list_jobs(None, None, 10, (last["created_at"], last["id"]))
    assert [job["id"] for job in both + rest] == [job["id"] for job in store.list_jobs(None, None, 10, None)]
    # sub-jobs keep their positions within each job
    assert [sub["id"] for sub in store.get_job("job-2")["sub_jobs"]] == ["s-2", "s-0", "s-1"]
    assert store.job_owner("job-1") == "bo" and store.job_owner("job-9") is None
    store.insert_request(
        {
            "id": "req-1",
            "job_id": "job-1",
            "sub_job_id": "s-2",
            "op": "noop",
            "status": "queued",
            "params": {},
        }
    )
    assert store.request_status("req-1") == "queued" and store.request_status("req-9") is None
    store.update_request("req-1", status="running")
    assert store.request_status("req-1") == store.get_request("req-1")["status"] == "running"
    # A poll's row leaves the result tensors out (only their size); a fetch of the tensors reads them.
    store.update_request("req-1", status="succeeded", tensors=b"\x01" * 1000)
    polled = store.get_request("req-1")
    assert "tensors" not in polled and polled["tensors_bytes"] == 1000
    assert store.get_request("req-1", tensors=True)["tensors"] == b"\x01" * 1000


def _counted(metrics: OperatorMetrics) -> dict[tuple[str, ...], float]:
    return {
        tuple(sample.labels.values()): sample.value
        for family in metrics.http_requests.collect()
        for sample in family.samples
        if sample.name.endswith("_total")
    }


def _timed(metrics: OperatorMetrics, route: str) -> float:
    return next(
        sample.value
        for family in metrics.http_latency.collect()
        for sample in family.samples
        if sample.name.endswith("_count") and sample.labels["route"] == route
    )


def test_every_answer_is_counted_under_its_own_labels():
    metrics = OperatorMetrics(None)
    for _ in range(3):
        metrics.observe_request("list_jobs", "GET", 200, 0.001, False)
    metrics.observe_request("list_jobs", "GET", 401, 0.001, False)
    metrics.observe_request("get_request", "GET", 200, 5.0, True)  # a long-poll: counted, not timed
    metrics.observe_request("noop", "BREW", 202, 0.002, False)
    assert _counted(metrics) == {
        ("list_jobs", "GET", "200"): 3.0,
        ("list_jobs", "GET", "401"): 1.0,
        ("get_request", "GET", "200"): 1.0,
        ("noop", "OTHER", "202"): 1.0,
    }
    assert _timed(metrics, "list_jobs") == 4.0 and _timed(metrics, "noop") == 1.0
    assert not any(
        sample.labels.get("route") == "get_request"
        for family in metrics.http_latency.collect()
        for sample in family.samples
    )
