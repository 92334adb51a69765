"""The cell record the server draws for the panel (`cortex/api/record/{job}`): the same picture a kernel's
widget writes, live while the run goes and final once it ended, through a real Jupyter server and backend."""

from __future__ import annotations

import time

from .test_server_extension import TINY_JOB, body, direct, fetch_error, jp_server_config, token_file  # noqa: F401


def wait_status(backend, job_id: str, wanted: set[str], timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while direct(backend, "GET", f"/v1/jobs/{job_id}").json()["status"] not in wanted:
        assert time.monotonic() < deadline, f"{job_id} never reached {wanted}"
        time.sleep(0.2)


async def test_the_record_is_live_while_the_run_goes_and_final_once_it_ended(jp_fetch, backend):
    job_id = direct(backend, "POST", "/v1/jobs", json={**TINY_JOB, "name": "record-run"}).json()["job_id"]
    try:
        wait_status(backend, job_id, {"running"})
        live = body(await jp_fetch("cortex", "api", "record", job_id))
        assert live["finished"] is False and live["status"] != "cancelled"
        assert f'data-cortex-job="{job_id}"' in live["html"] and "record-run" in live["html"]
        assert 'class="cortex-picture-note"' in live["html"]  # "picture as of …": a run still going
    finally:
        direct(backend, "POST", f"/v1/jobs/{job_id}/cancel")
    wait_status(backend, job_id, {"cancelled"})

    final = body(await jp_fetch("cortex", "api", "record", job_id))
    assert final["finished"] is True and final["status"] == "cancelled"
    assert 'class="cortex-picture-note"' not in final["html"] and "cancelled" in final["html"]
    assert "continued in" not in final["html"]

    moved = body(await jp_fetch("cortex", "api", "record", job_id, params={"continued_in": 7}))
    assert moved["html"].startswith('<div class="cortex-continued"')
    assert "continued in cell 7:" in moved["html"] and f"%cortex job {job_id}" in moved["html"]
    assert moved["text"].endswith("(continued in cell 7)")


async def test_bad_records_are_refused_with_a_code(jp_fetch, http_server_client, jp_base_url, backend):
    status, error = await fetch_error(jp_fetch, "cortex", "api", "record", "job-does-not-exist")
    assert status == 404 and error["error"]["code"] == "job_not_found"
    job_id = direct(backend, "POST", "/v1/jobs", json=TINY_JOB).json()["job_id"]
    direct(backend, "POST", f"/v1/jobs/{job_id}/cancel")
    status, error = await fetch_error(
        jp_fetch, "cortex", "api", "record", job_id, params={"continued_in": "x"}
    )
    assert status == 400 and error["error"]["code"] == "invalid_request"
    # Without Jupyter's own credentials: refused before any backend call, and the token never shows.
    response = await http_server_client.fetch(
        jp_base_url + f"cortex/api/record/{job_id}", raise_error=False, follow_redirects=False
    )
    assert response.code == 403 and backend.token not in response.body.decode()
