"""Stalwart's own rendezvous (launch/rendezvous/round_rendezvous.py, round_policy.py): the pure
decisions with times given, then the handler with agent threads on a real loopback TCPStore: a round at
min = max, min < max with the last call, a late node waiting and then joining the next round with the
group, a dead leader's round closed by a member, forged records refused, a closed rendezvous."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable

import pytest
from torch.distributed import TCPStore
from torch.distributed.elastic.rendezvous import (
    RendezvousClosedError,
    RendezvousHandler,
    RendezvousInfo,
    RendezvousTimeoutError,
)

from stalwart.job_key import JobKey, KeySource, Refusals
from stalwart.launch.rendezvous.round_policy import (
    Bounds,
    Closing,
    Joiner,
    RoundResult,
    RoundView,
    Verdict,
    choose,
    closing,
    takeover,
    view_of,
    wake_at,
)
from stalwart.launch.rendezvous.round_rendezvous import RoundRendezvousHandler

KEY = JobKey(b"r" * 32, KeySource.FILE)
RUN = "round-test"
JOIN_S = 60.0  # the test's own bound on any agent thread (a hang fails the test, it never blocks it)


# the pure decisions ----------------------------------------------------------------------------


def test_a_round_closes_at_once_when_max_arrived():
    got = closing(RoundView(count=4, back=0, previous=0), Bounds(2, 4, 3.0), ready_for_s=0.0, left_s=10)
    assert got.verdict is Verdict.CLOSE and "max" in got.reason


def test_between_min_and_max_the_round_waits_for_the_last_call_then_closes():
    bounds = Bounds(2, 4, 3.0)
    view = RoundView(count=3, back=0, previous=0)
    waiting = closing(view, bounds, ready_for_s=1.0, left_s=100)
    assert waiting.verdict is Verdict.WAIT and waiting.recheck_s == pytest.approx(2.0)
    assert closing(view, bounds, ready_for_s=3.0, left_s=100).verdict is Verdict.CLOSE


def test_below_min_the_round_waits_then_times_out_at_the_deadline():
    bounds = Bounds(3, 4, 1.0)
    view = RoundView(count=2, back=0, previous=0)
    assert closing(view, bounds, None, left_s=5).verdict is Verdict.WAIT
    got = closing(view, bounds, None, left_s=0)
    assert got.verdict is Verdict.TIMEOUT and "2 of at least 3" in got.reason


def test_newcomers_alone_never_close_a_round_beside_a_running_group():
    bounds = Bounds(2, 2, 1.0)
    spares = RoundView(count=2, back=0, previous=2)  # two hot spares while a full group of 2 runs
    assert closing(spares, bounds, None, left_s=5).verdict is Verdict.WAIT
    partly_back = RoundView(count=3, back=1, previous=2)  # one of the group came back: last call
    assert closing(partly_back, bounds, 0.5, left_s=5).verdict is Verdict.WAIT
    assert closing(partly_back, bounds, 1.0, left_s=5).verdict is Verdict.CLOSE
    all_back = RoundView(count=4, back=2, previous=2)
    assert closing(all_back, bounds, 0.0, left_s=5).verdict is Verdict.CLOSE


def test_a_waiting_leader_sleeps_until_min_then_until_max_not_on_every_arrival():
    bounds = Bounds(4, 16, 3.0)
    assert wake_at(RoundView(count=1, back=0, previous=0), bounds) == 4
    assert wake_at(RoundView(count=5, back=0, previous=0), bounds) == 16
    assert wake_at(RoundView(count=16, back=3, previous=4), bounds) == 17  # the group's last coming back


def test_a_member_takes_over_only_after_the_round_was_closable_for_the_bound():
    close = Closing(Verdict.CLOSE, "4 arrived")
    assert takeover(close, None, 5.0).verdict is Verdict.WAIT
    assert takeover(close, 4.9, 5.0).verdict is Verdict.WAIT
    got = takeover(close, 5.0, 5.0)
    assert got.verdict is Verdict.CLOSE and "leader" in got.reason
    wait = Closing(Verdict.WAIT, "1 of 2", 1.0)
    assert takeover(wait, None, 5.0) == wait


def test_the_previous_group_keeps_its_ranks_and_newcomers_follow_by_arrival():
    joiners = [
        Joiner(1, "spare", 1, -1, -1),
        Joiner(2, "b", 1, 7, 1),
        Joiner(3, "a", 1, 7, 0),
        Joiner(4, "old", 1, 5, 0),  # a member of an older round: a newcomer here
    ]
    assert [j.host for j in choose(joiners, 7, 4)] == ["a", "b", "spare", "old"]
    assert [j.host for j in choose(joiners, 7, 2)] == ["a", "b"]
    twice = [
        Joiner(1, "a", 1, -1, -1, "n-a"),
        Joiner(2, "b", 1, -1, -1, "n-b"),
        Joiner(3, "a", 2, -1, -1, "n-a"),
    ]
    assert [(j.host, j.arrival) for j in choose(twice, -1, 4)] == [("b", 2), ("a", 3)]  # a's last arrival
    assert view_of(twice, -1, 0).count == 2


def test_the_signed_records_not_the_counters_say_whether_a_round_is_ready():
    joiners = [Joiner(2, "a", 1, 4, 0), Joiner(5, "new", 1, -1, -1)]
    assert view_of(joiners, 4, previous=3) == RoundView(count=2, back=1, previous=3)
    assert view_of(joiners, -1, previous=0) == RoundView(count=2, back=0, previous=0)


def test_records_that_are_not_what_they_claim_are_rejected():
    assert Joiner.decode(3, Joiner(3, "h", 5, 1, 0, "n").encode()) == Joiner(3, "h", 5, 1, 0, "n")
    result = RoundResult(2, 3, 4, "h", 5)
    assert RoundResult.decode(result.encode()) == result
    for bad in (b"x", b"[1,2]", b'["h", "5", 1, 0, "n"]', b'["h", 5, 1, 0, 7]'):
        with pytest.raises(ValueError):
            Joiner.decode(1, bad)
    for bad in (
        b"{}",
        b'[1, 1, 0, "h", 1]',
        b'["1", 1, 2, "h", 1]',
    ):
        with pytest.raises(ValueError):
            RoundResult.decode(bad)


# the handler on a real store ---------------------------------------------------------------------


class Group:
    """A loopback TCPStore and agents (each its own client), run as threads."""

    def __init__(self) -> None:
        self.host = TCPStore("127.0.0.1", 0, None, True, wait_for_workers=False)
        self.refusals = Refusals()

    def client(self) -> TCPStore:
        return TCPStore("127.0.0.1", self.host.port, None, False, wait_for_workers=False)

    def agent(
        self,
        bounds: Bounds,
        cls: type[RoundRendezvousHandler] = RoundRendezvousHandler,
        **kw: float,
    ) -> RoundRendezvousHandler:
        kw.setdefault("timeout_s", 30.0)
        kw.setdefault("join_grace_s", 0.5)
        return cls(self.client(), RUN, KEY.signer(RUN), self.refusals, bounds, local_addr="127.0.0.1", **kw)  # type: ignore[arg-type]


def meet(
    handlers: list[RendezvousHandler], stagger: Callable[[int], None] = lambda i: None
) -> dict[int, object]:
    """Every handler's next_rendezvous on a thread of its own: its RendezvousInfo or its exception."""
    out: dict[int, object] = {}

    def go(i: int) -> None:
        try:
            out[i] = handlers[i].next_rendezvous()
        except Exception as exc:  # noqa: BLE001 - the test reads it
            out[i] = exc

    threads = []
    for i in range(len(handlers)):
        stagger(i)
        threads.append(threading.Thread(target=go, args=(i,), daemon=True))
        threads[-1].start()
    for t in threads:
        t.join(timeout=JOIN_S)
    assert not any(t.is_alive() for t in threads), "an agent did not answer"
    return out


