"""A real nginx terminating TLS in front of a relay, on loopback, for the proxy drill: a
self-signed CA made here, nginx run in the foreground as one process in a folder of its own."""

from __future__ import annotations

import datetime
import ipaddress
import os
import shutil
import ssl
import subprocess
import time
from pathlib import Path
from types import TracebackType

import httpx2
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tests.conftest import unavailable
from tests.relay.server import free_port

CONFIG = """
daemon off;
master_process off;
pid {folder}/nginx.pid;
error_log {folder}/error.log info;
events {{ worker_connections 64; }}
http {{
    access_log {folder}/access.log;
    client_body_temp_path {folder}/body;
    proxy_temp_path {folder}/proxy;
    fastcgi_temp_path {folder}/fastcgi;
    uwsgi_temp_path {folder}/uwsgi;
    scgi_temp_path {folder}/scgi;
    client_max_body_size 64m;
    server {{
        listen 127.0.0.1:{port} ssl;
        ssl_certificate {folder}/server.pem;
        ssl_certificate_key {folder}/server.key;
        location / {{
            proxy_pass http://127.0.0.1:{upstream};
            proxy_http_version 1.1;
            proxy_set_header Host $host;
            proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
            proxy_buffering off;
            proxy_read_timeout 1h;
        }}
    }}
}}
"""
"""One process (no master: nothing drops privileges), every path in the drill's folder;
unbuffered, so Server-Sent Events pass as the relay writes them."""


def nginx_binary() -> str:
    """nginx's path: a skip without it, a failure in CI (never a silent pass)."""
    found = shutil.which("nginx") or next(
        (p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx") if os.access(p, os.X_OK)), None
    )
    if found is None:
        unavailable("nginx is not installed: the TLS proxy drill runs a real one")
    return found


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _certificate(
    issuer: x509.Name,
    key: ec.EllipticCurvePublicKey,
    valid: tuple[datetime.datetime, datetime.datetime],
    subject: x509.Name | None = None,
) -> x509.CertificateBuilder:
    return (
        x509.CertificateBuilder()
        .subject_name(subject or issuer)
        .issuer_name(issuer)
        .public_key(key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(valid[0])
        .not_valid_after(valid[1])
    )


def make_certificates(folder: Path) -> Path:
    """A CA (its certificate is returned) and a server certificate it signed for 127.0.0.1
    and localhost, with the server's key, in `folder`."""
    now = datetime.datetime.now(datetime.UTC)
    valid = (now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=1))
    ca_key = ec.generate_private_key(ec.SECP256R1())
    server_key = ec.generate_private_key(ec.SECP256R1())
    signs_certificates = x509.KeyUsage(
        digital_signature=False, content_commitment=False, key_encipherment=False,
        data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
        encipher_only=False, decipher_only=False,
    )  # fmt: skip
    ca = (
        _certificate(_name("sealsync drill CA"), ca_key.public_key(), valid)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(signs_certificates, critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    names = [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
    server = (
        _certificate(ca.subject, server_key.public_key(), valid, _name("127.0.0.1"))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    (folder / "ca.pem").write_bytes(ca.public_bytes(pem))
    (folder / "server.pem").write_bytes(server.public_bytes(pem))
    (folder / "server.key").write_bytes(
        server_key.private_bytes(
            pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return folder / "ca.pem"


class Nginx:
    """nginx on 127.0.0.1 with TLS, proxying to a relay at `upstream_port`."""

    def __init__(self, folder: Path, upstream_port: int) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.ca = make_certificates(folder)
        self.port = free_port()
        self.url = f"https://127.0.0.1:{self.port}"
        config = CONFIG.format(folder=folder, port=self.port, upstream=upstream_port)
        (folder / "nginx.conf").write_text(config)
        self._process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Nginx:
        command = [nginx_binary(), "-p", str(self.folder), "-c", str(self.folder / "nginx.conf"),
                   "-e", str(self.folder / "error.log")]  # fmt: skip
        self._process = subprocess.Popen(command, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"nginx exited: {(self.folder / 'error.log').read_text()}")
            try:
                httpx2.get(f"{self.url}/v1/health", verify=self.trust(), timeout=1)
                return self
            except httpx2.TransportError:
                time.sleep(0.05)
        raise RuntimeError("nginx did not answer within 10 s")

    def trust(self) -> ssl.SSLContext:
        """What verifies the proxy's certificate: the drill's CA alone."""
        return ssl.create_default_context(cafile=str(self.ca))

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._process is not None:
            self._process.terminate()
            self._process.wait(timeout=10)
            if self._process.stderr is not None:
                self._process.stderr.close()
