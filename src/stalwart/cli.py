"""The ``stalwart`` command. Thin: parses, calls a package, prints.

Each sub-command lives in ``stalwart/commands/<name>.py`` and exposes ``register(app)``; they are
discovered here so packages never edit this file to add a command.
"""

from __future__ import annotations

from .process_clock import process_start  # noqa: E402 - light, no dependencies

PROCESS_START = process_start()  # the job's wall clock starts with the process

import importlib  # noqa: E402
import pkgutil  # noqa: E402
import sys  # noqa: E402

import typer  # noqa: E402

try:  # typer >= 0.29 vendors click and does not install it
    from typer._click import exceptions as _cx
except ImportError:  # pragma: no cover - older typer raises click's own exceptions
    from click import exceptions as _cx

_USAGE = (_cx.UsageError,)
_NO_ARGS = (_cx.NoArgsIsHelpError,)
_EXIT = (typer.Exit,)
_ABORT = (typer.Abort,)

from . import __version__  # noqa: E402
from .errors import StalwartError  # noqa: E402

app = typer.Typer(
    name="stalwart",
    help="Keep distributed training runs productive through failures.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        print(f"stalwart {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """Keep distributed training runs productive through failures."""


def _register_commands() -> None:
    from . import commands

    for mod in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        if mod.name.startswith("_"):
            continue
        module = importlib.import_module(f"{commands.__name__}.{mod.name}")
        module.register(app)


_register_commands()


def _fail(message: str, code: int) -> None:
    print(f"stalwart: error: {message}", file=sys.stderr)
    sys.exit(code)


def main(argv: list[str] | None = None) -> None:
    try:
        result = app(args=argv, standalone_mode=False)
    except StalwartError as exc:
        _fail(str(exc), exc.exit_code)
    except _NO_ARGS as exc:
        # typer prints the help itself in some versions; make sure something useful is shown
        print(exc.ctx.get_help() if exc.ctx else "stalwart --help")
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
