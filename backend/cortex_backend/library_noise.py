"""Start-up noise of the libraries a worker imports, kept out of a job's logs (the first lines a user reads).

torchao (which peft imports when it is installed) logs a line per optional GPU kernel library it cannot
load, and registers enums that make torch's pytree warn; transformers warns about a name peft still calls.
None of these says anything about the user's job. Real warnings (a model's, a sampler's) still pass.
"""

from __future__ import annotations

import logging
import warnings

QUIET_LOGGERS = ("torchao", "torch.utils._pytree")
QUIET_WARNINGS = (r"`is_gradient_checkpointing` is deprecated",)


def quiet_library_noise() -> None:
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    for message in QUIET_WARNINGS:
        warnings.filterwarnings("ignore", message=message)
