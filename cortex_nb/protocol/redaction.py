"""Credential redaction: one definition used by client telemetry and by the backend wherever it shows
text to someone other than its owner (log lines, telemetry it keeps).

It removes what looks like a credential (our `ctx_` and `tml-` tokens, `Bearer ...` values, passwords in URLs,
`token=...`-style assignments and a few well-known key formats) and bounds the length. It is a
safety net, not a guarantee: the primary rule is that credentials are never put into messages.
"""

from __future__ import annotations

import re

REDACTED = "[REDACTED]"

_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    # Authorization header values, whatever the token looks like.
    (re.compile(r"\b(Bearer)\s+[A-Za-z0-9._~+/=\-]{6,}", re.IGNORECASE), r"\1 " + REDACTED),
    # user:password@ in URLs (any scheme).
    (re.compile(r"([a-z][a-z0-9+.\-]*://[^\s:/@]+:)[^\s@/]+@", re.IGNORECASE), r"\1" + REDACTED + "@"),
    # cortex-nb API tokens (auth.TOKEN_PREFIX, and TINKER_TOKEN_PREFIX for the Tinker SDK's keys) and common
    # third-party key formats.
    (re.compile(r"\bctx_[A-Za-z0-9_\-]{6,}"), "ctx_" + REDACTED),
    (re.compile(r"\btml-[A-Za-z0-9_\-]{6,}"), "tml-" + REDACTED),
    (re.compile(r"\bhf_[A-Za-z0-9]{10,}"), "hf_" + REDACTED),
    (re.compile(r"\b(sk|pk|rk)-[A-Za-z0-9_\-]{16,}"), r"\1-" + REDACTED),
    (re.compile(r"\bgh[pousr]_[A-Za-z0-9]{16,}"), REDACTED),
    (re.compile(r"\bAKIA[0-9A-Z]{16}\b"), REDACTED),
    # key=value / key: value where the key names a credential (query strings, env dumps, JSON).
    (
        re.compile(
            r"""(["']?\b[\w\-]*(?:password|passwd|secret|token|api[_\-]?key|access[_\-]?key|private[_\-]?key)["']?\s*[=:]\s*["']?)"""
            r"""[^\s"'&,;]{3,}""",
            re.IGNORECASE,
        ),
        r"\1" + REDACTED,
    ),
)

DEFAULT_MAX_CHARS = 500


def redact(text: str) -> str:
    """`text` with credential-looking substrings replaced by [REDACTED]."""
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return text


def bounded(text: str | None, max_chars: int = DEFAULT_MAX_CHARS) -> str | None:
    """Redact, then cut to `max_chars` (redacting first, so a cut never leaves half a secret)."""
    if text is None:
        return None
    text = redact(str(text))
    if len(text) > max_chars:
        text = text[: max_chars - 1] + "…"
    return text