def infos(out: dict[int, object]) -> list[RendezvousInfo]:
    assert all(isinstance(v, RendezvousInfo) for v in out.values()), out
    return [v for _, v in sorted(out.items())]  # type: ignore[misc]


def test_agents_at_min_equal_max_form_one_round_with_distinct_ranks():
    group = Group()
    agents = [group.agent(Bounds(8, 8, 5.0)) for _ in range(8)]
    got = infos(meet(agents))  # type: ignore[arg-type]
    assert sorted(i.rank for i in got) == list(range(8))
    assert {i.world_size for i in got} == {8}
    assert all(a.num_nodes_waiting() == 0 for a in agents)
    boot = {(i.bootstrap_store_info.master_addr, i.bootstrap_store_info.master_port) for i in got}  # type: ignore[union-attr]
    assert len(boot) == 1  # every member learns the same rank 0 address
    got[0].store.set("probe", b"1")  # the round's store: a prefix of the same TCPStore
    assert got[5].store.get("probe") == b"1"
    assert group.refusals.count == 0


def test_between_min_and_max_the_round_forms_with_those_there_after_the_last_call():
    group = Group()
    agents = [group.agent(Bounds(2, 5, 0.3)) for _ in range(3)]
    got = infos(meet(agents))  # type: ignore[arg-type]
    assert {i.world_size for i in got} == {3} and sorted(i.rank for i in got) == [0, 1, 2]


