"""TLS for the backend: a certificate given by the operator, or one the backend makes for itself.

`--tls self-signed` makes an EC P-256 certificate once and keeps it in the data dir (tls/cert.pem,
tls/key.pem, mode 0600), so its fingerprint (what clients pin) stays the same across restarts. The
certificate names localhost, 127.0.0.1, ::1, this host's name and the address served, so it also works
as a CA file for clients that check host names.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import socket
import ssl
from dataclasses import dataclass
from pathlib import Path

from cortex_nb.protocol.tls_pin import fingerprint

SELF_SIGNED = "self-signed"
VALIDITY_DAYS = 3650


@dataclass(frozen=True)
class TlsFiles:
    cert: Path
    key: Path

    def fingerprint(self) -> str:
        return fingerprint(ssl.PEM_cert_to_DER_cert(self.cert.read_text()))


def self_signed_files(data_dir: Path, host: str) -> TlsFiles:
    """The data dir's self-signed certificate, made on first use."""
    folder = data_dir / "tls"
    files = TlsFiles(folder / "cert.pem", folder / "key.pem")
    if files.cert.exists() and files.key.exists():
        return files
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o700)
    cert_pem, key_pem = make_self_signed(host)
    for path, data in ((files.key, key_pem), (files.cert, cert_pem)):
        temporary = path.with_suffix(".tmp")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        temporary.replace(path)
    return files


def _names(host: str) -> tuple[list[str], list[str]]:
    dns = {"localhost", socket.gethostname()}
    ips = {"127.0.0.1", "::1"}
    if host and host not in ("0.0.0.0", "::", ""):
        try:
            ipaddress.ip_address(host)
            ips.add(host)
        except ValueError:
            dns.add(host)
    return sorted(d for d in dns if d), sorted(ips)


def make_self_signed(host: str) -> tuple[bytes, bytes]:
    """(certificate PEM, private key PEM) for a new self-signed certificate."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    dns, ips = _names(host)
    name = x509.Name(
        [x509.NameAttribute(NameOID.COMMON_NAME, f"cortex-nb backend on {socket.gethostname()}"[:64])]
    )
    now = datetime.datetime.now(datetime.timezone.utc)
    alt_names = [x509.DNSName(d) for d in dns] + [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=VALIDITY_DAYS))
        .add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
        # A self-signed certificate that can be its own trust anchor (clients give it as their CA file).
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return certificate.public_bytes(serialization.Encoding.PEM), key_pem


def server_context(files: TlsFiles) -> ssl.SSLContext:
    """The listening socket's context; a missing or mismatched key pair fails here, before serving."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(str(files.cert), str(files.key))
    return context


def is_loopback(host: str) -> bool:
    if host in ("localhost", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def plaintext_warning(host: str) -> str | None:
    """What `serve` prints when it listens beyond loopback without TLS; None when that is not the case."""
    if is_loopback(host):
        return None
    return (
        f"WARNING: serving on {host} without TLS: bearer tokens and training data cross the network in"
        " clear text. Use --tls self-signed (clients pin the fingerprint printed below) or --tls-cert/--tls-key,"
        " or listen on 127.0.0.1 behind a TLS-terminating proxy."
    )
