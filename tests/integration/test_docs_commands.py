"""Every shell command in the docs' code blocks runs, as a new user would type it.

A code block without a language, or marked bash/sh/shell/console, holds commands: each of its lines
(``\\`` continuations joined, trailing ``# comments`` dropped, a leading ``$ `` removed) must have an
entry in ``ENTRIES`` below. An entry gives the command as the page writes it, the command the test
runs (``None``: exactly as written) and, when they differ, the reason. Synopses (``[--flag]``,
``RUN_DIR``) run as an instance with the options they show. Servers run until they answered one real
request, then get SIGINT and must exit 0. Diagrams and output belong in ```text blocks. A shell
block that starts with ``#!`` is a whole script, shown to be copied, not typed: it must be a copy of a
file shipped in ``src/stalwart/examples`` (the tests run that file).

The commands share one small run (the observability page's ``stalwart run --metrics-port``), made
once per module. A command added to a page without an entry fails ``test_every_docs_command_has_an_entry``
with the line to add."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from vocab import outside, words_in, words_in_metrics
from widths import problems, unwrap

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
EXAMPLES = ROOT / "src" / "stalwart" / "examples"
SHELL_LANGS = {"", "bash", "sh", "shell", "console"}

TRAIN_PY = """
import torch
from stalwart.train import Session

