"""The etcd rendezvous client's TLS and user options (settings/etcd_access.py): torch's ``--rdzv-conf``
names, the combinations refused when the run's configuration is built, private key and password
files, and the one sentence a refusal by a member becomes. Real members: tests/integration/test_etcd_tls.py."""

from __future__ import annotations

import os
import socket
import ssl
import struct
import threading

import pytest

from stalwart.errors import ConfigError
from stalwart.launch.rendezvous.etcd import EtcdClient, members
from stalwart.settings.etcd_access import EtcdAccess, auth_refusal, gateway_error, refusal
from stalwart.settings.run_config import build, parse_rdzv_conf

ETCD = {"script": "train.py", "nnodes": "2", "rdzv_backend": "etcd", "rdzv_endpoint": "127.0.0.1:2379"}


@pytest.fixture
def files(tmp_path):
    """Stand-ins for the PEM files (only their modes and owners are read before a TLS handshake)."""
    out = {}
    for name in ("ca.crt", "client.crt", "client.key", "password"):
        p = tmp_path / name
        p.write_text("secret\n" if name == "password" else "pem\n")
        p.chmod(0o600 if name in ("client.key", "password") else 0o644)
        out[name] = str(p)
    return out


def test_torchs_rdzv_conf_names_map_to_the_etcd_settings():
    conf = parse_rdzv_conf("cacert=/p/ca.pem,cert=/p/c.pem,key=/p/c.key,user=rdzv,password_file=/p/pw")
    assert conf == {
        "etcd_cacert": "/p/ca.pem",
        "etcd_cert": "/p/c.pem",
        "etcd_key": "/p/c.key",
        "etcd_user": "rdzv",
        "etcd_password_file": "/p/pw",
    }


def test_tls_and_user_options_build_into_the_trust_settings(files):
    cfg = build(
        {
            **ETCD,
            "rdzv_endpoint": "127.0.0.1:2379,https://h1:2379",
            "etcd_cacert": files["ca.crt"],
            "etcd_cert": files["client.crt"],
            "etcd_key": files["client.key"],
            "etcd_user": "rdzv",
            "etcd_password_file": files["password"],
        },
        env={},
    )
    access = EtcdAccess.of(cfg.trust)
    assert access.tls and access.cacert == files["ca.crt"] and access.password() == "secret"
    assert members(cfg.rendezvous.endpoint, https=access.tls) == ["https://127.0.0.1:2379", "https://h1:2379"]
    assert members("a:1, http://b:2") == ["http://a:1", "http://b:2"]  # without TLS: plain, as given


def test_the_options_come_from_the_environment_too(files):
    env = {"STALWART_ETCD_CACERT": files["ca.crt"]}
    assert build(dict(ETCD), env=env).trust.etcd_cacert == files["ca.crt"]


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ({"rdzv_backend": "c10d"}, "apply to the etcd rendezvous only"),
        ({"rdzv_backend": None, "rdzv_endpoint": None, "nnodes": "1"}, "add --rdzv-backend etcd"),
        ({"etcd_key": None}, "--etcd-cert and --etcd-key go together"),
        ({"etcd_cert": None}, "--etcd-cert and --etcd-key go together"),
        ({"etcd_password_file": None}, "--etcd-user and --etcd-password-file go together"),
        ({"rdzv_endpoint": "http://127.0.0.1:2379"}, "is plain http"),
    ],
)
def test_one_clear_error_for_a_bad_combination(files, extra, expected):
    flags = {
        **ETCD,
        "etcd_cacert": files["ca.crt"],
        "etcd_cert": files["client.crt"],
        "etcd_key": files["client.key"],
        "etcd_user": "rdzv",
        "etcd_password_file": files["password"],
    }
    flags.update(extra)
    with pytest.raises(ConfigError, match=expected):
        build(flags, env={})


