"""How a listener proves it is the backend a state file (backend.json) names, before any token goes to it.

Each start of a backend draws a secret nonce and writes it into its state file (0600, in a 0700 dir of
the user). A client sends a fresh random challenge to the unauthenticated `GET /version?challenge=`
and checks the answer's `proof`: an HMAC of the challenge keyed by the nonce. Another user who took
the old port after a crash (or any listener) cannot answer it, since it cannot read the state file, and
a proof seen earlier is no use against a fresh challenge.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

CHALLENGE_PATTERN = r"^[0-9a-f]{32,128}$"
_CONTEXT = b"cortex-nb backend proof\x00"


def new_nonce() -> str:
    """The per-start secret a backend writes into its state file."""
    return secrets.token_hex(32)


def new_challenge() -> str:
    return secrets.token_hex(16)


def proof(nonce: str, challenge: str) -> str:
    """What the backend holding `nonce` answers to `challenge`."""
    return hmac.new(nonce.encode(), _CONTEXT + challenge.encode(), hashlib.sha256).hexdigest()


def proves(nonce: str, challenge: str, answer: object) -> bool:
    return isinstance(answer, str) and hmac.compare_digest(proof(nonce, challenge), answer)
