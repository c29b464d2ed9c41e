"""The etcd rendezvous against etcd as people run it (Debian's etcd-server on loopback): TLS with
client certificates (``--client-cert-auth``, certificates made by openssl in the test) and etcd's
users. The right CA and certificate get the rendezvous; a missing client certificate, a wrong CA and a
wrong password each get one sentence that says what to fix, not a traceback of urllib."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from etcdutil import etcd_member, make_ca, make_certs
from stalwart.errors import ConfigError
from stalwart.launch.rendezvous.etcd import EtcdAccessError, EtcdClient, EtcdRendezvousBackend, EtcdStore
from stalwart.settings.etcd_access import EtcdAccess
from widths import unwrap

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        shutil.which("etcd") is None or shutil.which("etcdctl") is None or shutil.which("openssl") is None,
        reason="needs etcd and etcdctl (Debian: etcd-server, etcd-client) and openssl",
    ),
]


@pytest.fixture
def certs(tmp_path):
    return make_certs(tmp_path / "certs")


@pytest.fixture
def tls_etcd(tmp_path, certs):
    with etcd_member(tmp_path / "etcd", certs) as endpoint:
        yield endpoint


def _access(certs, **change) -> EtcdAccess:
    given = {"cacert": str(certs.ca), "cert": str(certs.client_cert), "key": str(certs.client_key)}
    given.update(change)
    return EtcdAccess(**given)


def test_with_the_ca_and_a_client_certificate_the_rendezvous_works(tls_etcd, certs):
    client = EtcdClient(tls_etcd, request_s=3.0, access=_access(certs))
    assert client.members == [f"https://{tls_etcd}"]
    client.put("/stalwart/t/x", b"1")
    assert client.get("/stalwart/t/x")[0] == b"1"
    backend = EtcdRendezvousBackend(client, "tls-job")
    first = backend.set_state(b"round-0")
    assert first is not None and first[2] is True
    assert backend.set_state(b"other", token=first[1] - 1) == (b"round-0", first[1], False)
    second = backend.set_state(b"round-1", token=first[1])
    assert second is not None and second[2] and backend.get_state() == (b"round-1", second[1])
    store = EtcdStore(client, "/stalwart/store/tls-job", timeout_s=2.0)
    store.set("master", "h0:4000")
    assert store.get("master") == b"h0:4000" and store.add("joined", 2) == 2
    client.probe()


def test_without_a_client_certificate_the_member_refuses_with_one_clear_error(tls_etcd, certs):
    client = EtcdClient(tls_etcd, request_s=3.0, access=EtcdAccess(cacert=str(certs.ca)))
    with pytest.raises(EtcdAccessError) as err:
        client.probe()
    said = str(err.value)
    assert f"etcd member https://{tls_etcd} refused this client" in said, said
    assert "no client certificate" in said and "--etcd-cert" in said
    assert "Traceback" not in said and "urlopen" not in said


def test_a_member_whose_certificate_another_ca_signed_is_not_trusted(tls_etcd, certs, tmp_path):
    other_ca, _ = make_ca(tmp_path / "other", "other-ca")
    client = EtcdClient(tls_etcd, request_s=3.0, access=_access(certs, cacert=str(other_ca)))
    with pytest.raises(EtcdAccessError) as err:
        client.get("/stalwart/t/x")
    said = str(err.value)
    assert f"the certificate of etcd member https://{tls_etcd} is not trusted" in said, said
    assert f"--etcd-cacert {other_ca}" in said and "urlopen" not in said


def test_a_plain_client_of_a_tls_member_is_told_to_give_the_ca(tls_etcd):
    with pytest.raises(Exception, match="serves https closes plain connections: give --etcd-cacert"):
        EtcdClient(tls_etcd, request_s=3.0).probe()


def test_a_client_key_others_can_read_is_refused(certs, tmp_path):
    os.chmod(certs.client_key, 0o644)
    with pytest.raises(ConfigError, match=f"chmod 600 {certs.client_key}"):
        EtcdClient("127.0.0.1:2379", access=_access(certs))


def test_stalwart_run_says_what_to_fix_in_one_line(tls_etcd, certs, tmp_path):
    """At the command line: a readable key stops the run before it starts (exit 2); a member that
    refuses this client ends it with the refusal as the verdict (exit 2: a requeue cannot help), not a
    traceback."""
    base = [sys.executable, "-m", "stalwart.cli", "run", "--nnodes", "2", "--rdzv-backend", "etcd"]
    base += ["--rdzv-endpoint", tls_etcd, "--run-dir", str(tmp_path / "run"), "--etcd-cacert", str(certs.ca)]
    script = tmp_path / "train.py"
    script.write_text("print('never runs')\n")
    refused = subprocess.run([*base, str(script)], capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2, refused.stdout + refused.stderr  # a requeue cannot help: no 75
    said = unwrap(refused.stdout)  # the console's lines whole, wherever 80 columns broke them
    assert "the rendezvous store refused this agent: EtcdAccessError" in said
    assert "refused this client" in said
    assert "Traceback" not in refused.stdout + refused.stderr
    os.chmod(certs.client_key, 0o644)
    mine = ["--etcd-cert", str(certs.client_cert), "--etcd-key", str(certs.client_key)]
    readable = subprocess.run([*base, *mine, str(script)], capture_output=True, text=True, timeout=300)
    assert readable.returncode == 2 and f"run `chmod 600 {certs.client_key}`" in readable.stderr
    assert "Traceback" not in readable.stderr


def _etcdctl(endpoint: str, *args: str) -> None:
    done = subprocess.run(
        ["etcdctl", "--endpoints", endpoint, "--user", "root:root-pw", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr


@pytest.fixture
def auth_etcd(tmp_path):
    """A member with users on: ``root``, and ``rdzv`` who may read and write ``/stalwart/``."""
    with etcd_member(tmp_path / "etcd") as endpoint:
        url = f"http://{endpoint}"
        for step in (
            ["user", "add", "root", "--new-user-password=root-pw"],
            ["user", "grant-role", "root", "root"],
            ["user", "add", "rdzv", "--new-user-password=rdzv-pw"],
            ["role", "add", "stalwart"],
            ["role", "grant-permission", "--prefix=true", "stalwart", "readwrite", "/stalwart/"],
            ["user", "grant-role", "rdzv", "stalwart"],
            ["auth", "enable"],
        ):
            _etcdctl(url, *step)
        yield endpoint


def _password_file(tmp_path, text: str) -> str:
    path = tmp_path / f"pw-{text}"
    path.write_text(text + "\n")
    path.chmod(0o600)
    return str(path)


def test_a_user_and_password_get_a_token_and_a_lost_token_is_fetched_again(auth_etcd, tmp_path):
    access = EtcdAccess(user="rdzv", password_file=_password_file(tmp_path, "rdzv-pw"))
    client = EtcdClient(auth_etcd, request_s=3.0, access=access)
    client.put("/stalwart/t/x", b"1")
    assert client.get("/stalwart/t/x")[0] == b"1"
    assert client.swap("/stalwart/t/x", b"2", client.get("/stalwart/t/x")[1])[0]
    client._token = "not-a-token.1"  # as after etcd dropped it (expired, or its users changed)
    assert client.get("/stalwart/t/x")[0] == b"2"
    assert client._token and client._token != "not-a-token.1"
    with pytest.raises(EtcdAccessError, match="etcd denied user 'rdzv' access"):
        client.get("/elsewhere")  # outside the prefix its role grants


def test_a_wrong_password_or_no_user_is_one_clear_error(auth_etcd, tmp_path):
    access = EtcdAccess(user="rdzv", password_file=_password_file(tmp_path, "wrong"))
    with pytest.raises(EtcdAccessError) as err:
        EtcdClient(auth_etcd, request_s=3.0, access=access).probe()
    said = str(err.value)
    assert "etcd refused user 'rdzv'" in said and "invalid user ID or password" in said, said
    with pytest.raises(EtcdAccessError, match="authentication enabled and this client has no user"):
        EtcdClient(auth_etcd, request_s=3.0).probe()