def test_a_late_node_waits_then_the_group_rejoins_and_the_next_round_takes_it():
    group = Group()
    bounds = Bounds(2, 4, 0.3)
    first = [group.agent(bounds) for _ in range(2)]
    got = infos(meet(first))  # type: ignore[arg-type]
    ranks = {id(a): i.rank for a, i in zip(first, got, strict=True)}
    late = group.agent(bounds)
    answer: dict[int, object] = {}
    joining = threading.Thread(target=lambda: answer.update({0: late.next_rendezvous()}), daemon=True)
    joining.start()
    for _ in range(600):  # bounded: the late node's arrival shows in the group's cheap read
        if first[0].num_nodes_waiting() > 0:
            break
        threading.Event().wait(0.05)
    assert first[0].num_nodes_waiting() == 1 and first[1].num_nodes_waiting() == 1
    again = infos(meet(first))  # type: ignore[arg-type]
    joining.join(timeout=JOIN_S)
    assert isinstance(answer.get(0), RendezvousInfo)
    assert {i.world_size for i in [*again, answer[0]]} == {3}  # type: ignore[attr-defined]
    assert [i.rank for i in again] == [ranks[id(a)] for a in first]  # the group kept its ranks
    assert answer[0].rank == 2  # type: ignore[attr-defined]
    assert all(a.last is not None and a.last.round == 1 for a in [*first, late])


def test_a_full_group_does_not_re_rendezvous_for_a_hot_spare():
    group = Group()
    bounds = Bounds(2, 2, 0.2)
    pair = [group.agent(bounds) for _ in range(2)]
    infos(meet(pair))  # type: ignore[arg-type]
    spare = group.agent(bounds, timeout_s=0.5)
    out = meet([spare])
    assert isinstance(out[0], RendezvousTimeoutError)  # nobody came back: it stays a spare
    assert pair[0].num_nodes_waiting() == 0


class DeadLeader(RoundRendezvousHandler):
    """Joins, then dies as the leader (its thread ends without closing the round)."""

    def _lead(self, rnd: int, arrival: int, deadline: float):
        raise RuntimeError("the leader died")


def test_a_member_closes_the_round_when_its_leader_dies():
    group = Group()
    bounds = Bounds(3, 3, 0.1)
    leader = group.agent(bounds, DeadLeader)
    out = meet([leader])
    assert isinstance(out[0], RuntimeError)
    others = [group.agent(bounds, takeover_s=0.3) for _ in range(2)]
    got = infos(meet(others))  # type: ignore[arg-type]
    assert {i.world_size for i in got} == {3}  # the dead leader counted: its next round drops it
    assert sorted(i.rank for i in got) == [1, 2]


