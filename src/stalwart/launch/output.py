"""torchrun's output options (``--redirects``, ``--tee``, ``--local-ranks-filter``, ``--log-dir``) as
one route per worker (pure)."""

from __future__ import annotations

from pathlib import Path

from ..settings.streams import ERR, OUT, parse_streams
from .processes.worker_group import OutputRoute


def routes(
    *,
    nproc: int,
    redirects: str,
    tee: str,
    ranks_filter: str,
    log_dir: Path | None,
    run_log: list[Path],
    log_root: Path | None = None,
) -> list[OutputRoute]:
    """One route per local rank. A redirected stream leaves the console (unless teed); a teed one
    goes to both, its console lines prefixed with the worker's name, as torchrun does. Streams
    redirected or teed also go to ``log_dir/attempt_N/<local rank>/{stdout,stderr}.log`` when
    ``log_dir`` is given (it already holds the attempt); ``log_root`` is the ``--log-dir`` it is
    under (``log_dir`` itself when None): the levels below it are created private, never through
    a link."""
    red = parse_streams(redirects, nproc, flag="--redirects")
    tees = parse_streams(tee, nproc, flag="--tee")
    shown = {int(x) for x in ranks_filter.split(",") if x.strip()} if ranks_filter else None
    out = []
    for local in range(nproc):
        streams = []
        for bit in (OUT, ERR):
            teed = bool(tees[local] & bit)
            to_file = teed or bool(red[local] & bit)
            console = (teed or not red[local] & bit) and (shown is None or local in shown)
            name = "stdout.log" if bit == OUT else "stderr.log"
            path = log_dir / str(local) / name if log_dir is not None and to_file else None
            streams.append((console, teed, path))
        out.append(
            OutputRoute(
                run_log[local],
                (streams[0][0], streams[1][0]),
                (streams[0][1], streams[1][1]),
                (streams[0][2], streams[1][2]),
                log_root or log_dir,
            )
        )
    return out
