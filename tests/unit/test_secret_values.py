"""Secrets stay secret: webhook URLs are shown as scheme and host only, secret files must be private."""

from __future__ import annotations

import json
import os

import pytest

from stalwart.errors import ConfigError
from stalwart.secret_values import read_secret_file, read_url_file, redact_url, scrub
from stalwart.settings.schema import ObserveSettings

HOOK = "https://hooks.slack.com/services/T0/B0/sEcReT"


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (HOOK, "https://hooks.slack.com/..."),
        ("generic:http://user:pw@ops.example:8080/hook?k=sEcReT", "generic:http://ops.example:8080/..."),
        ("http://[::1]:9/x", "http://[::1]:9/..."),
        ("http://h:notaport/x", "<unparsable URL>"),
    ],
)
def test_a_url_is_redacted_to_scheme_and_host(url, shown):
    assert redact_url(url) == shown


def test_scrub_replaces_the_url_inside_a_message():
    assert scrub(f"POST {HOOK} failed", [HOOK]) == "POST https://hooks.slack.com/... failed"


def test_the_saved_configuration_keeps_only_scheme_and_host(tmp_path):
    s = ObserveSettings(notify=[HOOK, "generic:http://ops/hook/sEcReT"])
    dumped = json.dumps(s.model_dump(mode="json"))
    assert "sEcReT" not in dumped and "https://hooks.slack.com/..." in dumped
    assert s.notify_urls()[0] == HOOK  # the run itself still has the URL


def test_a_secret_file_readable_by_others_is_refused_with_the_fix(tmp_path):
    f = tmp_path / "hooks"
    f.write_text(f"# team channel\n{HOOK}\n\n")
    f.chmod(0o644)
    with pytest.raises(ConfigError, match="others could read it") as err:
        read_secret_file(f, "--notify")
    assert err.value.hint == f"run `chmod 600 {f}`"
    f.chmod(0o600)
    assert read_url_file(f, "--notify") == [HOOK]
    assert ObserveSettings(notify_file=f).notify_urls() == [HOOK]


def test_an_empty_or_missing_or_linked_secret_file_is_refused(tmp_path):
    empty = tmp_path / "empty"
    empty.write_text("\n")
    empty.chmod(0o600)
    with pytest.raises(ConfigError, match="empty"):
        read_secret_file(empty, "--token")
    with pytest.raises(ConfigError, match="cannot read"):
        read_secret_file(tmp_path / "nope", "--token")
    (tmp_path / "link").symlink_to(empty)
    with pytest.raises(ConfigError, match="cannot read"):
        read_secret_file(tmp_path / "link", "--token")


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_a_secret_file_of_another_user_is_refused(tmp_path):
    f = tmp_path / "token"
    f.write_text("t" * 24)
    f.chmod(0o600)
    os.chown(f, 65534, 65534)
    with pytest.raises(ConfigError, match="owned by uid 65534"):
        read_secret_file(f, "--token")
