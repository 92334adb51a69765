"""`%cortex compare` / `cortex_nb.compare`: two real runs' curves overlaid, their hyperparameters and final
metrics side by side, and the same prompts sampled from each with per-token logprob differences."""

from __future__ import annotations

import xml.etree.ElementTree as ElementTree

import pytest

from .notebook_fixtures import run_cell, train_spec

PROMPTS = ["The lighthouse keeper", "On stormy nights"]
STEPS = 8


def test_compare_two_runs_overlays_curves_and_samples_both_side_by_side(cortex_shell):
    sample = (
        "{every: 100, prompts: ['The lighthouse keeper', 'On stormy nights'], max_tokens: 6}"  # at the end
    )
    for name, lr in (("fast", 0.003), ("slow", 0.0005)):  # both train at once
        ran = run_cell(
            cortex_shell,
            f"%%cortex train -o {name} --name lr-{name}\n"
            + train_spec(STEPS, sample=sample).replace("lr: 0.003", f"lr: {lr}"),
        )
        assert ran.success, ran.stderr
    fast, slow = cortex_shell.user_ns["fast"], cortex_shell.user_ns["slow"]
    fast.wait(timeout_s=300)
    slow.wait(timeout_s=300)
    ran = run_cell(cortex_shell, f"%cortex compare {fast.job_id} {slow.job_id} --max-tokens 8 -o comparison")
    assert ran.success, ran.stderr
    comparison = cortex_shell.user_ns["comparison"]

    # Curves: both runs, every step, the backend's numbers.
    for job in (fast, slow):
        curve = comparison.curves[comparison.curves["job_id"] == job.job_id]
        assert list(curve["step"]) == list(range(1, STEPS + 1))
        assert list(curve["loss_per_token"]) == [
            p["loss_per_token"] for p in job.refresh()["progress"]["history"]
        ]
    # Table: the hyperparameter that differs and the final metrics.
    table = comparison.table.set_index("job_id")
    assert table.loc[fast.job_id, "lr"] == 0.003 and table.loc[slow.job_id, "lr"] == 0.0005
    assert table.loc[fast.job_id, "loss_per_token"] < table.loc[slow.job_id, "loss_per_token"]
    assert set(table["last_checkpoint"]) == {"final"} and comparison.checkpoints == {
        fast.job_id: "final",
        slow.job_id: "final",
    }

    # A/B samples: each prompt answered by each run's final checkpoint, each answer scored under both.
    assert sorted((row.prompt, row.job_id) for row in comparison.samples.itertuples()) == sorted(
        (prompt, job.job_id) for prompt in PROMPTS for job in (fast, slow)
    )
    for answer in comparison.ab:
        assert set(answer.logprobs) == {fast.job_id, slow.job_id} and 0 < len(answer.tokens) <= 8
        other = slow.job_id if answer.job_id == fast.job_id else fast.job_id
        difference = answer.difference(other)
        assert len(difference) == len(answer.tokens) and any(abs(d) > 1e-4 for d in difference)
        assert "".join(answer.tokens) == answer.text
        assert all(value <= 0 for value in answer.logprobs[answer.job_id])  # log-probabilities
    # Each run's greedy sample from its checkpoint is what the run itself sampled at its last step.
    final_samples = {
        job.job_id: {item["prompt"]: item["text"] for item in job.progress["samples"]["items"]}
        for job in (fast, slow)
    }
    for row in comparison.samples.itertuples():
        assert final_samples[row.job_id][row.prompt].startswith(row.sample[:6])

    # The widget: one chart with both runs, the table, and every token shaded by its difference.
    widget = comparison.widget()
    svg = ElementTree.fromstring(widget.curves.value)
    assert len(svg.findall("{http://www.w3.org/2000/svg}polyline")) == 2
    assert "lr-fast" in widget.curves.value and "lr-slow" in widget.curves.value
    assert "0.0005" in widget.table.value and "final" in widget.table.value
    shaded = widget.samples.value.count('class="cortex-ab-token"')
    assert shaded == sum(len(answer.tokens) for answer in comparison.ab)
    first = comparison.ab[0]
    other = slow.job_id if first.job_id == fast.job_id else fast.job_id
    assert f'data-logprob-diff="{first.difference(other)[0]:.4f}"' in widget.samples.value
    assert repr(comparison) == f"<Comparison of 2 runs: lr-fast ({fast.job_id}), lr-slow ({slow.job_id})>"


def test_compare_refuses_fewer_than_two_runs(cortex_shell):
    ran = run_cell(cortex_shell, "%cortex compare job-only-one")
    assert not ran.success and "give two or more job ids" in ran.error_lines[0]
    from cortex_nb import compare

    with pytest.raises(ValueError, match="two or more"):
        compare(["job-a"])
