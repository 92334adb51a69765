"""How a client checks the backend's TLS certificate: the system's CAs, a CA file, or a pinned
SHA-256 fingerprint (what `cortex-nb backend serve --tls self-signed` prints).

One setting, `verify`, read from a profile (`verify = "sha256:..."`), `CORTEX_VERIFY`, or the
`verify=` argument of `Client`:

- `True` / `"true"` / unset: the system's trusted CAs, host name checked (an ordinary certificate);
- a path to a PEM file: trust the CAs (or the self-signed certificate) in it, host name checked;
- `"sha256:<64 hex digits>"`: trust exactly the certificate with that fingerprint, whatever it names;
- `False` / `"false"`: no check at all (tests against a throwaway backend only).

A pinned connection checks the fingerprint inside the TLS handshake, before any byte of a request
(and so before the token) is sent.
"""

from __future__ import annotations

import hmac
import os
import re
import ssl
from pathlib import Path

from .errors import CortexError
from .protocol.tls_pin import PIN_PREFIX, fingerprint  # noqa: F401  (their SDK names)

Verify = bool | str

_PIN = re.compile(r"^sha256:([0-9a-f]{64})\Z")


def normalize_pin(value: str) -> str | None:
    """A `sha256:` pin in canonical form (lower case, no colons between bytes), or None if `value` is not one."""
    text = value.strip().lower()
    if not text.startswith(PIN_PREFIX):
        return None
    digits = text[len(PIN_PREFIX) :].replace(":", "")
    pin = PIN_PREFIX + digits
    if not _PIN.match(pin):
        raise CortexError(
            f"verify: {value!r} is not a SHA-256 pin; write sha256: and 64 hex digits", code="invalid_request"
        )
    return pin


def parse_verify(value: Verify | None) -> Verify:
    """Turn a setting (bool, "true"/"false", a pin, a CA file path) into True, False, a pin or a path."""
    if value is None:
        return True
    if isinstance(value, bool):
        return value
    text = str(value).strip()
    if text.lower() in ("", "true", "yes", "1", "system"):
        return True
    if text.lower() in ("false", "no", "0", "off"):
        return False
    pin = normalize_pin(text)
    if pin is not None:
        return pin
    path = Path(text).expanduser()
    if not path.is_file():
        raise CortexError(
            f"verify: {text!r} is neither a sha256: pin nor a readable CA file", code="invalid_request"
        )
    return str(path)


def refuse_pin_without_tls(url: str, verify: Verify | ssl.SSLContext | None) -> None:
    """A pin says "only this certificate": on a plain http:// URL there is none, and the token would travel
    in clear, so refuse before anything is sent."""
    pinned = isinstance(verify, _PinnedContext) or (
        isinstance(verify, str) and normalize_pin(verify) is not None
    )
    if pinned and url.lower().startswith("http://"):
        raise CortexError(
            f"verify is a sha256: pin but {url} is plain http: nothing would be checked and the token"
            " would travel unencrypted. Use the backend's https:// URL (it prints it at start), or drop"
            " the pin for a loopback http backend",
            code="invalid_request",
        )


def verify_from_env() -> Verify | None:
    return os.environ.get("CORTEX_VERIFY") or None


class PinMismatchError(ssl.SSLCertVerificationError):
    """The backend presented a certificate other than the pinned one."""


class _PinnedContext(ssl.SSLContext):
    """An SSLContext whose sockets check the peer certificate's fingerprint once the handshake ends."""

    expected_pin: str = ""


def _check_pin(sock: ssl.SSLSocket | ssl.SSLObject) -> None:
    context = sock.context
    der = sock.getpeercert(binary_form=True)
    got = fingerprint(der) if der else "no certificate"
    if not isinstance(context, _PinnedContext) or not hmac.compare_digest(got, context.expected_pin):
        expected = getattr(context, "expected_pin", "?")
        # SSL_ERROR_SSL as args[0]: Tornado's and asyncio's handshake code treat it as a failed handshake.
        raise PinMismatchError(
            ssl.SSL_ERROR_SSL,
            f"the backend's certificate is {got}, not the pinned {expected}: refusing to talk to it. If the"
            " backend made a new certificate, copy the fingerprint it prints at start into `verify`",
        )


class _PinnedSocket(ssl.SSLSocket):
    def do_handshake(self, block: bool = False) -> None:
        super().do_handshake(block)
        _check_pin(self)


class _PinnedObject(ssl.SSLObject):
    def do_handshake(self) -> None:
        super().do_handshake()
        _check_pin(self)


def pinned_context(pin: str) -> ssl.SSLContext:
    """Trust exactly the certificate with this fingerprint (host name and CA chain are not consulted)."""
    context = _PinnedContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.expected_pin = normalize_pin(pin) or pin
    context.sslsocket_class = _PinnedSocket
    context.sslobject_class = _PinnedObject
    return context


def ssl_context(verify: Verify | None) -> ssl.SSLContext:
    """The SSLContext for a parsed or raw `verify` setting."""
    verify = parse_verify(verify)
    if verify is True:
        return ssl.create_default_context()
    if verify is False:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return context
    if verify.startswith(PIN_PREFIX):
        return pinned_context(verify)
    return ssl.create_default_context(cafile=verify)


def httpx_verify(verify: Verify | ssl.SSLContext | None) -> ssl.SSLContext | bool:
    """What `httpx.Client(verify=...)` takes for this setting (True keeps httpx's own default CAs); a
    context already made (a side channel reusing a transport's) is taken as it is."""
    if isinstance(verify, ssl.SSLContext):
        return verify
    verify = parse_verify(verify)
    return True if verify is True else ssl_context(verify)


def describe(verify: Verify | None) -> str:
    verify = parse_verify(verify)
    if verify is True:
        return "system CAs"
    if verify is False:
        return "certificate NOT checked"
    if verify.startswith(PIN_PREFIX):
        return f"pinned {verify[:19]}…"
    return f"CA file {verify}"
