"""SDK overhead per step: ``Session.loop`` + 4 sections + the pipe to the agent, against the bare loop.

    .venv/bin/python bench/bench_sdk_overhead.py [--rounds N] [--sizes 1,20]

Each step does the same work in both loops: four small matmuls (one per section: data, forward,
backward, optimizer), sized at start-up so a step takes about 1 ms or 20 ms on this machine; size 0 runs empty sections,
which isolates the SDK's own cost per step.
The instrumented loop runs under a ``Session`` that believes it has an agent: its messages go
through a real non-blocking pipe to a reader thread that drains it every 50 ms (the agent's default
monitor interval) and feeds a ``ProgressTracker``, and it reads a real control block every step.
The same loop is also run with the reader in a separate process, which is how the agent runs.
A third loop runs ``Session.loop`` without an agent (no IPC), the plain ``python train.py`` case.

Rounds interleave the loops so all of them see the same load; the figure is the median over
rounds of each round's mean step time, and the ratio is instrumented / bare.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

import torch

from stalwart.launch.progress import ProgressTracker
from stalwart.protocol import control
from stalwart.protocol.pipe import Receiver
from stalwart.train import Session

SECTIONS = ("data", "forward", "backward", "optimizer")


class Work:
    """Four matmuls of an n x n matrix (one per section)."""

    def __init__(self, n: int, reps: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.a = torch.randn(n, n, generator=g)
        self.b = torch.randn(n, n, generator=g)
        self.reps = reps

    def part(self) -> None:
        for _ in range(self.reps):
            torch.mm(self.a, self.b)


def calibrate(target_s: float) -> Work:
    """Pick a matmul size whose four parts take about ``target_s`` (0: empty sections)."""
    if target_s <= 0:
        return Work(8, 0)
    for n in (32, 48, 64, 96, 128, 192, 256, 384, 512):
        w = Work(n, 1)
        for _ in range(3):
            w.part()
        t0 = time.perf_counter()
        for _ in range(20):
            w.part()
        per_part = (time.perf_counter() - t0) / 20
        if 4 * per_part >= target_s / 8 or n == 512:
            w.reps = max(1, round(target_s / (4 * per_part)))
            for _ in range(2):  # correct the estimate with whole steps
                step = bare_loop(w, max(3, int(0.2 / target_s)))
                w.reps = max(1, round(w.reps * target_s / step))
            return w
    raise AssertionError("unreachable")


def bare_loop(work: Work, steps: int) -> float:
    t0 = time.perf_counter()
    for _ in range(steps):
        for _ in SECTIONS:
            work.part()
    return (time.perf_counter() - t0) / steps


def sdk_loop(session: Session, work: Work, steps: int) -> float:
    t0 = time.perf_counter()
    for _ in session.loop(steps, {}, resume=False):
        for name in SECTIONS:
            with session.section(name):
                work.part()
    return (time.perf_counter() - t0) / steps


def reader_process(receiver: Receiver, ctl: Path, interval: float = 0.05) -> None:
    """The agent's side in a separate process (the real topology): drain and parse until killed."""
    tracker = ProgressTracker(ranks=[0], started=time.time())
    block = control.ControlBlock(ctl)
    while True:
        now = time.time()
        for msg in receiver.drain():
            tracker.observe(msg, now)
        beat = block.read_beat(0)
        if beat is not None:
            tracker.observe_beat(0, *beat, now)
        time.sleep(interval)


class Reader(threading.Thread):
    """Stands in for the agent: drains the pipe every ``interval`` s into a ProgressTracker."""

    def __init__(self, receiver: Receiver, ctl: Path, interval: float = 0.05) -> None:
        super().__init__(daemon=True)
        self.receiver = receiver
        self.block = control.ControlBlock(ctl)
        self.beats = 0
        self.interval = interval
        self.tracker = ProgressTracker(ranks=[0], started=time.time())
        self.stop = threading.Event()
        self.messages = 0

    def run(self) -> None:
        while not self.stop.is_set():
            now = time.time()
            for msg in self.receiver.drain():
                self.tracker.observe(msg, now)
                self.messages += 1
            beat = self.block.read_beat(0)  # the heartbeat slot in shared memory, as the agent reads it
            if beat is not None:
                self.tracker.observe_beat(0, *beat, now)
                self.beats += 1
            self.stop.wait(self.interval)


