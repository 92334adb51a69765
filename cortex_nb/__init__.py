"""cortex-nb: fine-tune and sample language models on GPUs from a Jupyter notebook.

    import cortex_nb
    client = cortex_nb.Client.local()           # or Client(url, token), Client.from_profile()
    job = client.create_training_job("tiny")
    job.forward_backward(batch).result(); job.step().result()

In IPython: `%load_ext cortex_nb`, then `%cortex?`. Importing this package never imports torch.
"""

from .client import Client, PollPolicy
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
    RequestFailed,
    RunFailed,
    SubmissionOutcomeUnknown,
    TimeoutError,
    VersionMismatchError,
)
from .futures import APIFuture
from .runs import RunHandle
from .training import GenerateResult, Sampler, TrainingJob
from .transport import RetryPolicy
from .version import API_VERSION, __version__


def load_ipython_extension(ipython) -> None:
    """`%load_ext cortex_nb`: register `%cortex` / `%%cortex` (IPython and widgets load only now)."""
    from .magics import load_ipython_extension as load

    load(ipython)


def unload_ipython_extension(ipython) -> None:
    from .magics import unload_ipython_extension as unload

    unload(ipython)


__all__ = [
    "API_VERSION",
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
    "RequestFailed",
    "RetryPolicy",
    "RunFailed",
    "RunHandle",
    "Sampler",
    "SubmissionOutcomeUnknown",
    "TimeoutError",
    "TrainingJob",
    "VersionMismatchError",
    "__version__",
    "compare",
]
