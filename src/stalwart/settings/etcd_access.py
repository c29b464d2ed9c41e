"""How the etcd rendezvous client proves who it is and whom it trusts (``--etcd-*``).

etcd as people run it serves its clients over TLS and takes only those whose certificate its CA
signed (members started with ``--client-cert-auth --trusted-ca-file CA --cert-file ... --key-file
...``), and may have users (``etcdctl auth enable``). :class:`EtcdAccess` holds the run's
``--etcd-cacert``, ``--etcd-cert``/``--etcd-key`` and ``--etcd-user``/``--etcd-password-file``
(settings_trust.py): with a CA or a client certificate the members are spoken to over https (a member
given as ``HOST:PORT`` becomes ``https://HOST:PORT``), their certificates verified against the CA,
host names included. The private key and the password file must be private to their owner.

:func:`check_etcd_access` refuses a bad combination, or a file that is missing or readable by others,
when the run's configuration is built (exit 2 before anything starts); :func:`refusal` and
:func:`gateway_error` turn what a member answered into one sentence that says what to fix.
"""

from __future__ import annotations

import json
import os
import ssl
import stat
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

from ..errors import ConfigError
from ..secret_values import read_secret_file

if TYPE_CHECKING:
    from .trust import TrustSettings

ETCD_BACKENDS = ("etcd", "etcd-v2")
FLAGS = {
    "cacert": "--etcd-cacert",
    "cert": "--etcd-cert",
    "key": "--etcd-key",
    "user": "--etcd-user",
    "password_file": "--etcd-password-file",
}
TOKEN_REJECTED = ("invalid auth token", "auth token expired", "revision of auth store is old")


@dataclass(frozen=True)
class EtcdAccess:
    """The client's TLS files and etcd user (all empty: plain http, no user)."""

    cacert: str = ""
    cert: str = ""
    key: str = ""
    user: str = ""
    password_file: str = ""

    @classmethod
    def of(cls, trust: TrustSettings) -> EtcdAccess:
        """From the run's trust settings (``cfg.trust``)."""
        return cls(
            str(trust.etcd_cacert or ""),
            str(trust.etcd_cert or ""),
            str(trust.etcd_key or ""),
            str(trust.etcd_user or ""),
            str(trust.etcd_password_file or ""),
        )

    @property
    def tls(self) -> bool:
        return bool(self.cacert or self.cert)

    @property
    def given(self) -> list[str]:
        """The flags of the options that are set."""
        return [FLAGS[f.name] for f in fields(self) if getattr(self, f.name)]

    def check(self, backend: str, endpoint: str) -> None:
        """Options that belong together come together, and only with the etcd backend."""
        given = self.given
        if not given:
            return
        if backend not in ETCD_BACKENDS:
            raise ConfigError(
                f"{', '.join(given)} apply to the etcd rendezvous only, not to --rdzv-backend {backend or '(none)'}",
                "add --rdzv-backend etcd, or drop them",
            )
        if bool(self.cert) != bool(self.key):
            raise ConfigError(
                "--etcd-cert and --etcd-key go together (the client's certificate and its private key)",
                "give both, or neither",
            )
        if bool(self.user) != bool(self.password_file):
            raise ConfigError("--etcd-user and --etcd-password-file go together", "give both, or neither")
        plain = [m for m in endpoint.split(",") if m.strip().startswith("http://")]
        if self.tls and plain:
            raise ConfigError(
                f"--rdzv-endpoint {plain[0].strip()} is plain http, but {', '.join(given)} ask for TLS",
                "give the members as HOST:PORT or https://HOST:PORT",
            )

    def check_files(self) -> None:
        """Every file given can be read; the key and the password file are private to their owner."""
        for path, flag in ((self.cacert, "--etcd-cacert"), (self.cert, "--etcd-cert")):
            if path and not os.access(path, os.R_OK):
                raise ConfigError(f"{flag} {path}: no such readable file", f"give {flag} a PEM file")
        if self.key:
            check_private_key(self.key)
        if self.password_file:
            self.password()

    def password(self) -> str:
        return read_secret_file(self.password_file, "etcd password") if self.password_file else ""

    def ssl_context(self) -> ssl.SSLContext:
        """The context the members' certificates are verified in (host names included), with this
        client's certificate when one is given; the system's CAs without ``--etcd-cacert``."""
        try:
            ctx = ssl.create_default_context(cafile=self.cacert or None)
        except (OSError, ValueError) as exc:
            raise ConfigError(
                f"--etcd-cacert {self.cacert}: not a CA certificate ({_why(exc)})",
                "give the PEM file of the CA that signed the members' certificates",
            ) from None
        if self.cert:
            check_private_key(self.key)
            try:
                ctx.load_cert_chain(self.cert, self.key)
            except (OSError, ValueError) as exc:
                raise ConfigError(
                    f"--etcd-cert {self.cert} with --etcd-key {self.key}: {_why(exc)}",
                    "give a PEM certificate and its own private key (unencrypted)",
                ) from None
        return ctx


