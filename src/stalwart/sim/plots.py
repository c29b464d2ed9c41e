"""Charts of a plan: ETTR against checkpoint interval and against cluster size (matplotlib, `plot` extra)."""

from __future__ import annotations

from pathlib import Path

from ..errors import ConfigError
from .planner import Plan


def _pyplot():  # type: ignore[no-untyped-def]
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ConfigError("plotting needs matplotlib", "pip install 'stalwart[plot]'") from exc
    return plt


def write_plots(p: Plan, out_dir: str | Path, fmt: str = "png") -> list[Path]:
    """Write ``ettr_vs_interval.<fmt>`` and ``ettr_vs_gpus.<fmt>`` into ``out_dir``; return the paths."""
    if fmt not in ("png", "svg"):
        raise ConfigError(f"unknown plot format {fmt!r}", "use png or svg")
    plt = _pyplot()
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot create plot directory {out}: {exc.strerror}") from exc
    written = []
    if p.sweep:
        fig, ax = plt.subplots(figsize=(7, 4.2))
        xs = [row["interval_s"] / 60.0 for row in p.sweep]
        ax.plot(xs, [row["ettr_daly"] for row in p.sweep], "-", label="Daly (2006) closed form")
        ax.plot(xs, [row["ettr_sim"] for row in p.sweep], "o--", label="simulated (mean)")
        ax.set_xscale("log")
        ax.set_xlabel("durable checkpoint interval (minutes of training)")
        ax.set_ylabel("ETTR")
        ax.set_title("ETTR against checkpoint interval")
        written.append(_finish(plt, fig, ax, out / f"ettr_vs_interval.{fmt}"))
    if p.scale:
        fig, ax = plt.subplots(figsize=(7, 4.2))
        gs = [pt.gpus for pt in p.scale]
        ax.plot(gs, [pt.ettr_mean for pt in p.scale], "o-", label="mean ETTR")
        ax.plot(gs, [pt.ettr_p5 for pt in p.scale], "v:", label="5th percentile")
        ax.set_xscale("log")
        ax.set_ylim(0, 1)
        ax.set_xlabel("GPUs (interval re-optimised at each size)")
        ax.set_ylabel("ETTR")
        ax.set_title("ETTR against cluster size")
        written.append(_finish(plt, fig, ax, out / f"ettr_vs_gpus.{fmt}"))
    return written


def _finish(plt, fig, ax, path: Path) -> Path:
    """Grid, legend, tight layout; write the chart and free the figure."""
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
