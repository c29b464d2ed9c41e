"""Dashboard JSON API: answers from snapshots, refuses bad input with 4xx, writes only with the token."""

from __future__ import annotations

import json
import os
import sqlite3
import urllib.error
import urllib.request

import pytest

from stalwart.errors import ConfigError
from stalwart.serve.dashboard import Dashboard
from stalwart.serve.synthetic import SyntheticRun, write

TOKEN = "t" * 24


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("runs")


@pytest.fixture(scope="module")
def dash(root):
    tmp_path = root
    write(tmp_path / "good", SyntheticRun(crash_steps=(15,), run_id="good"))
    (tmp_path / "broken" / "ledger").mkdir(parents=True)
    con = sqlite3.connect(tmp_path / "broken" / "ledger" / "agent-x.ledger")
    con.execute("CREATE TABLE stray (x)")
    con.commit()
    con.close()
    os.utime(
        tmp_path / "broken" / "ledger" / "agent-x.ledger", (1e9, 1e9)
    )  # an old stray file, not one being created
    d = Dashboard(tmp_path, token=TOKEN, interval_s=0.05).start()
    for run in ("good", "broken"):
        d.watcher(run).refresh()
    yield d
    d.stop()


def call(
    d: Dashboard,
    path: str,
    *,
    data: bytes | None = None,
    token: str | None = None,
    cookie: str | None = TOKEN,
    host: str | None = None,
):
    """GET (or POST ``data``); reads carry the login cookie unless ``cookie=None``."""
    req = urllib.request.Request(
        d.url.rstrip("/") + path, data=data, method="POST" if data is not None else "GET"
    )
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    if cookie is not None and data is None:
        req.add_header("Cookie", f"stalwart_dashboard={cookie}")
    if host is not None:
        req.add_header("Host", host)
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_runs_and_run_detail(dash):
    code, body = call(dash, "/api/runs")
    runs = {r["id"]: r for r in json.loads(body)["runs"]}
    assert code == 200 and set(runs) == {"good", "broken"}
    code, body = call(dash, "/api/runs/good")
    run = json.loads(body)
    assert run["outcome"] == "succeeded" and len(run["interruptions"]) == 1 and run["ranks"][1]["heat"]


@pytest.mark.parametrize(
    "path, code, needle",
    [
        ("/api/runs/good/events?limit=abc", 400, "must be an integer"),
        ("/api/runs/good/events?limit=0", 400, "between 1 and 1000"),
        ("/api/runs/good/events?bogus=1", 400, "unknown query parameter"),
        ("/api/runs/good/events?kind=%3Cscript%3E", 400, "event kind"),
        ("/api/runs/good/events?limit=1&limit", 400, "malformed query string"),
        ("/api/runs/nope", 404, "no run"),
        ("/api/runs/..%2F..%2Fetc", 400, "not valid"),
        ("/static/..%2F..%2Fdashboard.py", 404, "no asset"),
        ("/api/whatever", 404, "no GET endpoint"),
        ("/nowhere", 404, "no page"),
    ],
)
def test_bad_requests_get_4xx_with_a_message(dash, path, code, needle):
    got, body = call(dash, path)
    assert got == code
    assert needle in json.loads(body)["error"]


def test_events_page_filters_by_kind(dash):
    code, body = call(dash, "/api/runs/good/events?kind=FailureDetected&limit=5")
    data = json.loads(body)
    assert code == 200 and data["total"] == 1 and data["events"][0]["failure"] == "crash"


def test_writes_need_the_token(dash, root):
    tmp_path = root
    note = json.dumps({"text": "rank 1 node swapped"}).encode()
    assert call(dash, "/api/runs/good/annotations", data=note)[0] == 401
    assert call(dash, "/api/runs/good/annotations", data=note, token="x" * 24)[0] == 403
    assert not (tmp_path / "good" / "annotations.jsonl").exists()
    assert call(dash, "/api/runs/good/annotations", data=b"{}", token=TOKEN)[0] == 400
    assert call(dash, "/api/runs/good/annotations", data=note, token=TOKEN)[0] == 201
    assert (tmp_path / "good" / "annotations.jsonl").stat().st_mode & 0o777 == 0o600
    code, body = call(dash, "/api/runs/good/annotations")
    assert [a["text"] for a in json.loads(body)["annotations"]] == ["rank 1 node swapped"]


def test_reads_need_the_token_as_a_header_or_the_login_cookie(dash):
    code, body = call(dash, "/api/runs", cookie=None)
    assert code == 401 and "/login?token=" in json.loads(body)["error"]
    assert call(dash, "/api/runs", cookie="x" * 24)[0] == 403
    assert call(dash, "/api/runs", cookie=None, token=TOKEN)[0] == 200
    assert call(dash, "/", cookie=None)[0] == 200  # the page itself holds no data


def test_the_login_url_sets_a_strict_http_only_cookie_and_a_wrong_token_does_not(dash):
    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):
            return None

    opener = urllib.request.build_opener(NoRedirect)
    with pytest.raises(urllib.error.HTTPError) as got:
        opener.open(dash.login_url, timeout=5)
    assert got.value.code == 303 and got.value.headers["Location"] == "/"
    cookie = got.value.headers["Set-Cookie"]
    assert (
        cookie.startswith(f"stalwart_dashboard={TOKEN};")
        and "HttpOnly" in cookie
        and "SameSite=Strict" in cookie
    )
    assert call(dash, "/login?token=" + "x" * 24, cookie=None)[0] == 403


def test_a_write_with_only_the_cookie_is_refused(dash, root):
    note = json.dumps({"text": "from another site"}).encode()
    req = urllib.request.Request(dash.url + "api/runs/good/annotations", data=note, method="POST")
    req.add_header("Cookie", f"stalwart_dashboard={TOKEN}")
    with pytest.raises(urllib.error.HTTPError) as got:
        urllib.request.urlopen(req, timeout=5)
    assert got.value.code == 401


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8470", "127.0.0.1.evil.example"])
def test_a_foreign_host_header_is_refused_dns_rebinding(dash, host):
    code, body = call(dash, "/api/runs", host=host)
    assert code == 403 and "rebound DNS name" in json.loads(body)["error"]
    assert call(dash, "/", host=host)[0] == 403


@pytest.mark.parametrize("host", ["localhost:8470", "127.0.0.1", "[::1]:8470"])
def test_loopback_host_names_are_accepted(dash, host):
    assert call(dash, "/api/runs", host=host)[0] == 200


def test_a_corrupt_ledger_is_an_error_field_not_a_500(dash):
    code, body = call(dash, "/api/runs/broken")
    assert code == 200
    assert "not a Stalwart ledger" in json.loads(body)["error"]


def test_the_page_and_its_assets_come_from_the_package(dash):
    code, body = call(dash, "/")
    assert (
        code == 200
        and b"/static/app.js" in body
        and b"http" not in body.split(b"<body>")[1].split(b"</body>")[0]
    )
    for asset in ("app.js", "style.css"):
        assert call(dash, f"/static/{asset}")[0] == 200


def test_a_short_token_is_refused(tmp_path):
    with pytest.raises(ConfigError):
        Dashboard(tmp_path, token="short")
