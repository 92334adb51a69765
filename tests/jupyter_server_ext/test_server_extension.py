"""The Jupyter server extension (cortex_server) through a real Jupyter server (jp_fetch) and a real
backend: auth, the allowlist, token handling, errors, streaming and base_url prefixes."""

from __future__ import annotations

import json
import re
from http.cookies import SimpleCookie
from urllib.parse import urlencode

import pytest
from tornado.httpclient import HTTPClientError
from traitlets.config import Config

from cortex_nb import __version__
from cortex_nb.protocol import routes
from cortex_nb.protocol.schemas.server_extension import ExtensionStatus
from cortex_nb.protocol.versions import API_VERSION

TINY_JOB = {"sub_jobs": [{"type": "training", "base_model": "tiny"}]}


def server_config(backend_url: str, token_file: str) -> Config:
    return Config(
        {
            "ServerApp": {
                "jpserver_extensions": {"cortex_server": True, "jupyterlab": True},
                "allow_unauthenticated_access": False,
            },
            "CortexServerApp": {"backend_url": backend_url, "token_file": token_file},
        }
    )


@pytest.fixture
def token_file(backend, tmp_path):
    path = tmp_path / "backend.token"
    path.write_text(backend.token + "\n")
    path.chmod(0o600)
    return path


@pytest.fixture
def jp_server_config(backend, token_file):
    return server_config(backend.url, str(token_file))


def body(response) -> dict:
    return json.loads(response.body)


async def fetch_error(jp_fetch, *parts, **kwargs):
    with pytest.raises(HTTPClientError) as caught:
        await jp_fetch(*parts, **kwargs)
    return caught.value.code, json.loads(caught.value.response.body)


def direct(backend, method: str, path: str, **kwargs):
    import httpx

    return httpx.request(
        method, backend.url + path, headers={"Authorization": f"Bearer {backend.token}"}, timeout=30, **kwargs
    )


# auth ------------------------------------------------------------------------------------------------
async def test_unauthenticated_calls_are_refused(jp_fetch, http_server_client, jp_base_url, backend):
    job_id = direct(backend, "POST", "/v1/jobs", json=TINY_JOB).json()["job_id"]
    try:
        for method, path in [
            ("GET", "cortex/api/status"),
            ("GET", "cortex/api/v1/jobs"),
            ("GET", "cortex/api/version"),
            ("POST", f"cortex/api/v1/jobs/{job_id}/cancel"),
        ]:
            for headers in (
                {},
                {"Authorization": "token not-the-jupyter-token"},
                {"Authorization": f"Bearer {backend.token}"},
            ):
                response = await http_server_client.fetch(
                    jp_base_url + path,
                    method=method,
                    headers=headers,
                    body=b"{}" if method == "POST" else None,
                    raise_error=False,
                    follow_redirects=False,
                )
                assert response.code == 403, (method, path, headers, response.code)
                assert backend.token not in response.body.decode()
        # The refused cancel never reached the backend.
        assert direct(backend, "GET", f"/v1/jobs/{job_id}").json()["status"] != "cancelled"
    finally:
        direct(backend, "POST", f"/v1/jobs/{job_id}/cancel")


async def test_authenticated_calls_reach_the_real_backend(jp_fetch, backend):
    version = body(await jp_fetch("cortex", "api", "version"))
    assert version == direct(backend, "GET", "/version").json()
    capacity = body(await jp_fetch("cortex", "api", "v1", "capacity"))
    assert [d["id"] for d in capacity["devices"]] == [
        d["id"] for d in direct(backend, "GET", "/v1/capacity").json()["devices"]
    ]

    created = await jp_fetch(
        "cortex",
        "api",
        "v1",
        "jobs",
        method="POST",
        body=json.dumps({**TINY_JOB, "name": "via-proxy"}),
        headers={"Content-Type": "application/json"},
    )
    assert created.code == 200 or created.code == 201
    job_id = body(created)["job_id"]
    listed = body(await jp_fetch("cortex", "api", "v1", "jobs", params={"limit": 500}))
    assert job_id in [job["job_id"] for job in listed["jobs"]]
    cancelled = body(
        await jp_fetch("cortex", "api", "v1", "jobs", job_id, "cancel", method="POST", body=b"{}")
    )
    assert cancelled["status"] == "cancelled"
    assert direct(backend, "GET", f"/v1/jobs/{job_id}").json()["status"] == "cancelled"


