"""How Tinker's names map onto ours, in both directions and without any table, so a `tinker://` path stays
valid after its session (or the backend) is gone.

- A training run (Tinker's model id) is a job. The SDK derives model ids as `<session>:train:<n>`; a job id
  cannot hold ':', so that job is `<session>.train.<n>`. Any other job's id is its own training-run id, so
  checkpoints made with our own API are reachable from the Tinker SDK too.
- `tinker://<run>/weights/<name>` is checkpoint `<name>` of that job (what `save_state` writes, resumable);
  `tinker://<run>/sampler_weights/<name>` is checkpoint `sampler.<name>` (weights only), and
  `tinker://<run>/external_weights/<name>` is checkpoint `external.<name>` (`save_weights_external`: weights only,
  downloaded as files by signed URLs).
"""

from __future__ import annotations

import re
import secrets

from cortex_nb.protocol.errors import ApiError

SCHEME = "tinker://"
SAMPLER_PREFIX = "sampler."
EXTERNAL_PREFIX = "external."
KINDS = {"weights": "training", "sampler_weights": "sampler", "external_weights": "external"}
_PREFIXES = {"sampler_weights": SAMPLER_PREFIX, "external_weights": EXTERNAL_PREFIX}
_SESSION = re.compile(r"tk-[0-9a-f]{16}")
_MODEL_JOB = re.compile(r"(tk-[0-9a-f]{16})\.train\.(\d{1,9})")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,55}")


def new_session_id() -> str:
    return "tk-" + secrets.token_hex(8)


def is_session_id(value: str) -> bool:
    return _SESSION.fullmatch(value) is not None


def model_id(session_id: str, model_seq_id: int) -> str:
    """The id the SDK itself derives for a session's n-th training client."""
    return f"{session_id}:train:{model_seq_id}"


def job_id_for(training_run_id: str) -> str:
    return training_run_id.replace(":", ".")


def training_run_id_for(job_id: str) -> str:
    return job_id.replace(".", ":") if _MODEL_JOB.fullmatch(job_id) else job_id


def sampling_session_id(session_id: str, seq: int) -> str:
    return f"{session_id}:sample:{seq}"


def checkpoint_name(name: object, field: str = "path") -> str:
    """A user's checkpoint name: it becomes a checkpoint id, so it must be one (and not look like a sampler's)."""
    if (
        not isinstance(name, str)
        or not _NAME.fullmatch(name)
        or name.startswith((SAMPLER_PREFIX, EXTERNAL_PREFIX))
    ):
        raise ApiError(
            "invalid_checkpoint_id",
            f"{field}: checkpoint name {str(name)[:80]!r} is not allowed; use 1-56 letters, digits, '_', '.' or '-',"
            f" starting with a letter or digit (and not '{SAMPLER_PREFIX}' or '{EXTERNAL_PREFIX}')",
            {"field": field},
        )
    return name


def checkpoint_id(kind: str, name: str) -> str:
    return _PREFIXES.get(kind, "") + name


def _kind_and_name(checkpoint: str) -> tuple[str, str]:
    for kind, prefix in _PREFIXES.items():
        if checkpoint.startswith(prefix):
            return kind, checkpoint[len(prefix) :]
    return "weights", checkpoint


def tinker_path(job_id: str, checkpoint: str) -> str:
    kind, name = _kind_and_name(checkpoint)
    return f"{SCHEME}{training_run_id_for(job_id)}/{kind}/{name}"


def parse_path(path: object) -> tuple[str, str, str]:
    """`tinker://<run>/<weights|sampler_weights>/<name>` -> (job id, checkpoint id, kind)."""
    if not isinstance(path, str) or not path.startswith(SCHEME):
        raise ApiError(
            "invalid_field", f"path: {str(path)[:120]!r} is not a tinker:// path", {"field": "path"}
        )
    parts = path[len(SCHEME) :].split("/")
    if len(parts) != 3 or parts[1] not in KINDS or not parts[0] or not parts[2]:
        raise ApiError(
            "invalid_field",
            f"path: {path[:120]!r} is not tinker://<training run>/weights/<name> (or sampler_weights,"
            " external_weights)",
            {"field": "path"},
        )
    return job_id_for(parts[0]), checkpoint_id(parts[1], parts[2]), parts[1]


def checkpoint_kind(checkpoint: str) -> str:
    """Tinker's checkpoint_type for one of our checkpoint ids."""
    return KINDS[_kind_and_name(checkpoint)[0]]


def tinker_checkpoint_id(checkpoint: str) -> str:
    """Tinker's checkpoint_id: `weights/<name>` or `sampler_weights/<name>`."""
    return tinker_path("x", checkpoint).split("/", 3)[3]
