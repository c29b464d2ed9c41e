"""Exporter: incremental ledger reading, snapshot = report's accounting, exposition names and values."""

from __future__ import annotations

import os
import sqlite3

from prometheus_client.parser import text_string_to_metric_families

from stalwart.account.goodput import compute
from stalwart.account.report import build
from stalwart.events import StepCompleted
from stalwart.ledger import LedgerWriter, read_merged
from stalwart.serve.metrics import render
from stalwart.serve.snapshot import take
from stalwart.serve.synthetic import SyntheticRun, events, write
from stalwart.serve.tail import LedgerTail
from stalwart.serve.watcher import RunWatcher


def _samples(text: bytes) -> dict[tuple[str, tuple], float]:
    out = {}
    for fam in text_string_to_metric_families(text.decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_tail_reads_only_new_rows_within_its_budget(tmp_path):
    path = tmp_path / "ledger" / "agent-a.ledger"
    evs = list(events(SyntheticRun(steps=20, crash_steps=())))
    with LedgerWriter(path) as w:
        w.extend(evs[:10])
        tail = LedgerTail(tmp_path, max_rows=4)
        got = [tail.poll() for _ in range(3)]
        assert [g.new_events for g in got] == [4, 4, 2]
        assert [g.caught_up for g in got] == [False, False, True]
        w.extend(evs[10:])
    while not tail.poll().caught_up:
        pass
    assert tail.count() == len(evs)
    assert [e.ts for e in tail.events()] == [e.ts for e in read_merged(tmp_path)]


def test_snapshot_equals_the_report(tmp_path):
    write(tmp_path, SyntheticRun(crash_steps=(15, 40)))
    rep = build(tmp_path)
    snap = take(read_merged(tmp_path), now=0.0)
    assert snap.goodput == rep["goodput"]
    assert snap.buckets == rep["buckets_s"]
    assert snap.interruptions_by_cause == {"crash": 2}
    assert snap.restarts_by_cause == {"crash": 2}
    assert snap.mtbf_job_hours == rep["reliability"]["mtbf_job_hours"]
    strag = {r.rank: r.straggler_score for r in snap.ranks}
    assert strag[1] > 1.2 > strag[0]


def test_exposition_carries_the_accounting(tmp_path):
    write(
        tmp_path,
        SyntheticRun(
            crash_steps=(15,),
            health_findings=(
                {
                    "check": "nvml",
                    "code": "gpu.clock.hw_thermal",
                    "subject": "gpu0",
                    "severity": "warn",
                    "message": "hot",
                },
            ),
        ),
    )
    evs = read_merged(tmp_path)
    gp = compute(evs)
    snap = take(evs, now=evs[-1].ts + 100)
    s = _samples(render(snap, now=evs[-1].ts + 100))
    run = ("run", "synthetic")
    assert s[("stalwart_goodput_ratio", (run,))] == gp.goodput
    for bucket, secs in gp.buckets.items():
        if bucket != "productive":
            assert s[("stalwart_badput_seconds", (("bucket", bucket), run))] == secs
    assert s[("stalwart_restarts_total", (("cause", "crash"), run))] == 1
    assert s[("stalwart_detection_latency_seconds_count", (run,))] == 1
    assert s[("stalwart_node_hw_slowdown", (("node", "node0"), run, ("subject", "gpu0")))] == 1
    newest = max(e.ts for e in evs if e.kind == "CheckpointCommitted")
    assert s[("stalwart_checkpoint_newest_age_seconds", (run,))] == evs[-1].ts + 100 - newest
    steps_rank1 = sum(1 for e in evs if isinstance(e, StepCompleted) and e.rank == 1)
    assert s[("stalwart_rank_steps_total", (("node", "node0"), ("rank", "1"), run))] == steps_rank1
    assert s[("stalwart_job_running", (run,))] == 0


def test_a_corrupt_ledger_is_reported_and_the_others_still_read(tmp_path):
    write(tmp_path, SyntheticRun(steps=20, crash_steps=()))
    bad = tmp_path / "ledger" / "rank-9.ledger"
    con = sqlite3.connect(bad)
    con.execute("CREATE TABLE other (x)")
    con.commit()
    con.close()
    os.utime(bad, (1e9, 1e9))  # an old stray file, not one being created
    w = RunWatcher(tmp_path)
    snap = w.refresh()
    assert snap.started and snap.steps_completed == 20
    assert "rank-9.ledger" in snap.error
    s = _samples(render(snap, now=0.0))
    assert s[("stalwart_ledger_error", (("run", "synthetic"),))] == 1


def test_concurrent_polls_never_read_a_row_twice(tmp_path):
    import threading

    write(tmp_path, SyntheticRun(steps=200, crash_steps=()))
    tail = LedgerTail(tmp_path, max_rows=7)
    threads = [threading.Thread(target=lambda: [tail.poll() for _ in range(200)]) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert tail.count() == len(read_merged(tmp_path))


def test_the_endpoint_lingers_for_one_more_scrape_only_when_scraped(tmp_path):
    import threading
    import urllib.request

    from stalwart.serve.metrics import MetricsServer

    write(tmp_path, SyntheticRun(steps=10, crash_steps=()))
    srv = MetricsServer(RunWatcher(tmp_path), port=0).start()
    try:
        assert srv.linger(max_s=5) is False  # nobody scrapes: no wait
        for _ in range(2):
            assert b"stalwart_goodput_ratio" in urllib.request.urlopen(srv.url, timeout=5).read()
        late = threading.Timer(0.05, lambda: urllib.request.urlopen(srv.url, timeout=5).read())
        late.start()
        assert srv.linger(max_s=5) is True
        late.join()
    finally:
        srv.stop()


def test_alert_rules_and_grafana_only_use_series_the_exporter_exposes(tmp_path):
    import re
    from pathlib import Path

    from stalwart.events.node_health import NodeDrained
    from stalwart.serve.rules import rules_path

    write(
        tmp_path,
        SyntheticRun(
            crash_steps=(15,),
            ended=False,
            health_findings=(
                {
                    "check": "ib",
                    "code": "ib.state",
                    "subject": "mlx5_0/1",
                    "severity": "fail",
                    "message": "down",
                },
                {
                    "check": "nvml",
                    "code": "gpu.clock.hw_slowdown",
                    "subject": "gpu0",
                    "severity": "warn",
                    "message": "hw",
                },
            ),
        ),
    )
    evs = read_merged(tmp_path)
    evs.append(NodeDrained(ts=evs[-1].ts + 1, node="node0", backend="local", reason="stalwart: bad ib"))
    exposed = {s[0] for s in _samples(render(take(evs, now=evs[-1].ts), now=evs[-1].ts))}
    docs = Path(__file__).parents[2] / "docs" / "grafana-stalwart.json"
    for source in (rules_path().read_text(), docs.read_text()):
        used = set(re.findall(r"stalwart_[a-z_]+", source)) - {"stalwart_"}
        used = {u for u in used if not u.startswith(("stalwart_dashboard", "stalwart_metrics_file"))}
        assert used and used <= exposed, sorted(used - exposed)


def test_loading_ends_only_when_the_snapshot_covers_the_whole_ledger(tmp_path):
    write(tmp_path, SyntheticRun(steps=100, crash_steps=(40,)))
    total = len(read_merged(tmp_path))
    w = RunWatcher(tmp_path, max_rows=100)
    states = []
    for _ in range(total // 100 + 3):
        snap = w.refresh()
        states.append((w.loading, snap.events))
    assert states[0][0] is True and states[-1] == (False, total)
    assert all(events < total for loading, events in states if loading)
    assert w.snapshot().goodput == compute(read_merged(tmp_path)).goodput


def test_tokens_per_second_and_mfu_use_the_account_functions(tmp_path):
    import pytest

    from stalwart.account.mfu import mfu_from_step, parse_model_spec
    from stalwart.errors import ConfigError

    spec = parse_model_spec(
        "params=7e9,layers=32,heads=32,head_dim=128,seq_len=4096,tokens_per_step=4e6,gpus=64,device=h100"
    )
    write(tmp_path, SyntheticRun(steps=20, crash_steps=()))
    evs = read_merged(tmp_path)
    snap = take(evs, now=0.0, model=spec)
    ideal = compute(evs).ideal_step_s
    s = _samples(render(snap, now=0.0))
    assert s[("stalwart_tokens_per_second", (("run", "synthetic"),))] == pytest.approx(4e6 / ideal)
    expected = mfu_from_step(spec.dims, 4e6, ideal, 64, spec.peak_flops_per_gpu)
    assert s[("stalwart_mfu_ratio", (("run", "synthetic"),))] == pytest.approx(expected)
    for bad in (
        "params=7e9",
        "params=x,layers=1,heads=1,head_dim=1,seq_len=1,tokens_per_step=1,gpus=1,device=h100",
        "bogus=1",
        "params=1,layers=1,heads=1,head_dim=1,seq_len=1,tokens_per_step=1,gpus=1,device=z80",
    ):
        with pytest.raises(ConfigError):
            parse_model_spec(bad)


def test_a_ledger_still_being_created_is_retried_not_blacklisted(tmp_path):
    write(tmp_path, SyntheticRun(steps=10, crash_steps=()))
    young = tmp_path / "ledger" / "rank-0.ledger"
    young.touch()  # exists before its writer created the schema
    tail = LedgerTail(tmp_path)
    assert tail.poll().errors == ()
    with LedgerWriter(young) as w:
        w.extend(events(SyntheticRun(steps=3, crash_steps=(), node="n1")))
    tail.poll()
    assert any(e.node == "n1" for e in tail.events())
