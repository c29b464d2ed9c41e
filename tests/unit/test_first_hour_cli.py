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
