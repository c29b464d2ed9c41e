"""``stalwart run``: a torchrun-compatible launcher that keeps the job going.

Its flags, their help and defaults are generated from the settings schema (``settings/schema.py``):
add a setting there and it is a flag here, a key of the ``--config`` file and a ``STALWART_``
variable."""

from __future__ import annotations

import importlib.util
import inspect
import os
import shutil
import sys
from inspect import Parameter
from pathlib import Path
from typing import Any

import typer

from ..errors import ConfigError, LedgerError
from ..launch.finished_run import finished
from ..ledger import read_merged
from ..process_clock import process_start
from ..settings import run_config as run_config
from ..settings.panels import NEEDS_SDK, Panel
from ..settings.run_config import SETTINGS, claim_run_dir
from ..settings.sources import Leaf, cli_type
from ..settings.torchrun_flags import pet_defaults, resolve_nproc
from ..terminal import console as terminal_console
from ..terminal import say
from ._help import PanelledCommand

KEYWORD_ONLY = Parameter.KEYWORD_ONLY


def _param_name(leaf: Leaf) -> str:
    """The click parameter's name (its metavar in the help): the first long flag, as torchrun
    (``--hang-floor HANG_FLOOR``), else the setting's name."""
    longs = [f.split("/")[0] for f in leaf.setting.flags if f.startswith("--")]
    return longs[0][2:].replace("-", "_") if longs else leaf.name


def _help(leaf: Leaf) -> str:
    """A flag's help: the field's description, whether it needs the SDK and the schema's default
    (never in the description)."""
    d, text = leaf.field.default, leaf.field.description or ""
    text = f"{text} {NEEDS_SDK}" if leaf.needs_sdk else text
    if d is None or d == "" or not isinstance(d, (bool, int, float, str)):
        return text  # no default to show (unset, a list, or one the run derives)
    if isinstance(d, bool):
        if not any("/" in f for f in leaf.setting.flags):
            return text  # a plain switch: off unless given
        shown = "on" if d else "off"
    else:
        shown = f"{d:g}" if isinstance(d, float) else str(d)
    return f"{text}  [default: {shown}]"


def _parameter(leaf: Leaf) -> inspect.Parameter:
    s, panel = leaf.setting, _panel(leaf).value
    if s.argument:
        required = leaf.field.is_required()
        # Any: typer.Argument/typer.Option, which typer declares as returning Any
        info: Any = typer.Argument(
            ... if required else None, help=leaf.field.description, show_default=False, rich_help_panel=panel
        )
    else:
        info = typer.Option(
            None, *s.flags, help=_help(leaf), show_default=False, metavar=s.metavar, rich_help_panel=panel
        )
    return inspect.Parameter(_param_name(leaf), KEYWORD_ONLY, default=info, annotation=cli_type(leaf))


def _panel(leaf: Leaf) -> Panel:
    if leaf.panel is None:  # a flag without a heading would land in a list of its own
        raise TypeError(f"setting {leaf.name} has flags but no help panel (settings/panels.py)")
    return leaf.panel


# every setting with flags or a position is a parameter of `stalwart run`, grouped by help panel (in
# the panels' order, each in the schema's order: the help lists the panels as they first appear)
_ON_COMMAND_LINE = sorted(
    (leaf for leaf in SETTINGS.values() if leaf.setting.flags or leaf.setting.argument),
    key=lambda leaf: list(Panel).index(_panel(leaf)),
)
_SETTING_OF = {_param_name(leaf): leaf.name for leaf in _ON_COMMAND_LINE}
_COMMAND_ONLY = [  # what is not a setting of the run: where the settings come from, and the report
    inspect.Parameter(
        "config",
        KEYWORD_ONLY,
        default=typer.Option(
            None,
            "--config",
            help="YAML/TOML file of these settings (setting: value).",
            rich_help_panel=Panel.RUN.value,
        ),
        annotation=str,
    ),
    inspect.Parameter(
        "report",
        KEYWORD_ONLY,
        default=typer.Option(
            True,
            "--report/--no-report",
            help="Print the goodput report at the end.",
            rich_help_panel=Panel.RUN.value,
        ),
        annotation=bool,
    ),
]


