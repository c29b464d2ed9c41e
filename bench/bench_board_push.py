"""How long an announcement takes to reach every agent's board, pushed against polled (issue 39,
point 3), at 4, 16, 64 and 256 boards in one process.

Each board is Stalwart's ``StoreBoard`` on one real worker TCPStore, on its own poll thread, with its
liveness line; board n0 is the first node and watches every other (as in a multi-node job). Two arms
in the same run:

* **pushed**: the agent's ticker (``launch/inplace/ticker.ThreadTicker``): between polls each poll
  thread waits on its wake pipe and its liveness connections, so the announcing board writes at once
  and nudges the first node, which reads the document and passes the nudge on to every board;
* **polled**: the ticker before (a poll every 0.1 s, sleeping in between): the announcing board
  writes at its next poll, and every other board reads at its own next poll.

Per announcement (board n1 announces a new generation, as an agent that replaced a rank does):
the time until the first node's board holds it, and until every board does (read by the main thread
every 0.5 ms). Medians and 90th percentiles over ``--repeats`` announcements. Every board of one
process shares 2 cores and one interpreter lock, so the larger sizes also measure that.

Run: PYTHONPATH=src .venv/bin/python bench/bench_board_push.py [--sizes 4,16,64,256] [--repeats 20]
[--json out]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

from torch.distributed import TCPStore

from stalwart.job_key import JobKey, KeySource
from stalwart.launch.inplace.board import Announcement, StoreBoard
from stalwart.launch.inplace.ticker import POLL_S, Idle, ThreadTicker, Ticker

SIGNER = JobKey(b"q" * 32, KeySource.FILE).signer("bench-push")


class PolledTicker:
    """The ticker before pushes: a poll every :data:`POLL_S`, asleep in between."""

    def start(self, poll: Callable[[], None], stopped: threading.Event, idle: Idle) -> None:
        def loop() -> None:
            while not stopped.is_set():
                poll()
                stopped.wait(POLL_S)

        threading.Thread(target=loop, name="bench-polled-board", daemon=True).start()


def until(done: Callable[[], bool], bound_s: float) -> float | None:
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < bound_s:
        if done():
            return time.perf_counter() - t0
        time.sleep(0.0005)
    return None


def run(n: int, ticker: Callable[[], Ticker], repeats: int) -> dict:
    store = TCPStore("127.0.0.1", 0, None, True, timeout=timedelta(seconds=30), wait_for_workers=False)
    nodes = [f"n{i}" for i in range(n)]
    boards: list[StoreBoard] = []
    try:
        for i, node in enumerate(nodes):
            watch = tuple(nodes[1:]) if i == 0 else ()
            boards.append(
                StoreBoard(
                    "127.0.0.1",
                    store.port,
                    30.0,
                    node=node,
                    watch=watch,
                    signer=SIGNER,
                    live_host="127.0.0.1",
                    ticker=ticker(),
                )  # fmt: skip
            )
        first = boards[0]
        held = until(lambda: len(first._watch.hosts()) == n - 1, 300.0)
        if held is None:
            raise RuntimeError(f"the first node held {len(first._watch.hosts())} of {n - 1} lines")
        time.sleep(1.0)  # every board's poll thread settled into its pace
        to_first, to_all = [], []
        for gen in range(1, repeats + 1):
            a = Announcement(gen, "n1", (1,))
            t0 = time.perf_counter()
            boards[1].announce(a)
            got = until(lambda a=a: first.latest() == a, 60.0)
            every = until(lambda a=a: all(b.latest() == a for b in boards), 60.0)
            if got is None or every is None:
                raise RuntimeError(f"announcement {gen} did not reach every board in 60 s")
            to_first.append(got)
            to_all.append(time.perf_counter() - t0)
            time.sleep(0.05 + (gen % 7) * 0.013)  # announce at a different point of the poll cycle
        return {"to_first_s": to_first, "to_all_s": to_all}
    finally:
        for b in boards:
            b.close()


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="4,16,64,256")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    arms: dict[str, Callable[[], Ticker]] = {"pushed": ThreadTicker, "polled": PolledTicker}
    res: dict = {"cpus": os.cpu_count(), "load_before": os.getloadavg(), "sizes": {}}
    print("boards | arm | to the first node: median, p90 | to every board: median, p90", flush=True)
    for n in [int(x) for x in args.sizes.split(",")]:
        res["sizes"][n] = {}
        for name, ticker in arms.items():
            r = run(n, ticker, args.repeats)
            res["sizes"][n][name] = r
            f, a = r["to_first_s"], r["to_all_s"]
            print(
                f"{n:6d} | {name} | {statistics.median(f) * 1e3:.1f} ms, {pct(f, 0.9) * 1e3:.1f} ms | "
                f"{statistics.median(a) * 1e3:.1f} ms, {pct(a, 0.9) * 1e3:.1f} ms",
                flush=True,
            )
    res["load_after"] = os.getloadavg()
    print(f"load average {res['load_before'][0]:.1f} before, {res['load_after'][0]:.1f} after")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
