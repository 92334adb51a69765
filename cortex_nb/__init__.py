"""cortex-nb: fine-tune and sample language models on GPUs from a Jupyter notebook.

    import cortex_nb
    client = cortex_nb.Client.local()           # or Client(url, token), Client.from_profile()
    job = client.create_training_job("tiny")
    job.forward_backward(batch).result(); job.step().result()

In IPython: `%load_ext cortex_nb`, then `%cortex?`. Importing this package never imports torch.

The names below load on first use (PEP 562): the backend, its workers and the Jupyter proxy import
only `cortex_nb.protocol`, and never pay for the SDK, httpx or pandas.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .protocol.versions import API_VERSION, __version__

# public name -> the module that defines it
_EXPORTS = {
    "Client": ".client",
    "PollPolicy": ".poll_policy",
    "Comparison": ".comparison",
    "compare": ".comparison",
    "APIFuture": ".futures",
    "RunHandle": ".runs",
    "GenerateResult": ".training",
    "Sampler": ".training",
    "TrainingJob": ".training",
    "RetryPolicy": ".transport",
    **{
        name: ".errors"
        for name in (
            "AuthError",
            "BackendError",
            "BadRequestError",
            "ConflictError",
            "ConnectionError",
            "CortexError",
            "NotFoundError",
            "OutputVerificationError",
            "PermissionError",
            "RateLimitError",
            "ReplyMismatchError",
            "RequestFailed",
            "RunFailed",
            "SubmissionOutcomeUnknown",
            "TimeoutError",
            "VersionMismatchError",
        )
    },
}

if TYPE_CHECKING:
    from .client import Client
    from .comparison import Comparison, compare
    from .errors import (
        AuthError,
        BackendError,
        BadRequestError,
        ConflictError,
        ConnectionError,
        CortexError,
        NotFoundError,
        OutputVerificationError,
        PermissionError,
        RateLimitError,
        ReplyMismatchError,
        RequestFailed,
        RunFailed,
        SubmissionOutcomeUnknown,
        TimeoutError,
        VersionMismatchError,
    )
    from .futures import APIFuture
    from .poll_policy import PollPolicy
    from .runs import RunHandle
    from .training import GenerateResult, Sampler, TrainingJob
    from .transport import RetryPolicy


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'cortex_nb' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


def load_ipython_extension(ipython) -> None:
    """`%load_ext cortex_nb`: register `%cortex` / `%%cortex` (IPython and widgets load only now)."""
    from .magics import load_ipython_extension as load

    load(ipython)


def unload_ipython_extension(ipython) -> None:
    from .magics import unload_ipython_extension as unload

    unload(ipython)


# Spelled out, so linters and type checkers see the lazy names (a test keeps it equal to _EXPORTS).
__all__ = [
    "API_VERSION",
    "__version__",
    "APIFuture",
    "AuthError",
    "BackendError",
    "BadRequestError",
    "Client",
    "Comparison",
    "ConflictError",
    "ConnectionError",
    "CortexError",
    "GenerateResult",
    "NotFoundError",
    "OutputVerificationError",
    "PermissionError",
    "PollPolicy",
    "RateLimitError",
    "ReplyMismatchError",
    "RequestFailed",
    "RetryPolicy",
    "RunFailed",
    "RunHandle",
    "Sampler",
    "SubmissionOutcomeUnknown",
    "TimeoutError",
    "TrainingJob",
    "VersionMismatchError",
    "compare",
]
