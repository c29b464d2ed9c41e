"""The dashboard in real headless Chromium (Playwright): every page renders without console errors,
live steps and a new incident appear without a reload, a corrupt ledger shows a banner, and the
"live" badge goes off on a finished job's page.

Screenshots go to tests/artifacts/dashboard/ (git-ignored; STALWART_TEST_ARTIFACTS overrides); the test
prints the directory.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
from pathlib import Path

import pytest

from stalwart.events import AttemptStarted, DecisionTaken, FailureDetected, JobStarted, StepCompleted
from stalwart.ledger import LedgerWriter
from stalwart.serve.dashboard import Dashboard
from stalwart.serve.synthetic import SyntheticRun, write

pytestmark = pytest.mark.integration
CHROMIUM = "/usr/bin/chromium"
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
TOKEN = "k" * 24


def artifacts() -> Path:
    d = Path(os.environ.get("STALWART_TEST_ARTIFACTS", Path(__file__).parents[1] / "artifacts")) / "dashboard"
    d.mkdir(parents=True, exist_ok=True)
    return d


@pytest.fixture
def browser():
    if not Path(CHROMIUM).exists() and shutil.which("chromium") is None:
        pytest.skip("chromium is not installed (Debian package chromium; .ci/run installs it)")
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="playwright is not installed (pip install -e .[dev])"
    )
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=shutil.which("chromium") or CHROMIUM, headless=True, args=ARGS)
        yield b
        b.close()


def _page(browser, errors: list[str], width: int = 1280):
    page = browser.new_page(viewport={"width": width, "height": 900})
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    return page


def test_every_page_renders_and_live_updates_arrive(browser, tmp_path):
    out = artifacts()
    print(f"\nscreenshots: {out}")
    write(
        tmp_path / "finished",
        SyntheticRun(ranks=8, steps=120, crash_steps=(35, 80), straggler_rank=5, run_id="finished"),
    )
    (tmp_path / "broken" / "ledger").mkdir(parents=True)
    con = sqlite3.connect(tmp_path / "broken" / "ledger" / "agent-x.ledger")
    con.execute("CREATE TABLE stray (x)")
    con.commit()
    con.close()
    os.utime(
        tmp_path / "broken" / "ledger" / "agent-x.ledger", (1e9, 1e9)
    )  # an old stray file, not one being created
    live = LedgerWriter(tmp_path / "live" / "ledger" / "agent-n0.ledger")
    ctx = {"run_id": "live", "node": "n0"}
    t0 = 1_800_000_000.0
    live.extend(
        [
            JobStarted(ts=t0, script="train.py", nproc_per_node=2, **ctx),
            AttemptStarted(ts=t0 + 0.1, attempt=0, world_size=2, **ctx),
        ]
    )

    def steps(first: int, n: int, attempt: int = 0) -> None:
        live.extend(
            StepCompleted(
                ts=t0 + 1 + 0.1 * (s + 1),
                start=t0 + 1 + 0.1 * s,
                duration=0.1,
                step=s,
                rank=r,
                attempt=attempt,
                sections={"forward": 0.08},
                **ctx,
            )
            for s in range(first, first + n)
            for r in range(2)
        )

    steps(0, 10)
    dash = Dashboard(tmp_path, token=TOKEN, interval_s=0.2).start()
    errors: list[str] = []
    try:
        page = _page(browser, errors)
        page.goto(dash.login_url)  # the API needs the token: the login URL sets its cookie
        page.goto(dash.url + "#/")
        page.wait_for_selector("#runs tr[data-run=finished]")
        page.wait_for_selector("#runs tr[data-run=finished] .pill.succeeded")
        page.wait_for_selector("#runs tr[data-run=live] .pill.running")
        page.wait_for_selector("#runs tr[data-run=broken] .pill.bad")
        page.screenshot(path=str(out / "jobs.png"), full_page=True)

        page.goto(dash.url + "#/run/finished")
        page.wait_for_selector("#heatmap rect")
        page.wait_for_selector("#incidents tr.incident")
        assert page.locator("#incidents tr.incident").count() == 2
        assert page.locator("#goodput-chart polyline").count() == 1
        page.wait_for_selector("#live.ended")  # a finished job's page: the badge is off, not "live"
        assert page.inner_text("#live") == "ended"
        page.screenshot(path=str(out / "job-finished.png"), full_page=True)

        page.goto(dash.url + "#/nodes")
        page.wait_for_selector("#nodes tr.node")
        page.screenshot(path=str(out / "nodes.png"), full_page=True)

        page.goto(dash.url + "#/run/broken")
        page.wait_for_selector("#banner:not([hidden])")
        assert "not a Stalwart ledger" in page.inner_text("#banner")
        page.screenshot(path=str(out / "job-broken.png"), full_page=True)

        # live: no reload between the first view and the updates (a marker on window survives)
        page.goto(dash.url + "#/run/live")
        page.wait_for_function(
            "document.querySelector('#steps') && document.querySelector('#steps').textContent == '10'"
        )
        page.evaluate("window.__noReload = 1")
        assert page.inner_text("#live") == "live" and page.locator("#live.ended").count() == 0
        assert page.locator("#no-incidents").count() == 1
        steps(10, 15)
        page.wait_for_function("document.querySelector('#steps').textContent == '25'")
        onset = t0 + 1 + 2.5 + 0.05
        live.extend(
            [
                FailureDetected(
                    ts=onset + 0.4,
                    rank=1,
                    failure="crash",
                    onset=onset,
                    step=24,
                    evidence="rank 1 exited with SIGKILL",
                    exit_code=-9,
                    **ctx,
                ),
                DecisionTaken(ts=onset + 0.5, action="restart", reason="restart: 1 of 3 used", **ctx),
            ]
        )
        page.wait_for_selector("#incidents tr.incident")
        assert "crash" in page.inner_text("#incidents")
        assert page.evaluate("window.__noReload") == 1
        page.screenshot(path=str(out / "job-live.png"), full_page=True)

        narrow = _page(browser, errors, width=390)  # a phone-width / narrow laptop window
        narrow.goto(dash.login_url)
        narrow.goto(dash.url + "#/run/finished")
        narrow.wait_for_selector("#heatmap rect")
        narrow.screenshot(path=str(out / "job-narrow.png"), full_page=True)
    finally:
        dash.stop()
        live.close()
    assert errors == []