async def test_status_reports_reachability_identity_and_versions(jp_fetch, backend):
    status = body(await jp_fetch("cortex", "api", "status"))
    # every field of the declared shape (the panel's IExtensionStatus is generated from it), and no other
    assert set(status) == set(ExtensionStatus.model_fields)
    assert ExtensionStatus.model_validate(status).model_dump(mode="json") == status
    assert status["reachable"] is True and status["authenticated"] is True
    assert status["backend"] == {
        "service": "cortex-nb-backend",
        "version": __version__,
        "api_version": API_VERSION,
    }
    assert status["extension"] == {"version": __version__, "api_version": API_VERSION}
    assert status["versions_match"] is True and status["api_compatible"] is True
    whoami = direct(backend, "GET", "/v1/whoami").json()
    assert status["identity"] == {"owner": whoami["owner"], "scopes": whoami["scopes"]}
    assert status["error"] is None


# the allowlist ---------------------------------------------------------------------------------------
async def test_routes_off_the_allowlist_are_refused(jp_fetch, backend):
    off_allowlist = [route for route in routes.ROUTES if not route.proxied]
    assert off_allowlist, "the route table marks no route as not proxied"
    for route in off_allowlist:
        path = route.url(**{name: "x" for name in re.findall(r"\{(\w+)\}", route.template)})
        assert direct(backend, route.method, path).status_code != 404  # the backend serves it ...
        code, error = await fetch_error(
            jp_fetch,
            "cortex",
            "api",
            *path.strip("/").split("/"),
            method=route.method,
            **({"body": b"{}"} if route.method in ("POST", "PUT") else {}),
        )
        assert (code, error["error"]["code"]) == (403, "route_not_proxied")  # ... the proxy does not

    code, error = await fetch_error(jp_fetch, "cortex", "api", "v1", "tokens")
    assert (code, error["error"]["code"]) == (404, "route_not_found")
    code, error = await fetch_error(jp_fetch, "cortex", "api", "v1", "jobs", method="DELETE")
    assert (code, error["error"]["code"]) == (405, "method_not_allowed")


async def test_dot_segments_are_refused(http_server_client, jp_base_url, jp_auth_header):
    for path in ("cortex/api/v1/jobs/%2e%2e/whoami", "cortex/api/v1/jobs/../whoami", "cortex/api/v1/jobs/."):
        response = await http_server_client.fetch(
            jp_base_url + path, headers=jp_auth_header, raise_error=False
        )
        assert response.code in (400, 404), path
        assert json.loads(response.body)["error"]["code"] in ("invalid_request", "route_not_found")


def test_allowlist_is_the_route_table():
    from cortex_server import allowlist

    assert {route.name for route in allowlist.proxied_routes()} == {
        route.name for route in routes.ROUTES if route.proxied
    }
    for route in routes.ROUTES:
        path = route.url(**{name: "x" for name in re.findall(r"\{(\w+)\}", route.template)})
        if route.proxied:
            assert allowlist.check(route.method, path).route.name == route.name
        else:
            with pytest.raises(Exception, match="not forwarded"):
                allowlist.check(route.method, path)


# errors and tokens -----------------------------------------------------------------------------------
async def test_backend_errors_pass_on_with_their_codes(jp_fetch):
    code, error = await fetch_error(jp_fetch, "cortex", "api", "v1", "jobs", "job-does-not-exist")
    assert (code, error["error"]["code"]) == (404, "job_not_found")
    code, error = await fetch_error(
        jp_fetch,
        "cortex",
        "api",
        "v1",
        "jobs",
        method="POST",
        body=json.dumps({"sub_jobs": [{"type": "training", "base_model": "../etc"}]}),
    )
    assert code == 400 and error["error"]["code"] in ("invalid_model_name", "unknown_model", "invalid_field")
    code, error = await fetch_error(jp_fetch, "cortex", "api", "v1", "jobs", method="POST", body=b"{not json")
    assert (code, error["error"]["code"]) == (400, "invalid_json")


