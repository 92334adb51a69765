"""What a client pins of the backend's TLS certificate: `sha256:<hex>` of its DER bytes, the form the
backend prints at start and writes to its state file, and `verify` takes."""

from __future__ import annotations

import hashlib

PIN_PREFIX = "sha256:"


def fingerprint(der_certificate: bytes) -> str:
    """`sha256:<hex>` of a DER-encoded certificate: the form `verify` takes and `serve` prints."""
    return PIN_PREFIX + hashlib.sha256(der_certificate).hexdigest()
