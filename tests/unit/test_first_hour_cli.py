"""Dead ends a new user hit: a stray file given to ``report``, and ``nodes`` after a run."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from stalwart import cli
from stalwart.commands.nodes import _records


@pytest.mark.parametrize("target", ["README.md", "src", "no-such-dir"])
def test_report_refuses_a_path_that_is_not_a_run_in_one_line(target, capsys, monkeypatch):
    monkeypatch.chdir(Path(__file__).parents[2])
    with pytest.raises(SystemExit) as exc:
        cli.main(["report", target])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("stalwart: error:") and "run directory" in err[0]
    assert "stray" not in err[0]


@dataclass(frozen=True)
class Rec:
    since: float
    reason: str


class FakeStore:
    data: dict[str, dict[str, Rec]] = {}

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def records(self) -> dict[str, Rec]:
        return self.data.get(self.directory.parent.name, {})


def test_nodes_reads_every_runs_health_dir_and_the_newest_record_wins(tmp_path):
    root = tmp_path / "stalwart-runs"
    for name in ("health", "run-a/health", "run-b/health"):
        (root / name).mkdir(parents=True)
    FakeStore.data = {
        "stalwart-runs": {"n1": Rec(1.0, "shared")},
        "run-a": {"n1": Rec(5.0, "run a"), "n2": Rec(2.0, "run a")},
        "run-b": {"n2": Rec(1.0, "run b, older")},
    }
    got = _records(None, root / "health", FakeStore)
    assert {k: v.reason for k, v in got.items()} == {"n1": "run a", "n2": "run a"}
    only = _records(root / "run-b" / "health", root / "health", FakeStore)
    assert {k: v.reason for k, v in only.items()} == {"n2": "run b, older"}


def test_plan_scale_table_fits_80_columns_with_every_number_whole(capsys, monkeypatch):
    """At 100,000 GPUs the lost GPU-hours and the cost ran past 80 columns and rich cut them."""
    from stalwart.commands.plan import _print, compact

    assert [compact(x) for x in (812, 99_999, 123_456, 2_882_848, 122_609_311, 3.4e9)] == [
        "812",
        "99,999",
        "123k",
        "2.9M",
        "122.6M",
        "3.4B",
    ]
    monkeypatch.setenv("COLUMNS", "80")
    point = {
        "gpus": 100_000,
        "spare_nodes": 196,
        "job_mtbf_h": 0.51,
        "interval_s": 311.0,
        "ettr_mean": 0.543,
        "ettr_p5": 0.533,
        "interruptions_mean": 2356.0,
        "lost_gpu_hours_mean": 59_272_692.0,
        "cost_mean": 122_609_311.0,
    }
    tier = {
        "name": "shared_fs",
        "current_s": 1800.0,
        "closed_form_s": 797.0,
        "recommended_s": 797.0,
        "reason": "r",
    }
    _print(
        {
            "tiers": [tier],
            "spares": {"value": 196, "reason": "r"},
            "strategy": {"value": "in_job", "reason": "r"},
            "scale": [point],
            "notes": [],
            "plots": [],
            "gpu_hour_price": 2.0,
        }
    )
    out = capsys.readouterr().out.splitlines()
    row = next(line for line in out if line.lstrip().startswith("100,000"))
    # durations with their unit (MTBF 0.51 h = 31 min, interval 311 s = 5.2 min), ETTR in percent
    assert row.split() == [
        "100,000",
        "196",
        "31",
        "min",
        "5.2",
        "min",
        "54.3%",
        "53.3%",
        "2,356",
        "59.3M",
        "122.6M",
    ]
    table = out[out.index(next(line for line in out if "predicted at scale" in line)) :][:6]
    assert all(len(line) <= 80 for line in table), table
