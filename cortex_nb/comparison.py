"""Comparing runs (`cortex_nb.compare`): which learning rate, rank or data did better, and how do their
answers differ?

    comparison = cortex_nb.compare([job_a, job_b])       # TrainingJobs, or job ids with client=
    comparison.curves      # long table: job_id, name, step, loss_per_token, eval_loss_per_token
    comparison.table       # one row per run: hyperparameters and final metrics
    comparison.samples     # one row per prompt and run: the greedy sample and its logprobs
    comparison.ab          # per prompt and run: tokens, logprobs under every run, differences
    comparison             # in a notebook: overlaid curves and both tables (a widget)

Curves and metrics come from each job's progress record (the backend's numbers). Samples come from one
short-lived job with a sampling sub-job per run, each loaded with that run's last checkpoint (`final`
where there is one): every run answers the same prompts greedily, and each answer is scored under
every run, so the A/B view shows per token how much more (or less) likely one run finds the other's
answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .api import Api, HasApi, api_of
from .protocol.states import SAMPLING, SHORT_LIVED, TRAINING

if TYPE_CHECKING:
    import pandas as pd

MAX_SAMPLED_RUNS = 8  # a job holds at most 8 sub-jobs


@dataclass
class ABSample:
    """One run's greedy answer to one prompt, scored under every compared run."""

    prompt: str
    job_id: str
    text: str
    tokens: list[str]
    # job id -> log p(token) of each sampled token under that run's weights
    logprobs: dict[str, list[float]] = field(default_factory=dict)

    def difference(self, other_job_id: str) -> list[float]:
        """Per token: log p under `other_job_id` minus log p under the run that sampled it (negative:
        the other run finds this answer less likely)."""
        own, other = self.logprobs[self.job_id], self.logprobs[other_job_id]
        return [b - a for a, b in zip(own, other, strict=True)]


@dataclass
class Comparison:
    jobs: list[dict[str, Any]]
    curves: pd.DataFrame
    table: pd.DataFrame
    samples: pd.DataFrame | None = None
    ab: list[ABSample] = field(default_factory=list)
    checkpoints: dict[str, str] = field(default_factory=dict)

    def label(self, job_id: str) -> str:
        """How views name a run: `name (job-id)`, or the id alone for a job without a name."""
        job = next(job for job in self.jobs if job["job_id"] == job_id)
        return f"{job['name']} ({job_id})" if job.get("name") else job_id

    def text(self) -> str:
        """A plain-text rendering (non-interactive runs, reprs)."""
        lines = [self.table.to_string(index=False)]
        if self.samples is not None and len(self.samples):
            lines += ["", self.samples.to_string(index=False)]
        return "\n".join(lines)

    def widget(self):
        from .widgets.compare_widget import ComparisonWidget

        return ComparisonWidget(self)

    def show(self):
        from IPython.display import display

        widget = self.widget()
        display(widget)
        return widget

    def _ipython_display_(self) -> None:
        from .magics.registry import noninteractive

        if noninteractive():
            print(self.text())
        else:
            self.show()

    def __repr__(self) -> str:
        return f"<Comparison of {len(self.jobs)} runs: {', '.join(self.label(job['job_id']) for job in self.jobs)}>"


def compare(
    jobs: Sequence[Any],
    *,
    client: Api | HasApi | None = None,
    prompts: Sequence[str] | None = None,
    max_tokens: int = 32,
    samples: bool = True,
) -> Comparison:
    """Compare runs (`TrainingJob`s, or job ids with `client`). `prompts` default to the runs' own
    `sample:` prompts; with none (or `samples=False`) no sampling job is started."""
    from .views import curves_frame, runs_table

    if len(jobs) < 2:
        raise ValueError("compare needs two or more jobs")
    client = client or next(
        (getattr(job, "client", None) for job in jobs if getattr(job, "client", None)), None
    )
    if client is None:
        raise ValueError("give TrainingJobs, or job ids and client=")
    api = api_of(client)
    infos = [api.get_job(job if isinstance(job, str) else job.job_id) for job in jobs]
    comparison = Comparison(infos, curves_frame(infos), runs_table(infos))
    if samples:
        chosen = list(prompts) if prompts else _sample_prompts(infos)
        if chosen:
            _sample(api, comparison, chosen, max_tokens)
    return comparison


