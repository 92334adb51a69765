"""A streamed generate as the user holds it: iterate for tokens as the backend decodes them.

Each item is one sample's news: {prompt_index, sample_index, tokens, logprobs, text} (the tokens drawn
since the last item of that sample, their logprobs under the model's own distribution, and the text
they add). Once iteration ends, `result` is the call's `GenerateResult`, the same as `generate` gives.
Stopping early (`break`, `close()`, Ctrl-C) closes the connection, and the backend cancels the request.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from . import errors
from .polling import finished_result

if TYPE_CHECKING:
    from .api import Api


class TokenStream:
    def __init__(
        self,
        api: Api,
        job_id: str,
        prompts: Sequence[Any],
        sampling: dict[str, Any],
        *,
        adapter: str | dict[str, str] | None = None,
        sub_job: str | None = None,
        result_type: Callable[[dict[str, Any], list[Any]], Any] = lambda request, prompts: request,
        after_end: Callable[[errors.CortexError], Generator[dict[str, Any], None, Any]] | None = None,
    ) -> None:
        """`result_type` wraps the finished request as `generate` returns it (`training.GenerateResult`),
        given by the caller so this module stays below `training`. `after_end`, when the job refuses
        because it has ended, streams from elsewhere instead (its checkpoint, sampled on demand): a
        generator of the same items that returns the result."""
        self.api, self.job_id, self.prompts = api, job_id, list(prompts)
        self.result_type = result_type
        self.after_end = after_end
        self.sampling, self.adapter, self.sub_job = sampling, adapter, sub_job
        self.request_id: str | None = None
        self.result: Any = None
        self._items: Iterator[dict[str, Any]] | None = None

    def __iter__(self) -> Iterator[dict[str, Any]]:
        if self._items is None:
            self._items = self._read()
        return self._items

    def __repr__(self) -> str:
        state = "done" if self.result is not None else "streaming" if self.request_id else "not started"
        return f"<TokenStream {self.job_id} {self.request_id or ''} {state}>"

    def close(self) -> None:
        """Stop reading: the connection closes and the backend cancels the request."""
        if self._items is not None:
            self._items.close()  # type: ignore[attr-defined]

    def text(self) -> str:
        """Read the whole stream and return the first sample's text (a convenience for one prompt)."""
        for _ in self:
            pass
        return self.result.texts[0] if self.result is not None else ""

    def _read(self) -> Iterator[dict[str, Any]]:
        try:
            yield from self._read_job()
        except errors.CortexError as exc:
            # Refused before any event: the job has ended and its device is free.
            if exc.code != "job_finished" or self.after_end is None or self.request_id is not None:
                raise
            self.result = yield from self.after_end(exc)

    def _read_job(self) -> Iterator[dict[str, Any]]:
        with self.api.generate_stream(
            self.job_id, self.prompts, self.sampling, adapter=self.adapter, sub_job=self.sub_job
        ) as events:
            for name, data in events:
                if name == "submitted":
                    self.request_id = data["request_id"]
                elif name == "tokens":
                    yield from data["samples"]
                elif name == "result":
                    self.result = self.result_type(finished_result(self.api, self.job_id, data), self.prompts)
                    return
        raise errors.ConnectionError(
            f"the stream of generate request {self.request_id} ended before its result; poll it with"
            " `client.poll_request(job_id, request_id)`",
            code="backend_unavailable",
        )
