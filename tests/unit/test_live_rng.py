"""A rank's RNG record for an in-place replacement (train/live_rng.py) and the worker side of a
re-formation (train/inplace.py): no sleeping, no processes."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from stalwart.protocol import Hello, Reformed, Reforming, decode, encode
from stalwart.train.inplace import Generation, Reform, is_comm_failure
from stalwart.train.live_rng import LiveRng, path_for, restore_at


def _draw() -> tuple:
    return (random.random(), float(np.random.rand()), torch.rand(3).tolist())


def test_the_state_recorded_at_a_step_start_is_restored_exactly(tmp_path):
    rec = LiveRng(path_for(tmp_path, "n0", 2))
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    _draw()
    rec.write(17)
    expected = _draw()
    rec.write(18)  # the next step's start goes to the other slot
    _draw()
    assert restore_at(rec.path, 17) == ""
    assert _draw() == expected
    rec.close()


def test_a_record_of_another_step_or_a_torn_one_is_refused_not_half_applied(tmp_path):
    rec = LiveRng(path_for(tmp_path, "n0", 0))
    rec.write(4)
    rec.close()
    assert "of step 4, not 6" in restore_at(rec.path, 6)
    raw = bytearray(rec.path.read_bytes())
    raw[100] ^= 0xFF  # a torn write: the CRC no longer matches
    rec.path.write_bytes(bytes(raw))
    torch.manual_seed(9)
    before = torch.get_rng_state()
    assert restore_at(rec.path, 4) != ""
    assert torch.equal(torch.get_rng_state(), before)
    assert "no RNG record" in restore_at(tmp_path / "missing.bin", 4)


def test_a_planted_symlink_is_not_followed(tmp_path):
    target = tmp_path / "elsewhere.bin"
    target.write_bytes(b"keep")
    link = path_for(tmp_path, "n0", 1)
    link.symlink_to(target)
    rec = LiveRng(link)
    rec.write(3)  # refused (O_NOFOLLOW): the record is lost, the step is not
    rec.close()
    assert target.read_bytes() == b"keep"


def test_re_formation_messages_round_trip():
    for msg in (
        Hello(1, 2.5, in_place=True),
        Reforming(3, 2, 0.04, 10.0),
        Reformed(3, 2, 17, 1024, {"abort": 0.1, "transfer": 0.2}, 11.0),
    ):
        assert decode(encode(msg).rstrip(b"\n")) == msg
    assert decode(encode(Hello(0, 1.0)).rstrip(b"\n")) == Hello(0, 1.0, in_place=False)


class _Clock:
    def __init__(self) -> None:
        self.t = 0.0
        self.slept = 0.0

    def now(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s
        self.slept += s


def test_a_survivor_waits_for_the_agents_request_and_no_longer_than_its_bound():
    clock = _Clock()
    asked = {"gen": 0}
    gen = Generation(1, lambda: asked["gen"], clock.sleep, clock.now)
    assert gen.wait(2.0) == 0 and clock.now() == pytest.approx(2.0, abs=0.01)
    asked["gen"] = 1  # the current generation is no request
    assert gen.requested() == 0
    asked["gen"] = 2
    clock.slept = 0.0
    assert gen.wait(2.0) == 2 and clock.slept == 0.0
    gen.current = 2
    assert gen.store_prefix() == "stalwart/gen2/"


def test_only_a_peers_failure_or_a_request_is_recovered_in_place():
    assert is_comm_failure(Reform(3))
    assert is_comm_failure(RuntimeError("[gloo/transport/tcp/pair.cc:537] Read error: Connection reset"))
    assert not is_comm_failure(ValueError("bad batch"))
    assert not is_comm_failure(KeyboardInterrupt())
    assert not is_comm_failure(SystemExit(1))
