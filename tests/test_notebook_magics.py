"""A notebook using the magics and the widget, executed by nbclient in a real ipykernel."""

from __future__ import annotations

import base64
import json
import re
import xml.etree.ElementTree as ElementTree

import nbformat
from nbclient import NotebookClient

from cortex_nb import Client
from cortex_nb.protocol.states import CELL_DISPLAY_LABEL, format_loss

from .notebook_fixtures import DEMO_TEXT

TRAIN_CELL = f"""%%cortex train --wait -o job --name notebook-run
base_model: tiny
data: {DEMO_TEXT}
steps: 15
batch_size: 4
max_seq_len: 64
optimizer: {{lr: 0.003}}
lora: {{r: 16, alpha: 32}}
keep_alive: 5m
"""

CELLS = [
    "%load_ext cortex_nb",
    "%cortex connect",
    TRAIN_CELL,
    "%%cortex sample --job {job.job_id} --temperature 0 --max-tokens 10\nThe lighthouse keeper\n",
    "%cortex jobs --status running",
    (
        "points = list(job.history['loss_per_token'])\n"
        "assert job.progress['phase'] == 'keep_alive' and len(points) == 15 and points[-1] < points[0], points\n"
        "print('loss fell', round(points[0], 3), '->', round(points[-1], 3))"
    ),
    "job.cancel()['status']",
]


# A run that ends inside its cell (no keep-alive, --wait): its widget becomes the static picture there.
PICTURE_CELLS = [
    TRAIN_CELL.replace("-o job --name notebook-run", "-o short_job --name saved-picture")
    .replace("steps: 15", "steps: 6")
    .replace("keep_alive: 5m\n", ""),
    "import json\nprint(json.dumps({'history': list(short_job.history['loss_per_token']),"
    " 'final': short_job.progress['loss_per_token']}))",
]


def execute(
    tmp_path, monkeypatch, backend, noninteractive: bool, cells: list[str] = CELLS
) -> nbformat.NotebookNode:
    monkeypatch.setenv("CORTEX_URL", backend.url)
    monkeypatch.setenv("CORTEX_TOKEN", backend.token)
    if noninteractive:
        monkeypatch.setenv("CORTEX_NONINTERACTIVE", "1")
    else:
        monkeypatch.delenv("CORTEX_NONINTERACTIVE", raising=False)
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(source) for source in cells]
    client = NotebookClient(
        notebook,
        timeout=300,
        kernel_name="python3",
        store_widget_state=True,
        resources={"metadata": {"path": str(tmp_path)}},
    )
    client.execute()  # raises CellExecutionError on any error in any cell
    nbformat.write(notebook, tmp_path / "executed.ipynb")
    return notebook


def texts(cell) -> str:
    parts = []
    for output in cell.outputs:
        if output.output_type == "stream":
            parts.append(output.text)
        elif "data" in output and "text/plain" in output.data:
            parts.append(output.data["text/plain"])
    return "\n".join(parts)


def test_notebook_with_widgets_runs_in_a_real_kernel(tmp_path, monkeypatch, backend):
    notebook = execute(tmp_path, monkeypatch, backend, noninteractive=False, cells=CELLS + PICTURE_CELLS)
    connect, train, sample, jobs, check, cancel = notebook.cells[1:7]
    assert texts(connect).startswith(f"connected to {backend.url}")
    summary = [line for line in texts(train).splitlines() if "(tiny) sampling: 15/15 steps" in line]
    assert len(summary) == 1 and "loss per token " in summary[0]
    job_id = summary[0].split()[0]
    widget_outputs = [
        o for o in train.outputs if "application/vnd.jupyter.widget-view+json" in o.get("data", {})
    ]
    assert len(widget_outputs) == 1
    # Next to the widget view, the picture a notebook shows without the widget's kernel followed the run:
    # it reads where the run got to (all 15 steps, now sampling in keep-alive), not how it started.
    picture = widget_outputs[0]["data"]["text/html"]
    assert "step 15/15" in picture and ">sampling</span>" in picture and "starting" not in picture
    assert f"%cortex job {job_id}</code> shows the run live" in picture
    # The widget recorded its display with the job: a widget that reattaches after a restart rewrites it.
    with Client(backend.url, backend.token) as client:
        recorded = client.get_job(job_id)["labels"][CELL_DISPLAY_LABEL]
    assert re.fullmatch(r"[0-9a-f]{32}", recorded)  # IPython's display id (saved files drop it)
    # The trait updates made on background threads reached the frontend: the saved widget state
    # holds the finished progress bar and the falling loss chart.
    state = notebook.metadata.widgets["application/vnd.jupyter.widget-state+json"]["state"]
    bars = [m["state"] for m in state.values() if m["model_name"] == "IntProgressModel"]
    assert any(bar["value"] == 15 and bar["max"] == 15 for bar in bars)
    html = [m["state"].get("value", "") for m in state.values() if m["model_name"] == "HTMLModel"]
    assert any("<polyline" in value and "loss per token" in value for value in html)
    assert any(f'data-cortex-open-job="{job_id}"' in value for value in html)
    assert "The lighthouse keeper" in texts(sample) and "finish_reason" in texts(sample)
    assert job_id in texts(jobs)
    assert texts(check).startswith("loss fell")
    assert texts(cancel) == "'cancelled'"
    assert_saved_notebook_shows_the_final_widget_without_a_kernel(tmp_path / "executed.ipynb")