session = Session()
session.init_process_group("gloo")
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in session.loop(6, {"model": model, "optimizer": opt}, checkpoint_every=3):
    loss = model(torch.randn(8, 4)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
session.finish()
"""


@dataclass
class Walk:
    """What the commands share: the working directory, the run made once, and captured output."""

    cwd: Path
    run_dir: Path | None = None
    outputs: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Entry:
    page: str
    written: str
    run: str | None = None  # None: run as written
    reason: str = ""
    server: bool = False  # runs until interrupted: probe it, then SIGINT
    check: Callable[[str, Walk], None] | None = None  # key output (stdout) of a command
    probe: Callable[[str, Walk], None] | None = None  # a server: given its URL, prove it serves
    before: tuple[str, int] | None = None  # a command (and its exit code) that sets up what this one reads


def _json(out: str, walk: Walk) -> None:
    json.loads(out)


def _sim_json(out: str, walk: Walk) -> None:
    res = json.loads(out)
    assert res["gpus"] == 2048 and res["strategy"] == "requeue", "sim.yaml's fields must reach the simulator"


def _sim_table(out: str, walk: Walk) -> None:
    assert "16,384 GPUs (2,048 nodes), 54 days, 20 trials" in out and re.search(r"│ ettr +│ +0\.\d+", out)


def _plan_plots(out: str, walk: Walk) -> None:
    charts = walk.cwd / "charts"
    assert sorted(p.name for p in charts.iterdir()) == [
        "cost_vs_gpus.svg",
        "ettr_vs_gpus.svg",
        "ettr_vs_interval.svg",
    ]
    # the --scale-to row: the size is rounded down to whole model-parallel groups of the target job
    # (128 GPUs for the default 405B model: 99,968), and a note says so
    assert re.search(r"^ 99,968 ", out, flags=re.M), out[-2000:]
    assert "--scale-to 100,000 is predicted at 99,968 GPUs: rounded down" in " ".join(out.split())


def _has(out: str, text: str) -> None:
    assert text in out, out[-2000:]


def _ledger_written(walk: Walk) -> None:
    assert (walk.cwd / "runs" / "sim" / "ledger" / "sim.ledger").is_file()


def _plan_ledger(out: str, walk: Walk) -> None:
    res = json.loads(out)
    assert res["tiers"] and any("ledger" in n or "measured" in n for n in res.get("notes", [])), res.get(
        "notes"
    )


def _health_json(out: str, walk: Walk) -> None:
    res = json.loads(out)
    assert res["node"] == "n1" and res["passed"] is True


def _nodes_json(out: str, walk: Walk) -> None:
    nodes = {n["node"]: n for n in json.loads(out)}
    assert set(nodes) == {"n1", "n2"}, nodes  # n1 passed its first check above: healthy on record
    assert nodes["n1"]["state"] == "healthy" and nodes["n1"]["since"], nodes["n1"]
    n2 = nodes["n2"]
    assert n2["state"] == "quarantined" and "PCIe link x8" in n2["reason"], n2


def _rules_path(out: str, walk: Walk) -> None:
    path = Path(out.strip())
    assert path.name == "alerts.yml" and "alert:" in path.read_text()


def _run_ended(out: str, walk: Walk) -> None:
    assert re.search(r"^metrics: http://127\.0\.0\.1:\d+/metrics$", out, flags=re.M), out[:500]
    assert "Where the wall time went" in out


def _ended_ok(out: str, walk: Walk) -> None:
    assert "job ended (succeeded, exit 0)" in out, out[-2000:]


def _facility_unreachable(out: str, walk: Walk) -> None:
    _ended_ok(out, walk)
    assert re.search(r"incident: facility telemetry on \S+ cannot be read", out), out[-2000:]


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as r:  # noqa: S310 - a local server the test started
        assert r.status == 200
        return r.read().decode()


def _metrics_probe(url: str, walk: Walk) -> None:
    # the exporter reads ledgers in its own thread, so a scrape never waits on one: the first scrapes
    # after start may come before its first read (bounded wait for the run's series)
    series = f'stalwart_job_wall_seconds{{run="{walk.run_dir.name}"}}'
    deadline = time.monotonic() + 60
    body = _get(url)
    while series not in body and time.monotonic() < deadline:
        time.sleep(0.2)
        body = _get(url)
    assert series in body
    assert "stalwart_mfu" in body, "--model gives MFU"


def _dashboard_probe(url: str, walk: Walk) -> None:
    assert "<html" in _get(url).lower()
    req = urllib.request.Request(
        url.rstrip("/") + "/api/runs", headers={"Authorization": "Bearer docs-walk-token-0123456789"}
    )
    with urllib.request.urlopen(req, timeout=10) as r:  # noqa: S310 - a local server the test started
        runs = json.loads(r.read())["runs"]
    assert [r["id"] for r in runs] == [walk.run_dir.name]


NOTIFY_TOKEN = "docs-walk-notify-token-0123"


def _notify_probe(url: str, walk: Walk) -> None:
    """Post an Alertmanager webhook; the Slack and the generic target (local receivers) both get it."""
    got = walk.outputs["receiver"]  # type: ignore[assignment]
    payload = {
        "version": "4",
        "status": "firing",
        "alerts": [{"labels": {"alertname": "StalwartHang", "run": "r1"}, "annotations": {"summary": "s"}}],
    }
    req = urllib.request.Request(
        url,
        data=json.dumps(payload).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {NOTIFY_TOKEN}"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=10) as r:  # noqa: S310 - a local server the test started
        assert r.status in (200, 202)
    assert got.wait(20), "both targets must receive the alert"  # type: ignore[attr-defined]


# The order matters only where a command reads what an earlier one wrote.
ENTRIES = [
    Entry(
        "observability.md",
        "stalwart run --metrics-port 9400 [--metrics-addr 127.0.0.1] [--metrics-model SPEC] ... train.py",
        "stalwart run --metrics-port 0 --metrics-addr 127.0.0.1 --metrics-model params=7e9,layers=32,heads=32,"
        "head_dim=128,seq_len=4096,tokens_per_step=4e6,gpus=64,device=h100 --nproc-per-node 1 train.py",
        "a synopsis; port 0 because 9400 may be taken on a shared machine, the model spec of `--help`, and "
        "one worker of a 6-step SDK script (train.py, written by the test); this is the run the other "
        "commands read",
        check=_run_ended,
    ),
    Entry(
        "observability.md",
        "stalwart metrics serve RUN_DIR --port 9400 [--model SPEC] [--file-sd-dir DIR]",
        "stalwart metrics serve {run} --port 0 --model params=7e9,layers=32,heads=32,head_dim=128,"
        "seq_len=4096,tokens_per_step=4e6,gpus=64,device=h100 --file-sd-dir file_sd",
        "a synopsis; the run above, any free port, the model spec of `--help`",
        server=True,
        probe=_metrics_probe,
    ),
    Entry("observability.md", "stalwart metrics rules", check=_rules_path),
    Entry(
        "observability.md",
        "stalwart notify serve --slack-file FILE [--generic https://ops/hook] --token-file FILE --port 9401",
        f"stalwart notify serve --slack {{receiver}}/slack --generic {{receiver}}/hook --token {NOTIFY_TOKEN} "
        "--port 0",
        "a synopsis; Slack and the generic hook are local receivers started by the test (their URLs on the "
        "command line instead of files), the token on the command line, any free port",
        server=True,
        probe=_notify_probe,
    ),
    Entry(
        "observability.md",
        "stalwart dashboard RUN_DIR_OR_PARENT [--port 8470] [--token T | STALWART_DASHBOARD_TOKEN]",
        "stalwart dashboard stalwart-runs --port 0 --token docs-walk-token-0123456789",
        "a synopsis; the parent of the run above, any free port, a token of the required 16+ characters",
        server=True,
        probe=_dashboard_probe,
    ),
    Entry(
        "health.md",
        "stalwart health check [--active] [--json] [--fixture DIR] [--expected-gpus N] [--mount PATH]... "
        "[--ib-rate GBPS] [--kernel-log dmesg|FILE|''] [--rules FILE] [--backend none|local|slurm] "
        "[--node NAME] [--state-dir DIR]",
        "stalwart health check --json --fixture {root}/tests/fixtures/gpu/h100 --expected-gpus 1 --mount / "
        "--ib-rate 0 --kernel-log '' --rules {root}/src/stalwart/health/rules.yaml --backend local "
        "--node n1 --state-dir health-state",
        "a synopsis; a recorded healthy H100 node (one GPU) so the check passes on any machine; without "
        "--active, which the README walk runs (40-60 s on a busy 2-core machine), and without Slurm",
        check=_health_json,
    ),
    Entry(
        "health.md",
        "stalwart nodes [--backend local|slurm] [--state-dir DIR] [--json]",
        "stalwart nodes --backend local --state-dir health-state --json",
        "a synopsis; the records of the passing check above (n1) and of a failed check of a recorded "
        "node (n2, PCIe link at x8) made first (the Slurm backend needs a Slurm controller: "
        "tests/integration/test_slurm_health.py)",
        check=_nodes_json,
        before=(
            "stalwart health check --fixture {root}/tests/fixtures/gpu/h100_derived/pcie_x8 --expected-gpus 1 "
            "--kernel-log '' --backend local --node n2 --state-dir health-state",
            1,
        ),
    ),
    Entry(
        "diagnosis.md",
        "stalwart run --topology topology.yaml --facility facility.csv --kernel-log /var/log/kern-xid.log "
        "--node-telemetry /run/gpu-telemetry --nproc-per-node 8 train.py",
        "stalwart run --topology topology.yaml --facility facility.csv --kernel-log kern-xid.log "
        "--node-telemetry {root}/tests/fixtures/gpu/h100 --nproc-per-node 1 --run-dir diag-files train.py",
        "the topology, facility CSV and an empty kernel log written by the test, the recorded H100 telemetry "
        "for the node's, one worker, its own run directory (the walk's run stays as the other commands read it)",
        check=_ended_ok,
    ),
    Entry(
        "diagnosis.md",
        "stalwart run --facility http://prometheus:9090 --facility-query inlet_temp_c=cdu_inlet_celsius "
        "--facility-query coolant_flow_lpm=cdu_flow_lpm --topology topology.csv ... train.py",
        "stalwart run --facility http://127.0.0.1:9 --facility-query inlet_temp_c=cdu_inlet_celsius "
        "--facility-query coolant_flow_lpm=cdu_flow_lpm --topology topology.csv --nproc-per-node 1 "
        "--run-dir diag-prom train.py",
        "no Prometheus on a test machine: a closed port, so the run shows what an unreachable facility "
        "source gives (a collector incident, never silence) and still ends well; the client against a "
        "serving Prometheus API is tested in tests/unit/test_diagnose_seams.py",
        check=_facility_unreachable,
    ),
    Entry(
        "simulator.md",
        "stalwart sim --gpus 16384 --days 54 --trials 1000",
        "stalwart sim --gpus 16384 --days 54 --trials 20",
        "1000 trials take minutes on 2 cores; 20 go through the same simulation",
        check=_sim_table,
    ),
    Entry("simulator.md", "stalwart sim --config sim.yaml --json", check=_sim_json),
    Entry(
        "simulator.md",
        "stalwart plan --gpus 16384 --scale-to 32768 --scale-to 100000 --plot charts/ --plot-format svg",
        "stalwart plan --gpus 16384 --scale-to 32768 --scale-to 100000 --plot charts/ --plot-format svg "
        "--trials 10",
        "200 trials per candidate take minutes on 2 cores; 10 go through the same planning and plots",
        check=_plan_plots,
    ),
    Entry(
        "simulator.md",
        "stalwart sim --gpus 8 --days 0.5 --trials 2 --rate-scale 5000 --write-ledger runs/sim --step 10",
        check=lambda out, walk: _ledger_written(walk),
    ),
    Entry(
        "simulator.md",
        "stalwart plan --ledger runs/demo --gpus 16384 --model 70b",
        "stalwart plan --ledger runs/sim-plan --gpus 16384 --model 70b --trials 10",
        "the demo's 4-rank run takes minutes; a simulated run's ledger with a few failures at ten times the "
        "fleet rate goes through the same planning of a 70B job at 16,384 GPUs, 10 trials instead of 200",
        before=(
            # 5-minute steps: the same failure and planning, 30x fewer events to write and read (at 10 s
            # steps the two commands took 130 s of the suite)
            "stalwart sim --gpus 8 --days 100 --trials 2 --rate-scale 10 --write-ledger runs/sim-plan --step 300",
            0,
        ),
        check=lambda out, walk: _has(out, "in_place"),
    ),
    Entry(
        "simulator.md",
        "stalwart plan --gpus 4800 --model 70b --inplace-phases inplace-phases.json",
        "stalwart plan --gpus 4800 --model 70b --inplace-phases {root}/tests/fixtures/inplace-phases.json "
        "--trials 10",
        "the phases measured by bench/bench_inplace.py are kept as a test fixture; 10 trials instead of 200",
        check=lambda out, walk: _has(out, "in_place"),
    ),
    Entry(
        "simulator.md",
        "stalwart plan --ledger runs/sim --gpus 8 --days 2 --json",
        "stalwart plan --ledger runs/sim --gpus 8 --days 2 --trials 10 --json",
        "200 trials per candidate take a while on 2 cores; 10 go through the same planning. The docs walk's "
        "own run had no failure, which plan --ledger refuses (no rate to fit): a simulated run has some",
        before=(
            "stalwart sim --gpus 8 --days 0.5 --trials 2 --rate-scale 5000 --write-ledger runs/sim --step 10",
            0,
        ),
        check=_plan_ledger,
    ),
]


def _code_blocks(text: str) -> list[tuple[str, str]]:
    return [
        (m.group(1), m.group(2))
        for m in re.finditer(r"^[ \t]*```([a-z]*)\n(.*?)^[ \t]*```", text, flags=re.S | re.M)
    ]


def docs_commands() -> list[tuple[str, str]]:
    """(page, command line) for every line of every shell code block of docs/*.md."""
    out = []
    for page in sorted(DOCS.glob("*.md")):
        for lang, block in _code_blocks(page.read_text()):
            if lang not in SHELL_LANGS or block.startswith("#!"):  # a script file: docs_scripts
                continue
            joined = re.sub(r"\\\n\s*", " ", block)
            for line in joined.splitlines():
                line = re.sub(r"(^|\s+)#.*$", "", line).strip().removeprefix("$ ").strip()
                if line:
                    out.append((page.name, re.sub(r"\s+", " ", line)))
    return out


def test_every_docs_command_has_an_entry():
    found = docs_commands()
    assert found, "the docs show commands"
    known = {(e.page, e.written) for e in ENTRIES}
    missing = [f"{page}: {line!r}" for page, line in found if (page, line) not in known]
    assert not missing, (
        "commands in the docs without an entry in ENTRIES of tests/integration/test_docs_commands.py "
        "(add one: the command as written, the command run and the reason if it differs; put diagrams "
        "and output in ```text blocks):\n" + "\n".join(missing)
    )
    stale = sorted(known - set(found))
    assert not stale, f"entries whose command is no longer in the docs (remove or update them): {stale}"
    for e in ENTRIES:
        assert e.run is None or e.reason, f"a command run in another form needs its reason: {e.written}"
        assert e.server == (e.probe is not None), f"a server needs a probe and only a server has one: {e.run}"


def docs_scripts() -> list[tuple[str, str]]:
    """(page, text) of every shell code block that is a whole script (its first line ``#!...``)."""
    return [
        (page.name, block)
        for page in sorted(DOCS.glob("*.md"))
        for lang, block in _code_blocks(page.read_text())
        if lang in SHELL_LANGS and block.startswith("#!")
    ]


def test_docs_scripts_are_the_shipped_files():
    shipped = {p.read_text(): p.name for p in EXAMPLES.iterdir() if p.is_file() and p.suffix != ".py"}
    scripts = docs_scripts()
    assert scripts, "docs/slurm.md shows the sbatch template"
    for page, text in scripts:
        assert text in shipped, (
            f"{page}: a script block ({text.splitlines()[0]} ...) must be a copy of a file in "
            "src/stalwart/examples, which the tests run: copy that file into the page"
        )


def test_docs_show_the_sim_yaml_they_run():
    """`stalwart sim --config sim.yaml` runs as written: the page shows the file it reads."""
    assert _sim_yaml(), "docs/simulator.md must show a ```yaml block starting with '# sim.yaml'"


def _sim_yaml() -> str:
    return next(
        (
            b
            for lang, b in _code_blocks((DOCS / "simulator.md").read_text())
            if lang == "yaml" and "# sim.yaml" in b
        ),
        "",
    )


def _argv(cmd: str, walk: Walk, receiver: str = "") -> list[str]:
    cmd = cmd.format(run=walk.run_dir or "{run}", root=ROOT, receiver=receiver)
    argv = shlex.split(cmd)
    assert argv[0] == "stalwart", f"only stalwart commands are run here so far: {cmd}"
    return [sys.executable, "-m", "stalwart.cli", *argv[1:]]


def _machine_output(command: str) -> bool:
    """A command whose output is for programs (JSON, Prometheus rules, a CSV): not held to the
    80-column check."""
    return any(flag in command for flag in ("--json", "--csv", " rules", "--format json"))


def _env() -> dict[str, str]:
    return {**os.environ, "COLUMNS": "80"}


class _Receiver:
    """Two local webhook targets (Slack-style and generic); ``wait`` returns once both got a post."""

    def __init__(self) -> None:
        self.paths: set[str] = set()
        self.done = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.paths.add(self.path)
                if {"/slack", "/hook"} <= outer.paths:
                    outer.done.set()
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wait(self, timeout: float) -> bool:
        return self.done.wait(timeout)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def walk(tmp_path_factory) -> Walk:
    """The one run every command reads: the first entry, run once."""
    cwd = tmp_path_factory.mktemp("docs-walk")
    (cwd / "train.py").write_text(TRAIN_PY)
    (cwd / "sim.yaml").write_text(_sim_yaml())
    node = "{rack: r1, leaf_switch: sw1, pdu: p1, cooling_loop: loopA}"  # the diagnosis page's files
    (cwd / "topology.yaml").write_text(f"nodes:\n  n1: {node}\n  n2: {node}\n")
    (cwd / "topology.csv").write_text("node,rack,leaf_switch,pdu,cooling_loop\nn1,r1,sw1,p1,loopA\n")
    (cwd / "facility.csv").write_text("ts,loop,metric,value\n1700000000,loopA,inlet_temp_c,24.0\n")
    (cwd / "kern-xid.log").write_text("")
    w = Walk(cwd)
    first = ENTRIES[0]
    p = subprocess.run(_argv(first.run, w), cwd=cwd, env=_env(), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, f"{first.run}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    w.outputs[first.written] = p.stdout
    (w.run_dir,) = (cwd / "stalwart-runs").iterdir()
    return w


def _serve(e: Entry, walk: Walk) -> None:
    receiver = _Receiver() if "{receiver}" in (e.run or "") else None
    if receiver is not None:
        walk.outputs["receiver"] = receiver  # type: ignore[assignment]
    argv = _argv(e.run or e.written, walk, receiver.url if receiver else "")
    p = subprocess.Popen(
        argv, cwd=walk.cwd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        first = p.stdout.readline()  # every server prints its URL first
        m = re.search(r"(http://127\.0\.0\.1:\d+\S*)", first)
        assert m, (
            f"{argv}: no URL in its first line {first!r}; stderr: {p.stderr.read(2000) if p.poll() else ''}"
        )
        e.probe(m.group(1), walk)
    finally:
        p.send_signal(signal.SIGINT)
        try:
            rc = p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            rc = p.wait(timeout=10)
        if receiver is not None:
            receiver.close()
    assert rc == 0, f"{argv}: exit {rc} on SIGINT; stderr: {p.stderr.read()[-2000:]}"


def _off_vocabulary(out: str) -> list[tuple[str, str, str]]:
    """The labelled words of a command's JSON or metrics output outside the one vocabulary
    (policy/vocabulary.py, docs/vocabulary.md)."""
    try:
        return outside(words_in(json.loads(out)))
    except ValueError:
        return outside(words_in_metrics(out))


@pytest.mark.parametrize("e", ENTRIES, ids=[f"{e.page}:{e.written.split(' [')[0][:60]}" for e in ENTRIES])
def test_docs_command_runs(e: Entry, walk: Walk):
    if e is ENTRIES[0]:
        out = walk.outputs[e.written]
        assert not problems(out), problems(out)  # the run's console and report fit 80 columns
    elif e.server:
        _serve(e, walk)
        return
    else:
        if e.before is not None:
            argv = _argv(e.before[0], walk)
            p = subprocess.run(argv, cwd=walk.cwd, env=_env(), capture_output=True, text=True, timeout=300)
            assert p.returncode == e.before[1], f"{argv}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
        argv = _argv(e.run or e.written, walk)
        p = subprocess.run(argv, cwd=walk.cwd, env=_env(), capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, f"{argv}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
        out = p.stdout
        said = p.stdout + p.stderr
        assert "Traceback (most recent call last)" not in said, (argv, said[-3000:])
        if not _machine_output(e.written):  # what a person reads fits 80 columns
            assert not problems(said), (argv, problems(said))
        assert not _off_vocabulary(out), (argv, _off_vocabulary(out))
    if e.check is not None:  # a run's console lines whole again, wherever 80 columns broke them
        e.check(unwrap(out) if e.written.startswith("stalwart run") else out, walk)
