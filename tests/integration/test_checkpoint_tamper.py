"""A newest checkpoint that was tampered with, each way an attacker or a broken writer could: the
engine rejects it with a reason, runs nothing from it, and resumes from the older good version with
exactly its values. In process (one rank) for every way, and once with 2 gloo ranks to show that
all ranks fall back together.

Run as a script, this file is one rank of the 2-rank case (see ``_main``)."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import socket
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve()
KEY = "0123456789abcdef0123456789abcdef"
pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(300),
    pytest.mark.filterwarnings("ignore:torch.distributed is disabled"),
]


class Evil:
    """Unpickling this runs ``touch <marker>``."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def state_for(step: int) -> dict:
    import torch

    g = torch.Generator().manual_seed(step)
    return {"model": {"w": torch.randn(64, 8, generator=g), "b": torch.randn(8, generator=g)}, "epoch": step}


def _zeros() -> dict:
    import torch

    return {"model": {"w": torch.zeros(64, 8), "b": torch.zeros(8)}, "epoch": -1}


def _same(a: dict, b: dict) -> bool:
    import torch

    return a["epoch"] == b["epoch"] and all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])


def _recompute(d: Path, drop: tuple[str, ...] = ()) -> None:
    """What someone who can write the directory but has no key does: fix sizes and digests (the MAC
    they cannot recompute stays as it was)."""
    from stalwart.checkpoint.manifest import sha256_file

    doc = json.loads((d / "MANIFEST.json").read_text())
    doc["files"] = {
        n: {"size": (d / n).stat().st_size, "sha256": sha256_file(d / n)}
        for n in doc["files"]
        if n not in drop
    }
    (d / "MANIFEST.json").write_text(json.dumps(doc))


def _manifest(raw: bytes):
    return lambda d, marker: (d / "MANIFEST.json").write_bytes(raw)


def _path_traversal(d, marker):
    doc = json.loads((d / "MANIFEST.json").read_text())
    doc["files"]["../step-000000001/__0_0.distcp"] = doc["files"].pop("__0_0.distcp")
    (d / "MANIFEST.json").write_text(json.dumps(doc))


def _metadata_pickle(d, marker):
    (d / ".metadata").write_bytes(pickle.dumps(Evil(marker)))
    _recompute(d)


def _metadata_pickle_unlisted(d, marker):  # verification never looks at it: the load itself must refuse
    (d / ".metadata").write_bytes(pickle.dumps(Evil(marker)))
    _recompute(d, drop=(".metadata",))


def _value_pickle(d, marker):
    import torch.distributed.checkpoint as dcp

    state = state_for(2)
    state["epoch"] = Evil(marker)  # a non-tensor value: DCP stores it pickled
    dcp.save(state, checkpoint_id=str(d))
    _recompute(d)


