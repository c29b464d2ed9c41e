"""Charts of a plan (matplotlib, `plot` extra): ETTR against the checkpoint interval with the current
and recommended intervals marked, and ETTR and cost against cluster size with one line per recovery
option. A chart needs at least two points; a plan always has several sizes and intervals."""

from __future__ import annotations

from pathlib import Path

from ..errors import ConfigError
from .planner import OPTIONS, Plan


def _pyplot():  # -> matplotlib.pyplot (an optional dependency, untyped)
    try:
        import matplotlib  # deferred: optional extra (matplotlib)

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # deferred: optional extra (matplotlib)
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ConfigError("plotting needs matplotlib", "pip install 'stalwart[plot]'") from exc
    return plt


def write_plots(p: Plan, out_dir: str | Path, fmt: str = "png") -> list[Path]:
    """Write ``ettr_vs_interval``, ``ettr_vs_gpus`` and ``cost_vs_gpus`` (``.<fmt>``) into ``out_dir``."""
    if fmt not in ("png", "svg"):
        raise ConfigError(f"unknown plot format {fmt!r}", "use png or svg")
    plt = _pyplot()
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot create plot directory {out}: {exc.strerror}") from exc
    written = []
    if len(p.sweep) >= 2:
        fig, ax = plt.subplots(figsize=(7, 4.2))
        xs = [row["interval_s"] / 60.0 for row in p.sweep]
        ax.plot(xs, [100 * row["ettr_daly"] for row in p.sweep], "-", label="Daly (2006) closed form")
        ax.plot(xs, [100 * row["ettr_sim"] for row in p.sweep], "o--", label="simulated (mean)")
        durable = p.tiers[-1] if p.tiers else None
        if p.current_interval_s > 0:
            ax.axvline(p.current_interval_s / 60.0, color="grey", ls=":", label="current")
        if durable is not None:
            rec = max(t.recommended_s for t in p.tiers)
            ax.axvline(rec / 60.0, color="green", ls="-.", label="recommended")
        ax.set_xscale("log")
        ax.set_xlabel("checkpoint interval (minutes of training, log scale)")
        ax.set_ylabel("effective training time ratio (%)")
        ax.set_title("ETTR against checkpoint interval")
        written.append(_finish(plt, fig, ax, out / f"ettr_vs_interval.{fmt}"))
    sizes = sorted({int(r["gpus"]) for r in p.options})
    if len(sizes) >= 2:
        for key, label, name, scale in (
            ("ettr", "effective training time ratio (%)", "ettr_vs_gpus", 100.0),
            (
                "cost",
                f"cost of lost GPU-hours and spares per run, at {p.gpu_hour_price:g} a GPU-hour",
                "cost_vs_gpus",
                1.0,
            ),
        ):
            fig, ax = plt.subplots(figsize=(7, 4.2))
            for opt in OPTIONS:
                rows = sorted((r for r in p.options if r["option"] == opt), key=lambda r: float(r["gpus"]))
                xs = [float(r["gpus"]) for r in rows]
                (line,) = ax.plot(xs, [scale * float(r[key]) for r in rows], "o-", label=opt)
                if key == "ettr" and all("ettr_p5" in r for r in rows):  # the trials' 5-95% band
                    ax.fill_between(
                        xs,
                        [scale * float(r["ettr_p5"]) for r in rows],
                        [scale * float(r["ettr_p95"]) for r in rows],
                        color=line.get_color(),
                        alpha=0.15,
                        linewidth=0,
                    )
            ax.set_xscale("log")
            if key == "ettr":  # zoomed to the data, so that close options stay apart
                low = min(100.0 * float(r.get("ettr_p5", r["ettr"])) for r in p.options)
                ax.set_ylim(max(0.0, low - 5.0), 100.5)
            else:
                ax.set_yscale("log")
            ax.set_xlabel("GPUs (log scale; interval re-optimised at each size)")
            ax.set_ylabel(label)
            what = "ETTR (mean, 5-95% of trials shaded)" if key == "ettr" else "Cost"
            ax.set_title(f"{what} against cluster size, by recovery option")
            written.append(_finish(plt, fig, ax, out / f"{name}.{fmt}"))
    return written


def _finish(plt, fig, ax, path: Path) -> Path:
    """Grid, legend, tight layout; write the chart and free the figure."""
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
