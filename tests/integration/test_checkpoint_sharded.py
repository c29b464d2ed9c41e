"""Sharded state through the SDK with real gloo processes running a user-style FSDP2/HSDP script
(tests/e2e/scripts/fsdp_train.py): resharded resume, exactly-once data across a crash, a SIGTERM
and requeue, and a shrink from 4 to 2 ranks."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pytest

import warm
from netutil import free_port

pytest.importorskip("torchdata")

SCRIPT = Path(__file__).resolve().parents[1] / "e2e" / "scripts" / "fsdp_train.py"
pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


def launch(world: int, *args: str, attempt: int = 0) -> list[tuple[int, str]]:
    """Start ``world`` ranks of the script the way torchrun does (env://) and wait for them. Ranks
    are forked warm (tests/warm.py): real processes, without importing torch once each."""
    port = free_port()
    procs = [warm.start(SCRIPT, list(args), _rank_env(r, world, port, attempt)) for r in range(world)]
    return warm.wait_all(procs, timeout=300)


def _rank_env(rank: int, world: int, port: int, attempt: int = 0) -> dict[str, str]:
    # TORCHELASTIC_RESTART_COUNT: what torchrun sets; the SDK reads it
    return warm.rank_env(rank, world, port, TORCHELASTIC_RESTART_COUNT=str(attempt))


def same(a, b, where="") -> None:
    import torch

    if isinstance(a, dict):
        assert set(a) == set(b), f"{where}: keys differ: {set(a) ^ set(b)}"
        for k in a:
            same(a[k], b[k], f"{where}/{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            same(x, y, f"{where}/{i}")
    elif isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b), f"{where} differs"
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def test_hsdp_saved_at_4_ranks_resumes_at_2_with_the_same_model_and_optimizer(tmp_path):
    import torch

    ck = str(tmp_path / "ck")
    saved, resumed = tmp_path / "saved.pt", tmp_path / "resumed.pt"
    runs = launch(
        4,
        "--mesh",
        "2x2",
        "--steps",
        "4",
        "--checkpoint-every",
        "4",
        "--checkpoint-dir",
        ck,
        "--out",
        str(saved),
    )
    assert all(code == 0 for code, _ in runs), runs[0][1][-3000:]
    runs = launch(
        2, "--steps", "5", "--checkpoint-every", "0", "--checkpoint-dir", ck, "--dump-at-start", str(resumed)
    )
    assert all(code == 0 for code, _ in runs), runs[0][1][-3000:]
    a, b = torch.load(saved, weights_only=True), torch.load(resumed, weights_only=True)
    assert len(a["optimizer"]["state"]) == 6 and int(a["optimizer"]["state"]["layers.0.weight"]["step"]) == 4
    same(a, b)  # parameters and every Adam moment, exactly, before the first new step
    fresh = {k: torch.zeros_like(v) for k, v in a["model"].items()}
    assert any(not torch.equal(v, fresh[k]) for k, v in a["model"].items())
    version = Path(ck) / "step-000000004"
    assert sorted(p.name for p in version.glob("rank-*.pt")) == [f"rank-{r}.pt" for r in range(4)]
    assert len(list(version.glob("*.distcp"))) == 4  # every rank wrote its own shards


def consumed(log_dir: Path) -> tuple[list[int], list[int]]:
    """The samples that made it into the model: per attempt (in order), drop what earlier attempts
    consumed at or after the step this one resumed from, then add this attempt's records."""
    by_attempt: dict[int, list[dict]] = {}
    for f in log_dir.glob("a*-r*-p*.jsonl"):
        by_attempt.setdefault(int(f.name[1:].split("-")[0]), []).extend(
            json.loads(line) for line in f.read_text().splitlines()
        )
    kept: list[dict] = []
    starts = []
    for attempt in sorted(by_attempt):
        recs = by_attempt[attempt]
        start = min(r["step"] for r in recs)
        starts.append(start)
        kept = [r for r in kept if r["step"] < start] + recs
    return [i for r in kept for i in r["ids"]], starts


def test_every_sample_of_an_epoch_is_consumed_exactly_once_across_crash_requeue_and_shrink(tmp_path):
    n, logs = 96, tmp_path / "ids"
    common = [
        "--samples",
        str(n),
        "--batch",
        "4",
        "--checkpoint-every",
        "2",
        "--checkpoint-dir",
        str(tmp_path / "ck"),
        "--log-dir",
        str(logs),
    ]
    # attempt 0, 4 ranks (16 samples a step): every rank dies in the middle of step 3
    runs = launch(4, *common, "--steps", "7", "--exit-at", "3", attempt=0)
    assert all(code == 1 for code, _ in runs), runs[0][1][-3000:]
    # attempt 1, 4 ranks: a preemption notice (SIGTERM) in step 4: emergency checkpoint after it
    runs = launch(4, *common, "--steps", "7", "--sigterm-at", "4", attempt=1)
    codes = {code for code, _ in runs}
    assert len(codes) == 1 and codes != {0} and codes != {1}, runs[0][1][-3000:]
    # attempt 2, requeued on 2 ranks (8 samples a step): the unseen rest of the epoch, split anew
    runs = launch(2, *common, "--steps", "7", attempt=2)
    assert all(code == 0 for code, _ in runs), runs[0][1][-3000:]
    ids, starts = consumed(logs)
    assert starts == [0, 2, 5]  # resumed from the step-2 checkpoint, then from the emergency one
    counts = Counter(ids)
    assert sorted(counts) == list(range(n)) and set(counts.values()) == {1}, counts.most_common(3)
    every = [json.loads(x) for f in logs.glob("*.jsonl") for x in f.read_text().splitlines()]
    assert {r["epoch"] for r in every} == {0} and {r["world"] for r in every} == {4, 2}
    raw = Counter(i for r in every for i in r["ids"])
    assert max(raw.values()) > 1  # the crash really did lose consumed samples that came again


def _flip_rank1_shard(v: Path) -> None:
    f = v / "__1_0.distcp"
    raw = bytearray(f.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    f.write_bytes(bytes(raw))


def _truncate_rank1_shard(v: Path) -> None:
    f = v / "__1_0.distcp"
    os.truncate(f, f.stat().st_size // 2)


def _drop_rank1_extras(v: Path) -> None:
    (v / "rank-1.pt").unlink()


@pytest.fixture(scope="module")
def versions_2_and_4(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Versions 2 and 4 of a 2-rank FSDP2 run (two attempts) and the state at step 2, made once and
    shared by the damage cases, each of which damages its own copy."""
    root = tmp_path_factory.mktemp("fsdp2-versions")
    common = ["--checkpoint-every", "2", "--checkpoint-dir", str(root / "ck")]
    runs = launch(2, *common, "--steps", "2", "--out", str(root / "at2.pt"))
    assert all(code == 0 for code, _ in runs), runs[0][1][-3000:]
    runs = launch(2, *common, "--steps", "4", attempt=1)
    assert all(code == 0 for code, _ in runs), runs[0][1][-3000:]
    return root


@pytest.mark.parametrize(
    "damage,reason",
    [
        (_flip_rank1_shard, "corrupted"),
        (_truncate_rank1_shard, "truncated"),
        (_drop_rank1_extras, "missing file"),
    ],
    ids=["bitflip", "truncated", "missing"],
)
def test_fsdp2_damaged_shard_of_one_rank_resumes_every_rank_from_the_previous_version(
    tmp_path, versions_2_and_4, damage, reason
):
    import torch

    ck = str(tmp_path / "ck")  # this case's own copy of the shared run's versions
    shutil.copytree(versions_2_and_4 / "ck", ck, symlinks=True)
    common = ["--checkpoint-every", "2", "--checkpoint-dir", ck]
    damage(Path(ck) / "step-000000004")
    from stalwart.checkpoint.manifest import verify

    assert reason in verify(Path(ck) / "step-000000004")[1]
    runs = launch(2, *common, "--steps", "5", "--dump-at-start", str(tmp_path / "resumed.pt"), attempt=2)
    assert all(code == 0 for code, _ in runs), runs[0][1][-3000:]
    same(
        torch.load(versions_2_and_4 / "at2.pt", weights_only=True),
        torch.load(tmp_path / "resumed.pt", weights_only=True),
    )
    assert verify(Path(ck) / "step-000000002")[0] is not None  # nothing good was lost
    for step in (4, 5):  # the run went on and wrote step 4 again, whole this time
        assert verify(Path(ck) / f"step-{step:09d}")[0] is not None


def test_fsdp2_kill_9_of_every_rank_never_resumes_from_a_torn_version(tmp_path):
    """All ranks are killed while checkpointing every step (most of a step is persist), then resumed."""
    import signal
    import time

    import torch

    ck = tmp_path / "ck"
    port = free_port()
    args = ["--steps", "100000", "--checkpoint-every", "1", "--checkpoint-dir", str(ck)]
    procs = [warm.start(SCRIPT, args, _rank_env(r, 2, port)) for r in range(2)]
    deadline = time.monotonic() + 180
    while len(list(ck.glob("step-*"))) < 2 if ck.exists() else True:
        assert all(p.poll() is None for p in procs) and time.monotonic() < deadline
        time.sleep(0.05)
    # kill while a version is being written, told by its partial directory (no fixed sleep)
    while not list(ck.glob(".step-*.partial")):
        assert all(p.poll() is None for p in procs) and time.monotonic() < deadline
        time.sleep(0.005)
    for p in procs:
        p.send_signal(signal.SIGKILL)
    for p in procs:
        p.wait(timeout=30)
    from stalwart.checkpoint.manifest import verify

    good = sorted(int(p.name[5:]) for p in ck.glob("step-*") if verify(p)[0] is not None)
    assert good
    newest = max(good)
    runs = launch(
        2,
        "--steps",
        str(newest + 1),
        "--checkpoint-every",
        "1",
        "--checkpoint-dir",
        str(ck),
        "--dump-at-start",
        str(tmp_path / "resumed.pt"),
        attempt=1,
    )
    assert all(code == 0 for code, _ in runs), runs[0][1][-3000:]
    got = torch.load(tmp_path / "resumed.pt", weights_only=True)
    assert int(got["optimizer"]["state"]["layers.0.weight"]["step"]) == newest
    assert not list(ck.glob(".step-*.partial"))  # torn leftovers swept
    assert verify(ck / f"step-{newest + 1:09d}")[0] is not None


@pytest.fixture
def small_tmpfs(tmp_path):
    import shutil
    import uuid

    mnt = tmp_path / f"full-{uuid.uuid4().hex[:6]}"
    mnt.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256k,mode=0700", "tmpfs", str(mnt)], capture_output=True
    )
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.decode().strip()}")
    yield mnt
    subprocess.run(["umount", str(mnt)], check=False)


def test_fsdp2_full_disk_fails_saves_keeps_committed_versions_and_resumes_from_the_newest(
    tmp_path, small_tmpfs
):
    import torch

    from stalwart.checkpoint.manifest import verify

    common = ["--checkpoint-every", "2", "--checkpoint-dir", str(small_tmpfs)]
    runs = launch(2, *common, "--steps", "12")
    assert all(code == 0 for code, _ in runs), runs[0][1][-3000:]  # a failed save does not stop training
    assert not list(small_tmpfs.glob(".step-*"))  # no partial version left behind
    versions = sorted(small_tmpfs.glob("step-*"))
    good = [int(p.name[5:]) for p in versions if verify(p)[0] is not None]
    assert good and len(good) == len(versions) and max(good) < 12  # the disk filled before the end
    runs = launch(2, *common, "--steps", "13", "--dump-at-start", str(tmp_path / "resumed.pt"), attempt=1)
    assert all(code == 0 for code, _ in runs), runs[0][1][-3000:]
    got = torch.load(tmp_path / "resumed.pt", weights_only=True)
    assert int(got["optimizer"]["state"]["layers.0.weight"]["step"]) == max(good)
    assert all(verify(small_tmpfs / f"step-{s:09d}")[0] is not None for s in good)