def _sample_prompts(jobs: list[dict[str, Any]]) -> list[str]:
    prompts: list[str] = []
    for job in jobs:
        for prompt in ((job.get("training_loop") or {}).get("sample") or {}).get("prompts") or []:
            if prompt not in prompts:
                prompts.append(prompt)
    return prompts


def _checkpoint_of(api: Api, job: dict[str, Any]) -> str:
    """The checkpoint a run is compared with: `final` where there is one, else its latest."""
    from .on_demand import sampling_checkpoint

    return sampling_checkpoint(api, job)


def _sample(api: Api, comparison: Comparison, prompts: list[str], max_tokens: int) -> None:
    from .training import Sampler
    from .views import ab_frame

    jobs = comparison.jobs
    if len(jobs) > MAX_SAMPLED_RUNS:
        raise ValueError(
            f"compare samples at most {MAX_SAMPLED_RUNS} runs at once; pass samples=False for more"
        )
    models = {sub["base_model"] for job in jobs for sub in job["sub_jobs"] if sub["type"] == TRAINING}
    if len(models) != 1:
        raise ValueError(
            f"the runs fine-tune different base models ({', '.join(sorted(models))}): their samples cannot"
            " be scored against each other; pass samples=False to compare curves and metrics"
        )
    comparison.checkpoints = {job["job_id"]: _checkpoint_of(api, job) for job in jobs}
    subs = []
    for job in jobs:
        trainer = next(sub for sub in job["sub_jobs"] if sub["type"] == TRAINING)
        subs.append(
            {
                "type": SAMPLING,
                "base_model": trainer["base_model"],
                "lora": trainer.get("lora") or {},
                "seed": 0,
            }
        )
    sampler = Sampler(api, api.create_job(subs, name="%cortex compare", labels=SHORT_LIVED["compare"]))
    try:
        sampler.wait_ready()
        targets = sampler.sub_jobs(SAMPLING)
        loads = [
            sampler.load(comparison.checkpoints[job["job_id"]], job["job_id"], target)
            for job, target in zip(jobs, targets, strict=True)
        ]
        for future in loads:
            future.result()
        model = subs[0]["base_model"]
        prompt_tokens = api.tokenize(model, prompts)["tokens"]
        answers = {
            job["job_id"]: sampler.generate(prompts, sub_job=target, max_tokens=max_tokens, temperature=0.0)
            for job, target in zip(jobs, targets, strict=True)
        }
        drawn = [
            (job_id, sample)
            for job_id, future in answers.items()
            for sample in future.result().samples
            if sample["tokens"]
        ]
        sequences = [
            list(prompt_tokens[sample["prompt_index"]]) + list(sample["tokens"]) for _, sample in drawn
        ]
        # Every answer scored under every run: one batched forward per run.
        scored = (
            {
                job["job_id"]: sampler.compute_logprobs(sequences, sub_job=target)
                for job, target in zip(jobs, targets, strict=True)
            }
            if sequences
            else {}
        )
        scores = {job_id: future.result() for job_id, future in scored.items()}
        for index, (job_id, sample) in enumerate(drawn):
            start = len(prompt_tokens[sample["prompt_index"]]) - 1
            comparison.ab.append(
                ABSample(
                    prompt=prompts[sample["prompt_index"]],
                    job_id=job_id,
                    text=sample["text"] or "",
                    tokens=api.detokenize(model, [[token] for token in sample["tokens"]])["texts"],
                    logprobs={
                        other: [float(x) for x in rows[index][start:]] for other, rows in scores.items()
                    },
                )
            )
    finally:
        sampler.complete()
    comparison.samples = ab_frame(comparison)
