"""Sessions through the published SDK: `search_sessions` finds this key's sessions by name, metadata, id and
status and project, newest first and a page at a time, never another owner's; `assign_session_project` moves a
session into a project;
`export_session_trace` gives a signed URL to the session's requests as a Chrome trace."""

from __future__ import annotations

import time

import pytest

from .tinker_fixtures import NEEDS_SDK, TINKER_MODEL
from .tokens import create_token

pytestmark = NEEDS_SDK


def test_search_finds_this_keys_sessions_by_name_metadata_id_and_status(backend):
    import tinker
    from tinker import types

    # An owner of its own: the session-wide test key also holds other modules' sessions (and their SDK
    # clients may still be making new ones), which a search by a word of their names would find too.
    tinker_key = create_token(backend.data_dir, "search-mine", "jobs:read", "jobs:write", tinker=True)

    def service(key: str, name: str, **metadata: str):
        return tinker.ServiceClient(metadata or None, base_url=backend.url, api_key=key, display_name=name)

    red = service(tinker_key, "search red run", colour="red")
    blue = service(tinker_key, "search blue run", colour="blue")
    done = service(tinker_key, "search finished run", colour="red")
    red_id, blue_id, done_id = (client.holder.get_session_id() for client in (red, blue, done))
    training = done.create_lora_training_client(base_model=TINKER_MODEL, rank=4).result()
    training.save_state("counted").result()
    done.close("success").result()
    other_key = create_token(backend.data_dir, "search-other", "jobs:read", "jobs:write", tinker=True)
    theirs = service(other_key, "search red run of another owner", colour="red")
    rest = tinker.RestClient(base_url=backend.url, api_key=tinker_key)

    def ids(**query) -> list[str]:
        page = rest.search_sessions(types.SessionSearchRequest(**query)).result()
        return [summary.session_id for summary in page.sessions]

    assert ids(display_name="SEARCH run") == [
        done_id,
        blue_id,
        red_id,
    ]  # newest first, case-insensitive words
    # an ended session keeps no metadata (docs/tinker.md, Limits): only the live red one matches, once the
    # close has been applied (it may still be on its way when the SDK's close returns)
    deadline = time.monotonic() + 30
    while (found := ids(display_name="search", user_metadata={"colour": "red"})) != [red_id]:
        assert time.monotonic() < deadline, (found, red_id, done_id)
        time.sleep(0.2)
    assert ids(session_id=blue_id) == [blue_id]
    active = ids(display_name="search", statuses=[types.ActiveSessionStatusQuery()])
    assert active == [blue_id, red_id]
    finished = rest.search_sessions(
        types.SessionSearchRequest(
            display_name="search", statuses=[types.ClientFinishedSessionStatusQuery(reasons=["success"])]
        )
    ).result()
    [summary] = finished.sessions
    assert summary.session_id == done_id and summary.status.reason.type == "success"
    assert summary.checkpoints_count == 1 and summary.checkpoint_storage_bytes > 0
    assert theirs.holder.get_session_id() not in ids(
        display_name="search", owner=types.AccessibleSearchOwner()
    )

    first = rest.search_sessions(types.SessionSearchRequest(display_name="search", limit=2)).result()
    assert [s.session_id for s in first.sessions] == [done_id, blue_id] and first.next_cursor is not None
    rest_page = types.SessionSearchRequest(display_name="search", limit=2, cursor=first.next_cursor)
    assert ids(**rest_page.model_dump(exclude_none=True)) == [red_id]
    assert ids(display_name="search", project_ids=["elsewhere"]) == []
    assert ids(display_name="search", project_ids=["default"]) == [done_id, blue_id, red_id]
    for client in (red, blue, theirs):
        client.close("success").result()


def test_a_session_moves_into_a_project_and_search_keeps_that_projects_sessions(backend, tinker_key):
    import tinker
    from tinker import types

    placed = tinker.ServiceClient(
        base_url=backend.url, api_key=tinker_key, display_name="projects placed", project_id="team-a"
    )
    moved = tinker.ServiceClient(base_url=backend.url, api_key=tinker_key, display_name="projects moved")
    placed_id, moved_id = placed.holder.get_session_id(), moved.holder.get_session_id()
    rest = tinker.RestClient(base_url=backend.url, api_key=tinker_key)

    def in_project(project: str) -> list[tuple[str, str]]:
        query = types.SessionSearchRequest(display_name="projects", project_ids=[project])
        return [(s.session_id, s.project_id) for s in rest.search_sessions(query).result().sessions]

    assert in_project("team-a") == [(placed_id, "team-a")]
    assert in_project("default") == [(moved_id, "default")]
    rest.assign_session_project(moved_id, "team-a").result()
    assert in_project("team-a") == [(moved_id, "team-a"), (placed_id, "team-a")]
    assert in_project("default") == []
    with pytest.raises(tinker.BadRequestError, match="project_id"):
        rest.assign_session_project(moved_id, "no spaces allowed").result()
    other_key = create_token(backend.data_dir, "projects-other", "jobs:read", "jobs:write", tinker=True)
    theirs = tinker.RestClient(base_url=backend.url, api_key=other_key)
    with pytest.raises(tinker.NotFoundError):
        theirs.assign_session_project(moved_id, "team-b").result()
    assert in_project("team-a")[0] == (moved_id, "team-a")
    for client in (placed, moved):
        client.close("success").result()


def test_a_session_trace_shows_each_request_queued_then_running_in_order(backend, tinker_key, service_client):
    import json
    import urllib.error
    import urllib.request

    import tinker
    from tinker import types

    training = service_client.create_lora_training_client(base_model=TINKER_MODEL, rank=4).result()
    datum = types.Datum(
        model_input=types.ModelInput.from_ints([1, 2, 3, 4]),
        loss_fn_inputs={"target_tokens": [2, 3, 4, 5], "weights": [1.0, 1.0, 1.0, 1.0]},
    )
    training.forward_backward([datum], "cross_entropy").result()
    training.optim_step(types.AdamParams(learning_rate=1e-3)).result()
    training.save_state("traced").result()
    session_id = service_client.holder.get_session_id()
    rest = tinker.RestClient(base_url=backend.url, api_key=tinker_key)
    url = rest.export_session_trace(session_id).result()
    with urllib.request.urlopen(url, timeout=60) as answer:  # no key: the URL is signed
        trace = json.load(answer)
    running = [event for event in trace["traceEvents"] if event["ph"] == "X" and "(" not in event["name"]]
    assert [event["name"] for event in running] == ["forward_backward", "step", "save"]
    assert all(event["dur"] >= 0 for event in running)
    assert running[0]["ts"] + running[0]["dur"] <= running[1]["ts"] <= running[2]["ts"]
    names = {event["args"]["name"] for event in trace["traceEvents"] if event["name"] == "process_name"}
    assert names == {training.model_id}

    with pytest.raises(urllib.error.HTTPError) as forged:
        urllib.request.urlopen(url.replace(session_id, "tk-" + "0" * 16), timeout=60)
    assert forged.value.code == 403
    other_key = create_token(backend.data_dir, "trace-other", "jobs:read", "jobs:write", tinker=True)
    with pytest.raises(tinker.NotFoundError):
        tinker.RestClient(base_url=backend.url, api_key=other_key).export_session_trace(session_id).result()
