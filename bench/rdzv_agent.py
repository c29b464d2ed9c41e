"""One host's side of bench_rdzv.py: Stalwart's rendezvous handler (launch/rendezvous.make_handler),
c10d or etcd, through ``rounds`` rounds; each round starts at a file barrier shared by all hosts and
its times go to ``<out>/<name>.json``.

argv: backend endpoint run_id hosts name out_dir rounds is_host

Runs on either side of the job key (bench/bench_signing.py runs it on the tree before it): where
make_handler takes a ``seal``, the rendezvous state is sealed as the agent seals it, with the key
job_key.resolve finds (``STALWART_JOB_KEY_FILE``, ...).
"""

from __future__ import annotations

import inspect
import json
import sys
import time
from pathlib import Path

from stalwart.launch.rendezvous.node_rendezvous import make_handler
from stalwart.settings.run_config import RunConfig


def _handler(cfg):
    """torch's rendezvous handler as the agent makes it: sealed with the job key where this tree signs."""
    if "seal" not in inspect.signature(make_handler).parameters:
        return make_handler(cfg)  # before the job key
    from stalwart.job_key import Refusals, resolve
    from stalwart.launch.rendezvous.sealed import SealedBackend

    signer = resolve(multi_node=True).signer(cfg.rendezvous.id or cfg.run_id)
    refusals = Refusals(lambda text: print(text, file=sys.stderr, flush=True))
    return make_handler(cfg, lambda backend: SealedBackend(backend, signer, refusals), refusals.note)


def _barrier(out: Path, tag: str, name: str, hosts: int, timeout: float = 300.0) -> None:
    (out / f"{tag}.{name}").touch()
    deadline = time.monotonic() + timeout
    while len(list(out.glob(f"{tag}.*"))) < hosts:
        if time.monotonic() > deadline:
            raise SystemExit(f"{name}: barrier {tag} not reached in {timeout:.0f}s")
        time.sleep(0.005)


def main() -> None:
    backend, endpoint, run_id, n, name, out_dir, rounds, is_host = sys.argv[1:9]
    hosts, out = int(n), Path(out_dir)
    cfg = RunConfig(
        script="x.py",
        run_dir=out / f"run-{name}",
        run_id=run_id,
        rdzv_backend=backend,
        rdzv_endpoint=endpoint,
        rdzv_id=run_id,
        rdzv_host=bool(int(is_host)),
        nnodes=str(hosts),
        node_name=name,
    )
    handler = _handler(cfg)
    times = []
    for r in range(int(rounds)):
        _barrier(out, f"r{r}", name, hosts)
        t0 = time.time()
        info = handler.next_rendezvous()
        t1 = time.time()
        times.append({"round": r, "joined": t0, "done": t1, "rank": info.rank, "world": info.world_size})
    (out / f"{name}.json").write_text(json.dumps(times))
    _barrier(out, "end", name, hosts)
    if int(is_host):
        time.sleep(2.0)  # the others read their last answers from this host's store before it goes


if __name__ == "__main__":
    main()