def run(**given: Any) -> None:  # Any: typer passes each option's value, each of its own type
    """Launch and supervise training workers; restart through crashes and hangs.

    Examples:

    \b
      # an unchanged torchrun script: 4 workers on this node
      stalwart run --nproc-per-node 4 train.py --epochs 3
      # the same with faults injected from a chaos plan (YAML)
      stalwart run --nproc-per-node 4 --chaos-file faults.yaml train.py
      # two nodes of 8 GPUs: the same line on each, one rendezvous endpoint
      stalwart run --nnodes 2 --nproc-per-node 8 \\
          --rdzv-endpoint head-node:29400 --rdzv-id job-1 train.py

    \b
    Flags marked (needs the SDK) act only for scripts that use
    stalwart.train.Session or a framework callback (docs/integrations.md);
    docs/unchanged-scripts.md says what an unchanged script gets. Every flag
    is also a --config file setting and a STALWART_<NAME> variable.
    """

    config, report = given.pop("config"), given.pop("report")
    flags: dict[str, Any] = {  # Any: typer passes each option's own type
        _SETTING_OF[name]: (value or None) if isinstance(value, list) else value
        for name, value in given.items()
    }
    flags["script_args"] = list(given.get("script_args") or [])
    for key, value in pet_defaults(os.environ).items():  # torchrun's PET_* variables: defaults for flags
        if flags.get(key) is None:
            flags[key] = value
    if flags.get("nproc_per_node") is not None:
        flags["nproc_per_node"] = resolve_nproc(str(flags["nproc_per_node"]))
    flags.update(run_config.parse_rdzv_conf(flags.get("rdzv_conf") or ""))
    script, chaos_file = flags["script"], flags.get("chaos_file")
    if not (flags.get("module") or flags.get("no_python")) and not Path(script).is_file():
        raise ConfigError(
            f"training script {script!r} not found", "give a path to a .py file, or use -m for a module"
        )
    if chaos_file and not Path(chaos_file).is_file():
        raise ConfigError(f"fault plan {chaos_file!r} not found")
    cfg = run_config.build(flags, config_file=config)
    if cfg.module and not cfg.no_python:
        _check_module(script)
    execute(cfg, report=report)


run.__signature__ = inspect.Signature([*map(_parameter, _ON_COMMAND_LINE), *_COMMAND_ONLY])  # type: ignore[attr-defined]


def _check_module(name: str) -> None:

    try:
        found = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        found = None
    if found is None:
        raise ConfigError(f"module {name!r} not found", "check -m NAME and the Python path (PYTHONPATH)")


def _finished(cfg) -> str:
    """What to say when this run id already ended ``succeeded`` ("" otherwise)."""

    ledger = cfg.run_dir / "ledger"
    if not ledger.is_dir() or not any(ledger.iterdir()):
        return ""
    try:
        done = finished(read_merged(cfg.run_dir))
    except LedgerError:
        return ""  # an unreadable ledger: the agent's own start says what is wrong with it
    return done.message(cfg.run_id, cfg.run_dir) if done is not None else ""


def register(app: typer.Typer) -> None:
    app.command(cls=PanelledCommand, context_settings={"allow_interspersed_args": False})(run)


def execute(cfg, *, report: bool, intro: list[str] | None = None) -> None:
    """Run the agent with live console output; optionally print the report; exit with the verdict's code."""
    from ..launch.agent import Agent  # deferred: heavy (yaml)
    from ..launch.console import RunConsole  # deferred: heavy (rich)

    if shutil.which(cfg.python) is None and not Path(cfg.python).exists():
        raise ConfigError(f"python interpreter {cfg.python!r} not found")
    claim_run_dir(cfg)
    done = _finished(cfg)
    if done:  # a finished run stays finished: launch nothing
        say(terminal_console(), done, markup=False)
        sys.exit(0)
    console = RunConsole(quiet=cfg.quiet)
    for line in intro or ():
        console.say(line)
    # deferred: heavy (aiohttp)
    from ..serve.attach import Observability  # exporter + notifier; no-ops without --metrics-port/--notify

    observe = Observability.from_config(cfg, say=console.say)
    agent = Agent(
        cfg,
        notify=observe.chain(console.event),
        progress=console.progress,
        started=process_start(),  # the process start, read from /proc
        note=console.note,
        stepped=console.stepped,
    )
    console.say(f"run dir: {cfg.run_dir}")
    observe.start()
    try:
        code = agent.run_job()
    finally:
        observe.stop()
        console.close()
    if report:
        from ..account.report import print_report  # deferred: heavy (rich, yaml)

        print()
        print_report(cfg.run_dir)
    # The ledger is closed and the verdict printed: skip interpreter teardown (torch's
    # finalizers take seconds on a loaded machine), so the job ends when its ledger says.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
