"""Observability commands and wiring: bad input is one line + exit 2; scrapes never wait on the ledger;
file_sd targets under Slurm; the notifier chained after the console never raises into the agent."""

from __future__ import annotations

import json
import threading
import urllib.request

import pytest

from stalwart import cli
from stalwart.events import JobEnded
from stalwart.serve.attach import Observability
from stalwart.serve.exporter import RunExporter
from stalwart.serve.file_sd import slurm_labels
from stalwart.serve.metrics import MetricsServer
from stalwart.serve.synthetic import SyntheticRun, write
from stalwart.serve.watcher import RunWatcher
from stalwart.settings.run_config import build


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["metrics", "serve", "/nonexistent/run"], "does not exist"),
        (["metrics", "serve", ".", "--port", "70000"], "not a TCP port"),
        (["dashboard", "/nonexistent/dir"], "is not a directory"),
        (["dashboard", ".", "--token", "short"], "at least 16 characters"),
        (["notify", "serve"], "no notification target"),
        (["notify", "serve", "--slack", "ftp://x"], "not http(s)"),
        (["run", "--notify", "ftp://x", "-m", "x"], "is not http(s)"),
        (["run", "--metrics-port", "-1", "-m", "x"], "metrics_port"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv, needle, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("STALWART_RUN_DIR", str(tmp_path / "run"))
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2
    assert err.startswith("stalwart: error:") and needle in err and "\n" not in err


def test_a_scrape_never_waits_for_the_ledger(tmp_path):
    write(tmp_path, SyntheticRun(steps=10, crash_steps=()))
    w = RunWatcher(tmp_path, interval_s=0.01)
    w.refresh()
    release = threading.Event()
    reading = threading.Event()
    real_poll = w.tail.poll

    def stuck_poll():  # a ledger read that does not return (slow disk, huge ledger)
        reading.set()
        release.wait(30)
        return real_poll()

    w.tail.poll = stuck_poll
    srv = MetricsServer(w, port=0).start()
    try:
        assert reading.wait(5)
        with urllib.request.urlopen(srv.url, timeout=5) as r:
            assert b'stalwart_steps_completed{run="synthetic"} 10.0' in r.read()
    finally:
        release.set()
        srv.stop()


def test_file_sd_target_under_slurm(tmp_path):
    assert slurm_labels({}) is None
    env = {"SLURM_JOB_ID": "4242", "SLURMD_NODENAME": "node3", "SLURM_JOB_NAME": "llm"}
    write(tmp_path / "run", SyntheticRun(steps=5, crash_steps=()))
    exp = RunExporter(tmp_path / "run", port=0, file_sd_dir=tmp_path / "sd", env=env)
    try:
        (target,) = json.loads(exp.sd_path.read_text())
        assert exp.sd_path.name == "stalwart-4242-node3.json"
        assert target["targets"] == [f"127.0.0.1:{exp.server.address[1]}"]
        assert target["labels"] == {"slurm_job_id": "4242", "slurm_node": "node3", "slurm_job_name": "llm"}
    finally:
        exp.stop()
    assert not exp.sd_path.exists()


def test_the_notifier_never_raises_into_the_agent(tmp_path):
    cfg = build({"script": "x", "module": True, "run_dir": tmp_path, "notify": ["http://127.0.0.1:9/hook"]})
    obs = Observability.from_config(cfg, say=lambda s: None)
    seen = []
    chained = obs.chain(seen.append)
    obs.notifier.poster.backoff_s = 0.0
    obs.notifier.poster._send = lambda *a: (_ for _ in ()).throw(OSError("connection refused"))
    chained(JobEnded(ts=1.0, verdict="v", outcome="succeeded", exit_code=0, requeue_helps=False))
    obs.stop()
    assert len(seen) == 1 and obs.notifier.poster.failed == 1