async def test_backend_token_reaches_no_response_or_page_config(jp_fetch, backend):
    responses = [
        await jp_fetch("cortex", "api", "status"),
        await jp_fetch("cortex", "api", "version"),
        await jp_fetch("cortex", "api", "v1", "jobs"),
        await jp_fetch("cortex", "api", "v1", "capacity"),
        await jp_fetch("lab"),  # the page, with the page config the browser receives
        await jp_fetch("lab", "api", "settings"),
    ]
    page = responses[4].body.decode()
    assert "jupyter-config-data" in page
    for response in responses:
        assert backend.token not in response.body.decode()
        assert all(backend.token not in value for _, value in response.headers.get_all())
    for parts in (("cortex", "api", "v1", "jobs", "nope"), ("cortex", "api", "v1", "whoami")):
        with pytest.raises(HTTPClientError) as caught:
            await jp_fetch(*parts)
        assert backend.token not in caught.value.response.body.decode()


async def test_missing_token_file_is_a_clear_error(jp_fetch, token_file):
    token_file.unlink()
    code, error = await fetch_error(jp_fetch, "cortex", "api", "v1", "jobs")
    assert (code, error["error"]["code"]) == (501, "proxy_not_configured")
    assert str(token_file) in error["error"]["message"]
    status = body(await jp_fetch("cortex", "api", "status"))
    assert status["reachable"] is True and status["authenticated"] is False
    assert status["error"]["code"] == "proxy_not_configured"


# XSRF for browser (cookie) sessions ------------------------------------------------------------------
async def login_cookies(http_server_client, jp_base_url, jupyter_token) -> dict[str, str]:
    """Log in through Jupyter's login form, as a browser does; return its cookies."""
    cookies: dict[str, str] = {}

    def keep(response):
        for header in response.headers.get_list("Set-Cookie"):
            parsed = SimpleCookie(header)
            cookies.update({key: morsel.value for key, morsel in parsed.items()})

    keep(await http_server_client.fetch(jp_base_url + "login", raise_error=False, follow_redirects=False))
    assert "_xsrf" in cookies
    response = await http_server_client.fetch(
        jp_base_url + "login",
        method="POST",
        follow_redirects=False,
        raise_error=False,
        body=urlencode({"password": jupyter_token, "_xsrf": cookies["_xsrf"]}),
        headers={"Cookie": "; ".join(f"{k}={v}" for k, v in cookies.items())},
    )
    assert response.code == 302, response.body
    keep(response)
    return cookies


async def test_cookie_sessions_need_xsrf_for_mutations(
    http_server_client, jp_base_url, jp_serverapp, backend
):
    cookies = await login_cookies(http_server_client, jp_base_url, jp_serverapp.identity_provider.token)
    cookie_header = {"Cookie": "; ".join(f"{k}={v}" for k, v in cookies.items())}
    listed = await http_server_client.fetch(jp_base_url + "cortex/api/v1/jobs", headers=cookie_header)
    assert "jobs" in json.loads(listed.body)

    job_id = direct(backend, "POST", "/v1/jobs", json=TINY_JOB).json()["job_id"]
    try:
        url = f"{jp_base_url}cortex/api/v1/jobs/{job_id}/cancel"
        refused = await http_server_client.fetch(
            url, method="POST", body=b"{}", headers=cookie_header, raise_error=False
        )
        assert refused.code == 403
        assert direct(backend, "GET", f"/v1/jobs/{job_id}").json()["status"] != "cancelled"
        accepted = await http_server_client.fetch(
            url, method="POST", body=b"{}", headers={**cookie_header, "X-XSRFToken": cookies["_xsrf"]}
        )
        assert json.loads(accepted.body)["status"] == "cancelled"
    finally:
        direct(backend, "POST", f"/v1/jobs/{job_id}/cancel")
