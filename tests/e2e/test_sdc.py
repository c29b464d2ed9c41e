"""Silent data corruption in a real 3-rank DDP job: a bit the chaos plan flips on rank 1 is found by
the cross-replica check within the checks' interval, rank 1 and its node are named, every rank rolls
back to the checkpoint verified clean before the flip, and the run ends with every replica's weights
bit-identical to a run without the fault. A healthy run is never flagged. With two ranks (a pair names
nobody) the replay of the step after the rollback names rank 1, whose node is quarantined."""

from __future__ import annotations

from pathlib import Path

import pytest

from stalwart.diagnose.precision import detector_stats
from stalwart.events import ChaosInjected, DecisionTaken, IncidentRaised, TrainingResumed
from stalwart.events.integrity import SilentCorruption, TrainingAnomaly
from stalwart.health.node_store import HealthStore
from stalwart.ledger import LedgerWriter

from .runner import events, integrity_findings, stalwart

pytestmark = pytest.mark.e2e

SCRIPT = str(Path(__file__).parent / "sdk_scripts" / "sdc_ddp.py")
STEPS = 60
FLIP_STEP = 30  # flipped at the end of step 30: 31 steps done; the checkpoint of step 30 is clean


def _run(
    tmp_path: Path, name: str, *chaos: str, nproc: int = 3, flags: tuple[str, ...] = ()
) -> tuple[Path, list[str]]:
    rd, out = tmp_path / name, tmp_path / f"{name}-out"
    out.mkdir()
    faults = [a for spec in chaos for a in ("--chaos", spec)]
    run = stalwart(
        "run", "-q", "--no-health-gate", "--nproc-per-node", str(nproc), "--run-dir", str(rd), *faults, *flags,
        SCRIPT, str(STEPS), str(out),
        timeout=400,
    )  # fmt: skip
    assert run.code == 0, run.out[-3000:] + run.err[-3000:]
    return rd, [(out / f"digest-rank{r}.txt").read_text() for r in range(nproc)]


@pytest.fixture(scope="module")
def clean(tmp_path_factory) -> tuple[Path, list[str]]:
    return _run(tmp_path_factory.mktemp("sdc"), "clean")


def test_a_healthy_ddp_job_is_never_flagged(clean):
    rd, digests = clean
    assert len(set(digests)) == 1
    evs = events(rd)
    assert not [e for e in evs if isinstance(e, SilentCorruption)]
    assert not [e for e in evs if isinstance(e, IncidentRaised) and e.rule.startswith("sdc:")]
    assert HealthStore(rd / "health").events() == [], "a healthy job quarantines no node"


@pytest.mark.parametrize("target", ["param", "grad", "optim"])
def test_a_flipped_bit_is_found_named_and_rolled_back_to_the_clean_result(tmp_path, clean, target):
    rd, digests = _run(tmp_path, target, f"bitflip@rank=1,step={FLIP_STEP},target={target}")
    evs = events(rd)
    (flip,) = [e for e in evs if isinstance(e, ChaosInjected)]
    assert (flip.fault, flip.rank, flip.step) == (
        "bitflip",
        1,
        FLIP_STEP,
    ) and "nothing flipped" not in flip.detail
    (sdc,) = [e for e in evs if isinstance(e, SilentCorruption)]
    assert sdc.suspect_ranks == (1,) and sdc.suspect_nodes and sdc.verdict == "odd_one_out"
    assert sdc.action == "rollback" and sdc.to_step == FLIP_STEP and sdc.confidence > 0.5
    # found at the first check after the flip: within one interval, and at the latest at the next save
    assert FLIP_STEP + 1 <= sdc.step <= min(FLIP_STEP + 1 + sdc.interval, 40)
    assert sdc.last_clean_step <= FLIP_STEP and sdc.tensors and sdc.evidence
    assert any(
        isinstance(e, IncidentRaised) and e.rule == "sdc:replica-mismatch" and e.ranks == (1,) for e in evs
    )
    assert any(isinstance(e, TrainingResumed) and e.step == FLIP_STEP for e in evs)
    # rank 1's node is quarantined by its agent (once, though every rank reported the finding), with the reason
    (node,) = sdc.suspect_nodes
    rec = HealthStore(rd / "health").record(node)
    assert rec.state.value == "quarantined" and rec.fault_key == "sdc" and rec.needs_human, rec
    assert (
        f"after step {sdc.step}" in rec.reason
        and "odd_one_out" in rec.reason
        and sdc.tensors[0] in rec.reason
    )
    (quarantine,) = [e for e in evs if isinstance(e, DecisionTaken) and e.action == "sdc_quarantine"]
    assert quarantine.node == node
    assert digests == clean[1], "every replica ends where the run without the fault ends"
    stats = {d.detector: d for d in detector_stats(evs)}["sdc"]
    assert stats.faults == 1 and stats.caught == 1 and stats.confirmed == 1, stats


