"""The fuzz corpus: every input path answers bad input with one ``stalwart: error:`` line and exit 2.

Each class found by fuzzing (binary, wrong types, deep nesting, huge sizes, FIFOs and devices, path
tricks, unbounded numbers) is a case here, run through the real CLI in-process (``stalwart.cli.main``),
except ``stalwart run``, which starts processes and is run as a subprocess. Recorded telemetry is the
one exception to exit 2: a fixture the parser cannot use is a ``telemetry.bad`` finding (the same code
reads live telemetry, where a garbled file must not stop the node), so those cases check that the
check finishes and names the problem, with no traceback.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from stalwart.cli import main
from stalwart.ledger import LedgerWriter

FIXTURE = Path(__file__).parents[1] / "fixtures" / "gpu" / "h100"
DEEP_JSON = "[" * 5000 + "]" * 5000
DEEP_YAML = "a: " + "[" * 5000 + "]" * 5000 + "\n"
ALIAS_BOMB = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 10)}]\n" for i in range(8)
)


def _cli(argv, capsys):
    try:
        main(argv)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    out = capsys.readouterr()
    return code, out.out, out.err


def _assert_one_line(code, out, err, argv):
    assert "Traceback" not in out + err, err
    assert code == 2, f"{argv}: exit {code}\n{out}\n{err}"
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("stalwart: error: "), err


def _files(d: Path) -> dict[str, Path]:
    """Bad input files, by name."""
    made = {
        "binary": b"\x00\x01\x02\xff garbage" * 50,
        "not-utf8": b"a: \xff\xfe\xfd\n",
        "deep-yaml": DEEP_YAML.encode(),
        "deep-json": DEEP_JSON.encode(),
        "alias-bomb": ALIAS_BOMB.encode(),
        "list": b"- 1\n- 2\n",
        "huge": b"# padding\n" * 200_000,
        "unclosed": b"a: [1, 2\n",
    }
    out = {}
    for name, data in made.items():
        p = d / f"{name}.yaml"
        p.write_bytes(data)
        out[name] = p
    fifo = d / "fifo.yaml"
    os.mkfifo(fifo)
    out["fifo"] = fifo
    out["dir"] = d
    out["device"] = Path("/dev/zero")
    out["missing"] = d / "absent.yaml"
    return out


FILE_KINDS = ["binary", "not-utf8", "deep-yaml", "deep-json", "alias-bomb", "list", "huge", "unclosed",
              "fifo", "dir", "device", "missing"]  # fmt: skip


@pytest.mark.timeout(20)
@pytest.mark.parametrize("kind", FILE_KINDS)
@pytest.mark.parametrize(
    "command",
    [
        ["sim", "--trials", "2", "--days", "1", "--config"],
        ["health", "check", "--fixture", str(FIXTURE), "--rules"],
    ],
    ids=["sim-config", "health-rules"],
)
def test_bad_files(command, kind, tmp_path, capsys):
    path = _files(tmp_path)[kind]
    argv = [*command, str(path)]
    _assert_one_line(*_cli(argv, capsys), argv)


def _rules(tmp_path, reason):
    p = tmp_path / "rules.yaml"
    p.write_text(
        "rules:\n  - {code: 'telemetry.*', verdict: warn, action: alert, reason: "
        + json.dumps(reason)
        + "}\n"
    )
    return p


@pytest.mark.timeout(20)
@pytest.mark.parametrize(
    "reason",
    ["{0}", "{}", "{x!z}", "{subject", "subject}", "{subject:>900000000}", "{subject.__class__}",
     "{message[0]}", "{subject:{message}}", "{subject:" + "x" * 100 + "}"],
)  # fmt: skip
def test_rule_templates(reason, tmp_path, capsys):
    argv = ["health", "check", "--fixture", str(FIXTURE), "--rules", str(_rules(tmp_path, reason))]
    _assert_one_line(*_cli(argv, capsys), argv)


@pytest.mark.timeout(20)
@pytest.mark.parametrize(
    "body",
    [
        "rules: [{code: x, verdict: [fail], action: drain}]",
        "rules: [{code: x, verdict: fail, action: drain, xid_in: [1]}]",
        "rules: [{code: x, verdict: fail, action: drain, severity: 3}]",
        "rules: [{code: {a: 1}, verdict: fail, action: drain}]",
        "xid_lists: [1, 2]\nrules: []",
        "rules: [" + ", ".join(["{code: x, verdict: pass, action: none}"] * 1001) + "]",
    ],
    ids=["verdict-list", "xid_in-list", "severity-int", "code-map", "xid_lists-list", "too-many"],
)
def test_rule_tables_with_wrong_types(body, tmp_path, capsys):
    p = tmp_path / "rules.yaml"
    p.write_text(body + "\n")
    argv = ["health", "check", "--fixture", str(FIXTURE), "--rules", str(p)]
    _assert_one_line(*_cli(argv, capsys), argv)


_HUGE_NUMBERS = [
    ["--trials", "100000000000000000000"],
    ["--trials", "1000000000"],
    ["--trials", "1e20"],
    ["--seed", "-1"],
    ["--spares", "99999999999999"],
    ["--stall", "inf"],
    ["--interval", "nan"],
    ["--rate-scale", "inf"],
    ["--days", "1e9"],
    ["--gpus", "100000000000"],
    ["--restart", "1e300"],
]
_PLAN_ONLY_LACKS = {"--spares"}  # plan chooses spares itself


@pytest.mark.timeout(30)
@pytest.mark.parametrize(
    "argv",
    [
        [c, *f]
        for c in ("sim", "plan")
        for f in _HUGE_NUMBERS
        if not (c == "plan" and f[0] in _PLAN_ONLY_LACKS)
    ],
    ids=lambda a: " ".join(a),
)
def test_sim_and_plan_numbers(argv, capsys):
    _assert_one_line(*_cli(argv, capsys), argv)


@pytest.mark.timeout(30)
def test_plan_scale_to_beyond_any_fleet(capsys):
    argv = ["plan", "--trials", "2", "--scale-to", "100000000000000"]
    _assert_one_line(*_cli(argv, capsys), argv)


@pytest.mark.timeout(20)
@pytest.mark.parametrize(
    "body",
    [
        "gpus: many",
        "tiers: [{name: a, interval_s: [1], stall_s: 1}]",
        "failures: [{name: x, per_1000_gpu_days: .inf}]",
        "seed: {a: 1}",
        "warp: 9",
        "failures: " + json.dumps([{"name": f"c{i}", "per_1000_gpu_days": 0.0} for i in range(1001)]),
    ],
    ids=["gpus-text", "interval-list", "rate-inf", "seed-map", "unknown", "too-many-classes"],
)
def test_sim_config_files_with_wrong_types(body, tmp_path, capsys):
    p = tmp_path / "sim.yaml"
    p.write_text(body + "\n")
    argv = ["sim", "--trials", "2", "--config", str(p)]
    _assert_one_line(*_cli(argv, capsys), argv)


def _ledger_with_rows(path: Path, payloads: list[str]) -> None:
    import sqlite3

    with LedgerWriter(path):
        pass
    conn = sqlite3.connect(path)
    conn.executemany(
        "INSERT INTO events(ts, kind, payload) VALUES (?, ?, ?)",
        [(1.0, "StepCompleted", p) for p in payloads],
    )
    conn.commit()
    conn.close()


@pytest.mark.timeout(20)
@pytest.mark.parametrize(
    "make",
    ["garbage", "empty-dir", "fifo-ledger", "bad-payloads", "dev-null", "foreign-sqlite"],
)
def test_report_inputs(make, tmp_path, capsys):
    run = tmp_path / "run"
    (run / "ledger").mkdir(parents=True)
    if make == "garbage":
        (run / "ledger" / "a.ledger").write_bytes(b"\x00garbage" * 100)
    elif make == "fifo-ledger":
        os.mkfifo(run / "ledger" / "a.ledger")
    elif make == "bad-payloads":
        _ledger_with_rows(run / "ledger" / "a.ledger", ["not json", "null", "[1]", DEEP_JSON, '{"ts": "x"}'])
    elif make == "foreign-sqlite":
        import sqlite3

        conn = sqlite3.connect(run / "ledger" / "a.ledger")
        conn.execute("CREATE TABLE t(x)")
        conn.commit()
        conn.close()
    target = "/dev/null" if make == "dev-null" else str(run)
    argv = ["report", target]
    _assert_one_line(*_cli(argv, capsys), argv)


@pytest.mark.timeout(20)
@pytest.mark.parametrize(
    "node", ["gpu[001-512]", "n1,n2,n3", "x State=RESUME", "../../x", "$(touch f)", "a" * 100_000]
)
def test_health_node_names_never_reach_slurm(node, tmp_path, capsys, fake_slurm):
    argv = ["health", "check", "--fixture", str(FIXTURE), "--backend", "slurm", "--node", node,
            "--state-dir", str(tmp_path / "state")]  # fmt: skip
    _assert_one_line(*_cli(argv, capsys), argv)
    assert not fake_slurm.exists()
    assert not (tmp_path / "state").exists() or not any((tmp_path / "state").iterdir())


@pytest.mark.timeout(20)
def test_slurmd_nodename_is_validated(tmp_path, capsys, monkeypatch, fake_slurm):
    monkeypatch.setenv("SLURMD_NODENAME", "../../escape")
    argv = [
        "health",
        "check",
        "--fixture",
        str(FIXTURE),
        "--backend",
        "local",
        "--state-dir",
        str(tmp_path / "s"),
    ]
    _assert_one_line(*_cli(argv, capsys), argv)
    assert not (tmp_path / "escape.ledger").exists() and not list(tmp_path.rglob("*escape*"))


@pytest.mark.timeout(20)
@pytest.mark.parametrize("kind", ["fifo", "device", "dir", "missing"])
def test_kernel_log_that_is_not_a_file(kind, tmp_path, capsys):
    path = _files(tmp_path)[kind]
    argv = ["health", "check", "--kernel-log", str(path)]
    _assert_one_line(*_cli(argv, capsys), argv)


@pytest.mark.timeout(20)
@pytest.mark.parametrize(
    "snapshot",
    [
        DEEP_JSON,
        '{"nvml": {"gpus": [{"nvlink_count": 1e300, "temp_gpu": 1e400, "remapped_rows": [[], {}, 1, 2]}]}}',
        '{"nvml": {"gpus": [{"nvlink_count": "lots", "pci": [1], "field_values": [1], "util": 5}]}}',
        '{"nvml": {"gpus": [{"xid_events": 7, "ecc_mode": "on", "name": {"a": 1}}]}}',
        '{"nvml": {"count": 99999999999999999999999, "cuda_driver": true, "gpus": [7, null]}}',
        "[1, 2, 3]",
        "\x00\x01binary",
    ],
    ids=["deep", "huge-values", "wrong-types", "more-wrong-types", "count", "list", "binary"],
)
def test_gpu_fixture_problems_are_findings_not_tracebacks(snapshot, tmp_path, capsys):
    fx = tmp_path / "fx"
    fx.mkdir()
    (fx / "nvml_snapshot.json").write_text(snapshot)
    (fx / "x_telemetry.csv").write_text("t,clock_event_reasons,phase\n1," + "9" * 300_000 + ",x\n")
    code, out, err = _cli(["health", "check", "--json", "--fixture", str(fx), "--kernel-log", ""], capsys)
    assert "Traceback" not in out + err, err
    assert code in (0, 1), err
    findings = json.loads(out)["findings"]
    assert any(f["code"] == "telemetry.bad" for f in findings), findings


# --- stalwart run: subprocess (it starts an agent) --------------------------------------------

LAUNCH = "launch: owned by h-realjobs; lead wires"


def _run(args, cwd):
    script = cwd / "train.py"
    script.write_text("raise SystemExit(0)\n")
    argv = [sys.executable, "-m", "stalwart.cli", "run", "--run-dir", str(cwd / "rd"), *args]
    if "-m" not in args:
        argv.append(str(script))
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=cwd)


def _run_cases(tmp_path: Path) -> dict[str, list[str]]:
    f = _files(tmp_path)
    big = tmp_path / "big-plan.yaml"
    big.write_text("".join(f"- {{fault: crash, rank: 0, step: {i}}}\n" for i in range(1001)))
    types = tmp_path / "types-plan.yaml"
    types.write_text("- {fault: crash, rank: [1], step: {a: 1}, factor: [2]}\n")
    keys = tmp_path / "keys.yaml"
    keys.write_text("1: 2\n")
    return {
        "run-dir-root": ["--run-dir", "/"],
        "run-dir-proc": ["--run-dir", "/proc/self/x"],
        "run-dir-file": ["--run-dir", str(f["binary"])],
        "run-dir-dev-null": ["--run-dir", "/dev/null"],
        "node-name-100k": ["--node-name", "n" * 100_000],
        "node-name-hostlist": ["--node-name", "gpu[001-512]"],
        "node-name-dotdot": ["--node-name", "../../x"],
        "chaos-file-binary": ["--chaos-file", str(f["binary"])],
        "chaos-file-deep": ["--chaos-file", str(f["deep-yaml"])],
        "chaos-file-fifo": ["--chaos-file", str(f["fifo"])],
        "chaos-file-1001": ["--chaos-file", str(big)],
        "chaos-file-types": ["--chaos-file", str(types)],
        "chaos-flags-huge": ["--chaos", ";".join(f"crash@rank=0,step={i}" for i in range(2000))],
        "config-binary": ["--config", str(f["binary"])],
        "config-fifo": ["--config", str(f["fifo"])],
        "config-deep": ["--config", str(f["deep-yaml"])],
        "config-int-keys": ["--config", str(keys)],
        "pg-timeout-huge": ["--pg-timeout", "1e14"],
        "rdzv-endpoint-garbage": ["--rdzv-endpoint", "::::garbage"],
        "rdzv-timeout-inf": ["--rdzv-timeout", "inf"],
        "fault-rank-absent": ["--chaos", "crash@rank=7,step=1"],
        "module-missing": ["-m", "no_such_module_for_stalwart"],
        "sizes-unmeetable": ["--valid-sizes", "multiple:3", "--nproc-per-node", "2"],
    }


RUN_XFAIL: dict[str, str] = {}  # every case is wired; a new one that fails names its owner here


RUN_CASES = (
    "run-dir-root", "run-dir-proc", "run-dir-file", "run-dir-dev-null", "node-name-100k",
    "node-name-hostlist", "node-name-dotdot", "chaos-file-binary", "chaos-file-deep", "chaos-file-fifo",
    "chaos-file-1001", "chaos-file-types", "chaos-flags-huge", "config-binary", "config-fifo",
    "config-deep", "config-int-keys", "pg-timeout-huge", "rdzv-endpoint-garbage", "rdzv-timeout-inf",
    "fault-rank-absent", "module-missing", "sizes-unmeetable",
)  # fmt: skip


@pytest.mark.integration
@pytest.mark.timeout(90)
@pytest.mark.parametrize(
    "case",
    [
        pytest.param(c, marks=pytest.mark.xfail(strict=True, reason=f"{LAUNCH}: {RUN_XFAIL[c]}"))
        if c in RUN_XFAIL
        else c
        for c in RUN_CASES
    ],
)
def test_run_flags(case, tmp_path):
    args = _run_cases(tmp_path)[case]
    res = _run(args, tmp_path)
    _assert_one_line(res.returncode, res.stdout, res.stderr, case)
    assert not Path("/ledger").exists() or case != "run-dir-root"
    shutil.rmtree(tmp_path / "rd", ignore_errors=True)