def test_a_forged_result_is_refused_and_replaced_by_the_real_one():
    group = Group()
    group.host.set(f"stalwart/rdzv/{RUN}/r0/result", b'[0, 1, 1, "evil", 1]')
    agents = [group.agent(Bounds(3, 3, 0.1)) for _ in range(3)]
    got = infos(meet(agents))  # type: ignore[arg-type]
    assert {i.world_size for i in got} == {3}
    assert {i.bootstrap_store_info.master_addr for i in got} == {"127.0.0.1"}  # type: ignore[union-attr]
    assert group.refusals.count >= 1


def test_an_unsigned_join_record_does_not_become_a_member():
    group = Group()
    forger = group.client()
    assert forger.add(f"stalwart/rdzv/{RUN}/r0/count", 1) == 1  # it takes arrival 1 (the leader's)
    forger.set(f"stalwart/rdzv/{RUN}/r0/join/1", b'["evil", 1, -1, -1, "x"]')
    agents = [group.agent(Bounds(2, 3, 0.1), takeover_s=0.3) for _ in range(2)]
    got = infos(meet(agents))  # type: ignore[arg-type]
    assert {i.world_size for i in got} == {2} and sorted(i.rank for i in got) == [0, 1]
    assert group.refusals.count >= 1


def test_forged_arrivals_never_close_a_round_below_min():
    group = Group()
    forger = group.client()
    forger.add(f"stalwart/rdzv/{RUN}/r0/count", 1)
    forger.set(f"stalwart/rdzv/{RUN}/r0/join/1", b'["evil", 1, -1, -1, "x"]')
    agents = [group.agent(Bounds(3, 3, 0.1), takeover_s=0.2, timeout_s=1.5) for _ in range(2)]
    out = meet(agents)  # type: ignore[arg-type]
    assert all(isinstance(v, RendezvousTimeoutError) for v in out.values()), out


def test_a_closed_rendezvous_refuses_later_joiners():
    group = Group()
    first = group.agent(Bounds(1, 2, 0.1))
    infos(meet([first]))
    assert not first.is_closed()
    assert first.shutdown() is True
    later = group.agent(Bounds(1, 2, 0.1))
    assert later.is_closed()
    assert isinstance(meet([later])[0], RendezvousClosedError)


def test_a_forged_closed_mark_is_ignored():
    group = Group()
    group.host.set(f"stalwart/rdzv/{RUN}/closed", b"closed")
    agent = group.agent(Bounds(1, 1, 0.1))
    assert not agent.is_closed() and group.refusals.count == 1
    infos(meet([agent]))


def test_too_few_agents_time_out_with_torchs_error():
    group = Group()
    lone = group.agent(Bounds(2, 2, 0.1), timeout_s=0.3)
    assert isinstance(meet([lone])[0], RendezvousTimeoutError)


def test_make_handler_returns_it_for_the_stalwart_backend(tmp_path):
    from stalwart.launch.rendezvous.node_rendezvous import make_handler  # deferred: as the agent does
    from stalwart.settings.run_config import RunConfig  # deferred: with it

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = RunConfig(
        script="x.py", run_dir=tmp_path, run_id=RUN, rdzv_backend="stalwart",
        rdzv_endpoint=f"127.0.0.1:{port}", rdzv_id=RUN, rdzv_host=True, nnodes="1:2", node_name="n0",
    )  # fmt: skip
    assert cfg.use_c10d
    hosted: list[bool] = []
    handler = make_handler(cfg, lambda b: b, hosted=lambda: hosted.append(True), signer=KEY.signer(RUN))
    assert isinstance(handler, RoundRendezvousHandler) and handler.get_backend() == "stalwart"
    assert hosted == [True] and not handler.use_agent_store and handler.get_run_id() == RUN
