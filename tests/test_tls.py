"""TLS: a backend serving HTTPS with its self-signed certificate, and clients that pin it, trust it
as a CA file, or refuse it."""

from __future__ import annotations

import ssl
import subprocess
import sys

import httpx
import pytest
from cortex_backend.tls import make_self_signed, plaintext_warning, self_signed_files

from cortex_nb import Client, errors, tls
from cortex_nb.transport import RetryPolicy

NO_RETRY = RetryPolicy(max_attempts=1)


def test_backend_prints_and_publishes_its_fingerprint(tls_backend):
    assert tls_backend.url.startswith("https://127.0.0.1:")
    der = ssl.PEM_cert_to_DER_cert((tls_backend.data_dir / "tls" / "cert.pem").read_text())
    assert tls_backend.fingerprint == tls.fingerprint(der)
    assert f'verify = "{tls_backend.fingerprint}"' in tls_backend.log()
    assert (tls_backend.data_dir / "tls" / "key.pem").stat().st_mode & 0o077 == 0


def test_pinned_client_works(tls_backend):
    with Client(tls_backend.url, tls_backend.token, verify=tls_backend.fingerprint) as client:
        assert client.check_version()["api_version"]
        assert isinstance(client.list_jobs(), list)


def test_client_refuses_a_certificate_whose_fingerprint_does_not_match(tls_backend):
    wrong = "sha256:" + "ab" * 32
    with pytest.raises(errors.ConnectionError) as caught:
        Client(tls_backend.url, tls_backend.token, verify=wrong, retry=NO_RETRY)
    message = str(caught.value)
    assert "pinned" in message and wrong in message and tls_backend.fingerprint in message


def test_certificate_file_works_as_ca_and_system_cas_refuse_it(tls_backend):
    with Client(
        tls_backend.url, tls_backend.token, verify=str(tls_backend.data_dir / "tls" / "cert.pem")
    ) as client:
        assert client.whoami()["owner"]
    with pytest.raises(errors.ConnectionError) as caught:
        Client(tls_backend.url, tls_backend.token, retry=NO_RETRY)
    assert "CERTIFICATE_VERIFY_FAILED" in str(caught.value)


def test_plain_http_to_the_tls_port_gets_no_answer(tls_backend):
    with pytest.raises(httpx.HTTPError):
        httpx.get(tls_backend.url.replace("https://", "http://") + "/version", timeout=10)


def test_profile_and_environment_carry_the_pin(tls_backend, tmp_path, monkeypatch):
    config = tmp_path / "config.toml"
    config.write_text(
        'default = "gpu"\n[profiles.gpu]\n'
        f'url = "{tls_backend.url}"\ntoken = "{tls_backend.token}"\nverify = "{tls_backend.fingerprint.upper().replace("SHA256", "sha256")}"\n'
    )
    monkeypatch.setenv("CORTEX_CONFIG", str(config))
    monkeypatch.delenv("CORTEX_URL", raising=False)
    with Client.from_profile() as client:
        assert client.whoami()["owner"]
    monkeypatch.setenv("CORTEX_URL", tls_backend.url)
    monkeypatch.setenv("CORTEX_TOKEN", tls_backend.token)
    monkeypatch.setenv("CORTEX_VERIFY", tls_backend.fingerprint)
    with Client.from_profile() as client:
        assert client.whoami()["owner"]
    monkeypatch.setenv("CORTEX_VERIFY", "sha256:" + "0" * 64)
    with pytest.raises(errors.ConnectionError):
        Client.from_profile(retry=NO_RETRY)


def test_bad_verify_settings_are_named():
    for value in ("sha256:1234", "/no/such/ca.pem"):
        with pytest.raises(errors.CortexError) as caught:
            tls.parse_verify(value)
        assert "verify" in str(caught.value)
    assert tls.parse_verify("false") is False
    assert tls.parse_verify("SHA256:" + "AB:" * 31 + "AB") == "sha256:" + "ab" * 32


def test_self_signed_certificate_is_kept_across_starts(tmp_path):
    first = self_signed_files(tmp_path, "127.0.0.1")
    again = self_signed_files(tmp_path, "127.0.0.1")
    assert first.fingerprint() == again.fingerprint()
    from cryptography import x509

    cert, _ = make_self_signed("10.1.2.3")
    names = (
        x509.load_pem_x509_certificate(cert)
        .extensions.get_extension_for_class(x509.SubjectAlternativeName)
        .value
    )
    assert "10.1.2.3" in {str(ip) for ip in names.get_values_for_type(x509.IPAddress)}
    assert "localhost" in names.get_values_for_type(x509.DNSName)


def test_plaintext_beyond_loopback_warns():
    assert plaintext_warning("127.0.0.1") is None and plaintext_warning("::1") is None
    assert plaintext_warning("localhost") is None
    warning = plaintext_warning("0.0.0.0")
    assert warning and "without TLS" in warning and "--tls self-signed" in warning


def test_serve_refuses_inconsistent_tls_options(tmp_path):
    from argparse import Namespace

    from cortex_backend.cli import _tls_arguments_error

    cert, _ = make_self_signed("127.0.0.1")
    _, other_key = make_self_signed("127.0.0.1")
    (tmp_path / "cert.pem").write_bytes(cert)
    (tmp_path / "key.pem").write_bytes(other_key)
    cert_file, key_file = tmp_path / "cert.pem", tmp_path / "key.pem"
    assert "go together" in _tls_arguments_error(Namespace(tls=None, tls_cert=cert_file, tls_key=None))
    assert "exclude each other" in _tls_arguments_error(
        Namespace(tls="self-signed", tls_cert=cert_file, tls_key=key_file)
    )
    # The command itself refuses a key that is not the certificate's, before serving anything.
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "cortex_backend",
            "serve",
            "--port",
            "0",
            "--data-dir",
            str(tmp_path / "data"),
            "--tls-cert",
            str(cert_file),
            "--tls-key",
            str(key_file),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "cannot serve TLS" in done.stderr, done.stderr
    assert not (tmp_path / "data" / "backend.json").exists()
