"""A survivor's step stuck on a host that went silent (train/inplace.py ``StuckStep``): once the agent
asks for a new generation, a step that does not reach its boundary within three times its usual time has its
group's connections severed, once per generation; a step that runs normally is left to end."""

from __future__ import annotations

from stalwart.train.inplace import STUCK_FACTOR, STUCK_MIN_S, Generation, StuckStep, sever_due


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def now(self) -> float:
        return self.t


def _watch(asked: list[int]) -> tuple[StuckStep, Clock, list[set[int]]]:
    clock, severed = Clock(), []
    gen = Generation(0, lambda: asked[0], lambda s: None, clock.now)

    def sever(keep: set[int]) -> int:
        severed.append(keep)
        return 3

    return StuckStep(gen, 29500, sever), clock, severed


def test_the_bound_is_a_multiple_of_the_usual_step_and_never_below_the_floor():
    assert not sever_due(STUCK_MIN_S / 2, None)
    assert sever_due(STUCK_MIN_S, None)
    assert not sever_due(STUCK_FACTOR - 0.1, 1.0) and sever_due(STUCK_FACTOR, 1.0)
    assert sever_due(STUCK_MIN_S, 0.01)  # fast steps: the floor decides


def test_a_step_stuck_after_the_request_is_severed_once_keeping_the_agents_store():
    asked = [0]
    w, clock, severed = _watch(asked)
    w.step_began()
    clock.t += 0.1
    w.boundary()  # a usual step: 0.1 s
    w.step_began()
    assert not w.tick()  # nothing asked
    asked[0] = 1
    clock.t += 0.05
    assert not w.tick()  # asked just now
    clock.t += 0.44
    assert not w.tick()  # 0.44 s pending: under max(0.5, 3 x 0.1)
    clock.t += 0.1
    assert w.tick() and severed == [{29500}]
    clock.t += 1.0
    assert not w.tick() and len(severed) == 1  # once per generation
    asked[0] = 2  # a later generation asked while the step is still stuck: its own wait, then again
    assert not w.tick()
    clock.t += 0.55
    assert w.tick() and len(severed) == 2


def test_a_step_that_reaches_its_boundary_is_never_severed():
    asked = [1]
    w, clock, severed = _watch(asked)
    for _ in range(5):  # the group grows back at a boundary: every step ends in its usual time
        w.step_began()
        w.tick()
        clock.t += 0.15
        w.tick()
        w.boundary()
        assert not w.tick()  # at a boundary: the rank re-forms there by itself
    assert severed == []


def test_a_request_seen_in_an_earlier_step_does_not_count_against_the_next():
    asked = [1]
    w, clock, severed = _watch(asked)
    w.step_began()
    w.tick()
    clock.t += 0.15
    w.boundary()
    w.step_began()
    clock.t += 0.01
    assert not w.tick()  # pending from this step's start, not from the earlier step's
    assert severed == []