def assert_saved_notebook_shows_the_final_widget_without_a_kernel(path) -> None:
    """The run that ended in its cell: what the saved file holds there is the final picture, as HTML a
    viewer renders with no kernel and no widget state: no widget view left to say "model not found"."""
    saved = nbformat.read(path, as_version=4)
    picture_cell, numbers_cell = saved.cells[-2:]
    numbers = json.loads(texts(numbers_cell))
    [output] = [o for o in picture_cell.outputs if o.output_type == "display_data"]
    assert "application/vnd.jupyter.widget-view+json" not in output.data
    html = output.data["text/html"]
    job_id = re.search(r'data-cortex-job="([^"]+)"', html).group(1)
    assert (
        output.data["text/plain"]
        == f"<cortex job {job_id} done step 6/6 loss per token {format_loss(numbers['final'])}>"
    )
    assert "<b>saved-picture</b>" in html and ">done</span>" in html and "step 6/6" in html
    assert f"loss per token {format_loss(numbers['final'])}" in html and "CPU host: no GPU metrics" in html
    # The loss chart, as an image: one point per step, and its heights follow the losses.
    [(svg, alt)] = [
        (base64.b64decode(data).decode(), alt)
        for data, alt in re.findall(
            r'<img src="data:image/svg\+xml;base64,([^"]+)" alt="(loss per token[^"]*)"', html
        )
    ]
    assert alt.endswith(f"{format_loss(numbers['final'])} at step 6")
    points = ElementTree.fromstring(svg).find("{http://www.w3.org/2000/svg}polyline").get("points").split()
    heights = [float(point.split(",")[1]) for point in points]
    losses = numbers["history"]
    assert len(heights) == len(losses) == 6
    assert sorted(range(6), key=lambda i: heights[i]) == sorted(range(6), key=lambda i: -losses[i])


def test_notebook_in_noninteractive_mode_prints_progress_and_summary(tmp_path, monkeypatch, backend):
    notebook = execute(tmp_path, monkeypatch, backend, noninteractive=True)
    train = notebook.cells[2]
    text = texts(train)
    lines = text.strip().splitlines()
    job_id = lines[0].split(":")[0]
    assert lines[0].startswith(f"{job_id}: training tiny on the backend: 15 steps")
    assert any(line.startswith(f"{job_id} step 15/15  loss per token ") for line in lines)
    assert lines[-1].startswith(f"{job_id} (tiny) sampling: 15/15 steps")
    assert not any("application/vnd.jupyter.widget-view+json" in o.get("data", {}) for o in train.outputs)
    assert texts(notebook.cells[-1]) == "'cancelled'"


THREAD_CELLS = [
    (
        "import time\n"
        "from cortex_nb.kernel_threads import capture_parent, start_thread\n"
        "start_thread(lambda: (time.sleep(1.0), print('adopted thread output')), 'adopted', capture_parent())"
    ),
    "time.sleep(2.5)",
    "start_thread(lambda: (time.sleep(1.0), print('orphan thread output')), 'orphan', None)",
    "time.sleep(2.5)",
]


def test_background_threads_keep_output_out_of_later_cells(tmp_path):
    """ipykernel >= 7 sends a thread's output to the latest cell unless the thread adopts a parent;
    ours adopt the one captured at display (the orphan is the control that shows the difference)."""
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(source) for source in THREAD_CELLS]
    NotebookClient(
        notebook, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    later_with_adopted, later_with_orphan = texts(notebook.cells[1]), texts(notebook.cells[3])
    assert "adopted thread output" not in later_with_adopted
    assert "orphan thread output" in later_with_orphan
