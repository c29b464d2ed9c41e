"""Cross-replica checks with threads as replicas: a fake all_gather exchanges their fingerprints, each
replica trains the same tiny model on the same data (as DDP's averaged gradients make them), saves
in-memory checkpoints and rolls back when the check says so. With ``allreduce`` the replicas average
their gradients through the exchange, as DDP does, so a corrupted replica pollutes the others from
its next step on."""

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


def _allreduce(model: torch.nn.Module, ex: Exchange, rank: int) -> None:
    """Every replica's gradients averaged in rank order (the same sum on every run)."""
    grads = ex.gather(rank, [p.grad.clone() for p in model.parameters()])
    for i, p in enumerate(model.parameters()):
        p.grad.copy_(sum(g[i] for g in grads) / len(grads))


def _train(
    r: Replica, ex: Exchange, data, steps: int, flip, seed: int, every: int, allreduce: bool = False
) -> None:
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
        if allreduce:
            _allreduce(model, ex, r.rank)
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


def run(n=3, steps=40, flip=None, seeds=(0, 0, 0), data=ex_data, every=0, allreduce=False) -> list[Replica]:
    ex = Exchange(n)
    reps = [Replica(r) for r in range(n)]

    def main(r: Replica) -> None:
        try:
            _train(r, ex, data, steps, flip, seeds[r.rank], every, allreduce)
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


@pytest.mark.parametrize("flip", [flip_weight, flip_moment])
def test_a_pair_rolls_back_without_naming_a_rank_and_the_replay_names_the_corrupted_one(flip):
    """Checked every step (caught before the next all-reduce spreads it): the pair's finding names
    nobody; the replay of its step matches rank 0's first result, so rank 1's was the corrupted one."""
    clean = run(n=2, seeds=(0, 0), every=1, allreduce=True)
    reps = run(n=2, seeds=(0, 0), flip=(1, 25, flip), every=1, allreduce=True)
    assert all(r.error is None for r in reps)
    pair, again = [e for e in reps[0].events if isinstance(e, SilentCorruption)]
    assert (pair.verdict, pair.step, pair.suspect_ranks, pair.action, pair.to_step) == (
        "pair",
        26,
        (),
        "rollback",
        20,
    )
    assert (again.verdict, again.replay, again.step, again.action, again.to_step) == (
        "replayed",
        "transient",
        26,
        "continue",
        20,
    )
    assert again.suspect_ranks == (1,) and again.suspect_nodes == ("n1",) and again.confidence == 0.9
    assert "matched rank 0's first result; rank 1's first result differed: rank 1 corrupted" in again.reason
    assert again.tensors and all("first rank 0=" in e and "; replay rank 0=" in e for e in again.evidence)
    (inc,) = [e for e in reps[0].events if e.kind == "IncidentRaised" and e.rule == "sdc:replay"]
    assert inc.nodes == ("n1",) and inc.ranks == (1,)
    for r in reps:  # every rank tells its agent: the pair, then the replay that names rank 1
        assert [(t.verdict, t.step, t.suspect_ranks, t.suspect_nodes) for t in r.told] == [
            ("pair", 26, (), ()),
            ("replayed", 26, (1,), ("n1",)),
        ]
        assert r.rollbacks == [(26, 20)] and r.check.replays == {}
    for r, c in zip(reps, clean, strict=True):  # the replay ends where the clean run ends
        for k in c.final:
            assert torch.equal(r.final[k], c.final[k]), k


def test_a_pair_found_after_the_corruption_spread_is_replayed_but_nobody_is_named():
    """Checked every 4 steps: the check after the flip comes after rank 1's polluted gradients were
    averaged into rank 0's, so neither first result is the clean one; the replay says only that the
    fault did not repeat."""
    clean = run(n=2, seeds=(0, 0), every=4, allreduce=True)
    reps = run(n=2, seeds=(0, 0), flip=(1, 25, flip_weight), every=4, allreduce=True)
    pair, again = [e for e in reps[0].events if isinstance(e, SilentCorruption)]
    assert pair.verdict == "pair" and pair.step == 28 and pair.last_clean_step == 24
    assert (again.verdict, again.replay, again.step, again.suspect_ranks) == ("replayed", "spread", 28, ())
    assert not [e for e in reps[0].events if e.kind == "IncidentRaised" and e.rule == "sdc:replay"]
    assert [t.suspect_ranks for t in reps[1].told] == [(), ()]
    for r, c in zip(reps, clean, strict=True):
        for k in c.final:
            assert torch.equal(r.final[k], c.final[k]), k


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


