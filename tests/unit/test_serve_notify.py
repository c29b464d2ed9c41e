"""Notifications: Alertmanager payloads and run events become Slack/generic messages; delivery never blocks."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request

import pytest

from stalwart.errors import ConfigError
from stalwart.events import DecisionTaken, FailureDetected, JobEnded
from stalwart.serve.notify import Message, Poster, RunNotifier, Target, from_alertmanager
from stalwart.serve.receiver import NotifyReceiver

PAYLOAD = {
    "version": "4",
    "status": "firing",
    "receiver": "stalwart",
    "commonLabels": {"alertname": "StalwartRestartStorm"},
    "alerts": [
        {
            "status": "firing",
            "startsAt": "2026-11-22T23:00:00Z",
            "labels": {
                "alertname": "StalwartRestartStorm",
                "severity": "critical",
                "run": "r1",
                "rank": "1",
                "node": "n1",
                "cause": "crash",
            },
            "annotations": {
                "summary": "run r1: restart storm, latest crash of rank 1 on n1",
                "description": "the latest interruption has cost 42s so far.",
            },
        }
    ],
}


class Recorder:
    def __init__(self, fail_first: int = 0, block: threading.Event | None = None):
        self.calls: list[tuple[str, dict]] = []
        self.fail_first = fail_first
        self.block = block

    def __call__(self, url, body, timeout):
        if self.block is not None:
            self.block.wait(5)
        if self.fail_first > 0:
            self.fail_first -= 1
            raise urllib.error.URLError("refused")
        self.calls.append((url, body))


def test_alertmanager_payload_to_slack_names_run_rank_cause_cost():
    (msg,) = from_alertmanager(PAYLOAD)
    body = msg.slack()
    assert set(body) == {"text", "blocks"}
    for needle in ("StalwartRestartStorm", "r1", "rank 1", "crash", "42s"):
        assert needle in body["text"]
    assert body["blocks"][0]["type"] == "section"
    assert msg.generic()["fields"]["cause"] == "crash"


@pytest.mark.parametrize("bad", [{}, {"alerts": "x"}, {"alerts": [1]}])
def test_malformed_payloads_are_refused(bad):
    with pytest.raises(ConfigError):
        from_alertmanager(bad)


def test_poster_retries_then_delivers_and_counts_failures():
    rec = Recorder(fail_first=2)
    p = Poster([Target("http://x", "slack")], retries=2, backoff_s=0.0, send=rec)
    p.post(Message("t", ()))
    p.close(5)
    assert len(rec.calls) == 1 and p.sent == 1 and p.failed == 0
    rec2 = Recorder(fail_first=10)
    p2 = Poster([Target("http://x", "slack")], retries=1, backoff_s=0.0, send=rec2)
    p2.post(Message("t", ()))
    p2.close(5)
    assert p2.failed == 1 and "refused" in p2.last_error


def test_a_full_queue_drops_instead_of_blocking():
    gate = threading.Event()
    p = Poster([Target("http://x", "slack")], maxsize=2, send=Recorder(block=gate))
    results = [p.post(Message(str(i), ())) for i in range(6)]
    assert results.count(False) >= 3 and p.dropped == results.count(False)
    gate.set()
    p.close(5)


def test_run_notifier_names_the_cause_and_the_verdict():
    rec = Recorder()
    n = RunNotifier([], poster=Poster([Target("http://x", "generic")], send=rec))
    ctx = {"run_id": "r9", "node": "n2"}
    n(FailureDetected(ts=10.0, rank=1, failure="peer_lost", evidence="peer", onset=9.0, **ctx))
    n(
        FailureDetected(
            ts=10.1, rank=3, failure="crash", evidence="rank 3 exited with SIGKILL", onset=9.5, step=40, **ctx
        )
    )
    n(
        DecisionTaken(
            ts=11.0,
            action="restart",
            reason="restart: 1 of 3 used",
            restarts_used=1,
            restarts_allowed=3,
            **ctx,
        )
    )
    n(
        JobEnded(
            ts=20.0,
            verdict="finished after 1 restart",
            outcome="succeeded",
            exit_code=0,
            requeue_helps=False,
            **ctx,
        )
    )
    n.close(5)
    first, second = (body for _, body in rec.calls)
    assert "crash of rank 3 on n2 at step 40 -> restart" in first["title"]
    assert first["fields"]["cost so far"].startswith("1.5s")
    assert second["fields"]["outcome"] == "succeeded" and second["fields"]["restarts"] == 1


def test_target_parse_refuses_non_http():
    assert Target.parse("generic:http://h/x") == Target("http://h/x", "generic")
    with pytest.raises(ConfigError):
        Target.parse("ftp://h")


TOKEN = "notify-test-token-0123456789"


def _post(url: str, data: bytes, headers: dict[str, str] | None = None) -> tuple[int, dict]:
    req = urllib.request.Request(
        url, data=data, method="POST", headers={"Content-Type": "application/json", **(headers or {})}
    )
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


AUTH = {"Authorization": f"Bearer {TOKEN}"}


def test_receiver_forwards_and_refuses_bad_bodies(caplog):
    rec = Recorder()
    r = NotifyReceiver([], token=TOKEN, poster=Poster([Target("http://sink", "slack")], send=rec)).start()
    try:
        assert _post(r.url, json.dumps(PAYLOAD).encode(), AUTH)[0] == 202
        code, body = _post(r.url, b"{not json", AUTH)
        assert code == 400 and "not an Alertmanager" in body["error"]
        assert _post(r.url, b"[]", AUTH)[0] == 400
    finally:
        r.stop()
    assert rec.calls and "restart storm" in rec.calls[0][1]["text"]


def test_an_unauthenticated_or_misdirected_post_is_refused_and_nothing_is_forwarded():
    rec = Recorder()
    r = NotifyReceiver([], token=TOKEN, poster=Poster([Target("http://sink", "slack")], send=rec)).start()
    body = json.dumps(PAYLOAD).encode()
    try:
        assert _post(r.url, body)[0] == 401
        assert _post(r.url, body, {"Authorization": "Bearer wrong-token-0123456789"})[0] == 403
        assert _post(r.url.replace("/alertmanager", "/anything"), body, AUTH)[0] == 404
        assert r.received == 0
    finally:
        r.stop()
    assert rec.calls == []


@pytest.mark.parametrize(
    "bad",
    [
        {**PAYLOAD, "status": 5},
        {**PAYLOAD, "alerts": [{**PAYLOAD["alerts"][0], "labels": ["a", "b"]}]},
        {**PAYLOAD, "alerts": [{**PAYLOAD["alerts"][0], "status": "exploded"}]},
        {**PAYLOAD, "commonLabels": {"alertname": 7}},
    ],
)
def test_a_malformed_alert_is_one_logged_error_and_a_400(bad, caplog):
    rec = Recorder()
    r = NotifyReceiver([], token=TOKEN, poster=Poster([Target("http://sink", "slack")], send=rec)).start()
    try:
        with caplog.at_level("ERROR", logger="stalwart.notify"):
            code, body = _post(r.url, json.dumps(bad).encode(), AUTH)
        assert code == 400 and body["error"].startswith("not an Alertmanager webhook payload: ")
        assert [rec.levelname for rec in caplog.records if rec.name == "stalwart.notify"] == ["ERROR"]
        assert _post(r.url, json.dumps(PAYLOAD).encode(), AUTH)[0] == 202  # still serving
    finally:
        r.stop()


def test_slack_control_syntax_from_an_alert_is_escaped():
    hostile = {
        **PAYLOAD,
        "alerts": [
            {
                **PAYLOAD["alerts"][0],
                "annotations": {
                    "summary": "<!channel> wake up",
                    "description": "see <https://evil.example|the runbook> & <@U123>",
                },
                "labels": {**PAYLOAD["alerts"][0]["labels"], "node": "<!here>"},
            }
        ],
    }
    (msg,) = from_alertmanager(hostile)
    text = json.dumps(msg.slack())
    for raw in ("<!channel>", "<!here>", "<https://", "<@U123>", " & "):
        assert raw not in text
    assert "&lt;!channel&gt; wake up" in text and "&lt;https://evil.example|the runbook&gt; &amp;" in text


def test_the_webhook_url_never_reaches_healthz_or_the_log(caplog):
    secret = "http://127.0.0.1:9/services/T000/B000/sEcReTtOkEn"  # port 9: refused at once

    r = NotifyReceiver(
        [], token=TOKEN, poster=Poster([Target(secret, "slack")], retries=0, backoff_s=0.0)
    ).start()
    try:
        with caplog.at_level("WARNING", logger="stalwart.notify"):
            assert _post(r.url, json.dumps(PAYLOAD).encode(), AUTH)[0] == 202
            r.poster.close(10)
        with urllib.request.urlopen(r.url.replace("/alertmanager", "/healthz"), timeout=5) as resp:
            health = json.loads(resp.read())
    finally:
        r.stop()
    assert health["failed"] == 1 and health["last_error"].startswith("http://127.0.0.1:9/...")
    assert "sEcReTtOkEn" not in json.dumps(health) and "sEcReTtOkEn" not in caplog.text
    assert "sEcReTtOkEn" not in repr(Target(secret, "slack")) + str(Target(secret, "slack"))


def test_a_target_style_is_slack_or_generic_and_picks_the_body():
    from stalwart.serve.notify import Severity, TargetStyle

    assert Target("http://h/x", "generic").style is TargetStyle.GENERIC
    with pytest.raises(ValueError):
        Target("http://h/x", "teams")
    msg = Message("disk full", ("node n1",), Severity.CRITICAL)
    assert msg.body(TargetStyle.SLACK)["blocks"][0]["text"]["text"] == ":rotating_light: *disk full*"
    generic = json.loads(json.dumps(msg.body(TargetStyle.GENERIC)))
    assert generic["severity"] == "critical" and generic["text"] == "disk full\nnode n1"
