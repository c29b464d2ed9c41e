"""A DDP job with dropout under ``Session.run`` (in-place recovery). Each call of ``train`` appends this
process's pid to ``<out>/pids-rank<R>.txt`` (R: the rank it was launched as) and "pid rank world" to
``<out>/place-rank<R>.txt`` (its place in the group that call trains in, which a shrink in place
changes); rank 0 saves the final weights to ``<out>/final.pt``. With ``stop_rank stop_step``, that
rank SIGSTOPs itself once at the start of that step's work (a hang at a known point). With
``INPLACE_DATA=1`` each rank takes one sample per step from an ``ElasticDistributedSampler`` kept in
the state and appends "call step index" to ``<out>/seen-rank<R>.txt``. With ``INPLACE_STOP_FILE``,
once that file exists (written whole by the test) every rank ends its loop at the step it names (a
test that cannot know beforehand how long a run must last). With ``INPLACE_IDIOM=loop`` the script
calls ``train`` itself (the plain loop idiom, no ``Session.run``): a survivor's process ends with the
broken group and the whole group restarts; ``INPLACE_IDIOM=own`` is the same with the script's own
loop and step counter (``session.track``), and ``run-own`` that loop under ``Session.run``. With ``INPLACE_LOG_LOSS=1`` every rank all-reduces its loss
after the optimizer step (as a script logging the mean loss does); with ``INPLACE_EXIT_AFTER_UPDATE="R S"``
rank R exits once, right after its optimizer step of step S (its peers' updates land too, and they fail
in that all-reduce).
argv: steps out_dir [stop_rank stop_step]."""

import os
import signal
import sys
import time
from collections.abc import Callable

import torch
import torch.nn as nn

from stalwart.train import Session
from stalwart.train.data import ElasticDistributedSampler
from stalwart.train.determinism import rank_ordered_allreduce_hook

STEPS = int(sys.argv[1])
OUT = sys.argv[2]
STOP = (int(sys.argv[3]), int(sys.argv[4])) if len(sys.argv) > 4 else None
LAUNCHED = int(os.environ.get("RANK", "0"))  # the rank this process was started as
DATA = os.environ.get("INPLACE_DATA") == "1"
LOG_LOSS = os.environ.get("INPLACE_LOG_LOSS") == "1"
OWN = os.environ.get("INPLACE_IDIOM") in ("own", "run-own")
EXIT_AFTER = tuple(int(x) for x in os.environ.get("INPLACE_EXIT_AFTER_UPDATE", "").split())
calls = 0


def own_loop(session: Session, state: dict, work: Callable[[int], bool]) -> None:
    """The script's own loop and step counter, in epochs of 7 steps; it says where a step ends."""
    with session.track(state, total_steps=STEPS, checkpoint_every=10) as steps:
        for epoch in range(steps.start // 7, -(-STEPS // 7)):
            for step in range(max(steps.start, epoch * 7), min(STEPS, epoch * 7 + 7)):
                if not work(step):
                    return
                steps.done()


def train(session: Session) -> None:
    global calls
    calls += 1
    session.init_process_group("gloo")
    rank = session.rank
    with open(os.path.join(OUT, f"pids-rank{LAUNCHED}.txt"), "a") as fh:
        fh.write(f"{os.getpid()}\n")
    with open(os.path.join(OUT, f"place-rank{LAUNCHED}.txt"), "a") as fh:
        fh.write(f"{os.getpid()} {rank} {session.world_size}\n")
    torch.manual_seed(0)  # the same initial weights on every rank
    drop = float(os.environ.get("INPLACE_DROPOUT", "0.1"))  # 0: no random stream a lost node takes along
    model = nn.Sequential(nn.Linear(16, 64), nn.Dropout(drop), nn.Linear(64, 4))
    torch.manual_seed(100 + rank)  # a per-rank dropout stream: exact only if each rank's RNG is kept
    ddp = nn.parallel.DistributedDataParallel(model)
    ddp.register_comm_hook(None, rank_ordered_allreduce_hook)  # a reduction order that survives re-forming
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    state = {"model": model, "optimizer": opt}
    sampler = ElasticDistributedSampler(100_000, rank=rank, world_size=session.world_size, shuffle=False)
    if DATA:
        state["data"] = sampler
    samples = []
    stop_at = os.environ.get("INPLACE_STOP_FILE", "")

    def work(step: int) -> bool:
        """One step's work; False: stop before it (the stop file)."""
        if stop_at and os.path.exists(stop_at) and step >= int(open(stop_at).read()):
            return False
        if DATA:
            if not samples:
                samples.append(iter(sampler))  # after the session loaded the position
            with open(os.path.join(OUT, f"seen-rank{LAUNCHED}.txt"), "a") as fh:
                fh.write(f"{calls} {step} {next(samples[0])}\n")
        marker = os.path.join(OUT, "stopped")
        if STOP == (rank, step) and not os.path.exists(marker):
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGSTOP)
        g = torch.Generator().manual_seed(step * 97 + rank)
        x = torch.randn(8, 16, generator=g)
        loss = ddp(x).pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        gone = os.path.join(OUT, "exited")
        if EXIT_AFTER == (rank, step) and not os.path.exists(gone):
            open(gone, "w").close()
            os._exit(1)
        if LOG_LOSS:
            torch.distributed.all_reduce(loss.detach())
        time.sleep(0.05)
        return True

    if OWN:
        own_loop(session, state, work)
    else:
        for step in session.loop(STEPS, state, checkpoint_every=10):
            if not work(step):
                break
    if rank == 0:
        torch.save(model.state_dict(), os.path.join(OUT, "final.pt"))
    session.finish()


if os.environ.get("INPLACE_IDIOM") in ("loop", "own"):
    train(Session())
else:
    Session().run(train)
