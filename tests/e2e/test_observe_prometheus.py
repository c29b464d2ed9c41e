"""A chaos run under ``stalwart run --metrics-port`` scraped by a real Prometheus; its crash storm fires
the shipped restart-storm rule, a real Alertmanager delivers it to ``stalwart notify serve``, which
posts a Slack-format message to a sink on loopback.

Skipped, with the reason, only when the Debian binaries are missing (.ci/run installs them).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from netutil import free_ports
from stalwart.account.report import build as build_report
from stalwart.events import DecisionTaken
from stalwart.serve.rules import rules_path

from .runner import EXAMPLE, events, stalwart

pytestmark = pytest.mark.e2e
SCRAPE_S = 1.0
WATCH_S = 1.0  # the exporter's ledger poll interval (its default)
CRASHES = {8: 1, 16: 0, 24: 1}  # step -> rank: three restarts in a young job = a storm
RUN_ID = "obs-e2e"
TOKENS_PER_STEP = 4096.0
MODEL = f"params=2e5,layers=2,heads=4,head_dim=16,seq_len=64,tokens_per_step={TOKENS_PER_STEP:g},gpus=2,device=h100"


def _bin(*names: str) -> str:
    for n in names:
        if shutil.which(n):
            return shutil.which(n)
    pytest.skip(f"{' / '.join(names)} not installed (Debian packages prometheus, prometheus-alertmanager)")


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.loads(r.read())


def _wait(pred, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            got = pred()
        except OSError:
            got = None
        if got:
            return got
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


class Sink:
    """A stand-in for Slack: records every JSON body posted to it."""

    def __init__(self) -> None:
        self.bodies: list[dict] = []
        sink = self

        class H(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                n = int(self.headers.get("Content-Length", "0"))
                sink.bodies.append(json.loads(self.rfile.read(n)))
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *a):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/hook"


@pytest.fixture
def stack(tmp_path):
    prom_bin = _bin("prometheus")
    am_bin = _bin("prometheus-alertmanager", "alertmanager")
    metrics, prom, am, rx = free_ports(4)
    sink = Sink()
    token = tmp_path / "notify-token"  # Alertmanager authenticates to the receiver with it
    token.write_text("e2e-notify-token-0123456789\n")
    token.chmod(0o600)
    (tmp_path / "am.yml").write_text(
        json.dumps(
            {
                "route": {
                    "receiver": "stalwart",
                    "group_by": ["alertname", "run"],
                    "group_wait": "1s",
                    "group_interval": "1s",
                    "repeat_interval": "1h",
                },
                "receivers": [
                    {
                        "name": "stalwart",
                        "webhook_configs": [
                            {
                                "url": f"http://127.0.0.1:{rx}/alertmanager",
                                "send_resolved": False,
                                "http_config": {
                                    "authorization": {"type": "Bearer", "credentials_file": str(token)}
                                },
                            }
                        ],
                    }
                ],
            }
        )
    )
    (tmp_path / "prom.yml").write_text(
        json.dumps(
            {
                "global": {"scrape_interval": f"{SCRAPE_S:g}s", "evaluation_interval": "1s"},
                "rule_files": [str(rules_path())],
                "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{am}"]}]}]},
                "scrape_configs": [
                    {"job_name": "stalwart", "static_configs": [{"targets": [f"127.0.0.1:{metrics}"]}]}
                ],
            }
        )
    )
    procs = [
        subprocess.Popen(
            [
                *(sys.executable, "-m", "stalwart.cli", "notify", "serve", "--slack", sink.url),
                *("--token-file", str(token), "--port", str(rx)),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        ),
        subprocess.Popen(
            [
                am_bin,
                f"--config.file={tmp_path / 'am.yml'}",
                f"--storage.path={tmp_path / 'am'}",
                f"--web.listen-address=127.0.0.1:{am}",
                "--cluster.listen-address=",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        ),
        subprocess.Popen(
            [
                prom_bin,
                f"--config.file={tmp_path / 'prom.yml'}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{prom}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        ),
    ]
    base = f"http://127.0.0.1:{prom}"
    try:
        _wait(
            lambda: urllib.request.urlopen(f"{base}/-/ready", timeout=2).status == 200, 60, "Prometheus ready"
        )
        _wait(
            lambda: urllib.request.urlopen(f"http://127.0.0.1:{am}/-/ready", timeout=2).status == 200,
            60,
            "Alertmanager ready",
        )
        # the scrape loop runs once the target has been tried (first scrape comes 5-10 s after start)
        _wait(
            lambda: any(
                t["health"] != "unknown" for t in _get(f"{base}/api/v1/targets")["data"]["activeTargets"]
            ),
            60,
            "Prometheus' first scrape attempt",
        )
        yield {"prom": base, "metrics_port": metrics, "sink": sink, "tmp": tmp_path}
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        sink.httpd.shutdown()


def _query(base: str, q: str) -> list[dict]:
    data = _get(f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": q}))
    assert data["status"] == "success", data
    return data["data"]["result"]


def test_prometheus_sees_what_the_report_says_and_a_storm_reaches_slack(stack):
    run_dir: Path = stack["tmp"] / "run"
    chaos = [f"--chaos=crash@rank={r},step={s}" for s, r in CRASHES.items()]
    run = stalwart(
        "run",
        "-q",
        "--nproc-per-node",
        "2",
        "--max-restarts",
        "5",
        # the default hang floor (10 s): the job has crashes only, and beside a CPU hog a worker's full
        # garbage collection (0.19 s quiet at step 41) stretched past a 2 s floor into a restart for "hang"
        "--run-id",
        RUN_ID,
        "--run-dir",
        str(run_dir),
        "--metrics-port",
        str(stack["metrics_port"]),
        "--metrics-model",
        MODEL,
        *chaos,
        *EXAMPLE,
        "--steps",
        "50",
        "--checkpoint-every",
        "4",
    )
    assert run.code == 0, run.err + run.out
    rep = build_report(run_dir)
    base = stack["prom"]

    # restarts and interruptions by cause: exactly the report's
    restarts = {
        r["metric"]["cause"]: float(r["value"][1])
        for r in _query(base, f'last_over_time(stalwart_restarts_total{{run="{RUN_ID}"}}[10m])')
    }
    decided = sum(1 for e in events(run_dir, DecisionTaken) if e.action == "restart")
    assert restarts == {"crash": float(decided)} and decided == len(CRASHES)
    ints = {
        r["metric"]["cause"]: float(r["value"][1])
        for r in _query(base, f'last_over_time(stalwart_interruptions_total{{run="{RUN_ID}"}}[10m])')
    }
    assert ints == {k: float(v) for k, v in Counter(i["failure"] for i in rep["interruptions"]).items()}

    # goodput: the last scrape was taken at most one scrape (+ one ledger poll) before the job ended;
    # goodput = productive / wall moves by at most dt / wall in dt seconds
    (g,) = _query(base, f'last_over_time(stalwart_goodput_ratio{{run="{RUN_ID}"}}[10m])')
    (w,) = _query(base, f'last_over_time(stalwart_job_wall_seconds{{run="{RUN_ID}"}}[10m])')
    lag = rep["wall_s"] - float(w["value"][1])
    print(
        f"\nreport goodput {rep['goodput']:.4f}, Prometheus {float(g['value'][1]):.4f}, "
        f"wall {rep['wall_s']:.1f}s, exported wall lags by {lag:.2f}s"
    )
    assert -0.01 <= lag <= SCRAPE_S + WATCH_S + 1.0
    assert abs(float(g["value"][1]) - rep["goodput"]) <= (SCRAPE_S + WATCH_S + 1.0) / rep["wall_s"]

    # tokens/s and MFU from --metrics-model: the report's ideal step time through the account functions
    from stalwart.account.mfu import mfu_from_step, parse_model_spec

    spec = parse_model_spec(MODEL)
    (tps,) = _query(base, f'last_over_time(stalwart_tokens_per_second{{run="{RUN_ID}"}}[10m])')
    (mfu,) = _query(base, f'last_over_time(stalwart_mfu_ratio{{run="{RUN_ID}"}}[10m])')
    ideal = float(TOKENS_PER_STEP) / float(tps["value"][1])
    print(
        f"tokens/s {float(tps['value'][1]):.1f} (ideal step {ideal:.4f}s), MFU {float(mfu['value'][1]):.3e}"
    )
    assert ideal == pytest.approx(rep["ideal_step_s"], rel=1e-6)  # the final scrape saw every step
    assert float(mfu["value"][1]) == pytest.approx(
        mfu_from_step(spec.dims, TOKENS_PER_STEP, ideal, spec.num_gpus, spec.peak_flops_per_gpu), rel=1e-6
    )

    # every ledger file was read (none skipped as unreadable) at every scrape
    errs = _query(base, f'max_over_time(stalwart_ledger_error{{run="{RUN_ID}"}}[10m])')
    assert [float(e["value"][1]) for e in errs] == [0.0]

    # the storm: Prometheus -> Alertmanager -> stalwart notify serve -> the Slack sink
    sink = stack["sink"]
    _wait(
        lambda: any("StalwartRestartStorm" in b.get("text", "") for b in sink.bodies),
        60,
        "the restart-storm alert at the Slack sink",
    )
    body = next(b for b in sink.bodies if "StalwartRestartStorm" in b["text"])
    print("slack message:", body["text"])
    assert set(body) == {"text", "blocks"}
    text = body["text"]
    assert RUN_ID in text and "crash" in text and "cost" in text
    last = rep["interruptions"][-1]
    assert f"rank {last['rank']}" in text
