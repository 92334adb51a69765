"""A `sha256:` pin names the certificate to trust; on a plain http:// URL there is none. The client refuses
such a setting before it connects, instead of ignoring the pin and sending the token in clear."""

from __future__ import annotations

import socket

import pytest

from cortex_nb import Client
from cortex_nb.errors import CortexError

PIN = "sha256:" + "ab" * 32


def test_a_pin_on_an_http_url_is_refused_before_anything_is_sent(monkeypatch):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(0.5)
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    try:
        with pytest.raises(CortexError) as caught:
            Client(url, "secret-token", verify=PIN)
        assert caught.value.code == "invalid_request" and "plain http" in str(caught.value)
        monkeypatch.setenv("CORTEX_VERIFY", PIN)
        with pytest.raises(CortexError):
            Client(url, "secret-token")
        with pytest.raises(TimeoutError):
            listener.accept()  # no connection was made, so no token left this process
    finally:
        listener.close()