def _data_byte_digest_recomputed(d, marker):
    f = d / "__0_0.distcp"
    raw = bytearray(f.read_bytes())
    raw[len(raw) // 2] ^= 0x40
    f.write_bytes(bytes(raw))
    _recompute(d)


def _planted_newer_version(d, marker):
    planted = d.with_name("step-000000003")
    shutil.copytree(d, planted)
    doc = json.loads((planted / "MANIFEST.json").read_text())
    doc["step"] = 3
    (planted / "MANIFEST.json").write_text(json.dumps(doc))


CASES = {
    # name: (tamper, key configured, expected step, words in the rejection)
    "manifest null": (_manifest(b"null"), False, 1, "unreadable manifest"),
    "manifest files list": (_manifest(b'{"files": []}'), False, 1, "unreadable manifest"),
    "manifest not utf-8": (_manifest(b'{"step": "\xff"}'), False, 1, "not UTF-8"),
    "manifest path traversal": (_path_traversal, False, 1, "is a path"),
    "metadata pickle": (_metadata_pickle, False, 1, "posix.system"),
    "metadata pickle not in manifest": (_metadata_pickle_unlisted, False, 1, "posix.system"),
    "non-tensor value pickle": (_value_pickle, False, 1, "weights_only"),
    "data byte with recomputed digest": (_data_byte_digest_recomputed, True, 1, "MAC does not match"),
    "planted newer version": (_planted_newer_version, True, 2, "MAC does not match"),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_tampered_newest_version_falls_back_to_the_older_good_one(tmp_path, monkeypatch, case):
    from stalwart.checkpoint.engine import CheckpointEngine
    from stalwart.checkpoint.tiers import TierConfig
    from stalwart.events import CheckpointRejected

    tamper, keyed, expected, words = CASES[case]
    if keyed:
        monkeypatch.setenv("STALWART_CHECKPOINT_KEY", KEY)
    marker = tmp_path / "PWNED"
    tiers = [TierConfig(name="disk", kind="local", location=str(tmp_path / "disk"), keep=5)]
    eng = CheckpointEngine(tiers)
    for step in (1, 2):
        eng.save(step, state_for(step)).future.result()
    eng.close()
    tamper(tmp_path / "disk" / "step-000000002", marker)

    events: list = []
    eng = CheckpointEngine(tiers, sink=events.append)
    target = _zeros()
    got = eng.load_latest(target)
    eng.close()
    assert not marker.exists(), "code from the checkpoint ran"
    assert got is not None and got.step == expected and _same(target, state_for(expected))
    rejected = [e for e in events if isinstance(e, CheckpointRejected)]
    assert rejected and words in rejected[0].reason and "\n" not in rejected[0].reason


# --- 2 ranks -------------------------------------------------------------------------------------


def _main(phase: str, root: str) -> None:
    import torch.distributed as dist

    from stalwart.checkpoint.engine import CheckpointEngine
    from stalwart.checkpoint.tiers import TierConfig

    dist.init_process_group("gloo")
    rank, ws = dist.get_rank(), dist.get_world_size()
    tiers = [TierConfig(name="disk", kind="local", location=str(Path(root) / "disk"), keep=5)]
    eng = CheckpointEngine(tiers, rank=rank, world_size=ws)
    if phase == "train":
        for step in (1, 2):
            eng.save(step, state_for(step)).future.result()  # replicated, as with DDP
    else:
        target = _zeros()
        got = eng.load_latest(target)
        ok = got is not None and got.step == 1 and _same(target, state_for(1))
        Path(root, f"rank{rank}.json").write_text(json.dumps({"ok": ok, "rejected": list(got.rejected)}))
    eng.close()
    dist.destroy_process_group()


def _run(phase: str, root: Path, env_extra: dict) -> None:
    import warm  # deferred: each rank runs this file as a script, where tests/ need not be on the path

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [warm.start(HERE, [phase, str(root)], warm.rank_env(r, 2, port, **env_extra)) for r in range(2)]
    for r, (code, o) in enumerate(warm.wait_all(procs, timeout=240)):  # ranks forked warm
        assert code == 0, f"{phase} rank {r} failed:\n{o[-3000:]}"


@pytest.mark.parametrize("keyed", [False, True], ids=["planted metadata", "forged manifest with key"])
def test_two_ranks_reject_together_and_resume_from_the_older_version(tmp_path, keyed):
    env = {"STALWART_CHECKPOINT_KEY": KEY} if keyed else {}
    _run("train", tmp_path, env)
    newest = tmp_path / "disk" / "step-000000002"
    marker = tmp_path / "PWNED"
    if keyed:
        _data_byte_digest_recomputed(newest, marker)
    else:
        _metadata_pickle_unlisted(newest, marker)
    _run("resume", tmp_path, env)
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert not marker.exists()
    assert all(r["ok"] for r in reports)
    assert all(len(r["rejected"]) == 1 and "step-000000002" in r["rejected"][0] for r in reports)
    assert ("MAC does not match" if keyed else "posix.system") in reports[0]["rejected"][0]


if __name__ == "__main__":
    _main(sys.argv[1], sys.argv[2])