class Scripted:
    """Rank 0 of two replicas in one thread: the other replica's fingerprints are this rank's, with
    ``bump`` added to its first tensor's (what a test scripts it to hold)."""

    def __init__(self, every: int = 7) -> None:
        self.bump = 0
        self.events: list = []
        self.told: list = []
        self.state = {"model": torch.nn.Linear(4, 2)}
        self.check = ReplicaCheck(
            every=every, budget=0.01, rank=0, node="n0", clock=Clock(), emit=self.events.append,
            note=lambda text: None, context=dict, gather=self.gather, nodes=lambda node: ["n0", "n1"],
            tell=self.told.append,
        )  # fmt: skip

    def gather(self, vec: torch.Tensor) -> list[list[int]]:
        mine, other = vec.tolist(), vec.tolist()
        if vec.numel() > 2:  # fingerprints and the proposal (not the two-number header)
            other[0] += self.bump
        return [mine, other]

    def pair_found_at_a_save(self) -> None:
        """Clean at the save of step 10 (next check due at 17); rank 1 differs at the save of step 15."""
        self.check.begin(self.state, 0, resumed=False)
        assert self.check.verify(1, False) == -1 and self.check.verify(10, True) == -1
        self.bump = 4
        assert self.check.verify(15, True) == 10  # every replica rolls back to step 10

    def replays(self) -> list:
        return [e for e in self.events if isinstance(e, SilentCorruption) and e.verdict == "replayed"]


@pytest.mark.parametrize(
    "bump,outcome,named",
    [(0, "transient", (1,)), (8, "intermittent", (1,)), (4, "repeated", ())],
    ids=["agree", "differs-again", "same-mismatch"],
)
def test_the_replay_is_checked_at_the_pairs_step_whatever_the_interval_and_judged(bump, outcome, named):
    s = Scripted()
    s.pair_found_at_a_save()
    assert not s.check.due(14, False) and s.check.due(15, False), "due at the pair's step, off the interval"
    assert not s.check.due(16, False)
    s.bump = bump
    s.check.verify(15, False)
    (ev,) = s.replays()
    assert (ev.step, ev.replay, ev.suspect_ranks, ev.to_step) == (15, outcome, named, 10)
    assert ev.suspect_nodes == tuple(f"n{r}" for r in named)
    assert ev.action == ("continue" if bump == 0 else "rollback")
    assert s.told[-1 if bump == 0 else -2].verdict == "replayed"
    if bump:  # a pair again: rolled back again, and its step remembered for the next replay
        assert s.check.rollbacks == 2 and list(s.check.replays) == [15]


def test_a_pair_that_keeps_repeating_halts_with_nothing_left_pending():
    s = Scripted()
    s.pair_found_at_a_save()
    with pytest.raises(SilentCorruptionError, match="3 rollback"):
        for _ in range(3):
            s.check.verify(15, False)
    assert [e.replay for e in s.replays()] == ["repeated"] * 3 and s.check.replays == {}


@pytest.mark.parametrize("how", ["finish", "new-loop"])
def test_a_replay_that_ends_before_the_pairs_step_is_recorded_as_not_reached(how):
    s = Scripted()
    s.pair_found_at_a_save()
    s.bump = 0
    if how == "finish":  # Session.finish: the loop stopped (preempted) after step 12
        s.check.end(12)
    else:  # a new loop (a re-formed group) starts at step 12
        s.check.begin(s.state, 12, resumed=False)
    (ev,) = s.replays()
    assert ev.replay == "not_reached" and ev.suspect_ranks == () and ev.action == ""
    assert "stopped after step 12, before step 15" in ev.reason and ev.tensors == ("model.weight",)
    assert [t.verdict for t in s.told] == ["pair"], "nothing named: no agent is told"
    assert s.check.replays == {}
    if how == "finish":
        assert not s.check.due(15, False), "no longer due off the interval"
