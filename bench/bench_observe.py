"""Observability costs: scrape time, step-path overhead of the exporter, dashboard on a 1M-event ledger.

    .venv/bin/python bench/bench_observe.py [--events 1000000] [--repeat N] [--no-browser]

Every figure is printed with a baseline measured in the same run:
- one /metrics scrape (HTTP) of a run with 1,024 ranks vs the same for a 2-rank run;
- the step path (appending StepCompleted events to a ledger, as the agent and SDK do) with an exporter
  following the same run and a scraper at 10 Hz, vs the same loop with metrics off;
- dashboard API latency and first paint (headless Chromium) on a ledger of ~1M events vs ~1k events,
  and how long the server takes to catch up with the big ledger.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from stalwart.events import StepCompleted
from stalwart.ledger import LedgerWriter
from stalwart.serve.dashboard import Dashboard
from stalwart.serve.metrics import MetricsServer, render
from stalwart.serve.synthetic import SyntheticRun, write
from stalwart.serve.watcher import RunWatcher


def median_ms(fn, repeat: int) -> float:
    xs = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        xs.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(xs)


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=60) as r:
        return r.read()


def bench_scrape(tmp: Path, repeat: int) -> None:
    rows = []
    for ranks in (2, 1024):
        d = tmp / f"scrape-{ranks}"
        write(
            d, SyntheticRun(ranks=ranks, steps=25, crash_steps=(12,), checkpoint_every=5, run_id=f"r{ranks}")
        )
        w = RunWatcher(d)
        t0 = time.perf_counter()
        w.refresh()
        snap_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        render(w.snapshot(), time.time())
        render_s = time.perf_counter() - t0
        srv = MetricsServer(w, port=0)
        srv.server.start()  # the endpoint only: no watcher thread polling during the measurement
        body = get(srv.url)
        ms = median_ms(lambda url=srv.url: get(url), repeat)
        series = sum(1 for line in body.decode().splitlines() if line and not line.startswith("#"))
        rows.append((ranks, ms, series, len(body), snap_s, render_s))
        srv.server.stop()
    base = rows[0][1]
    print("\n## one /metrics scrape (HTTP GET, median of", repeat, ")")
    print(
        "| ranks | scrape | x baseline | series | bytes | background: read ledger + snapshot | background: render |"
    )
    print("|---|---|---|---|---|---|---|")
    for ranks, ms, series, size, snap_s, render_s in rows:
        print(
            f"| {ranks:,} | {ms:.2f} ms | x{ms / base:.1f} | {series:,} | {size:,} | {snap_s * 1e3:.0f} ms "
            f"| {render_s * 1e3:.0f} ms |"
        )


def _step_loop(run_dir: Path, steps: int) -> list[float]:
    """What the step path does per step: one durable ledger append per rank-step (2 ranks)."""
    out = []
    with LedgerWriter(run_dir / "ledger" / f"rank-{os.getpid()}-{time.monotonic_ns()}.ledger") as w:
        for s in range(steps):
            t0 = time.perf_counter()
            now = time.time()
            w.append(StepCompleted(ts=now, start=now - 0.01, duration=0.01, step=s, rank=0, run_id="bench"))
            out.append(time.perf_counter() - t0)
    return out


def bench_step_path(tmp: Path, steps: int) -> None:
    d = tmp / "steps"
    write(d, SyntheticRun(ranks=2, steps=10, crash_steps=(), run_id="bench", ended=False))
    results = {}
    for mode in ("off", "on", "off2"):
        srv = stop = None
        if mode == "on":
            srv = MetricsServer(RunWatcher(d, interval_s=0.1), port=0).start()
            stop = threading.Event()

            def scrape(url=srv.url, ev=stop):
                while not ev.wait(0.1):
                    get(url)

            threading.Thread(target=scrape, daemon=True).start()
        xs = _step_loop(d, steps)
        if srv is not None:
            stop.set()
            srv.stop()
        results[mode] = (1e6 * statistics.median(xs), 1e6 * sorted(xs)[int(0.99 * len(xs))])
    off = (results["off"][0] + results["off2"][0]) / 2
    print(f"\n## step path: {steps} ledger appends, exporter polling at 10 Hz + a scraper at 10 Hz")
    print("| metrics | median per step | p99 | x off |")
    print("|---|---|---|---|")
    for mode in ("off", "on", "off2"):
        med, p99 = results[mode]
        label = {"off": "off (before)", "on": "on", "off2": "off (after)"}[mode]
        print(f"| {label} | {med:.0f} us | {p99:.0f} us | x{med / off:.2f} |")


def bench_dashboard(tmp: Path, events: int, repeat: int, browser: bool) -> None:
    ranks = 8
    per_step = ranks + 0.2  # steps + checkpoints/failures, roughly
    steps = int(events / per_step)
    rows = []
    for label, n_steps in (("small", max(20, int(1000 / per_step))), ("big", steps)):
        root = tmp / f"dash-{label}"
        t0 = time.perf_counter()
        write(
            root / "run",
            SyntheticRun(
                ranks=ranks,
                steps=n_steps,
                crash_steps=(n_steps // 3, 2 * n_steps // 3),
                checkpoint_every=50,
                run_id=label,
            ),
            batch=20_000,
        )
        gen_s = time.perf_counter() - t0
        dash = Dashboard(root, token="b" * 24, interval_s=1.0).start()
        t0 = time.perf_counter()
        w = dash.watcher("run")
        while w.loading or not w.snapshot().started:
            time.sleep(0.05)
        ready_s = time.perf_counter() - t0
        n_events = w.snapshot().events
        api_ms = median_ms(lambda url=dash.url + "api/runs/run": get(url), repeat)
        ev_ms = median_ms(
            lambda url=dash.url + "api/runs/run/events?limit=100&kind=FailureDetected": get(url), repeat
        )
        paint = fcp = None
        if browser:
            paint, fcp = first_paint(dash.url + "#/run/run")
        rows.append((label, n_events, gen_s, ready_s, api_ms, ev_ms, paint, fcp))
        dash.stop()
    print("\n## dashboard (run page)")
    print(
        "| ledger | events | write ledger | server caught up | GET /api/runs/ID | GET events?kind= | "
        "page complete (heat map drawn) | first contentful paint |"
    )
    print("|---|---|---|---|---|---|---|---|")
    base = rows[0]
    for label, n, gen_s, ready_s, api_ms, ev_ms, paint, fcp in rows:
        extra = "" if label == "small" else f" (x{api_ms / base[4]:.1f})"
        ptxt = (
            "-"
            if paint is None
            else f"{paint:.0f} ms" + ("" if label == "small" else f" (x{paint / base[6]:.1f})")
        )
        ftxt = "-" if fcp is None else f"{fcp:.0f} ms"
        print(
            f"| {label} | {n:,} | {gen_s:.1f} s | {ready_s:.1f} s | {api_ms:.1f} ms{extra} | {ev_ms:.1f} ms | "
            f"{ptxt} | {ftxt} |"
        )


def first_paint(url: str) -> tuple[float, float]:
    from playwright.sync_api import sync_playwright

    exe = shutil.which("chromium") or "/usr/bin/chromium"
    with sync_playwright() as p:
        b = p.chromium.launch(
            executable_path=exe,
            headless=True,
            args=["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-sync"],
        )
        page = b.new_page(viewport={"width": 1280, "height": 900})
        page.goto("about:blank")
        t0 = time.perf_counter()
        page.goto(url)
        page.wait_for_selector("#heatmap rect")
        done = 1e3 * (time.perf_counter() - t0)
        fcp = page.evaluate("performance.getEntriesByName('first-contentful-paint')[0]?.startTime ?? -1")
        b.close()
    return done, fcp


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--no-browser", action="store_true")
    args = ap.parse_args()
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        bench_scrape(tmp, args.repeat)
        bench_step_path(tmp, args.steps)
        bench_dashboard(tmp, args.events, args.repeat, not args.no_browser)
    print(f"load at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