def _why(exc: BaseException) -> str:
    reason = getattr(exc, "reason", None)  # set by OpenSSL's errors only
    if isinstance(exc, ssl.SSLError) and isinstance(reason, str) and reason:
        return reason.lower().replace("_", " ")
    return getattr(exc, "strerror", None) or str(exc)


def _verify_message(err: ssl.SSLCertVerificationError) -> str:
    return str(getattr(err, "verify_message", "") or _why(err))


def check_private_key(path: str) -> None:
    """The client's private key: a regular file of the current user's, readable by no one else."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise ConfigError(
            f"--etcd-key {path}: {exc.strerror}", "give the client's private key file"
        ) from None
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"--etcd-key {path} is not a regular file", "give the client's private key file")
    if st.st_mode & 0o077:
        raise ConfigError(
            f"--etcd-key {path} has mode {stat.S_IMODE(st.st_mode):04o}: others could read the private key",
            f"run `chmod 600 {path}`",
        )
    if st.st_uid != os.geteuid():
        raise ConfigError(
            f"--etcd-key {path} belongs to user id {st.st_uid}, not to this user ({os.geteuid()})",
            f"run `chown {os.geteuid()} {path}` (and `chmod 600 {path}`)",
        )


def check_etcd_access(backend: str, endpoint: str, trust: TrustSettings) -> None:
    """The run's ``--etcd-*`` options, checked when its configuration is built."""
    access = EtcdAccess.of(trust)
    access.check(backend, endpoint)
    access.check_files()


def refusal(exc: BaseException, member: str, access: EtcdAccess) -> str:
    """What a TLS failure talking to ``member`` means for the user ("" for anything else)."""
    reason = getattr(exc, "reason", None)
    err = reason if isinstance(reason, ssl.SSLError) else exc
    if isinstance(err, ssl.SSLCertVerificationError):
        ca = f"--etcd-cacert {access.cacert}" if access.cacert else "the system's CAs (no --etcd-cacert)"
        return (
            f"the certificate of etcd member {member} is not trusted: {_verify_message(err)} "
            f"(checked against {ca}; give the CA that signed the members' --cert-file, whose "
            "certificates must name the address used in --rdzv-endpoint)"
        )
    if not isinstance(err, ssl.SSLError):
        return ""
    why = _why(err)
    if isinstance(err, ssl.SSLEOFError):  # TLS 1.3: the member's alert may be lost as it hangs up
        why = "it closed the connection in the handshake"
    if isinstance(err, ssl.SSLEOFError) or "certificate" in why or "unknown ca" in why:
        mine = f"its certificate {access.cert}" if access.cert else "no client certificate"
        return (
            f"etcd member {member} refused this client, which showed {mine} ({why}; give --etcd-cert "
            "and --etcd-key signed by the CA of the members' --trusted-ca-file)"
        )
    if "wrong version number" in why or "record layer failure" in why:
        return f"etcd member {member} does not speak TLS (serve https there, or give it as http:// without --etcd-*)"
    return f"TLS with etcd member {member} failed: {why}"


def gateway_error(body: bytes) -> str:
    """The message of an error the v3 gateway answered ("" when the body is not one)."""
    try:
        doc = json.loads(body or b"{}")
    except ValueError:
        return ""
    if not isinstance(doc, dict):
        return ""
    return str(doc.get("error") or doc.get("message") or "").removeprefix("etcdserver: ")


def auth_refusal(message: str, access: EtcdAccess) -> str:
    """What an authentication or permission error of etcd means for the user ("" for other errors)."""
    if "user name is empty" in message:
        return (
            "etcd has authentication enabled and this client has no user "
            "(give --etcd-user and --etcd-password-file, or a client certificate whose CN is an etcd user)"
        )
    if "authentication failed" in message or "invalid user" in message:
        return (
            f"etcd refused user {access.user!r}: {message} "
            f"(check --etcd-user and the password in {access.password_file})"
        )
    if "permission denied" in message:
        who = f"user {access.user!r}" if access.user else "this client"
        return (
            f"etcd denied {who} access to Stalwart's keys ({message}; grant it a role with "
            "`etcdctl role grant-permission --prefix=true ROLE readwrite /stalwart/`)"
        )
    return ""