def measure(target_ms: float, rounds: int, tmp: Path) -> dict[str, float]:
    work = calibrate(target_ms / 1e3)
    steps = max(50, int(round(1000 / target_ms))) if target_ms > 0 else 5000  # ~1 s per loop per round
    receiver = Receiver()
    ctl = tmp / f"control-{target_ms:g}.bin"
    control.create(ctl, slots=1)  # one heartbeat slot, as the agent creates per local worker
    env = {
        "STALWART_W_IPC": str(receiver.new_channel()),
        "STALWART_W_CONTROL": str(ctl),
        "RANK": "0",
        "WORLD_SIZE": "1",
    }
    agent_session = Session(env, checkpoint_dir=str(tmp / "ckpt"))
    plain_session = Session({"RANK": "0", "WORLD_SIZE": "1"}, checkpoint_dir=str(tmp / "ckpt"))
    reader = Reader(receiver, ctl)
    reader.start()
    # a second channel read by another process, as the agent really is
    proc_receiver = Receiver()
    ctl_proc = tmp / f"control-proc-{target_ms:g}.bin"
    control.create(ctl_proc, slots=1)
    env_proc = dict(env, STALWART_W_IPC=str(proc_receiver.new_channel()), STALWART_W_CONTROL=str(ctl_proc))
    proc_session = Session(env_proc, checkpoint_dir=str(tmp / "ckpt"))
    proc = multiprocessing.get_context("fork").Process(
        target=reader_process, args=(proc_receiver, ctl_proc), daemon=True
    )
    proc.start()
    bare, agent, plain, agent_proc = [], [], [], []
    bare_loop(work, steps)  # warm-up
    sdk_loop(agent_session, work, steps)
    for _ in range(rounds):
        bare.append(bare_loop(work, steps))
        agent.append(sdk_loop(agent_session, work, steps))
        agent_proc.append(sdk_loop(proc_session, work, steps))
        plain.append(sdk_loop(plain_session, work, steps))
    time.sleep(0.2)  # let the readers drain the last messages
    reader.stop.set()
    reader.join()
    proc.kill()  # the Session installed in this process before the fork ignores SIGTERM
    proc.join()
    receiver.close()
    proc_receiver.close()
    b, a, p = statistics.median(bare), statistics.median(agent), statistics.median(plain)
    ap = statistics.median(agent_proc)
    return {
        "target_ms": target_ms,
        "steps": steps,
        "bare_ms": b * 1e3,
        "agent_ms": a * 1e3,
        "plain_ms": p * 1e3,
        "agent_proc_ms": ap * 1e3,
        "ratio_agent": a / b,
        "ratio_plain": p / b,
        "ratio_proc": ap / b,
        "overhead_us": (a - b) * 1e6,
        "overhead_proc_us": (ap - b) * 1e6,
        "dropped": agent_session._link.dropped + proc_session._link.dropped,
        "messages": reader.messages,
        "steps_seen": reader.tracker.progress[0].done_steps,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument(
        "--sizes",
        default="0,1,20",
        help="target step times in ms, comma-separated (0: empty steps, the SDK's own cost)",
    )
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(
        f"torch {torch.__version__}, {os.cpu_count()} CPUs, 1 torch thread, {args.rounds} interleaved rounds"
    )
    with tempfile.TemporaryDirectory() as d:
        for size in (float(s) for s in args.sizes.split(",")):
            r = measure(size, args.rounds, Path(d))
            print(
                f"step ~{r['target_ms']:g} ms ({r['steps']} steps/round): bare {r['bare_ms']:.3f} ms | "
                f"with agent pipe {r['agent_ms']:.3f} ms (x{r['ratio_agent']:.3f}, "
                f"{r['overhead_us']:+.1f} us/step) | reader in another process {r['agent_proc_ms']:.3f} ms "
                f"(x{r['ratio_proc']:.3f}, {r['overhead_proc_us']:+.1f} us/step) | no agent {r['plain_ms']:.3f} ms (x{r['ratio_plain']:.3f}) | "
                f"messages read {r['messages']}, dropped {r['dropped']}, steps seen by reader {r['steps_seen']}"
            )


if __name__ == "__main__":
    main()
