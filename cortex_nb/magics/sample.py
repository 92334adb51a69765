"""`%%cortex sample`: prompts from the cell, samples from a job or a base model, a DataFrame back."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError
from IPython.core.magic_arguments import argument, magic_arguments

from ..protocol.states import SHORT_LIVED
from .registry import subcommand

if TYPE_CHECKING:
    from . import CortexMagics


@subcommand("sample", "cell", "sample from a job or a model; one prompt per line (DataFrame)")
@magic_arguments(name="cortex sample")
@argument("--job", metavar="ID", help="sample from this job (its trained weights)")
@argument("--model", metavar="NAME", help="sample from a base model (a short-lived sampling job)")
@argument("--n", type=int, help="samples per prompt (default 1)")
@argument("--temperature", type=float, help="0 is greedy (default 1.0)")
@argument("--max-tokens", type=int, default=64, help="tokens to generate per sample (default 64)")
@argument("--top-p", type=float, help="nucleus sampling threshold (default 1.0)")
@argument("--seed", type=int, help="make sampling reproducible")
@argument("--stream", action="store_true", help="show the text live, token by token, as it is decoded")
@argument(
    "-o", "--output", metavar="VAR", help="store the DataFrame in VAR (otherwise it is the cell's result, _)"
)
def sample_command(self: CortexMagics, args: Any, cell: str | None):
    """Sample completions. The cell holds one prompt per line, or a YAML list of prompts. Returns a
    DataFrame of prompt, sample, logprob and finish_reason. With --stream the cell shows each sample's
    text as it is decoded. Ctrl-C cancels the request."""
    from ..training import Sampler, TrainingJob

    if bool(args.job) == bool(args.model):
        raise UsageError("cortex sample: give exactly one of --job ID or --model NAME")
    prompts = parse_prompts(cell or "")
    sampling = {
        key: value
        for key, value in (
            ("n", args.n),
            ("temperature", args.temperature),
            ("max_tokens", args.max_tokens),
            ("top_p", args.top_p),
            ("seed", args.seed),
        )
        if value is not None
    }
    client = self.client()
    sampler = None
    future = None
    try:
        if args.job:
            handle = TrainingJob(client, client.get_job(args.job))
        else:
            sampler = handle = Sampler.create(
                client, args.model, name="%%cortex sample", labels=SHORT_LIVED["sample"]
            )
        if args.stream:
            result = stream_into_cell(handle, prompts, sampling)
        else:
            future = handle.generate(prompts, **sampling)
            result = future.result()
        frame = result.to_dataframe()
        if result.checkpoint_id:
            print(result.provenance())
    except KeyboardInterrupt:
        if future is not None:
            future.cancel()
        if sampler is not None:
            sampler.cancel()
            sampler = None
        print("interrupted: the generate request was cancelled on the backend")
        return None
    finally:
        if sampler is not None:
            sampler.complete()
    if args.output:
        self.shell.user_ns[args.output] = frame
        return None
    return frame


def parse_prompts(body: str) -> list[str]:
    """One prompt per non-empty line, or a YAML list of strings (for prompts with newlines)."""
    stripped = body.strip()
    if stripped.startswith("- ") or stripped.startswith("["):
        import yaml

        try:
            prompts = yaml.safe_load(stripped)
        except yaml.YAMLError as exc:
            raise UsageError(
                f"cortex sample: the prompt list is not valid YAML: {str(exc).splitlines()[0]}"
            ) from None
        if not isinstance(prompts, list) or not all(isinstance(p, str) for p in prompts):
            raise UsageError("cortex sample: a YAML prompt list must hold strings only")
    else:
        prompts = [line for line in body.splitlines() if line.strip()]
    if not prompts:
        raise UsageError("cortex sample: the cell holds no prompts; write one prompt per line")
    return prompts


def stream_into_cell(handle: Any, prompts: list[str], sampling: dict[str, Any]) -> Any:
    """Generate with a live view: one line per sample, its text growing as tokens arrive (redrawn a few
    times a second). A job that has ended streams from its checkpoint, sampled on demand."""
    from IPython.display import Pretty, display

    from ..live_text import LiveSamples

    stream = handle.generate_stream(prompts, **sampling)
    live = LiveSamples(prompts)
    view = display(Pretty(live.render()), display_id=True)
    try:
        for piece in stream:
            if live.add(piece):
                view.update(Pretty(live.render()))
    finally:
        stream.close()
    view.update(Pretty(live.render(done=True)))
    return stream.result