def test_a_key_others_can_read_is_refused_with_the_fix(files):
    os.chmod(files["client.key"], 0o644)
    flags = {**ETCD, "etcd_cert": files["client.crt"], "etcd_key": files["client.key"]}
    with pytest.raises(ConfigError, match="mode 0644") as err:
        build(flags, env={})
    assert f"chmod 600 {files['client.key']}" in str(err.value)
    with pytest.raises(ConfigError, match="chmod 600"):  # a client built in code checks it too
        EtcdClient("127.0.0.1:2379", access=EtcdAccess(cert=files["client.crt"], key=files["client.key"]))


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_a_key_of_another_user_is_refused(files):
    os.chown(files["client.key"], 65534, -1)
    with pytest.raises(ConfigError, match="belongs to user id 65534") as err:
        build({**ETCD, "etcd_cert": files["client.crt"], "etcd_key": files["client.key"]}, env={})
    assert "chown" in str(err.value)


def test_missing_files_and_a_readable_password_file_are_refused(files, tmp_path):
    with pytest.raises(ConfigError, match="--etcd-cacert .*no such readable file"):
        build({**ETCD, "etcd_cacert": str(tmp_path / "nope.crt")}, env={})
    os.chmod(files["password"], 0o640)
    with pytest.raises(ConfigError, match="chmod 600"):
        build({**ETCD, "etcd_user": "rdzv", "etcd_password_file": files["password"]}, env={})


def test_a_file_that_is_not_a_certificate_is_named(files):
    with pytest.raises(ConfigError, match="--etcd-cacert .*not a CA certificate"):
        EtcdAccess(cacert=files["ca.crt"]).ssl_context()
    with pytest.raises(ConfigError, match="--etcd-cert .*with --etcd-key"):
        EtcdAccess(cert=files["client.crt"], key=files["client.key"]).ssl_context()


def test_a_members_tls_refusal_is_one_sentence_that_says_what_to_fix():
    access = EtcdAccess(cacert="/p/ca.pem")
    untrusted = ssl.SSLCertVerificationError(1, "certificate verify failed")
    assert "not trusted" in refusal(untrusted, "https://m:1", access)
    assert "--etcd-cacert /p/ca.pem" in refusal(untrusted, "https://m:1", access)
    bad_cert = ssl.SSLError(1, "[SSL: SSLV3_ALERT_BAD_CERTIFICATE] sslv3 alert bad certificate")
    bad_cert.reason = "SSLV3_ALERT_BAD_CERTIFICATE"
    said = refusal(bad_cert, "https://m:1", access)
    assert "refused this client" in said and "no client certificate" in said and "--etcd-cert" in said
    hung_up = refusal(ssl.SSLEOFError(8, "EOF occurred in violation of protocol"), "https://m:1", access)
    assert "refused this client" in hung_up and "closed the connection in the handshake" in hung_up
    assert refusal(ConnectionRefusedError(111, "refused"), "https://m:1", access) == ""


def test_etcds_auth_answers_become_clear_errors():
    body = b'{"error":"etcdserver: authentication failed, invalid user ID or password","code":3}'
    message = gateway_error(body)
    assert message == "authentication failed, invalid user ID or password"
    access = EtcdAccess(user="rdzv", password_file="/p/pw")
    assert "etcd refused user 'rdzv'" in auth_refusal(message, access)
    assert "--etcd-user" in auth_refusal("user name is empty", EtcdAccess())
    assert "role grant-permission" in auth_refusal("permission denied", access)
    assert auth_refusal("no leader", access) == "" and gateway_error(b"<html>") == ""


@pytest.mark.parametrize("how", ["close", "reset"])
def test_a_member_that_drops_a_plain_connection_is_said_to_serve_https(how):
    """A TLS member drops a plain client's request: it closes the connection, or, when its reply races
    the close (as on a busy machine), resets it. Both read as the same hint."""

    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def drop() -> None:
        conn, _ = server.accept()
        conn.recv(65536)
        if how == "reset":  # linger 0: close sends RST, not FIN
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        conn.close()

    thread = threading.Thread(target=drop, daemon=True)
    thread.start()
    try:
        with pytest.raises(Exception, match="serves https closes plain connections: give --etcd-cacert"):
            EtcdClient(f"127.0.0.1:{port}", request_s=3.0).probe()
    finally:
        thread.join(timeout=5)
        server.close()
