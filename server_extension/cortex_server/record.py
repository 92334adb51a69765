"""A job's cell record drawn on the server: the same static picture a kernel's widget writes next to
its view (`cortex_nb.widgets.job_view`), for the panel to bring a cell's record up to date where no
kernel can. After a kernel restart JupyterLab forgets which output a display id names, so the widget
that reattached a run in a new kernel cannot rewrite the first cell; the panel asks here instead.
"""

from __future__ import annotations

from typing import Any

from cortex_nb.client import Client
from cortex_nb.job_feed import JobFeed
from cortex_nb.job_state import JobState
from cortex_nb.protocol.errors import ApiError, CortexError
from cortex_nb.widgets.job_view import ViewOptions, continued_html, job_repr, static_html

# A record is one job read, its log tail and its metrics: the calls a widget's last round makes.
RECORD_TIMEOUT_S = 30.0


def draw_record(url: str, token: str, verify: Any, job_id: str, continued_in: int | None) -> dict[str, Any]:
    """The picture of `job_id` now (its final one once it ended), with "continued in cell N" first when
    the run was reattached in cell `continued_in`. Blocking: the handler runs it in a thread."""
    client = Client(url, token, check_version=False, verify=verify, timeout_s=RECORD_TIMEOUT_S)
    try:
        state = JobState(job_id)
        JobFeed(client, state).poll_once()
    except CortexError as exc:
        code = exc.code if (exc.status or 500) < 500 else "backend_unavailable"
        raise ApiError(code, exc.message) from None
    finally:
        client.close()
    snap = state.snapshot()
    options = ViewOptions()
    html = continued_html(snap, options, continued_in) if continued_in else static_html(snap, options)
    text = job_repr(snap) + (f" (continued in cell {continued_in})" if continued_in else "")
    return {"job_id": job_id, "status": snap.status, "finished": snap.finished, "html": html, "text": text}