def test_the_suites_check_for_false_findings_reads_every_ledger_under_a_directory(tmp_path: Path):
    # every other e2e test's tmp_path is read by this check after it (tests/e2e/conftest.py)
    assert integrity_findings(tmp_path) == []
    with LedgerWriter(tmp_path / "run" / "ledger" / "worker-n0-a0-r1-p9.ledger", writer="test") as w:
        w.append(SilentCorruption(ts=1.0, step=30, verdict="odd_one_out", node="n0", rank=1, reason="bit"))
        w.append(
            TrainingAnomaly(
                ts=2.0, step=31, signal="loss", anomaly="nonfinite", value="nan", node="n0", rank=1
            )
        )
    found = integrity_findings(tmp_path)
    assert len(found) == 2 and found[0].startswith("SilentCorruption on n0 rank 1"), found


@pytest.fixture(scope="module")
def clean_pair(tmp_path_factory) -> tuple[Path, list[str]]:
    return _run(tmp_path_factory.mktemp("sdc-pair"), "clean-pair", nproc=2)


def test_a_pairs_mismatch_is_localised_by_replaying_the_step(tmp_path, clean_pair):
    """Two replicas: the mismatch names nobody and every rank rolls back; checked every step, it was
    found before the next all-reduce spread it, so the replay of that step matches rank 0's first
    result and rank 1 is named (and its node quarantined); the run ends where the fault-free one does."""
    rd, digests = _run(
        tmp_path, "pair", f"bitflip@rank=1,step={FLIP_STEP}", nproc=2, flags=("--sdc-every", "1")
    )
    evs = events(rd)
    pair, again = [e for e in evs if isinstance(e, SilentCorruption)]
    assert (pair.verdict, pair.step, pair.suspect_ranks, pair.action, pair.to_step) == (
        "pair",
        FLIP_STEP + 1,
        (),
        "rollback",
        FLIP_STEP,
    )
    assert (again.verdict, again.replay, again.step, again.to_step) == (
        "replayed",
        "transient",
        FLIP_STEP + 1,
        FLIP_STEP,
    )
    assert again.suspect_ranks == (1,) and again.confidence >= 0.9 and again.action == "continue"
    assert "matched rank 0's first result; rank 1's first result differed: rank 1 corrupted" in again.reason
    assert again.evidence and "; replay " in again.evidence[0]
    assert any(isinstance(e, IncidentRaised) and e.rule == "sdc:replay" and e.ranks == (1,) for e in evs)
    (node,) = again.suspect_nodes
    rec = HealthStore(rd / "health").record(node)
    assert rec.state.value == "quarantined" and rec.fault_key == "sdc", rec
    assert f"after step {FLIP_STEP + 1}" in rec.reason and "replayed" in rec.reason
    (quarantine,) = [e for e in evs if isinstance(e, DecisionTaken) and e.action == "sdc_quarantine"]
    assert quarantine.node == node
    assert digests == clean_pair[1], "every replica ends where the run without the fault ends"
    stats = {d.detector: d for d in detector_stats(evs)}["sdc"]
    assert stats.faults == 1 and stats.caught == 1 and stats.confirmed == stats.firings == 2, stats
