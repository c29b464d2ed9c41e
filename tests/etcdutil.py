"""A real etcd member on loopback for tests (Debian's ``etcd-server``), plain or with TLS, and the
certificates for it, made by ``openssl`` in the test's own directory.

Importable from every test package (``from etcdutil import etcd_member``), as ``netutil``. The member
is killed and waited for on every exit path of its ``with`` block; its data lives under the directory
the test gives (a ``tmp_path``), which pytest removes.
"""

from __future__ import annotations

import ssl
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from netutil import free_ports

START_S = 30.0  # the member answers /health within this, or the test fails


@dataclass(frozen=True)
class Certs:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, all signed by that CA."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path

    def client_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.ca))
        ctx.load_cert_chain(str(self.client_cert), str(self.client_key))
        return ctx


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


def make_ca(directory: Path, name: str) -> tuple[Path, Path]:
    """A self-signed CA (certificate, key) in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    _openssl(
        *("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"),
        *("-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", f"/CN={name}"),
        *("-addext", "basicConstraints=critical,CA:TRUE"),
        *("-addext", "keyUsage=critical,keyCertSign,cRLSign"),
    )
    return cert, key


def make_cert(directory: Path, name: str, ca: tuple[Path, Path], *, server: bool) -> tuple[Path, Path]:
    """A certificate (and its key, mode 0600) signed by ``ca``: for the server 127.0.0.1 (its SAN),
    or a client named ``name``."""
    cert, key, csr = directory / f"{name}.crt", directory / f"{name}.key", directory / f"{name}.csr"
    ext = directory / f"{name}.ext"
    usage = "serverAuth,clientAuth" if server else "clientAuth"
    lines = [
        "basicConstraints=CA:FALSE",
        "keyUsage=critical,digitalSignature,keyEncipherment",
        f"extendedKeyUsage={usage}",
        "subjectKeyIdentifier=hash",
        "authorityKeyIdentifier=keyid,issuer",
    ]
    if server:
        lines.append("subjectAltName=IP:127.0.0.1")
    ext.write_text("\n".join(lines) + "\n")
    _openssl(
        *("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"),
        *("-keyout", str(key), "-out", str(csr), "-subj", f"/CN={name}"),
    )
    _openssl(
        *("x509", "-req", "-in", str(csr), "-CA", str(ca[0]), "-CAkey", str(ca[1]), "-CAcreateserial"),
        *("-out", str(cert), "-days", "2", "-extfile", str(ext)),
    )
    key.chmod(0o600)
    return cert, key


def make_certs(directory: Path) -> Certs:
    ca = make_ca(directory, "test-ca")
    server = make_cert(directory, "etcd-server", ca, server=True)
    client = make_cert(directory, "stalwart-client", ca, server=False)
    return Certs(ca[0], server[0], server[1], client[0], client[1])


def _wait_healthy(url: str, proc: subprocess.Popen, context: ssl.SSLContext | None) -> None:
    deadline = time.monotonic() + START_S
    while True:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=1.0, context=context):
                return
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise AssertionError(f"etcd did not start (exit {proc.poll()})") from None
            time.sleep(0.1)


@contextmanager
def etcd_member(data_dir: Path, certs: Certs | None = None, name: str = "it") -> Iterator[str]:
    """One etcd member on 127.0.0.1 (``HOST:PORT`` of its client URL), up and answering. With
    ``certs`` it serves https and takes only clients whose certificate its CA signed
    (``--client-cert-auth``), as members are run in production; its peer URL stays plain."""
    client_port, peer_port = free_ports(2)
    scheme = "https" if certs else "http"
    url, peer = f"{scheme}://127.0.0.1:{client_port}", f"http://127.0.0.1:{peer_port}"
    argv = ["etcd", "--name", name, "--data-dir", str(data_dir)]
    argv += ["--listen-client-urls", url, "--advertise-client-urls", url]
    argv += ["--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer]
    argv += ["--initial-cluster", f"{name}={peer}"]
    if certs:
        argv += ["--client-cert-auth", "--trusted-ca-file", str(certs.ca)]
        argv += ["--cert-file", str(certs.server_cert), "--key-file", str(certs.server_key)]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_healthy(url, proc, certs.client_context() if certs else None)
        yield f"127.0.0.1:{client_port}"
    finally:
        proc.kill()
        proc.wait(timeout=10)
