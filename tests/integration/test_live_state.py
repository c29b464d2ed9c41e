"""The live-state transfer of an in-place recovery over a real gloo group (two processes): a replica's
state arrives whole and exact; a wrong digest or a different model is refused before anything is applied."""

from __future__ import annotations

import json
import os
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import warm

pytestmark = pytest.mark.integration


def _model(width: int = 8) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, width), torch.nn.Linear(width, 2))


def _worker(rank: int, init: str, case: str, out: str) -> None:
    from stalwart.train import live_state, state

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        model = _model(16 if (case == "layout" and rank == 1) else 8)
        opt = torch.optim.AdamW(model.parameters(), lr=0.1)
        new = {"model": model, "optimizer": opt}
        if rank == 0:
            try:
                model(torch.ones(3, 4)).sum().backward()
                opt.step()  # the replica has trained: its state differs from a fresh model's
                cap = state.capture(new)
                if case == "digest":  # a header whose digest does not match the bytes that follow
                    bufs = live_state._flat(cap.sharded)
                    head = {
                        "layout": live_state._layout(cap.sharded),
                        "dtypes": sorted(bufs),
                        "numel": {d: b.numel() for d, b in bufs.items()},
                        "digest": "0" * 64,
                        "extras": 0,
                    }
                    live_state._send_bytes(json.dumps(head).encode(), 1)
                    for d in sorted(bufs):
                        dist.send(bufs[d], 1)
                    live_state._send_bytes(b"", 1)
                else:
                    live_state._send(live_state._payload(cap), 1)
                    torch.save(
                        {k: v.clone() for k, v in model.state_dict().items()}, os.path.join(out, "sent.pt")
                    )
            except RuntimeError:  # the receiver refused and left: the rest of the sends cannot land
                assert case != "ok"
            return
        targets = state.load_targets(new)
        try:
            extras, got = live_state._receive(targets, 0, 1 << 20)
        except live_state.LiveStateError as exc:
            open(os.path.join(out, "refused.txt"), "w").write(str(exc))
            return
        state.apply(new, targets, extras, own_rng=False)
        torch.save({k: v.clone() for k, v in model.state_dict().items()}, os.path.join(out, "got.pt"))
        open(os.path.join(out, "bytes.txt"), "w").write(str(got))
    finally:
        dist.destroy_process_group()


def _run(case: str, out: str) -> None:
    init = f"file://{tempfile.mkdtemp()}/store"
    mp.start_processes(
        _worker, args=(init, case, out), nprocs=2, join=True, start_method=warm.forkserver()
    )  # ranks forked warm


def test_a_replicas_state_arrives_exact(tmp_path):
    _run("ok", str(tmp_path))
    sent, got = torch.load(tmp_path / "sent.pt"), torch.load(tmp_path / "got.pt")
    assert sent.keys() == got.keys() and all(torch.equal(sent[k], got[k]) for k in sent)
    assert int((tmp_path / "bytes.txt").read_text()) > sum(t.numel() * 4 for t in sent.values())


def test_a_wrong_digest_is_refused(tmp_path):
    _run("digest", str(tmp_path))
    assert "fails its SHA-256 digest" in (tmp_path / "refused.txt").read_text()
    assert not (tmp_path / "got.pt").exists()


def test_a_different_model_is_refused(tmp_path):
    _run("layout", str(tmp_path))
    assert "does not match this rank's model" in (tmp_path / "refused.txt").read_text()
