"""Cross-replica checks with threads as replicas: a fake all_gather exchanges their fingerprints, each
replica trains the same tiny model on the same data (as DDP's averaged gradients make them), saves
in-memory checkpoints and rolls back when the check says so."""

from __future__ import annotations

import copy
import threading
from dataclasses import dataclass, field

import pytest
import torch

from stalwart.errors import SilentCorruptionError
from stalwart.events.integrity import SilentCorruption
from stalwart.train.fingerprint import bits
from stalwart.train.replica_check import ReplicaCheck

STEP_S = 0.016
CHECK_S = 0.0002
INIT = threading.Lock()


class Exchange:
    """An all_gather among ``n`` threads."""

    def __init__(self, n: int) -> None:
        self.barrier = threading.Barrier(n, timeout=30)
        self.slots: list[object] = [None] * n

    def gather(self, rank: int, value: object) -> list:
        self.slots[rank] = value
        self.barrier.wait()
        out = list(self.slots)
        self.barrier.wait()
        return out


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return 1000.0 + self.t

    def monotonic(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds


@dataclass
class Replica:
    rank: int
    events: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    told: list = field(default_factory=list)  # what this rank told its agent
    rollbacks: list = field(default_factory=list)
    final: dict = field(default_factory=dict)
    check: ReplicaCheck | None = None
    error: BaseException | None = None


def flip_weight(state, rank):
    bits(state["model"].weight.data).view(-1)[3] ^= 1 << 23  # the lowest exponent bit: the weight doubles


def flip_moment(state, rank):
    exp_avg = state["optimizer"].state[state["model"].weight]["exp_avg"]
    bits(exp_avg).view(-1)[0] ^= 1 << 23


def _train(r: Replica, ex: Exchange, data, steps: int, flip, seed: int, every: int) -> None:
    clock = Clock()
    with INIT:  # the global RNG, one thread at a time
        torch.manual_seed(seed)
        model = torch.nn.Linear(8, 4)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    state = {"model": model, "optimizer": opt}

    def gather(vec):
        clock.t += CHECK_S
        return [v.tolist() for v in ex.gather(r.rank, vec.clone())]

    check = ReplicaCheck(
        every=every,
        budget=0.01,
        rank=r.rank,
        node=f"n{r.rank}",
        clock=clock,
        emit=r.events.append,
        note=r.notes.append,
        context=lambda: {"rank": r.rank},
        gather=gather,
        nodes=lambda node: ex.gather(r.rank, node),
        tell=r.told.append,
    )
    r.check = check
    saved: dict[int, dict] = {}
    check.begin(state, 0, resumed=False)
    step, flipped = 0, False
    while step < steps:
        x = data(step, r.rank)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        clock.t += STEP_S
        done = step + 1
        if flip is not None and flip[0] == r.rank and flip[1] == step and not flipped:
            flip[2](state, r.rank)
            flipped = True
        saving = done % 10 == 0
        if check.due(done, saving or done == steps):
            back = check.verify(done, saving)
            if back >= 0:
                r.rollbacks.append((done, back))
                model.load_state_dict(saved[back]["model"])
                opt.load_state_dict(saved[back]["optimizer"])
                step = back
                continue
        if saving:
            saved[done] = copy.deepcopy({"model": model.state_dict(), "optimizer": opt.state_dict()})
        step = done
    r.final = {k: v.clone() for k, v in model.state_dict().items()}


def ex_data(step: int, rank: int) -> torch.Tensor:
    return torch.randn(16, 8, generator=torch.Generator().manual_seed(step))


def run(n=3, steps=40, flip=None, seeds=(0, 0, 0), data=ex_data, every=0) -> list[Replica]:
    ex = Exchange(n)
    reps = [Replica(r) for r in range(n)]

    def main(r: Replica) -> None:
        try:
            _train(r, ex, data, steps, flip, seeds[r.rank], every)
        except SilentCorruptionError as exc:  # every replica stops together
            r.error = exc
        except BaseException as exc:  # noqa: BLE001 - reported to the test; the others must not wait
            r.error = exc
            ex.barrier.abort()

    threads = [threading.Thread(target=main, args=(r,)) for r in reps]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return reps


def test_a_healthy_job_is_never_flagged_and_marks_every_save_clean():
    reps = run()
    for r in reps:
        assert r.error is None
        assert r.events == [] and r.rollbacks == [] and r.notes == [] and r.told == []
        assert r.check is not None and r.check.active
        assert r.check.clean_steps == [10, 20, 30, 40]
        # a 0.2 ms check at 16 ms steps within 1%: every 2 steps (the largest proposal of the ranks)
        assert r.check.interval == 2


@pytest.mark.parametrize("flip", [flip_weight, flip_moment])
def test_a_flipped_bit_is_found_the_rank_named_and_every_replica_rolled_back(flip):
    clean = run()
    reps = run(flip=(1, 25, flip))
    assert all(r.error is None for r in reps)
    (found_at, back), *more = reps[0].rollbacks
    assert back == 20 and more == []
    assert all(r.rollbacks == reps[0].rollbacks for r in reps)
    assert 26 <= found_at <= 26 + reps[0].check.interval  # within one interval of the flip
    (ev,) = [e for e in reps[0].events if isinstance(e, SilentCorruption)]
    assert ev.suspect_ranks == (1,) and ev.suspect_nodes == ("n1",)
    assert ev.action == "rollback" and ev.to_step == 20 and ev.verdict == "odd_one_out"
    assert ev.tensors and ev.evidence and ev.confidence > 0.5
    # the interval the finding check ran at: the steps since the previous check, which was clean
    assert ev.step == found_at and ev.interval == found_at - ev.last_clean_step > 0
    assert any(e.kind == "IncidentRaised" and e.nodes == ("n1",) for e in reps[0].events)
    assert reps[1].events == [] and reps[2].events == []  # rank 0 writes the event
    for r in reps:  # every rank tells its own agent, which quarantines its node if it is named
        (told,) = r.told
        assert (told.rank, told.step, told.verdict) == (r.rank, found_at, "odd_one_out")
        assert told.suspect_ranks == (1,) and told.suspect_nodes == ("n1",) and told.tensors == ev.tensors
    for r, c in zip(reps, clean, strict=True):  # the replay ends where the clean run ends
        for k in c.final:
            assert torch.equal(r.final[k], c.final[k]), k


def test_a_pair_that_disagrees_rolls_back_without_naming_a_rank():
    reps = run(n=2, seeds=(0, 0), flip=(1, 25, flip_weight))
    (ev,) = [e for e in reps[0].events if isinstance(e, SilentCorruption)]
    assert ev.verdict == "pair" and ev.suspect_ranks == () and ev.to_step == 20
    assert [(t.verdict, t.suspect_nodes) for r in reps for t in r.told] == [("pair", ())] * 2


def test_ranks_that_start_different_are_not_replicas_and_are_never_checked():
    reps = run(seeds=(0, 1, 2))
    assert all(r.error is None and not r.check.active and r.events == [] for r in reps)
    assert "not replicas" in reps[0].notes[0]


def test_ranks_that_diverge_by_themselves_turn_the_check_off():
    reps = run(data=lambda step, rank: torch.randn(16, 8, generator=torch.Generator().manual_seed(rank)))
    assert all(r.error is None and not r.check.active and r.events == [] for r in reps)
    assert "after a step" in reps[0].notes[0]


def test_corruption_before_any_clean_checkpoint_stops_the_run():
    reps = run(flip=(1, 3, flip_weight))
    assert all(isinstance(r.error, SilentCorruptionError) for r in reps)
    assert "nothing safe to roll back to" in str(reps[0].error)


def test_ranks_holding_different_tensors_are_told_apart_before_any_unequal_gather():
    """Pipeline stages hold other layers: the first gather (a fixed two-number header) says so, and
    no gather of vectors of unequal lengths (which would fail or hang a real collective) follows."""
    ex, sizes, notes = Exchange(2), [[], []], []

    def replica(rank: int) -> None:
        model = (
            torch.nn.Linear(8, 4)
            if rank == 0
            else torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Linear(4, 2))
        )

        def gather(vec):
            sizes[rank].append(vec.numel())
            return [v.tolist() for v in ex.gather(rank, vec.clone())]

        check = ReplicaCheck(every=0, budget=0.01, rank=rank, node=f"n{rank}", clock=Clock(),
                             emit=lambda e: None, note=notes.append, context=dict, gather=gather)  # fmt: skip
        check.begin({"model": model}, 0, resumed=False)
        assert not check.active

    threads = [threading.Thread(target=replica, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert sizes == [[2], [2]]
    assert notes and "hold different tensors" in notes[0]
