"""Labels the tool keeps for itself (the first cell's display id) are not a job's tags in `%cortex jobs`."""

from __future__ import annotations

from cortex_nb.protocol.states import CELL_DISPLAY_LABEL, user_labels
from cortex_nb.views import jobs_frame


def test_jobs_frame_shows_tags_without_the_internal_labels():
    job = {
        "job_id": "job-1",
        "name": "lamps",
        "status": "done",
        "created_at": 0.0,
        "labels": {"dataset": "lamps", CELL_DISPLAY_LABEL: "960e612f71c5cce3"},
        "sub_jobs": [],
    }
    assert user_labels(job["labels"]) == {"dataset": "lamps"}
    frame = jobs_frame([job], now=10.0)
    assert frame.loc[0, "labels"] == "dataset=lamps"
