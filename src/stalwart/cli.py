"""The ``stalwart`` command. Thin: parses, calls a package, prints.

Each sub-command lives in ``stalwart/commands/<name>.py`` and exposes ``register(app)``; they are
discovered here so packages never edit this file to add a command. A command line that names one
imports that one only (``stalwart run`` is every agent's start: the simulator, the dashboard's server
and the report's renderers are not its to import); anything else (``--help``, no or an unknown
command, or a use of :data:`app`) registers them all.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys

import typer

try:  # typer >= 0.29 vendors click and does not install it
    from typer._click import exceptions as _cx
except ImportError:  # pragma: no cover - older typer raises click's own exceptions
    from click import exceptions as _cx  # type: ignore[no-redef]

_USAGE = (_cx.UsageError,)
_NO_ARGS = (_cx.NoArgsIsHelpError,)
_EXIT = (typer.Exit,)
_ABORT = (typer.Abort,)

from . import __version__, commands  # noqa: E402
from .errors import StalwartError  # noqa: E402

_HELP = """Keep distributed training runs productive through failures.

\b
Start here: stalwart demo (a 4-worker DDP run under injected faults, under a
minute on 2 cores, no GPU), then stalwart run --nproc-per-node N train.py
(your torchrun script, unchanged). Docs: README.md; every run flag:
stalwart run -h.
"""

_app = typer.Typer(
    name="stalwart",
    help=_HELP,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # Plain click help: it wraps long flag names and help text to the terminal (rich's option
    # table cut flags with "..." at 80 columns), and never wider than 100 columns.
    rich_markup_mode=None,
    context_settings={"max_content_width": 100, "help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        print(f"stalwart {__version__}")
        raise typer.Exit()


@_app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """Keep distributed training runs productive through failures."""


_registered: set[str] = set()


def _names() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(commands.__path__) if not m.name.startswith("_"))


def _register_commands(argv: list[str] | None = None) -> typer.Typer:
    """Register the command ``argv`` names, or every command when it names none (help, a typo)."""
    names = _names()
    first = next((a for a in argv or () if not a.startswith("-")), None)
    for name in [first] if first in names and not _asks_root_help(argv or []) else names:
        if name not in _registered:
            importlib.import_module(f"{commands.__name__}.{name}").register(_app)
            _registered.add(name)
    return _app


def _asks_root_help(argv: list[str]) -> bool:
    """``stalwart -h run``: the root's help, which lists every command."""
    first = next((i for i, a in enumerate(argv) if not a.startswith("-")), len(argv))
    return any(a in ("-h", "--help") for a in argv[:first])


def __getattr__(name: str) -> typer.Typer:
    """``stalwart.cli.app``: the command with every sub-command registered (tests, docs tools)."""
    if name == "app":
        return _register_commands()
    raise AttributeError(name)


def _metavar(param) -> str:
    """argparse/torchrun style: ``--nproc-per-node NPROC_PER_NODE``, ``SCRIPT [SCRIPT_ARGS]...``."""
    return (param.name or "value").upper()


def _tidy_help(cmd) -> None:
    """One help style for every command, set here so commands keep their option lists short.

    Typer prints value types as ``<int>``/``<list[str]>`` and required arguments as ``{script}``, and
    click shortens a command's summary to 45 characters with "..."; this walks the command tree once
    and gives each value an upper-case metavar, each argument a plain usage name, and each command its
    whole first help paragraph as summary (click wraps it to the terminal instead of cutting it)."""
    for param in getattr(cmd, "params", ()):
        if getattr(param, "is_flag", False) or param.metavar is not None:
            continue
        param.metavar = _metavar(param)
        if param.param_type_name == "argument":
            piece = param.metavar if param.required else f"[{param.metavar}]"
            piece += "..." if param.nargs != 1 else ""
            # attributes of this one argument object, not a patch of the class
            param.get_usage_pieces = lambda ctx, piece=piece: [piece]
            param.display_type_rich = lambda ctx: None  # the name says it; no "<list[str]>" after it
    if getattr(cmd, "help", None) and not cmd.short_help:
        cmd.short_help = cmd.help.strip().split("\n\n")[0].replace("\n", " ")
    for sub in getattr(cmd, "commands", {}).values():
        _tidy_help(sub)


def command(argv: list[str] | None = None):
    """The click command behind ``stalwart``, with the shared help style applied: every sub-command,
    or only the one ``argv`` names."""
    cmd = typer.main.get_command(_register_commands(argv))
    _tidy_help(cmd)
    return cmd


def _fail(message: str, code: int) -> None:
    print(f"stalwart: error: {message}", file=sys.stderr)
    sys.exit(code)


def main(argv: list[str] | None = None) -> None:
    try:
        args = sys.argv[1:] if argv is None else argv
        result = command(args).main(args=args, prog_name="stalwart", standalone_mode=False)
    except StalwartError as exc:
        _fail(str(exc), exc.exit_code)
    except _NO_ARGS as exc:
        # printed here only (typer's rich path printed it as well: it appeared twice)
        print(exc.ctx.get_help() if exc.ctx else "see 'stalwart --help'")
        sys.exit(2)
    except _USAGE as exc:
        hint = f" (see '{exc.ctx.command_path} --help')" if exc.ctx else ""
        _fail(f"{exc.format_message()}{hint}", 2)
    except _EXIT as exc:
        sys.exit(exc.exit_code)
    except _ABORT:
        _fail("aborted", 130)
    except KeyboardInterrupt:
        _fail("interrupted", 130)
    if isinstance(result, int) and result != 0:
        sys.exit(result)


if __name__ == "__main__":
    main()
